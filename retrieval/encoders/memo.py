"""What a process learnt about how a tower runs, remembered for the next (docs/performance.md):
one small JSON memo type (:class:`JsonMemo`) in the user's cache, and its two books.

- **passed checks** of an image tower's runtime (:func:`lookup_check`, :func:`record_check`),
  with the tower's vector of a fixed probe input: a query process reopens the tower
  (:mod:`.recorded_tower`) only where the probe gives that vector bit for bit.
- **auto's text precision** (:func:`lookup_gate`, :func:`record_gate`): the quality gate's
  outcome for the numpy text tower.

Derived data, never inside an index directory: written atomically, bounded, and any failure to
read or write is ignored, so the work they save simply runs again.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..layout.durable import atomic_write
from . import cpu
from .base import user_cache
from .precision import GATE_K, GATE_MEAN_COSINE, GATE_MIN_COSINE, GATE_TOPK_OVERLAP, GateResult, gate_results_from_info
from .runtime.export import cache_dir

CHECKS_ENV = "CLIPSEARCH_RUNTIME_CHECKS"
GATE_CACHE_ENV = "CLIPSEARCH_GATE_CACHE"
# Bumped when what is checked or gated (the probe, the thresholds' meaning, the products) changes.
_CHECKS_VERSION = 1
_GATE_VERSION = 1


class JsonMemo:
    """Entries (JSON objects) under string keys in one file: the one ``$env`` names (``off``:
    none; read on every call, as the environment may change), else ``default()``. The oldest
    written go first beyond ``max_entries``."""

    def __init__(self, env: str, default: Callable[[], Path], max_entries: int = 64) -> None:
        self.env, self.default, self.max_entries = env, default, max_entries

    def file(self) -> Path | None:
        """Where the entries are kept (None: not kept)."""
        explicit = os.environ.get(self.env, "").strip()
        if explicit.lower() == "off":
            return None
        return Path(explicit).expanduser() if explicit else self.default()

    def _read(self, path: Path) -> dict[str, Any]:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str) -> dict[str, Any] | None:
        """The entry under ``key``, or None (off, no file, no entry, or not an object)."""
        path = self.file()
        if path is None:
            return None
        entry = self._read(path).get(key)
        return entry if isinstance(entry, dict) else None

    def put(self, key: str, entry: dict[str, Any]) -> None:
        """Keep ``entry`` under ``key``, atomically; a failure is ignored (the work runs next time)."""
        path = self.file()
        if path is None:
            return
        try:
            data = self._read(path)
            data.pop(key, None)
            data[key] = entry
            while len(data) > self.max_entries:
                data.pop(next(iter(data)))
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, lambda f: f.write(json.dumps(data, indent=1).encode()))
        except OSError:
            return


_CHECKS = JsonMemo(CHECKS_ENV, lambda: cache_dir() / "checks.json")
_GATES = JsonMemo(GATE_CACHE_ENV, lambda: user_cache() / "text-precision.json")
# Where passed checks and auto's text precision outcomes are kept (None: not kept).
checks_file, gate_file = _CHECKS.file, _GATES.file


# -- passed checks of a runtime's image tower --------------------------------------------------


def _cpu_identity() -> str:
    """The CPU's model name and flags, hashed: kernels are picked from them, caps or not."""
    raw = f"{cpu.cpuinfo('model name')}|{' '.join(sorted(cpu.cpu_flags()))}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def check_key(runtime: str, version: str, mode: str, tower_file: Path) -> str:
    """The key of one passed check: the runtime and its version, the mode, the tower's file
    (its name holds the weights' fingerprint, the input size and what made it) and the CPU (its
    level after the caps, and its identity). Not the thread count: a build and a query may run
    on different counts, and the probe vector, which a reopened tower must reproduce bit for
    bit, tells whether the count changes the vectors."""
    return f"v{_CHECKS_VERSION}|{runtime}={version}|{mode}|{tower_file.name}|level={cpu.cpu_level()}|cpu={_cpu_identity()}"


def probe_pixels(image_size: int) -> np.ndarray:
    """The fixed probe input: one image of normalised pixels, the same in every process."""
    rng = np.random.default_rng(20261205)
    return rng.standard_normal((1, 3, image_size, image_size)).astype(np.float32)


@dataclass(frozen=True)
class PassedChecks:
    """A remembered pass: the checks' figures (the index's ``image_runtime_parity``), the
    tower's vector of :func:`probe_pixels`, and an int8 tower's activation group (else 0)."""

    parity: dict[str, float]
    probe: np.ndarray
    int8_group: int = 0


def lookup_check(key: str) -> PassedChecks | None:
    """The pass remembered under ``key``, or None (none, off, or an unreadable entry)."""
    entry = _CHECKS.get(key)
    if entry is None:
        return None
    try:
        parity = {str(k): float(v) for k, v in dict(entry["parity"]).items()}
        probe = np.asarray(entry["probe"], dtype=np.float64).astype(np.float32)
        group = int(entry.get("int8_group", 0))
    except (KeyError, TypeError, ValueError):
        return None
    if probe.ndim != 1 or not probe.size:
        return None
    return PassedChecks(parity, probe, group)


def record_check(key: str, passed: PassedChecks) -> None:
    """Remember ``passed`` under ``key`` (atomically; a failure is ignored: the checks run next time)."""
    # float32 -> Python float -> JSON round-trips exactly.
    _CHECKS.put(key, {"parity": passed.parity, "probe": [float(v) for v in passed.probe], "int8_group": passed.int8_group})


# -- auto's text precision ---------------------------------------------------------------------


@dataclass(frozen=True)
class GateOutcome:
    """What ``auto`` chose for one text tower on one CPU setting (``int8`` or ``fp32``), the
    gate's figures, and why int8 was not kept although it passed (``note``)."""

    mode: str
    gate: tuple[GateResult, ...]
    note: str | None


def gate_key(fingerprint: str) -> str:
    """The key of an outcome: the weights, the CPU level and fbgemm's setting after the caps, the
    gate's thresholds (what makes the int8 products and the verdict differ)."""
    fbgemm = os.environ.get(cpu.FBGEMM_ENV, "").strip().upper() or "-"
    thresholds = f"{GATE_MEAN_COSINE}/{GATE_MIN_COSINE}/{GATE_TOPK_OVERLAP}/{GATE_K}"
    return f"v{_GATE_VERSION}|{fingerprint}|{cpu.cpu_level()}|fbgemm={fbgemm}|{thresholds}"


def lookup_gate(key: str) -> GateOutcome | None:
    """The outcome recorded under ``key``, or None (off, no entry, or an unreadable one)."""
    entry = _GATES.get(key)
    if entry is None or entry.get("mode") not in ("int8", "fp32"):
        return None
    note = entry.get("note")
    return GateOutcome(str(entry["mode"]), tuple(gate_results_from_info(entry.get("gate"))), note if isinstance(note, str) else None)


def record_gate(key: str, outcome: GateOutcome) -> None:
    """Keep ``outcome`` under ``key`` (atomically; any failure is ignored: the gate runs next time)."""
    _GATES.put(key, {"mode": outcome.mode, "gate": [g.to_dict() for g in outcome.gate], "note": outcome.note})


__all__ = [
    "CHECKS_ENV",
    "GATE_CACHE_ENV",
    "GateOutcome",
    "JsonMemo",
    "PassedChecks",
    "check_key",
    "checks_file",
    "gate_file",
    "gate_key",
    "lookup_check",
    "lookup_gate",
    "probe_pixels",
    "record_check",
    "record_gate",
]
