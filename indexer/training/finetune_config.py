"""The options of a fine-tuning run: :class:`FinetuneConfig`, checked once when it is made.

``clipsearch finetune`` maps its flags 1:1 onto the fields, so a bad value is a one-line error
whichever way the run is started. :func:`check_resume` holds a checkpoint to the options it was
made with.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from retrieval.checks import is_int, is_positive_int
from retrieval.errors import FinetuneError, InvalidArgumentError

from .augment import AugmentConfig
from .contrastive import ACCUM_MODES, FREEZE_CHOICES
from .train_state import SAVE_DTYPES

# Learning rates when none is given: gentle for a pretrained model, CLIP-like from scratch.
DEFAULT_LR_PRETRAINED = 1e-5
DEFAULT_LR_SCRATCH = 5e-4
DEFAULT_WARMUP_FRACTION = 0.1
# Options that must be the same to resume a checkpoint (the others only affect how it runs).
# (The pairs themselves are compared by content: see data.data_fingerprint.)
RESUME_KEYS = (
    "model", "from_config", "epochs", "lr", "batch_size", "grad_accum", "accum_mode", "weight_decay",
    "warmup_steps", "freeze", "augment", "seed",
)  # fmt: skip


@dataclass(frozen=True)
class FinetuneConfig:
    """Everything a fine-tuning run needs (the CLI maps its options 1:1 onto these fields).

    Attributes:
        data: pairs file for training (``{"path", "caption"}`` JSON Lines).
        out: output directory (a Hugging Face checkpoint at the end).
        model: base checkpoint (hub id or directory); exactly one of this and ``from_config``.
        from_config: train from scratch: a preset of ``retrieval.tools.random_model.PRESETS`` or a
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
            raise InvalidArgumentError(
                "give exactly one of --model BASE (a checkpoint to fine-tune) and --from-config SPEC (train from scratch)"
            )
        for name in ("data", "out"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise InvalidArgumentError(f"--{name} must be a non-empty path")
        for name, minimum in (("epochs", 1), ("batch_size", 1), ("grad_accum", 1)):
            value = getattr(self, name)
            if not is_positive_int(value, minimum):
                raise InvalidArgumentError(f"--{name.replace('_', '-')} must be an integer >= {minimum}, got {value!r}")
        for name in ("save_every", "stop_after_steps"):
            value = getattr(self, name)
            if value is not None and not is_positive_int(value):
                raise InvalidArgumentError(f"--{name.replace('_', '-')} must be an integer >= 1, got {value!r}")
        if self.warmup_steps is not None and not is_positive_int(self.warmup_steps, 0):
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
        if self.save_dtype not in SAVE_DTYPES:
            raise InvalidArgumentError(f"--save-dtype must be one of {', '.join(SAVE_DTYPES)}, got {self.save_dtype!r}")
        if not is_int(self.seed) or not 0 <= self.seed < 2**63:
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


def check_resume(saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """Refuse to resume with options that would change the run (it would not be a resume)."""
    diffs = [
        f"{key}={current.get(key)!r} (checkpoint: {saved.get(key)!r})"
        for key in (*RESUME_KEYS, "data_fingerprint")
        if saved.get(key) != current.get(key)
    ]
    if diffs:
        what = "the training pairs changed" if diffs[0].startswith("data_fingerprint") else "; ".join(diffs)
        raise FinetuneError(f"cannot resume with other training options than the checkpoint's: {what}")


__all__ = [
    "DEFAULT_LR_PRETRAINED", "DEFAULT_LR_SCRATCH", "DEFAULT_WARMUP_FRACTION", "RESUME_KEYS", "FinetuneConfig",
    "check_resume",
]  # fmt: skip
