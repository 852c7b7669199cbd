"""Contrastive fine-tuning of a CLIP checkpoint on (image, caption) pairs (``clipsearch finetune``: :mod:`clipsearch.cli.finetune`).

``clipsearch finetune`` (and :func:`finetune`) train a ``CLIPModel`` with CLIP's symmetric
InfoNCE loss (:mod:`indexer.training.contrastive`), AdamW (no weight decay on biases, LayerNorm,
embeddings and the temperature), a linear warm-up then a cosine decay of the learning rate,
gradient accumulation (GradCache by default, so accumulating equals a big batch) and a mild
random crop (:mod:`indexer.training.augment`). The starting point is a checkpoint (``model``) or a
randomly initialised small CLIP (``from_config``: a :data:`retrieval.tools.random_model.PRESETS`
name or a JSON file of :class:`~retrieval.tools.random_model.RandomClipSpec` fields).

Before training and after every epoch, text-to-image retrieval on held-out pairs is measured
with ``clipsearch eval``'s metric code (:mod:`indexer.training.validate`). The run checkpoints every
epoch (and every ``save_every`` steps) and resumes exactly; the result is a standard Hugging
Face checkpoint that ``clipsearch index --model OUT`` and ``CLIPModel.from_pretrained(OUT)``
load unchanged (:mod:`indexer.training.train_state`).

Epochs and steps: an optimizer step takes ``batch_size x grad_accum`` pairs (all pairs when
there are fewer); an epoch is ``pairs // (batch_size x grad_accum)`` steps over a fresh random
order, the few pairs left over are not used in that epoch (every step has the same number of
negatives).

This module only wires the pieces together: the options (:mod:`.config`), the starting point
(:mod:`.model`), the data (:mod:`.data`), the loop (:mod:`.loop`, over :mod:`.progress`'s
schedule and state) and the report (:mod:`.report`).
"""

from __future__ import annotations

import time
from pathlib import Path

from retrieval.version import __version__

from . import train_state
from .data import Log, data_fingerprint, training_data, validation_data
from .finetune_config import FinetuneConfig, check_resume
from .loop import Trainer
from .model import check_backend, load_model, model_source, resolve_spec
from .pairs import load_pairs
from .progress import Schedule, lr_factor
from .report import TABLE_HEADER, DataCounts, FinetuneReport, RunFacts, build_report, metrics_text, row_text
from .validate import DEFAULT_KS


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
    check_backend(config)
    out = Path(config.out)
    checkpoint = train_state.prepare_output_dir(out, config.resume)
    saved = train_state.load_state(checkpoint) if checkpoint is not None else None

    # Inputs first: a bad pairs file fails before a model is loaded.
    train_pairs = load_pairs(config.data, config.images_root)
    val_pairs = load_pairs(config.val, config.images_root) if config.val is not None else None
    run = config.to_dict()
    run["data_fingerprint"] = data_fingerprint([p.path for p in train_pairs.pairs], [p.caption for p in train_pairs.pairs])
    if saved is not None:
        check_resume(saved["run"], run)

    base = config.model if config.model is not None else f"from-config:{config.from_config}"
    with model_source(config, checkpoint) as source:
        loaded = load_model(source, config.device, base)
    data = training_data(train_pairs, loaded, warn)
    vset, skipped_val = validation_data(val_pairs, loaded.preprocess, warn)
    schedule = Schedule.plan(config, len(data.images))

    trainer = Trainer(config, loaded, data, vset, schedule, out, run, log)
    if saved is not None:
        trainer.restore(saved)
    counts = DataCounts(
        pairs=len(train_pairs.pairs) - len(data.failures),
        skipped_pairs=len(train_pairs.skipped) + len(data.failures),
        val_queries=len(vset.queries) if vset is not None else 0,
        val_images=len(vset.files) if vset is not None else 0,
        skipped_val_pairs=skipped_val,
    )
    chance = vset.chance(DEFAULT_KS).to_dict() if vset is not None else None
    facts = RunFacts(out=out, base=base, epochs=config.epochs, counts=counts, schedule=schedule, chance=chance, started=started)

    log(
        f"finetune {base} -> {out}: {schedule.pairs} pairs, {schedule.steps_per_epoch} steps/epoch x {config.epochs} epochs "
        f"= {schedule.total_steps} steps of {schedule.per_step} pairs ({config.batch_size} x {config.grad_accum}, "
        f"{config.accum_mode}), lr {config.learning_rate:g}, warm-up {schedule.warmup}, device {loaded.device}"
    )
    if vset is not None:
        log(f"validation: {len(vset.queries)} caption queries over {len(vset.files)} images; chance: {metrics_text(chance)}")
    log(TABLE_HEADER)
    state = trainer.state
    if state.resumed_from is not None:
        log(f"resumed at step {state.step} (epoch {state.epoch + 1}, step {state.batch_in_epoch} of {schedule.steps_per_epoch})")
    for row in state.history:
        log(row_text(row))

    if not trainer.train():
        return build_report(facts, trainer.state, finished=False, after=None, train_seconds=trainer.train_seconds())
    train_seconds = trainer.train_seconds()
    after = trainer.final_metrics()
    report = build_report(facts, trainer.state, finished=True, after=after, train_seconds=train_seconds)
    record = {
        "tool": f"clipsearch {__version__}",
        "base": base,
        "options": config.to_dict(),
        "learning_rate": config.learning_rate,
        "warmup_steps": schedule.warmup,
        "torch": torch.__version__,
        **{k: v for k, v in report.to_dict().items() if k not in ("out", "loss_history")},
    }
    train_state.export_model(out, loaded.model, loaded.tokenizer, loaded.preprocessor, config.save_dtype, record)
    if not config.keep_checkpoint:
        train_state.remove_checkpoint(out)
    return report


__all__ = ["FinetuneConfig", "FinetuneReport", "finetune", "lr_factor", "resolve_spec"]
