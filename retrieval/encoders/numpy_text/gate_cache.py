"""``auto``'s text precision, remembered per model and CPU, so that a cold start does not gate again.

The quality gate of ``precision="auto"`` embeds the probe texts in fp32 and in int8 and compares
them (and times them, see :func:`~.encoder.keep_if_faster`); its outcome depends only on the
weights and on the products this CPU runs. A one-shot ``clipsearch search`` would otherwise pay
for it on every run. The outcome (mode, gate figures, note) is kept in one small JSON file in the
user's cache directory, keyed by the weights' fingerprint and the CPU's int8 capabilities after
the caps (:func:`gate_key`). The file is written atomically; failures to read or write it are
ignored (the gate then simply runs).

Location: ``$CLIPSEARCH_GATE_CACHE`` (a file path; ``off`` disables the cache), else
``$XDG_CACHE_HOME/clipsearch/text-precision.json``, else ``~/.cache/clipsearch/text-precision.json``.
Never inside an index directory: readers do not write there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import cpu
from ..memo import JsonMemo, memo_file, user_cache
from ..precision import GATE_K, GATE_MEAN_COSINE, GATE_MIN_COSINE, GATE_TOPK_OVERLAP, GateResult, gate_results_from_info

GATE_CACHE_ENV = "CLIPSEARCH_GATE_CACHE"
# Bumped when what is gated changes (probe texts, thresholds' meaning, the int8 products).
_VERSION = 1
# Entries kept: one per model and CPU setting a user has queried with.
_MAX_ENTRIES = 64


@dataclass(frozen=True)
class GateOutcome:
    """What ``auto`` chose for one model on one CPU setting.

    Attributes:
        mode: ``int8`` or ``fp32``.
        gate: the gate's figures.
        note: why int8 was not kept although it passed (it ran no faster), or None.
    """

    mode: str
    gate: tuple[GateResult, ...]
    note: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "gate": [g.to_dict() for g in self.gate], "note": self.note}


def cache_file() -> Path | None:
    """Where outcomes are kept (None: the cache is off)."""
    return memo_file(GATE_CACHE_ENV, user_cache() / "text-precision.json")


def gate_key(fingerprint: str) -> str:
    """The key of an outcome: the weights, the CPU level and fbgemm's setting after the caps, the
    gate's thresholds (what makes the int8 products and the verdict differ)."""
    fbgemm = os.environ.get(cpu.FBGEMM_ENV, "").strip().upper() or "-"
    thresholds = f"{GATE_MEAN_COSINE}/{GATE_MIN_COSINE}/{GATE_TOPK_OVERLAP}/{GATE_K}"
    return f"v{_VERSION}|{fingerprint}|{cpu.cpu_level()}|fbgemm={fbgemm}|{thresholds}"


_MEMO = JsonMemo(lambda: cache_file(), _MAX_ENTRIES)


def lookup(key: str) -> GateOutcome | None:
    """The outcome recorded under ``key``, or None (no cache, no entry, or an unreadable one)."""
    entry = _MEMO.get(key)
    if entry is None or entry.get("mode") not in ("int8", "fp32"):
        return None
    note = entry.get("note")
    return GateOutcome(str(entry["mode"]), tuple(gate_results_from_info(entry.get("gate"))), note if isinstance(note, str) else None)


def record(key: str, outcome: GateOutcome) -> None:
    """Keep ``outcome`` under ``key`` (atomically; any failure is ignored: the gate runs next time)."""
    _MEMO.put(key, outcome.to_dict())


__all__ = ["GATE_CACHE_ENV", "GateOutcome", "cache_file", "gate_key", "lookup", "record"]
