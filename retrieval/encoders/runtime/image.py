"""One encoder's choice of runtime for its fp32 image tower: OpenVINO, ONNX Runtime or torch.

Tried in order (:data:`AUTO_ORDER`), on the first images the tower sees; the first that
installs, loads, matches torch (:data:`~. PARITY_MIN_COSINE`) and gives every image the same
vector whatever its batch (:func:`batch_drift`) runs the tower. OpenVINO comes first: its fp32
tower ran faster than ONNX Runtime's at ViT-B/32 and ViT-L/14 on the CPUs where it passed the
batch check (``benchmarks/README.md``, issue 39); on the AVX2 host measured its vectors moved
with the batch, so there the check hands the tower to ONNX Runtime.

An index records what ran (``image_runtime``); a run that adds to it, and image queries
against it, ask for the same runtime first (:meth:`ImageRuntime.follow`), so an update equals a
rebuild and an indexed image finds itself bit for bit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import ModelLoadError
from . import (
    ORT_INSTALL,
    OV_INSTALL,
    PARITY_IMAGES,
    PARITY_MIN_COSINE,
    RUNTIME_ENV,
    onnxruntime_missing,
    openvino_missing,
    runtime_choice,
)

if TYPE_CHECKING:
    import torch

LOG = logging.getLogger(__package__)

Tower = Callable[["torch.Tensor"], np.ndarray]


@dataclass(frozen=True)
class Runtime:
    """A runtime that can run an exported fp32 image tower."""

    name: str
    label: str
    install: str
    missing: Callable[[], str | None]
    load: Callable[[Path], Tower]
    version: Callable[[], str]


def _ort_tower(path: Path) -> Tower:
    from .ort_tower import OrtImageTower

    return OrtImageTower(path)


def _ort_version() -> str:
    import onnxruntime

    return str(onnxruntime.__version__)


def _ov_tower(path: Path) -> Tower:
    from .ov_tower import OvImageTower

    return OvImageTower(path)


def _ov_version() -> str:
    from .ov_tower import openvino_version

    return openvino_version()


RUNTIMES: dict[str, Runtime] = {
    "openvino": Runtime("openvino", "OpenVINO", OV_INSTALL, openvino_missing, _ov_tower, _ov_version),
    "onnxruntime": Runtime("onnxruntime", "ONNX Runtime", ORT_INSTALL, onnxruntime_missing, _ort_tower, _ort_version),
}
AUTO_ORDER: tuple[str, ...] = ("openvino", "onnxruntime")


def batch_drift(tower: Tower, sample: torch.Tensor, together: np.ndarray) -> float:
    """The largest change of a vector when its image runs in another batch: the first image
    alone, and the last three in reverse order (another batch size, other positions); one
    image is run three times over. 0.0 where the runtime's kernels do not depend on the batch."""
    n = len(sample)
    if n == 1:
        probes = [(sample.repeat(3, 1, 1, 1), np.repeat(together, 3, axis=0))]
    else:
        tail = slice(max(0, n - 3), n)
        probes = [(sample[:1], together[:1]), (sample[tail].flip(0), together[tail][::-1])]
    return max(float(np.abs(tower(images) - expected).max()) for images, expected in probes)


class ImageRuntime:
    """One encoder's choice of runtime for its fp32 image tower, made on first use.

    Args:
        model_name: the model's name (for messages).
        export: ``() -> Path`` of the cached ONNX export (made on first call).
        applies: False where only torch can run the tower (CUDA, NaFlex, another backend).
    """

    def __init__(self, model_name: str, export: Callable[[], Any], applies: bool) -> None:
        self.model_name = model_name
        self._export = export
        self.applies = applies
        self.name: str | None = None  # "torch", "openvino" or "onnxruntime" once chosen
        self.note: str | None = None
        self.parity: dict[str, float] | None = None
        self.recorded: str | None = None
        self._tower: Tower | None = None

    def reset(self) -> None:
        """Forget the choice (the input size changed: another export)."""
        self.name, self.note, self.parity, self._tower = None, None, None, None

    def follow(self, recorded: str | None) -> None:
        """Ask first for the runtime an index's vectors came from (its ``image_runtime``;
        ``torch`` for an index from before runtimes were recorded), unless the environment
        names one. None: no index to match, the usual order."""
        if recorded != self.recorded:
            self.recorded = recorded
            self.reset()

    def _plan(self) -> tuple[list[str], bool]:
        """The runtimes to try, in order (none: torch), and whether a failure is an error."""
        choice = runtime_choice()
        if choice == "torch":
            return [], False
        if choice != "auto":
            if not self.applies:
                raise ModelLoadError(
                    f"{RUNTIME_ENV}={choice}: {RUNTIMES[choice].label} runs only the fp32 image tower of a Hugging "
                    f"Face CLIP or SigLIP FixRes model on the CPU ({self.model_name} here is not one)"
                )
            return [choice], True
        if not self.applies or self.recorded == "torch":
            return [], False
        if self.recorded in RUNTIMES:
            return [self.recorded, *(name for name in AUTO_ORDER if name != self.recorded)], False
        return list(AUTO_ORDER), False

    @property
    def pending(self) -> bool:
        """Whether the choice is still to be made on a sample of images: not made yet, and not
        settled without one (torch asked for, or a tower no other runtime runs)."""
        return self.name is None and self.applies and bool(self._plan()[0])

    def tower(self, pixel_values: torch.Tensor, torch_embed: Callable[[torch.Tensor], np.ndarray]) -> Tower | None:
        """The tower to run fp32 batches on, or None for torch; chosen on the first call, with
        ``pixel_values`` (its first images) for the checks against ``torch_embed`` (the torch
        tower's normalised vectors).

        Raises:
            ModelLoadError: with ``CLIPSEARCH_IMAGE_RUNTIME`` naming a runtime, that runtime
                cannot be used (the message says why: the package to install, the failed
                export, the failed check).
        """
        if self.name is not None:
            return self._tower
        candidates, strict = self._plan()
        sample = pixel_values[:PARITY_IMAGES]
        reference: list[tuple[np.ndarray, float]] = []

        def torch_vectors() -> tuple[np.ndarray, float]:
            if not reference:
                t0 = time.perf_counter()
                reference.append((torch_embed(sample), time.perf_counter() - t0))
            return reference[0]

        reasons: list[str] = []
        for name in candidates:
            runtime = RUNTIMES[name]
            outcome = self._try(runtime, sample, torch_vectors)
            if isinstance(outcome, str):
                if strict:
                    raise ModelLoadError(f"{RUNTIME_ENV}={name}: {outcome}")
                # A runtime that is not installed is worth a word only when nothing else runs.
                reasons.append(outcome)
                continue
            self.name, self._tower = name, outcome
            if self.recorded is not None and self.recorded != name:
                why = "; ".join(reasons) if self.recorded in RUNTIMES else "this version does not know it"
                self.note = f"the index's vectors came from {self.recorded}, which cannot run here: {why}"
                LOG.warning("image tower of %s runs on %s: %s", self.model_name, runtime.label, self.note)
            else:
                failed = [r for r in reasons if " is not installed" not in r]
                self.note = "; ".join(failed) or None
                if failed:
                    LOG.info("image tower of %s runs on %s: %s", self.model_name, runtime.label, self.note)
            return outcome
        self.name = "torch"
        if reasons:
            self.note = "; ".join(reasons)
            LOG.warning("image tower of %s runs on torch: %s", self.model_name, self.note)
        return None

    def _try(self, runtime: Runtime, sample: torch.Tensor, torch_vectors: Callable[[], tuple[np.ndarray, float]]) -> Tower | str:
        """``runtime``'s tower where it passes every check, else why not (one line)."""
        missing = runtime.missing()
        if missing is not None:
            return f"{runtime.name} is not installed ({missing}); for the faster fp32 path: {runtime.install}"
        try:
            tower = runtime.load(self._export())
        except ModelLoadError as exc:
            return str(exc)
        reference, torch_seconds = torch_vectors()
        t0 = time.perf_counter()
        candidate = tower(sample)
        seconds = time.perf_counter() - t0
        cos = np.sum(reference.astype(np.float64) * candidate.astype(np.float64), axis=1)
        if float(cos.min()) < PARITY_MIN_COSINE:
            return f"{runtime.label}'s vectors differ from torch's (min cosine {cos.min():.7f} < {PARITY_MIN_COSINE})"
        drift = batch_drift(tower, sample, candidate)
        if drift:
            return (
                f"{runtime.label}'s vectors change with the batch on this CPU (by up to {drift:.1e}), "
                "so an update would not equal a rebuild"
            )
        self.parity = {
            "images": len(sample), "mean_cosine": round(float(cos.mean()), 7), "min_cosine": round(float(cos.min()), 7),
            "torch_seconds": round(torch_seconds, 3), f"{runtime.name}_seconds": round(seconds, 3),
        }
        return tower

    def info(self) -> dict[str, Any]:
        """What an index records (``image_runtime`` and its details), once chosen."""
        if self.name is None:
            return {}
        data: dict[str, Any] = {"image_runtime": self.name}
        if self.name in RUNTIMES:
            data["image_runtime_version"] = RUNTIMES[self.name].version()
        if self.parity is not None:
            data["image_runtime_parity"] = self.parity
        if self.note:
            data["image_runtime_note"] = self.note
        return data


__all__ = ["AUTO_ORDER", "RUNTIMES", "ImageRuntime", "Runtime", "batch_drift"]
