"""The checks an image tower's runtime passed, remembered, so that a query process need not
load torch's tower to run them again.

Before OpenVINO or ONNX Runtime runs an image tower (:mod:`.image`), its vectors are checked
against torch's and across batches on the first images. What passed depends on the tower's
file, the runtime and its version and the CPU, all in the key (:func:`check_key`). With the
figures the entry keeps the tower's vector of a fixed probe input (:func:`probe_pixels`): a
process that reopens the tower from the entry (:mod:`retrieval.encoders.recorded_tower`) runs
the probe and uses the tower only where the vector is the same bit for bit, so a changed kernel,
another thread count that changes the sums, a stale compiled-model cache or an edited entry
sends it back to the full checks.

Location: ``$CLIPSEARCH_RUNTIME_CHECKS`` (a file path; ``off`` disables it), else
``checks.json`` in the export cache (:func:`.export.cache_dir`), beside the files it speaks of.
Never inside an index directory: readers do not write there.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import cpu
from ..memo import JsonMemo, memo_file
from .export import cache_dir

CHECKS_ENV = "CLIPSEARCH_RUNTIME_CHECKS"
# Bumped when what is checked, or the probe, changes.
_VERSION = 1


def checks_file() -> Path | None:
    """Where passed checks are kept (None: not kept)."""
    return memo_file(CHECKS_ENV, cache_dir() / "checks.json")


_MEMO = JsonMemo(checks_file)


def _cpu_identity() -> str:
    """The CPU's model name and flags, hashed: kernels are picked from them, caps or not."""
    name = ""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                name = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    raw = f"{name}|{' '.join(sorted(cpu.cpu_flags()))}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def check_key(runtime: str, version: str, mode: str, tower_file: Path) -> str:
    """The key of one passed check: the runtime and its version, the mode, the tower's file
    (its name holds the weights' fingerprint, the input size and what made it) and the CPU (its
    level after the caps, and its identity). Not the thread count: a build and a query may run
    on different counts, and the probe vector, which a reopened tower must reproduce bit for
    bit, tells whether the count changes the vectors."""
    return f"v{_VERSION}|{runtime}={version}|{mode}|{tower_file.name}|level={cpu.cpu_level()}|cpu={_cpu_identity()}"


def probe_pixels(image_size: int) -> np.ndarray:
    """The fixed probe input: one image of normalised pixels, the same in every process."""
    rng = np.random.default_rng(20261205)
    return rng.standard_normal((1, 3, image_size, image_size)).astype(np.float32)


@dataclass(frozen=True)
class PassedChecks:
    """A remembered pass: the figures of the checks and the tower's probe vector.

    Attributes:
        parity: what the index records as ``image_runtime_parity``.
        probe: the tower's normalised vector of :func:`probe_pixels`.
        int8_group: the int8 tower's activation group (0 for fp32).
    """

    parity: dict[str, float]
    probe: np.ndarray
    int8_group: int = 0

    def to_dict(self) -> dict[str, Any]:
        # float32 -> Python float -> JSON round-trips exactly.
        return {"parity": self.parity, "probe": [float(v) for v in self.probe], "int8_group": self.int8_group}


def lookup(key: str) -> PassedChecks | None:
    """The pass remembered under ``key``, or None (none, off, or an unreadable entry)."""
    entry = _MEMO.get(key)
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


def record(key: str, passed: PassedChecks) -> None:
    """Remember ``passed`` under ``key`` (atomically; a failure is ignored: the checks run next time)."""
    _MEMO.put(key, passed.to_dict())


__all__ = ["CHECKS_ENV", "PassedChecks", "check_key", "checks_file", "lookup", "probe_pixels", "record"]
