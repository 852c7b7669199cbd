"""Reduced-precision modes of the towers (``--precision``; what each does: docs/performance.md,
"Precision modes"), and the quality gate that guards ``auto``.

``auto`` runs the fastest candidate (:func:`retrieval.encoders.chooser.auto_modes`) whose
vectors of a calibration sample pass :func:`gate` against fp32's (:func:`choose`), else fp32.
:mod:`.int8` imports torch, so it is imported inside the functions that make an int8 tower.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, Literal, get_args

import numpy as np

from ..errors import InvalidArgumentError
from ..images import DEFAULT_MAX_PIXELS, PreprocessConfig, load_pixels
from .chooser import TowerKind, auto_modes, refusal

if TYPE_CHECKING:
    import torch


# What a caller may ask for: a concrete mode, or ``auto`` (resolved by the gate on first use).
Precision = Literal["fp32", "bf16", "fp16", "int8", "auto"]
# What vectors are actually made in (and what an index records as ``precision``).
Mode = Literal["fp32", "bf16", "fp16", "int8"]

PRECISIONS: tuple[Precision, ...] = get_args(Precision)
MODES: tuple[Mode, ...] = get_args(Mode)

GATE_MEAN_COSINE = 0.999
GATE_MIN_COSINE = 0.99
GATE_TOPK_OVERLAP = 0.9
GATE_K = 10

# Images of the first batch an ``auto`` encoder embeds that calibrate its mode.
CALIBRATION_IMAGES = 16

# Captions whose embeddings calibrate ``auto`` for the text tower (varied lengths and topics).
PROBE_TEXTS: tuple[str, ...] = (
    "a dog on a beach", "a black cat sleeping on a sofa", "a red race car", "an airplane in the sky",
    "a bowl of fruit", "a banana", "a snowy mountain at sunrise", "two children playing football",
    "a plate of spaghetti with tomato sauce", "a city street at night with neon signs",
    "a close-up photo of a flower", "an old man reading a newspaper in a park",
    "a birthday cake with candles", "a sailing boat on a lake", "a horse in a field",
    "a laptop on a wooden desk", "a bicycle leaning against a wall", "a bird on a branch",
    "fireworks over a river", "a cup of coffee", "a train crossing a bridge", "a cartoon of a robot",
    "a forest path in autumn", "people waiting at a bus stop",
)


def parse_precision(value: object) -> Precision:
    """``value`` as a :data:`Precision`, for the public entry points (CLI handlers, loaders,
    ``BuildConfig``, ``ImageIndex.open``) and for modes read from a manifest; code behind them
    takes the typed value and does not check again.

    Raises:
        InvalidArgumentError: anything else (the message lists the modes).
    """
    for known in PRECISIONS:
        if isinstance(value, str) and value == known:
            return known
    raise InvalidArgumentError(f"unknown precision {value!r}; use one of {', '.join(PRECISIONS)}")


def parse_mode(value: object) -> Mode:
    """``value`` as a concrete :data:`Mode` (e.g. the mode an index recorded).

    Raises:
        InvalidArgumentError: an unknown precision, or ``auto``.
    """
    precision = parse_precision(value)
    if precision == "auto":
        raise InvalidArgumentError("set a concrete precision, not auto")
    return precision


def check_device_support(precision: Precision, device: torch.device) -> None:
    """Refuse a mode the device cannot run.

    Raises:
        InvalidArgumentError: ``int8`` on CUDA (dynamic quantisation is CPU-only).
    """
    if precision == "int8" and device.type != "cpu":
        raise InvalidArgumentError("precision int8 runs on the CPU only; on CUDA use bf16, fp16 or auto")


def auto_candidates(device: torch.device, tower: TowerKind = "image") -> tuple[Mode, ...]:
    """Reduced modes ``auto`` tries for torch's ``tower`` on ``device``, fastest first: the
    image tower's whatever runtime runs them, the text tower's on torch
    (:func:`~retrieval.encoders.chooser.auto_modes`)."""
    return tuple(parse_mode(m) for m in auto_modes(tower, device.type, None if tower == "image" else "torch"))


@dataclass(frozen=True)
class GateResult:
    """How one reduced mode compares with fp32 on a calibration sample."""

    mode: str  # a Mode, or whatever a manifest recorded (gate_results_from_info keeps it as read)
    samples: int
    mean_cosine: float
    min_cosine: float
    topk_overlap: float
    k: int
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return (
            self.mean_cosine >= GATE_MEAN_COSINE
            and self.min_cosine >= GATE_MIN_COSINE
            and self.topk_overlap >= GATE_TOPK_OVERLAP
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "samples": self.samples,
            "mean_cosine": round(self.mean_cosine, 6),
            "min_cosine": round(self.min_cosine, 6),
            "topk_overlap": round(self.topk_overlap, 4),
            "k": self.k,
            "seconds": round(self.seconds, 3),
            "passed": self.passed,
        }


def topk_overlap(reference: np.ndarray, candidate: np.ndarray, k: int = GATE_K) -> tuple[float, int]:
    """Mean overlap of each row's top-k neighbours (itself excluded), fp32 vs candidate.

    Each row of ``reference`` is a query; the database is ``reference`` itself for the fp32
    ranking and ``candidate`` for the reduced one. Returns ``(overlap, k used)``; ``k`` shrinks
    to ``n - 1`` for small samples, and a sample of one row has overlap 1.0 with k = 0.
    """
    n = len(reference)
    k = min(k, n - 1)
    if k < 1:
        return 1.0, 0
    ref_scores = reference @ reference.T
    cand_scores = reference @ candidate.T
    np.fill_diagonal(ref_scores, -np.inf)
    np.fill_diagonal(cand_scores, -np.inf)
    ref_top = np.argsort(-ref_scores, axis=1, kind="stable")[:, :k]
    cand_top = np.argsort(-cand_scores, axis=1, kind="stable")[:, :k]
    hits = [len(set(a.tolist()) & set(b.tolist())) for a, b in zip(ref_top, cand_top, strict=True)]
    return float(np.mean(hits) / k), k


def gate(mode: str, reference: np.ndarray, candidate: np.ndarray, seconds: float = 0.0) -> GateResult:
    """Compare a reduced mode's L2-normalised vectors with fp32's (same rows, same order)."""
    if reference.shape != candidate.shape or len(reference) == 0:
        raise ValueError(f"gate needs equal, non-empty shapes, got {reference.shape} and {candidate.shape}")
    cos = np.sum(reference.astype(np.float64) * candidate.astype(np.float64), axis=1)
    overlap, k = topk_overlap(reference, candidate)
    return GateResult(mode, len(reference), float(cos.mean()), float(cos.min()), overlap, k, seconds)


def choose(
    embed: Callable[[Mode], np.ndarray], candidates: Sequence[Mode],
    passes_over: Callable[[Mode], str | None] | None = None,
) -> tuple[Mode, list[GateResult]]:
    """Pick the first candidate whose vectors pass the gate against fp32's; fp32 if none does.

    Args:
        embed: ``mode -> normalised vectors`` of the same calibration sample.
        candidates: reduced modes, fastest first.
        passes_over: ``mode -> why it is not to be used here`` (None: it may be), asked just
            before a candidate is embedded (after fp32's reference): a candidate with a reason
            is not gated.

    Returns:
        The chosen mode and the gate figures of every candidate gated, in the order tried.
    """
    import time

    if not candidates:  # nothing to compare: do not embed the sample in fp32 for nothing
        return "fp32", []
    reference = embed("fp32")
    results: list[GateResult] = []
    for mode in candidates:
        if passes_over is not None and passes_over(mode) is not None:
            continue
        t0 = time.perf_counter()
        vectors = embed(mode)
        result = gate(mode, reference, vectors, time.perf_counter() - t0)
        results.append(result)
        if result.passed:
            return mode, results
    return "fp32", results


def precision_record(
    requested: str, mode: str | None, gate_results: Sequence[GateResult] = (), passed_over: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """JSON-able record of a tower's precision: requested and chosen mode, the gate figures
    (with the thresholds) when a gate ran, and the candidates it passed over, with why."""
    data: dict[str, Any] = {"requested": requested, "mode": mode}
    if passed_over:
        data["passed_over"] = dict(passed_over)
    if gate_results:
        data["gate"] = [r.to_dict() for r in gate_results]
        data["thresholds"] = {
            "mean_cosine": GATE_MEAN_COSINE,
            "min_cosine": GATE_MIN_COSINE,
            "topk_overlap": GATE_TOPK_OVERLAP,
            "k": GATE_K,
        }
    return data


@contextlib.contextmanager
def autocast(mode: Mode, device: torch.device) -> Iterator[None]:
    """``torch.autocast`` for bf16/fp16, nothing for fp32 and int8."""
    import torch

    if mode in ("bf16", "fp16"):
        dtype = torch.bfloat16 if mode == "bf16" else torch.float16
        with torch.autocast(device_type=device.type, dtype=dtype):
            yield
    else:
        yield


class TowerPrecision:
    """One tower's requested precision, its resolved mode, and its int8 copy when needed.

    ``variants`` may be shared between towers that live in one module (open_clip), so that one
    int8 copy serves both.
    """

    requested: Precision
    mode: Mode | None  # None until auto is resolved
    gate_results: list[GateResult]
    passed_over: dict[str, str]  # candidates auto did not gate, with why (e.g. torch's bf16 on the CPU)

    def __init__(
        self, requested: Precision, device: torch.device, variants: dict[str, Any] | None = None, tower: TowerKind = "image",
    ) -> None:
        self.device = device
        self.tower: TowerKind = tower
        self.variants = variants if variants is not None else {}
        self.request(requested)

    def request(self, requested: Precision) -> None:
        """Ask for another mode (``auto`` calibrates again on next use).

        Raises:
            InvalidArgumentError: a mode the device cannot run.
        """
        check_device_support(requested, self.device)
        self.requested = requested
        self.mode = None if requested == "auto" else requested
        self.gate_results, self.passed_over = [], {}

    def set(self, mode: Mode, gate_results: Sequence[GateResult] = ()) -> None:
        """Fix the mode (e.g. the one an index recorded, through :func:`parse_mode`) without calibrating.

        Raises:
            InvalidArgumentError: a mode the device cannot run.
        """
        check_device_support(mode, self.device)
        self.mode = mode
        self.gate_results, self.passed_over = list(gate_results), {}

    def module(self, fp32_module: Any, mode: Mode) -> Any:
        if mode != "int8":
            return fp32_module
        if "int8" not in self.variants:
            from .int8 import quantize_int8

            self.variants["int8"] = quantize_int8(fp32_module)
        return self.variants["int8"]

    def calibrate(self, embed: Callable[[Mode], np.ndarray], passes_over: Callable[[Mode], str | None] | None = None) -> Mode:
        """Resolve ``auto`` by running the gate (no-op once resolved); ``passes_over`` as
        :func:`choose`'s, its reasons kept in :attr:`passed_over`."""
        if self.mode is None:
            self.passed_over = {}

            def why_not(mode: Mode) -> str | None:
                reason = passes_over(mode) if passes_over is not None else None
                if reason is not None:
                    self.passed_over[mode] = reason
                return reason

            self.mode, self.gate_results = choose(embed, auto_candidates(self.device, self.tower), why_not)
        return self.mode

    def info(self) -> dict[str, Any]:
        """JSON-able record: requested and chosen mode, and the gate figures when ``auto`` ran."""
        return precision_record(self.requested, self.mode, self.gate_results, self.passed_over)

    def manifest_info(self) -> dict[str, Any]:
        """What an index records in ``model_info``: ``precision`` (the mode its vectors were
        made with), ``precision_requested``, when ``auto`` calibrated ``precision_gate``, and for
        int8 ``int8_activation_bits``."""
        data: dict[str, Any] = {"precision": self.mode or self.requested, "precision_requested": self.requested}
        if self.gate_results or self.passed_over:
            data["precision_gate"] = self.info()
        if data["precision"] == "int8":
            data["int8_activation_bits"] = self.int8_activation_bits()
        return data

    def int8_activation_bits(self) -> int:
        """8 or 7: the activation codes of the int8 copy (or of this CPU's kernel, before one
        exists); 7 on CPUs without int8 dot products (:mod:`retrieval.encoders.int8`)."""
        from .int8 import FULL_STEPS, Int8Linear, current_kernel

        kernel = current_kernel()
        variant = self.variants.get("int8")
        if variant is not None:
            kernel = next((m.kernel for m in variant.modules() if isinstance(m, Int8Linear)), kernel)
        return 8 if kernel.steps == FULL_STEPS else 7


class PixelPrecisionMixin:
    """``embed_pixels``, ``embed_image`` and ``calibrate_images`` for any backend: it provides
    ``image_precision``, ``text_precision`` and ``_embed_pixels(pixel_values, mode)``. The
    image-runtime capabilities of the ``Encoder`` protocol default to torch's tower (a backend
    with other runtimes overrides them); its text path is planned by the caller."""

    image_precision: TowerPrecision
    text_precision: TowerPrecision

    def text_precision_info(self) -> dict[str, Any]:
        """JSON-able record of the text tower's precision (:meth:`TowerPrecision.info`)."""
        return self.text_precision.info()

    def loaded_path(self) -> None:
        """None: the query's settings say which path a full encoder's texts take (:func:`.text_choice.text_path`)."""
        return None

    def embed_image(self, source: str | bytes | os.PathLike[str] | BinaryIO, cfg: PreprocessConfig, draft: bool = True) -> np.ndarray:
        """The ``(1, dim)`` vector of an image file, decoded as ``draft`` says and preprocessed by ``cfg`` in torch."""
        pixels, _, _ = load_pixels(source, cfg, max_pixels=DEFAULT_MAX_PIXELS, draft=draft)
        return self.embed_pixels(pixels[None])

    def image_query_path(self) -> dict[str, str | None]:
        """The full encoder on its image runtime; the reason is its caller's."""
        return {"tower": "encoder", "runtime": self.image_runtime_name(), "reason": None}

    def follow_image_runtime(self, recorded: str | None, precision: str | None = None) -> None:
        """Nothing to follow: torch runs every image tower of this backend."""

    def image_runtime_pending(self) -> bool:
        return False

    def image_runtime_name(self) -> str:
        return "torch"

    def _embed_pixels(self, pixel_values: torch.Tensor, mode: Mode) -> np.ndarray:
        raise NotImplementedError

    def _auto_passes_over(self, mode: Mode, sample: torch.Tensor) -> str | None:
        """Why ``auto`` must not use ``mode`` for this image tower on torch (None: it may, if it
        passes the gate): no row of the chooser's table lets torch run it on this device."""
        return refusal("image", mode, "torch", self.image_precision.device.type)

    def embed_pixels(self, pixel_values: torch.Tensor) -> np.ndarray:
        """Encode a preprocessed ``(N, 3, h, w)`` batch to L2-normalised float32 vectors.

        With precision ``auto`` the first call calibrates the mode on up to 16 of its images.
        """
        mode = self._calibrate(pixel_values[:CALIBRATION_IMAGES])
        return self._embed_pixels(pixel_values, mode)

    def calibrate_images(self, pixel_values: torch.Tensor) -> Mode:
        """Resolve an ``auto`` image precision on this sample now; returns the mode."""
        return self._calibrate(pixel_values)

    def _calibrate(self, sample: torch.Tensor) -> Mode:
        return self.image_precision.calibrate(
            lambda m: self._embed_pixels(sample, m), lambda m: self._auto_passes_over(m, sample)
        )


def gate_results_from_info(data: Any) -> list[GateResult]:
    """Rebuild gate figures recorded by :meth:`TowerPrecision.info` (tolerant of junk)."""
    out: list[GateResult] = []
    if not isinstance(data, Sequence):
        return out
    for item in data:
        try:
            out.append(
                GateResult(
                    str(item["mode"]), int(item["samples"]), float(item["mean_cosine"]), float(item["min_cosine"]),
                    float(item["topk_overlap"]), int(item["k"]), float(item.get("seconds", 0.0)),
                )
            )
        except (KeyError, TypeError, ValueError):
            continue
    return out


__all__ = [
    "CALIBRATION_IMAGES",
    "GATE_K",
    "GATE_MEAN_COSINE",
    "GATE_MIN_COSINE",
    "GATE_TOPK_OVERLAP",
    "MODES",
    "PRECISIONS",
    "PROBE_TEXTS",
    "GateResult",
    "Mode",
    "Precision",
    "TowerPrecision",
    "auto_candidates",
    "choose",
    "gate",
    "parse_mode",
    "parse_precision",
    "topk_overlap",
]
