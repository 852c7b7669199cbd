"""What a run tells: the progress table it logs and the :class:`FinetuneReport` it returns."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .progress import Schedule, TrainState

# The progress table's columns (a row: :func:`row_text`).
TABLE_HEADER = f"{'epoch':>5} {'step':>6} {'loss':>8} {'lr':>9} {'MRR':>7} {'R@1':>7} {'R@5':>7} {'R@10':>7} {'seconds':>8}"


@dataclass(frozen=True)
class DataCounts:
    """How much data a run used and left out (validation counts 0 without validation pairs)."""

    pairs: int
    skipped_pairs: int
    val_queries: int
    val_images: int
    skipped_val_pairs: int


@dataclass(frozen=True)
class RunFacts:
    """What a run knows before its first step, all a report needs besides the :class:`TrainState`."""

    out: Path
    base: str
    epochs: int
    counts: DataCounts
    schedule: Schedule
    chance: dict[str, float] | None
    started: float


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
        """The JSON-able report (``out`` as a string)."""
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


def build_report(
    facts: RunFacts, state: TrainState, *, finished: bool, after: dict[str, float] | None, train_seconds: float
) -> FinetuneReport:
    """The report of a run that stands at ``state`` (``after``: final metrics, None when unfinished)."""
    return FinetuneReport(
        out=facts.out,
        base=facts.base,
        pairs=facts.counts.pairs,
        skipped_pairs=facts.counts.skipped_pairs,
        val_queries=facts.counts.val_queries,
        val_images=facts.counts.val_images,
        skipped_val_pairs=facts.counts.skipped_val_pairs,
        epochs=facts.epochs,
        steps=state.step,
        total_steps=facts.schedule.total_steps,
        steps_per_epoch=facts.schedule.steps_per_epoch,
        effective_batch_size=facts.schedule.per_step,
        resumed_from_step=state.resumed_from,
        finished=finished,
        before=state.before,
        after=after,
        chance=facts.chance,
        history=tuple(state.history),
        loss_history=tuple(state.losses),
        seconds=time.perf_counter() - facts.started,
        train_seconds=train_seconds,
    )


def metrics_text(m: Mapping[str, float] | None) -> str:
    """``MRR 0.1234  R@1 0.0500 ...`` (``-`` without metrics)."""
    if not m:
        return "-"
    return "  ".join(f"{k.replace('recall@', 'R@').replace('mrr', 'MRR')} {v:.4f}" for k, v in m.items())


def row_text(row: Mapping[str, Any]) -> str:
    """One line of the progress table (columns as in :data:`TABLE_HEADER`)."""
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


__all__ = ["TABLE_HEADER", "DataCounts", "FinetuneReport", "RunFacts", "build_report", "metrics_text", "row_text"]
