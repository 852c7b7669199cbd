"""Contrastive fine-tuning of a Hugging Face CLIP checkpoint on (image, caption) pairs.

``clipsearch finetune`` (and :func:`finetune`) train a ``CLIPModel`` with CLIP's symmetric
InfoNCE loss (:mod:`indexer.training.contrastive`), AdamW (no weight decay on biases, LayerNorm,
embeddings and the temperature), a linear warm-up then a cosine decay of the learning rate,
gradient accumulation (GradCache by default, so accumulating equals a big batch) and a mild
random crop (:mod:`indexer.training.augment`). The starting point is a checkpoint (``model``) or a
randomly initialised small CLIP (``from_config``: a :data:`retrieval.random_model.PRESETS`
name or a JSON file of :class:`~retrieval.random_model.RandomClipSpec` fields).

Before training and after every epoch, text-to-image retrieval on held-out pairs is measured
with ``clipsearch eval``'s metric code (:mod:`indexer.training.validate`). The run checkpoints every
epoch (and every ``save_every`` steps) and resumes exactly; the result is a standard Hugging
Face checkpoint that ``clipsearch index --model OUT`` and ``CLIPModel.from_pretrained(OUT)``
load unchanged (:mod:`indexer.training.train_state`).

Epochs and steps: an optimizer step takes ``batch_size x grad_accum`` pairs (all pairs when
there are fewer); an epoch is ``pairs // (batch_size x grad_accum)`` steps over a fresh random
order, the few pairs left over are not used in that epoch (every step has the same number of
negatives).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from retrieval.encoders import HFClipEncoder, read_image_processor_config
from retrieval.errors import (
    FinetuneError,
    InvalidArgumentError,
    ModelLoadError,
    PairsFileError,
)
from retrieval.version import __version__

from . import train_state
from .augment import (
    AugmentConfig,
    decode_training_images,
    training_batch,
    validation_pixels,
)
from .contrastive import (
    ACCUM_MODES,
    FREEZE_CHOICES,
    PairBatch,
    forward_backward,
    freeze_tower,
    parameter_groups,
    positive_mask,
)
from .pairs import PairsFile, caption_groups, load_pairs
from .validate import (
    DEFAULT_KS,
    ValidationSet,
    build_validation_set,
    evaluate_model,
)

Log = Callable[[str], None]

# Learning rates when none is given: gentle for a pretrained model, CLIP-like from scratch.
DEFAULT_LR_PRETRAINED = 1e-5
DEFAULT_LR_SCRATCH = 5e-4
DEFAULT_WARMUP_FRACTION = 0.1
# CLIP's AdamW settings (Radford et al., 2021).
ADAM_BETAS = (0.9, 0.98)
ADAM_EPS = 1e-6
# CLIP clips the temperature so that logits are scaled by at most 100.
MAX_LOGIT_SCALE = math.log(100.0)
# Options that must be the same to resume a checkpoint (the others only affect how it runs).
# (The pairs themselves are compared by content: see _data_fingerprint.)
_RESUME_KEYS = (
    "model", "from_config", "epochs", "lr", "batch_size", "grad_accum", "accum_mode", "weight_decay",
    "warmup_steps", "freeze", "augment", "seed",
)  # fmt: skip


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class FinetuneConfig:
    """Everything a fine-tuning run needs (the CLI maps its options 1:1 onto these fields).

    Attributes:
        data: pairs file for training (``{"path", "caption"}`` JSON Lines).
        out: output directory (a Hugging Face checkpoint at the end).
        model: base checkpoint (hub id or directory); exactly one of this and ``from_config``.
        from_config: train from scratch: a preset of ``retrieval.random_model.PRESETS`` or a
            JSON file of ``RandomClipSpec`` fields (initialised with ``seed``).
        val: held-out pairs file, evaluated before training and after each epoch.
        images_root: directory image paths are relative to (default: each pairs file's own).
        epochs: passes over the training pairs.
        lr: peak learning rate (default 1e-5 with ``model``, 5e-4 with ``from_config``).
        batch_size: pairs encoded at once (a micro-batch).
        grad_accum: micro-batches per optimizer step (effective batch = product).
        accum_mode: ``gradcache`` (the loss of the whole effective batch) or ``micro``
            (a loss per micro-batch, negatives only from it); see :mod:`indexer.training.contrastive`.
        weight_decay: AdamW weight decay of weight matrices.
        warmup_steps: linear warm-up steps (default: 10 % of all steps).
        freeze: ``vision``, ``text`` or ``none``: a tower whose weights stay as they are.
        augment: the random crop.
        seed: seeds the data order, the crops and (``from_config``) the initial weights.
        device: ``auto``, ``cpu`` or ``cuda[:N]``.
        save_every: also checkpoint every this many steps (always at the end of each epoch).
        save_dtype: dtype of the saved weights (``float32``, ``float16``, ``bfloat16``).
        resume: continue the checkpoint in ``out`` (same training options required).
        keep_checkpoint: keep ``out/checkpoint/`` after the final model is written.
        stop_after_steps: stop once this many steps are done in all, leaving the checkpoint to
            resume from (for time-boxed runs on shared machines; the schedule still spans
            ``epochs``).

    Raises:
        InvalidArgumentError: a value out of range, or not exactly one of ``model`` and
            ``from_config``.
    """

    data: str
    out: str
    model: str | None = None
    from_config: str | None = None
    val: str | None = None
    images_root: str | None = None
    epochs: int = 10
    lr: float | None = None
    batch_size: int = 64
    grad_accum: int = 1
    accum_mode: str = "gradcache"
    weight_decay: float = 0.1
    warmup_steps: int | None = None
    freeze: str = "none"
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    seed: int = 0
    device: str = "auto"
    save_every: int | None = None
    save_dtype: str = "float32"
    resume: bool = False
    keep_checkpoint: bool = False
    stop_after_steps: int | None = None

    def __post_init__(self) -> None:
        if (self.model is None) == (self.from_config is None):
            raise InvalidArgumentError("give exactly one of --model BASE (a checkpoint to fine-tune) and --from-config SPEC (train from scratch)")
        for name in ("data", "out"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise InvalidArgumentError(f"--{name} must be a non-empty path")
        for name, minimum in (("epochs", 1), ("batch_size", 1), ("grad_accum", 1)):
            value = getattr(self, name)
            if not _is_int(value) or value < minimum:
                raise InvalidArgumentError(f"--{name.replace('_', '-')} must be an integer >= {minimum}, got {value!r}")
        for name in ("save_every", "stop_after_steps"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 1):
                raise InvalidArgumentError(f"--{name.replace('_', '-')} must be an integer >= 1, got {value!r}")
        if self.warmup_steps is not None and (not _is_int(self.warmup_steps) or self.warmup_steps < 0):
            raise InvalidArgumentError(f"--warmup-steps must be an integer >= 0, got {self.warmup_steps!r}")
        if self.lr is not None and not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise InvalidArgumentError(f"--lr must be a number > 0, got {self.lr!r}")
        if not (isinstance(self.weight_decay, (int, float)) and math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise InvalidArgumentError(f"--weight-decay must be a number >= 0, got {self.weight_decay!r}")
        if self.batch_size * self.grad_accum < 2:
            raise InvalidArgumentError("a contrastive step needs at least 2 pairs: raise --batch-size or --grad-accum")
        if self.accum_mode not in ACCUM_MODES:
            raise InvalidArgumentError(f"--accum-mode must be one of {', '.join(ACCUM_MODES)}, got {self.accum_mode!r}")
        if self.accum_mode == "micro" and self.batch_size < 2:
            raise InvalidArgumentError("--accum-mode micro needs --batch-size >= 2 (each micro-batch is its own contrastive batch)")
        if self.freeze not in FREEZE_CHOICES:
            raise InvalidArgumentError(f"--freeze must be one of {', '.join(FREEZE_CHOICES)}, got {self.freeze!r}")
        if self.save_dtype not in train_state.SAVE_DTYPES:
            raise InvalidArgumentError(f"--save-dtype must be one of {', '.join(train_state.SAVE_DTYPES)}, got {self.save_dtype!r}")
        if not _is_int(self.seed) or not 0 <= self.seed < 2**63:
            raise InvalidArgumentError(f"--seed must be an integer in [0, 2**63), got {self.seed!r}")
        if not isinstance(self.augment, AugmentConfig):
            raise InvalidArgumentError("augment must be an AugmentConfig")

    @property
    def learning_rate(self) -> float:
        """The peak learning rate, defaults applied."""
        if self.lr is not None:
            return float(self.lr)
        return DEFAULT_LR_SCRATCH if self.from_config is not None else DEFAULT_LR_PRETRAINED

    def to_dict(self) -> dict[str, Any]:
        """JSON-able options; paths as given, ``augment`` as a dict."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["augment"] = self.augment.to_dict()
        return out


@dataclass(frozen=True)
class FinetuneReport:
    """What a run did. :meth:`to_dict` is what ``clipsearch finetune --json`` prints.

    ``before`` / ``after`` / ``chance`` are None without validation pairs; ``after`` is
    measured on the weights as saved (after the cast to ``save_dtype``). ``finished`` is False
    when ``stop_after_steps`` ended the run early (no final model then).
    """

    out: Path
    base: str
    pairs: int
    skipped_pairs: int
    val_queries: int
    val_images: int
    skipped_val_pairs: int
    epochs: int
    steps: int
    total_steps: int
    steps_per_epoch: int
    effective_batch_size: int
    resumed_from_step: int | None
    finished: bool
    before: dict[str, float] | None
    after: dict[str, float] | None
    chance: dict[str, float] | None
    history: tuple[dict[str, Any], ...]
    loss_history: tuple[float, ...]
    seconds: float
    train_seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "out": str(self.out),
            "base": self.base,
            "finished": self.finished,
            "pairs": self.pairs,
            "skipped_pairs": self.skipped_pairs,
            "val_queries": self.val_queries,
            "val_images": self.val_images,
            "skipped_val_pairs": self.skipped_val_pairs,
            "epochs": self.epochs,
            "steps": self.steps,
            "total_steps": self.total_steps,
            "steps_per_epoch": self.steps_per_epoch,
            "effective_batch_size": self.effective_batch_size,
            "resumed_from_step": self.resumed_from_step,
            "before": self.before,
            "after": self.after,
            "chance": self.chance,
            "history": list(self.history),
            "loss_history": list(self.loss_history),
            "seconds": self.seconds,
            "train_seconds": self.train_seconds,
        }


# -- set-up -------------------------------------------------------------------------------------


def resolve_spec(spec: str) -> Any:
    """``--from-config SPEC`` -> a ``RandomClipSpec``: a preset name or a JSON file of its fields.

    Raises:
        InvalidArgumentError: unknown preset and no such file, unreadable JSON, unknown or
            missing fields, or invalid values.
    """
    from retrieval.random_model import PRESETS, RandomClipSpec

    if spec in PRESETS:
        return PRESETS[spec]
    path = Path(spec)
    if not path.is_file():
        raise InvalidArgumentError(
            f"--from-config {spec!r} is neither a preset ({', '.join(sorted(PRESETS))}) nor a JSON file"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidArgumentError(f"--from-config {spec}: not a readable JSON file ({exc})") from None
    names = [f.name for f in fields(RandomClipSpec)]
    if not isinstance(data, dict):
        raise InvalidArgumentError(f"--from-config {spec}: expected a JSON object with the fields {', '.join(names)}")
    unknown = sorted(set(data) - set(names))
    missing = [n for n in names if n not in data]
    if unknown or missing:
        parts = [f"unknown: {', '.join(unknown)}"] if unknown else []
        parts += [f"missing: {', '.join(missing)}"] if missing else []
        detail = "; ".join(parts)
        raise InvalidArgumentError(f"--from-config {spec}: {detail} (fields: {', '.join(names)})")
    return RandomClipSpec(**data)


@contextlib.contextmanager
def _model_source(config: FinetuneConfig, checkpoint: Path | None) -> Iterator[str]:
    """The directory (or hub id) the starting weights are read from."""
    if checkpoint is not None:
        yield str(checkpoint / train_state.MODEL_DIR)
    elif config.from_config is not None:
        from retrieval.random_model import make_random_clip

        spec = resolve_spec(config.from_config)
        with tempfile.TemporaryDirectory(prefix="clipsearch-from-config-") as tmp:
            make_random_clip(tmp, preset=spec, seed=config.seed)
            yield tmp
    else:
        yield str(config.model)


def _check_backend(config: FinetuneConfig) -> None:
    if config.model is not None and config.model.startswith("open_clip:"):
        raise FinetuneError(
            f"fine-tuning supports Hugging Face CLIP checkpoints (CLIPModel) only, not open_clip models ({config.model}); "
            "pass a Hugging Face checkpoint directory or hub id, or --from-config"
        )


@dataclass(frozen=True)
class _Model:
    """The loaded starting point: weights on the device, tokenizer, preprocessing."""

    name: str
    model: Any
    tokenizer: Any
    preprocess: Any
    preprocessor: bytes
    max_length: int
    device: Any


def _load_model(source: str, device: str, name: str) -> _Model:
    import torch
    from transformers import CLIPModel
    from transformers.utils import logging as hf_logging

    encoder = HFClipEncoder.load(source, device=device)
    bars, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()  # no "Loading weights" bar in the middle of the progress table
    hf_logging.set_verbosity_error()
    try:
        model, info = CLIPModel.from_pretrained(encoder.directory, output_loading_info=True, dtype=torch.float32)
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"cannot load CLIPModel from {name}: {str(exc).splitlines()[0]}") from exc
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    missing = list(info.get("missing_keys") or [])
    if missing:
        # Training would start from random values for these without saying so.
        raise ModelLoadError(f"{name} lacks weights for CLIPModel ({len(missing)} missing, e.g. {missing[0]})")
    # Settings from either layout of the base (the same ones clipsearch and transformers use),
    # saved as a top-level preprocessor_config.json: byte for byte when the base has one.
    processor = encoder.image_processor or read_image_processor_config(Path(encoder.directory), name)
    preprocessor = processor.preprocessor_json()
    return _Model(
        name=name,
        model=model.to(encoder.device),
        tokenizer=encoder.tokenizer,
        preprocess=encoder.preprocess,
        preprocessor=preprocessor,
        max_length=encoder.max_text_length,
        device=encoder.device,
    )


def _report_skips(pairs: PairsFile, failures: list[Any], warn: Log) -> None:
    for line in pairs.skipped_summary():
        warn(line)
    if failures:
        warn(f"{pairs.source}: skipped {len(failures)} pairs whose image cannot be decoded")
        for f in failures[:5]:
            pair = pairs.pairs[f.index]
            warn(f"  {pairs.source}:{pair.line}: {pair.path}: {f.reason}")
        if len(failures) > 5:
            warn(f"  ... and {len(failures) - 5} more")


def _data_fingerprint(paths: list[str], captions: list[str]) -> str:
    """Identifies the training pairs (as written), so that a resume notices a changed pairs file."""
    digest = hashlib.sha256()
    for path, caption in zip(paths, captions):
        digest.update(f"{path}\0{caption}\n".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


@dataclass(frozen=True)
class _TrainingData:
    """The usable training pairs, decoded and tokenized once for the whole run."""

    failures: list[Any]
    images: list[Any]
    tokens: Mapping[str, Any]
    image_groups: Any
    text_groups: Any


def _training_data(pairs_file: PairsFile, loaded: _Model, warn: Log) -> _TrainingData:
    """Decode the images (skipping, and reporting, those that fail), tokenize the captions.

    Raises:
        PairsFileError: fewer than 2 usable pairs are left.
    """
    import torch

    images, failures = decode_training_images([p.file for p in pairs_file.pairs], loaded.preprocess)
    _report_skips(pairs_file, failures, warn)
    keep = [i for i, img in enumerate(images) if img is not None]
    if len(keep) < 2:
        raise PairsFileError(
            f"only {len(keep)} usable pair(s) after decoding the images; training needs at least 2", pairs_file.source
        )
    pairs = [pairs_file.pairs[i] for i in keep]
    captions = [p.caption for p in pairs]
    # Padded once to the longest caption; each batch is cut to its own longest.
    tokens = loaded.tokenizer(captions, padding=True, truncation=True, max_length=loaded.max_length, return_tensors="pt")
    file_ids: dict[Path, int] = {}
    return _TrainingData(
        failures=failures,
        images=[images[i] for i in keep],
        tokens=tokens,
        image_groups=torch.tensor([file_ids.setdefault(p.file, len(file_ids)) for p in pairs]),
        text_groups=torch.tensor(caption_groups(captions)),
    )


def _validation_data(val_pairs: PairsFile | None, cfg: Any, warn: Log) -> tuple[ValidationSet | None, int]:
    """The held-out set (None without ``--val``) and how many of its pairs were skipped.

    Raises:
        PairsFileError: no validation image can be decoded.
    """
    if val_pairs is None:
        return None, 0
    pixels, failures = validation_pixels([p.file for p in val_pairs.pairs], cfg)
    _report_skips(val_pairs, failures, warn)
    ok = [i for i, p in enumerate(pixels) if p is not None]
    if not ok:
        raise PairsFileError("no usable validation pair after decoding the images", val_pairs.source)
    vset = build_validation_set(
        [val_pairs.pairs[i].file for i in ok],
        [val_pairs.pairs[i].caption for i in ok],
        [pixels[i] for i in ok],  # type: ignore[misc]
    )
    return vset, len(val_pairs.skipped) + len(failures)


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Learning-rate multiplier of optimizer step ``step`` (0-based): linear warm-up, cosine decay.

    Warm-up climbs ``1/warmup, 2/warmup, ..., 1``; then the factor follows half a cosine from 1
    towards 0, reaching it one step after the last.
    """
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


# -- the run ------------------------------------------------------------------------------------


def finetune(config: FinetuneConfig, *, log: Log | None = None, warn: Log | None = None) -> FinetuneReport:
    """Fine-tune (or train from scratch) a CLIP model on image-caption pairs.

    Args:
        config: the run's options.
        log: receives the progress table, one line per call (default: silent).
        warn: receives skipped-input reports, one line per call (default: silent).

    Returns:
        The report (the final model is in ``config.out`` when ``report.finished``).

    Raises:
        PairsFileError: a missing pairs file, or one without any usable pair.
        FinetuneError: an open_clip model, an output directory in the way, or a checkpoint
            that does not match the options given to resume it.
        ModelLoadError: the base model cannot be loaded.
        InvalidArgumentError: bad options (see :class:`FinetuneConfig`), a bad ``from_config``.
    """
    import torch

    log = log or (lambda _line: None)
    warn = warn or (lambda _line: None)
    started = time.perf_counter()
    _check_backend(config)
    out = Path(config.out)
    checkpoint = train_state.prepare_output_dir(out, config.resume)
    state = train_state.load_state(checkpoint) if checkpoint is not None else None

    # Inputs first: a bad pairs file fails before a model is loaded.
    train_pairs = load_pairs(config.data, config.images_root)
    val_pairs = load_pairs(config.val, config.images_root) if config.val is not None else None
    run = config.to_dict()
    run["data_fingerprint"] = _data_fingerprint([p.path for p in train_pairs.pairs], [p.caption for p in train_pairs.pairs])
    if state is not None:
        _check_resume(state["run"], run)

    base = config.model if config.model is not None else f"from-config:{config.from_config}"
    with _model_source(config, checkpoint) as source:
        loaded = _load_model(source, config.device, base)
    model, cfg, device = loaded.model, loaded.preprocess, loaded.device

    data = _training_data(train_pairs, loaded, warn)
    failures, train_images, tokens = data.failures, data.images, data.tokens
    image_groups, text_groups = data.image_groups, data.text_groups
    vset, skipped_val = _validation_data(val_pairs, cfg, warn)

    n = len(train_images)
    effective = config.batch_size * config.grad_accum
    per_step = min(effective, n)
    steps_per_epoch = max(1, n // effective)
    total_steps = steps_per_epoch * config.epochs
    warmup = config.warmup_steps if config.warmup_steps is not None else round(DEFAULT_WARMUP_FRACTION * total_steps)

    freeze_tower(model, config.freeze)
    optimizer = torch.optim.AdamW(
        parameter_groups(model, config.weight_decay), lr=config.learning_rate, betas=ADAM_BETAS, eps=ADAM_EPS
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, warmup, total_steps))
    generator = torch.Generator().manual_seed(config.seed)
    torch.manual_seed(config.seed)

    step, epoch, batch_in_epoch = 0, 0, 0
    perm: torch.Tensor | None = None
    losses: list[float] = []
    history: list[dict[str, Any]] = []
    before: dict[str, float] | None = None
    elapsed = 0.0
    resumed_from: int | None = None
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        step, epoch, batch_in_epoch = int(state["step"]), int(state["epoch"]), int(state["batch_in_epoch"])
        perm = state.get("perm")
        losses = list(state["losses"])
        history = list(state["history"])
        before = state.get("before")
        elapsed = float(state["elapsed"])
        resumed_from = step

    chance = vset.chance(DEFAULT_KS).to_dict() if vset is not None else None
    log(
        f"finetune {base} -> {out}: {n} pairs, {steps_per_epoch} steps/epoch x {config.epochs} epochs = {total_steps} steps "
        f"of {per_step} pairs ({config.batch_size} x {config.grad_accum}, {config.accum_mode}), lr {config.learning_rate:g}, "
        f"warm-up {warmup}, device {device}"
    )
    if vset is not None:
        log(f"validation: {len(vset.queries)} caption queries over {len(vset.files)} images; chance: {_metrics_text(chance)}")
    log(f"{'epoch':>5} {'step':>6} {'loss':>8} {'lr':>9} {'MRR':>7} {'R@1':>7} {'R@5':>7} {'R@10':>7} {'seconds':>8}")
    if resumed_from is not None:
        log(f"resumed at step {step} (epoch {epoch + 1}, step {batch_in_epoch} of {steps_per_epoch})")
    for row in history:
        log(_row_text(row))

    def validate() -> dict[str, float] | None:
        return evaluate_model(model, loaded.tokenizer, vset, loaded.max_length).to_dict() if vset is not None else None

    if state is None:
        before = validate()
        row = {"epoch": 0, "step": 0, "loss": None, "lr": None, **(before or {}), "seconds": 0.0}
        history.append(row)
        log(_row_text(row))

    t0 = time.perf_counter()
    last_lr: float | None = None

    def save() -> None:
        train_state.save_checkpoint(
            out,
            model,
            loaded.tokenizer,
            loaded.preprocessor,
            {
                "step": step,
                "epoch": epoch,
                "batch_in_epoch": batch_in_epoch,
                "perm": perm if 0 < batch_in_epoch else None,
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "generator": generator.get_state(),
                "torch_rng": torch.get_rng_state(),
                "losses": losses,
                "history": history,
                "before": before,
                "elapsed": elapsed + (time.perf_counter() - t0),
            },
            run,
        )

    model.train()
    frozen = {"vision": (model.vision_model, model.visual_projection), "text": (model.text_model, model.text_projection)}
    for module in frozen.get(config.freeze, ()):
        module.eval()  # no dropout in a tower that does not learn
    while epoch < config.epochs:
        if batch_in_epoch == 0 or perm is None:
            perm = torch.randperm(n, generator=generator)
            batch_in_epoch = 0
        epoch_losses = losses[len(losses) - batch_in_epoch :] if batch_in_epoch else []
        while batch_in_epoch < steps_per_epoch:
            idx = perm[batch_in_epoch * per_step : (batch_in_epoch + 1) * per_step]
            batch = _make_batch(idx, train_images, tokens, image_groups, text_groups, cfg, config.augment, generator, device)
            optimizer.zero_grad(set_to_none=True)
            loss = forward_backward(model, batch, config.batch_size, config.accum_mode, config.freeze)
            if not math.isfinite(loss):
                # Before the optimizer step: the last checkpoint and the weights stay usable.
                raise FinetuneError(f"the loss became {loss} at step {step + 1}; lower --lr (now {config.learning_rate:g})")
            last_lr = optimizer.param_groups[0]["lr"]
            optimizer.step()
            scheduler.step()
            with torch.no_grad():
                model.logit_scale.clamp_(0.0, MAX_LOGIT_SCALE)
            step += 1
            batch_in_epoch += 1
            losses.append(loss)
            epoch_losses.append(loss)
            stop = config.stop_after_steps is not None and step >= config.stop_after_steps
            if stop or (config.save_every is not None and step % config.save_every == 0):
                save()
            if stop and not (batch_in_epoch == steps_per_epoch and epoch + 1 == config.epochs):
                return _report(config, out, base, train_pairs, failures, vset, skipped_val, total_steps, steps_per_epoch,
                               per_step, resumed_from, False, before, None, chance, history, losses, started,
                               elapsed + time.perf_counter() - t0, step)  # fmt: skip
        metrics = validate()
        epoch += 1
        batch_in_epoch = 0
        row = {
            "epoch": epoch,
            "step": step,
            "loss": sum(epoch_losses) / len(epoch_losses) if epoch_losses else None,
            "lr": last_lr if epoch_losses else None,
            **(metrics or {}),
            "seconds": elapsed + time.perf_counter() - t0,
        }
        history.append(row)
        log(_row_text(row))
        save()
    train_seconds = elapsed + time.perf_counter() - t0

    after = history[-1] if vset is not None else None
    after_metrics = {k: after[k] for k in ("mrr", *(f"recall@{k}" for k in DEFAULT_KS))} if after else None
    if vset is not None and config.save_dtype != "float32":
        # Measure the weights as they will be saved and loaded (rounded, then back to fp32).
        import copy

        rounded = copy.deepcopy(model).to(getattr(torch, config.save_dtype)).to(torch.float32)
        after_metrics = evaluate_model(rounded, loaded.tokenizer, vset, loaded.max_length).to_dict()
        log(f"saved as {config.save_dtype}: {_metrics_text(after_metrics)}")
        del rounded
    report = _report(config, out, base, train_pairs, failures, vset, skipped_val, total_steps, steps_per_epoch,
                     per_step, resumed_from, True, before, after_metrics, chance, history, losses, started,
                     train_seconds, step)  # fmt: skip
    record = {
        "tool": f"clipsearch {__version__}",
        "base": base,
        "options": config.to_dict(),
        "learning_rate": config.learning_rate,
        "warmup_steps": warmup,
        "torch": torch.__version__,
        **{k: v for k, v in report.to_dict().items() if k not in ("out", "loss_history")},
    }
    train_state.export_model(out, model, loaded.tokenizer, loaded.preprocessor, config.save_dtype, record)
    if not config.keep_checkpoint:
        train_state.remove_checkpoint(out)
    return report


def _make_batch(
    idx: Any, images: list[Any], tokens: Mapping[str, Any], image_groups: Any, text_groups: Any, cfg: Any,
    aug: AugmentConfig, generator: Any, device: Any,
) -> PairBatch:  # fmt: skip
    rows = idx.tolist()
    pixels = training_batch([images[i] for i in rows], cfg, aug, generator)
    mask = tokens["attention_mask"][idx]
    width = int(mask.sum(dim=1).max())  # drop the padding columns no caption of this batch needs
    return PairBatch(
        pixels=pixels.to(device),
        input_ids=tokens["input_ids"][idx][:, :width].to(device),
        attention_mask=mask[:, :width].to(device),
        positives=positive_mask(image_groups[idx], text_groups[idx]).to(device),
    )


def _check_resume(saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """Refuse to resume with options that would change the run (it would not be a resume)."""
    diffs = [
        f"{key}={current.get(key)!r} (checkpoint: {saved.get(key)!r})"
        for key in (*_RESUME_KEYS, "data_fingerprint")
        if saved.get(key) != current.get(key)
    ]
    if diffs:
        what = "the training pairs changed" if diffs[0].startswith("data_fingerprint") else "; ".join(diffs)
        raise FinetuneError(f"cannot resume with other training options than the checkpoint's: {what}")


def _metrics_text(m: Mapping[str, float] | None) -> str:
    if not m:
        return "-"
    return "  ".join(f"{k.replace('recall@', 'R@').replace('mrr', 'MRR')} {v:.4f}" for k, v in m.items())


def _row_text(row: Mapping[str, Any]) -> str:
    def num(key: str, fmt: str, width: int) -> str:
        value = row.get(key)
        return f"{value:{width}{fmt}}" if value is not None else f"{'-':>{width}}"

    return " ".join(
        [
            f"{row['epoch']:>5}",
            f"{row['step']:>6}",
            num("loss", ".4f", 8),
            num("lr", ".2e", 9),
            num("mrr", ".4f", 7),
            num("recall@1", ".4f", 7),
            num("recall@5", ".4f", 7),
            num("recall@10", ".4f", 7),
            f"{row['seconds']:>8.1f}",
        ]
    )


def _report(
    config: FinetuneConfig, out: Path, base: str, train_pairs: PairsFile, failures: list[Any], vset: ValidationSet | None,
    skipped_val: int, total_steps: int, steps_per_epoch: int, per_step: int, resumed_from: int | None, finished: bool,
    before: dict[str, float] | None, after: dict[str, float] | None, chance: dict[str, float] | None,
    history: list[dict[str, Any]], losses: list[float], started: float, train_seconds: float, step: int,
) -> FinetuneReport:  # fmt: skip
    return FinetuneReport(
        out=out,
        base=base,
        pairs=len(train_pairs.pairs) - len(failures),
        skipped_pairs=len(train_pairs.skipped) + len(failures),
        val_queries=len(vset.queries) if vset is not None else 0,
        val_images=len(vset.files) if vset is not None else 0,
        skipped_val_pairs=skipped_val,
        epochs=config.epochs,
        steps=step,
        total_steps=total_steps,
        steps_per_epoch=steps_per_epoch,
        effective_batch_size=per_step,
        resumed_from_step=resumed_from,
        finished=finished,
        before=before,
        after=after,
        chance=chance,
        history=tuple(history),
        loss_history=tuple(losses),
        seconds=time.perf_counter() - started,
        train_seconds=train_seconds,
    )


__all__ = ["FinetuneConfig", "FinetuneReport", "finetune", "lr_factor", "resolve_spec"]
