"""Where a run stands: its plan (:class:`Schedule`) and how far it got (:class:`TrainState`).

The plan follows from the options and the number of usable pairs; the state is what a
checkpoint saves and a resume restores (on disk: :mod:`indexer.training.train_state`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .finetune_config import DEFAULT_WARMUP_FRACTION, FinetuneConfig


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Learning-rate multiplier of optimizer step ``step`` (0-based): linear warm-up, cosine decay.

    Warm-up climbs ``1/warmup, 2/warmup, ..., 1``; then the factor follows half a cosine from 1
    towards 0, reaching it one step after the last.
    """
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


@dataclass(frozen=True)
class Schedule:
    """How many steps of how many pairs: an epoch is ``pairs // (batch_size x grad_accum)`` steps.

    Every step has the same number of negatives, so the few pairs left over are not used in
    that epoch; with fewer pairs than an effective batch, a step takes them all.
    """

    pairs: int
    per_step: int
    steps_per_epoch: int
    total_steps: int
    warmup: int

    @classmethod
    def plan(cls, config: FinetuneConfig, pairs: int) -> Schedule:
        """The schedule of ``config`` over ``pairs`` usable pairs."""
        effective = config.batch_size * config.grad_accum
        steps_per_epoch = max(1, pairs // effective)
        total_steps = steps_per_epoch * config.epochs
        warmup = config.warmup_steps if config.warmup_steps is not None else round(DEFAULT_WARMUP_FRACTION * total_steps)
        return cls(
            pairs=pairs,
            per_step=min(effective, pairs),
            steps_per_epoch=steps_per_epoch,
            total_steps=total_steps,
            warmup=warmup,
        )


@dataclass
class TrainState:
    """The mutable position of a run: the one place the training loop writes to.

    ``perm`` is the current epoch's order of the pairs (None before the epoch's first batch);
    ``history`` holds one row per epoch (row 0: before training); ``elapsed`` is the training
    time of the runs before this one; ``resumed_from`` the step this run started at (None for
    a fresh run).
    """

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    perm: Any = None
    losses: list[float] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    before: dict[str, float] | None = None
    elapsed: float = 0.0
    resumed_from: int | None = None


__all__ = ["Schedule", "TrainState", "lr_factor"]
