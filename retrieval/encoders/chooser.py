"""How a tower runs: which runtime runs the image or the text tower in each mode, chosen in one place.

:data:`CANDIDATES` is the table (tower, mode, runtime, device, the CPU levels where a row is
tried, in the order tried); the tower's :data:`REFERENCE` runs what no row runs or every row
fails. :func:`agreement` is the one check of a candidate against the reference (cosines and
batch independence), :func:`requested_runtime` what the user asked for. The towers walk the
table in :mod:`.image_choice` and :mod:`.text_choice`, remember what passed in :mod:`.memo`,
record it with :func:`runtime_record` and log under this module's name. What each setting does,
and the measurements behind the rows: docs/performance.md.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ..errors import InvalidArgumentError
from . import cpu

# The log of every choice: the image and text choices (.image_choice, .text_choice) log here too.
LOG = logging.getLogger(__name__)

TowerKind = Literal["image", "text"]

# A runtime's exact (fp32) tower must agree this closely with the reference, vector by vector.
PARITY_MIN_COSINE = 0.99999
# A reduced tower must agree this closely with torch's tower in the same mode (both approximate fp32).
REDUCED_PARITY_MIN_COSINE = 0.999


@dataclass(frozen=True)
class Candidate:
    """One row of :data:`CANDIDATES`: ``runtime`` may run ``tower``'s ``mode`` on ``device``, on
    the CPU ``levels`` (after the caps; None: every level). A runtime other than the tower's
    reference (and torch's text tower) runs it only where its vectors pass :func:`agreement` at
    ``min_cosine``; a reduced mode is kept only where it passes :mod:`.precision`'s gate."""

    tower: TowerKind
    mode: str
    runtime: str
    levels: tuple[str, ...] | None = None
    min_cosine: float = PARITY_MIN_COSINE
    device: Literal["cpu", "cuda"] = "cpu"


def from_level(level: str) -> tuple[str, ...]:
    """``level`` and every level above it (:data:`.cpu.LEVELS`)."""
    return cpu.LEVELS[cpu.rank(level) :]


# In the order tried. On CUDA, torch's autocast: the tensor cores' fp16, then bf16. On the CPU
# (docs/performance.md, benchmarks/README.md): bf16 only on OpenVINO with AMX (the bf16 inference
# hint; torch's bf16 image vectors move with the batch, and with AVX-512 BF16 alone oneDNN's bf16
# products ran slower than fp32), except torch's text tower; int8 on OpenVINO with AVX-512 VNNI
# (NNCF int8 weights, activations quantised per row), on torch's kernels from AVX2 up (7-bit
# activations below VNNI); none below AVX2. ONNX Runtime quantises a whole batch with one
# scale, so it runs the exact (fp32) towers only.
CANDIDATES: tuple[Candidate, ...] = (
    Candidate("image", "fp16", "torch", device="cuda"),
    Candidate("image", "bf16", "torch", device="cuda"),
    Candidate("text", "fp16", "torch", device="cuda"),
    Candidate("text", "bf16", "torch", device="cuda"),
    Candidate("image", "bf16", "openvino", ("amx",), REDUCED_PARITY_MIN_COSINE),
    Candidate("image", "int8", "openvino", ("avx512_vnni",), REDUCED_PARITY_MIN_COSINE),
    Candidate("image", "int8", "torch", from_level("avx2")),
    Candidate("image", "fp32", "openvino"),
    Candidate("image", "fp32", "onnxruntime"),
    Candidate("text", "bf16", "torch", ("amx",)),
    Candidate("text", "int8", "numpy", from_level("avx2")),
    Candidate("text", "int8", "torch", from_level("avx2")),
    Candidate("text", "fp32", "onnxruntime"),
)
# Why a runtime has no row for a mode that auto gates on that device (what auto says when it passes it over).
NO_ROW: dict[tuple[TowerKind, str, str, str], str] = {
    # oneDNN's AMX kernels are picked by the batch size, so an update would not equal a rebuild.
    ("image", "bf16", "torch", "cpu"): "torch's bf16 image tower on the CPU gives vectors that move with the batch",
}
# What runs a tower where no row does.
REFERENCE: dict[TowerKind, str] = {"image": "torch", "text": "numpy"}
# The user's setting of the runtime asked for, per tower (docs/performance.md).
SETTINGS: dict[TowerKind, str] = {"image": "CLIPSEARCH_IMAGE_RUNTIME", "text": "CLIPSEARCH_TEXT_RUNTIME"}
RUNTIME_ENV = SETTINGS["image"]
TEXT_RUNTIME_ENV = SETTINGS["text"]
# What may be asked for beside the rows' runtimes and the reference: texts on the backend's torch tower.
ALSO: dict[TowerKind, tuple[str, ...]] = {"image": (), "text": ("torch",)}
# The older setting of CLIPSEARCH_TEXT_RUNTIME=torch, still read (with a warning).
TEXT_PATH_ENV = "CLIPSEARCH_TEXT_PATH"
# What an index records of the image tower's choice (runtime_record("image_", ...)).
RUNTIME_KEYS: tuple[str, ...] = ("image_runtime", "image_runtime_version", "image_runtime_parity", "image_runtime_note")


def runtime_record(
    prefix: str, name: str, version: str | None = None, parity: Mapping[str, float] | None = None, note: str | None = None,
) -> dict[str, Any]:
    """What an index (``image_``) or the text tower's ``info`` (no prefix) records of a choice:
    ``{prefix}runtime`` and, where there are, its ``_version``, ``_parity`` (the check's
    figures) and ``_note`` (why the runtimes before it were passed over)."""
    data: dict[str, Any] = {f"{prefix}runtime": name}
    for key, value in (("version", version), ("parity", dict(parity or {})), ("note", note)):
        if value:
            data[f"{prefix}runtime_{key}"] = value
    return data


def _checked(row: Candidate) -> bool:
    """Whether ``row``'s runtime must pass :func:`agreement` (not the reference, nor torch's text tower)."""
    return row.runtime != REFERENCE[row.tower] and row.runtime not in ALSO[row.tower]


def _applies(row: Candidate) -> bool:
    return row.levels is None or cpu.cpu_level() in row.levels


def _device(device_type: str) -> str:
    return "cuda" if device_type == "cuda" else "cpu"


def _here(tower: TowerKind, device_type: str, runtime: str | None = None) -> Iterator[Candidate]:
    """The rows of ``tower`` (of ``runtime``'s only, where given) on ``device_type`` (``cuda``;
    anything else is the CPU) that apply at this CPU's level (CUDA rows name no level)."""
    device = _device(device_type)
    return (c for c in CANDIDATES
            if c.tower == tower and c.device == device and (runtime is None or c.runtime == runtime) and _applies(c))


def candidates(tower: TowerKind, mode: str | None) -> tuple[Candidate, ...]:
    """The rows of ``tower`` in ``mode`` whose runtime must pass the check, in the order tried (on every level)."""
    return tuple(c for c in CANDIDATES if c.tower == tower and c.mode == mode and _checked(c))


def runtime_modes(tower: TowerKind) -> tuple[str, ...]:
    """The modes some runtime other than the reference may run."""
    return tuple(dict.fromkeys(c.mode for c in CANDIDATES if c.tower == tower and _checked(c)))


def choices(tower: TowerKind) -> tuple[str, ...]:
    """What may be asked for: ``auto``, the reference, or a runtime of some row."""
    checked = (c.runtime for c in CANDIDATES if c.tower == tower and _checked(c))
    return ("auto", REFERENCE[tower], *dict.fromkeys(checked), *ALSO[tower])


def tried_here(mode: str) -> bool:
    """Whether ``auto`` tries a runtime for ``mode``'s image tower on this CPU (after the caps)."""
    return any(_applies(c) for c in candidates("image", mode))


def refusal(tower: TowerKind, mode: str, runtime: str, device_type: str) -> str | None:
    """Why ``runtime`` may not run ``tower``'s ``mode`` on ``device_type`` here (None: it may: the
    reference in fp32, or a row that applies)."""
    if (mode == "fp32" and runtime == REFERENCE[tower]) or any(c.mode == mode for c in _here(tower, device_type, runtime)):
        return None
    return NO_ROW.get((tower, mode, runtime, _device(device_type)), f"no row runs the {mode} {tower} tower on {runtime} here")


def auto_modes(tower: TowerKind, device_type: str, runtime: str | None = None) -> tuple[str, ...]:
    """The reduced modes ``auto`` gates for ``tower`` on ``device_type`` at this CPU's level,
    fastest first: those of the rows that apply (of ``runtime``'s rows only, where given)."""
    return tuple(dict.fromkeys(c.mode for c in _here(tower, device_type, runtime) if c.mode != "fp32"))


def requested_runtime(tower: TowerKind, requested: str | None = None) -> str:
    """The runtime asked for ``tower``: ``requested`` when given, else the user's setting
    (``auto`` when unset).

    Raises:
        InvalidArgumentError: an unknown value.
    """
    setting = SETTINGS[tower]
    value = (requested if requested is not None else os.environ.get(setting, "")).strip().lower() or "auto"
    if tower == "text" and requested is None and value == "auto" and os.environ.get(TEXT_PATH_ENV, "").strip().lower() == "torch":
        warnings.warn(f"{TEXT_PATH_ENV}=torch is deprecated; set {TEXT_RUNTIME_ENV}=torch instead", FutureWarning, stacklevel=2)
        return "torch"
    known = choices(tower)
    if value not in known:
        what = "a runtime" if tower == "image" else "a text runtime"
        raise InvalidArgumentError(f"{setting}={value!r} is not {what}; use one of {', '.join(known)}")
    return value


@dataclass(frozen=True)
class Agreement:
    """What :func:`agreement` found: the figures, and why the candidate fails (None: it passes)."""

    figures: dict[str, float]
    failure: str | None = None


def agreement(
    label: str, what: str, against: str, reference: np.ndarray, candidate: np.ndarray, min_cosine: float,
    drift: Callable[[], float] = lambda: 0.0,
) -> Agreement:
    """The one check of a candidate tower: each of its normalised vectors of a sample has cosine
    at least ``min_cosine`` to the reference's (``against``), and ``drift()`` (the largest change
    of a vector when its input runs in another batch) is 0.

    ``label`` and ``what`` name the candidate in the failure (``OpenVINO``, ``fp32 vectors``).
    """
    cos = np.sum(reference.astype(np.float64) * candidate.astype(np.float64), axis=1)
    figures = {"mean_cosine": round(float(cos.mean()), 7), "min_cosine": round(float(cos.min()), 7)}
    if not float(cos.min()) >= min_cosine:  # also catches NaN
        return Agreement(figures, f"{label}'s {what} differ from {against}'s (min cosine {cos.min():.7f} < {min_cosine})")
    moved = drift()
    if moved:
        return Agreement(
            figures,
            f"{label}'s {what} change with the batch on this CPU (by up to {moved:.1e}), so an update would not equal a rebuild",
        )
    return Agreement(figures)


__all__ = [
    "CANDIDATES",
    "LOG",
    "NO_ROW",
    "PARITY_MIN_COSINE",
    "REDUCED_PARITY_MIN_COSINE",
    "REFERENCE",
    "RUNTIME_ENV",
    "RUNTIME_KEYS",
    "SETTINGS",
    "TEXT_PATH_ENV",
    "TEXT_RUNTIME_ENV",
    "Agreement",
    "Candidate",
    "agreement",
    "auto_modes",
    "candidates",
    "choices",
    "from_level",
    "refusal",
    "requested_runtime",
    "runtime_record",
    "runtime_modes",
    "tried_here",
]
