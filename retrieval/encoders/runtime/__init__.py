"""Which runtime runs the fp32 image tower on the CPU: torch, or ONNX Runtime.

The same fp32 model, two runtimes. ONNX Runtime ran a ViT-B/32 image tower faster than torch's
fp32 path on the CPUs measured (``benchmarks/README.md``, "Peers"), with vectors equal to
torch's within float32 rounding, so where it is installed it serves the ``fp32`` mode of a Hugging
Face CLIP or SigLIP (FixRes) image tower on the CPU, after a parity check. Everything else
(reduced modes, CUDA, NaFlex, open_clip, text towers) stays on torch.

``CLIPSEARCH_IMAGE_RUNTIME`` (:data:`RUNTIME_ENV`):

- ``auto`` (default): ONNX Runtime where it applies, is installed, exports and passes the
  parity check; else torch, with a one-line notice saying why (package missing, export failed
  naming the model and operator, parity failed);
- ``torch``: always torch;
- ``onnxruntime``: ONNX Runtime where it applies, an error where it cannot be used.

The parity check (:data:`PARITY_MIN_COSINE`): the first batch's first 16 images through both
runtimes, per-image cosine >= 0.99999. ONNX Runtime's CPU kernels do not split the batch into
the sums they make, so an image's vector is bit-identical whatever its batch (tested): an
update equals a rebuild. The export is cached in the user's cache directory (:mod:`.export`).
What ran is recorded in an index's ``model_info`` as ``image_runtime``.

The exact (fp32) text tower has its own choice, :mod:`.text` (``CLIPSEARCH_TEXT_RUNTIME``,
:data:`TEXT_RUNTIME_ENV`: ``auto``, ``numpy`` or ``onnxruntime``), made when the numpy text
tower (:mod:`retrieval.encoders.numpy_text`) loads in a long-lived process.

:mod:`.export` makes the ONNX file, :mod:`.ort_tower` runs it; onnxruntime is imported only
there, and only when a tower is made.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np

from ...errors import InvalidArgumentError, ModelLoadError
from ..base import first_line

if TYPE_CHECKING:
    import torch

LOG = logging.getLogger(__package__)

RUNTIME_ENV = "CLIPSEARCH_IMAGE_RUNTIME"
RuntimeChoice = Literal["auto", "torch", "onnxruntime"]
RUNTIME_CHOICES: tuple[RuntimeChoice, ...] = ("auto", "torch", "onnxruntime")
PARITY_MIN_COSINE = 0.99999
PARITY_IMAGES = 16
ORT_INSTALL = "pip install 'clipsearch[onnx]' (or: pip install onnxruntime onnx)"

TEXT_RUNTIME_ENV = "CLIPSEARCH_TEXT_RUNTIME"
TextRuntimeChoice = Literal["auto", "numpy", "onnxruntime"]
TEXT_RUNTIME_CHOICES: tuple[TextRuntimeChoice, ...] = ("auto", "numpy", "onnxruntime")


class RuntimeUnavailable(ModelLoadError):
    """A runtime the environment insists on (``...=onnxruntime``) cannot be used here; unlike
    other load errors of the numpy text tower, this one is not answered by the torch path."""


def runtime_choice() -> RuntimeChoice:
    """``CLIPSEARCH_IMAGE_RUNTIME``, checked (``auto`` when unset).

    Raises:
        InvalidArgumentError: an unknown value.
    """
    return _env_choice(RUNTIME_ENV, RUNTIME_CHOICES, "a runtime")


def text_runtime_choice() -> TextRuntimeChoice:
    """``CLIPSEARCH_TEXT_RUNTIME``, checked (``auto`` when unset).

    Raises:
        InvalidArgumentError: an unknown value.
    """
    return _env_choice(TEXT_RUNTIME_ENV, TEXT_RUNTIME_CHOICES, "a text runtime")


_Choice = TypeVar("_Choice", bound=str)


def _env_choice(name: str, choices: tuple[_Choice, ...], what: str) -> _Choice:
    value = os.environ.get(name, "").strip().lower() or "auto"
    for known in choices:
        if value == known:
            return known
    raise InvalidArgumentError(f"{name}={value!r} is not {what}; use one of {', '.join(choices)}")


def onnxruntime_missing() -> str | None:
    """Why ONNX Runtime cannot be used here (a package missing or broken), or None."""
    try:
        import onnx  # noqa: F401  (the exporter writes through it)
        import onnxruntime  # noqa: F401
    except ImportError as exc:
        return first_line(exc)
    return None


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
        self.name: str | None = None  # "torch" or "onnxruntime" once chosen
        self.note: str | None = None
        self.parity: dict[str, float] | None = None
        self._tower: Any = None

    def reset(self) -> None:
        """Forget the choice (the input size changed: another export)."""
        self.name, self.note, self.parity, self._tower = None, None, None, None

    @property
    def pending(self) -> bool:
        """Whether the choice is still to be made on a sample of images: not made yet, and not
        settled without one (torch asked for, or a tower ONNX Runtime does not run)."""
        return self.name is None and self.applies and runtime_choice() != "torch"

    def _fall_back(self, why: str, strict: bool) -> None:
        if strict:
            raise ModelLoadError(f"{RUNTIME_ENV}=onnxruntime: {why}")
        self.name, self.note = "torch", why
        LOG.warning("image tower of %s runs on torch: %s", self.model_name, why)

    def tower(self, pixel_values: torch.Tensor, torch_embed: Callable[[torch.Tensor], np.ndarray]) -> Any:
        """The ONNX Runtime tower to run fp32 batches on, or None for torch; chosen on the first
        call, with ``pixel_values`` (its first images) for the parity check against
        ``torch_embed`` (the torch tower's normalised vectors).

        Raises:
            ModelLoadError: with ``CLIPSEARCH_IMAGE_RUNTIME=onnxruntime``, ONNX Runtime cannot
                be used (the message says why: the package to install, the failed export).
        """
        if self.name is not None:
            return self._tower
        choice = runtime_choice()
        strict = choice == "onnxruntime"
        if choice == "torch" or not self.applies:
            if strict:
                raise ModelLoadError(
                    f"{RUNTIME_ENV}=onnxruntime: ONNX Runtime runs only the fp32 image tower of a Hugging "
                    f"Face CLIP or SigLIP FixRes model on the CPU ({self.model_name} here is not one)"
                )
            self.name = "torch"
            return None
        missing = onnxruntime_missing()
        if missing is not None:
            self._fall_back(f"{missing}; for the faster fp32 path: {ORT_INSTALL}", strict)
            return None
        try:
            from .ort_tower import OrtImageTower

            tower = OrtImageTower(self._export())
        except ModelLoadError as exc:
            self._fall_back(str(exc), strict)
            return None
        sample = pixel_values[:PARITY_IMAGES]
        t0 = time.perf_counter()
        reference = torch_embed(sample)
        t1 = time.perf_counter()
        candidate = tower(sample)
        t2 = time.perf_counter()
        cos = np.sum(reference.astype(np.float64) * candidate.astype(np.float64), axis=1)
        self.parity = {
            "images": len(sample), "mean_cosine": round(float(cos.mean()), 7), "min_cosine": round(float(cos.min()), 7),
            "torch_seconds": round(t1 - t0, 3), "onnxruntime_seconds": round(t2 - t1, 3),
        }
        if float(cos.min()) < PARITY_MIN_COSINE:
            self._fall_back(f"ONNX Runtime's vectors differ from torch's (min cosine {cos.min():.7f} < {PARITY_MIN_COSINE})", strict)
            return None
        self.name, self._tower = "onnxruntime", tower
        return tower

    def info(self) -> dict[str, Any]:
        """What an index records (``image_runtime`` and its details), once chosen."""
        if self.name is None:
            return {}
        data: dict[str, Any] = {"image_runtime": self.name}
        if self.name == "onnxruntime":
            import onnxruntime

            data["image_runtime_version"] = onnxruntime.__version__
        if self.parity is not None:
            data["image_runtime_parity"] = self.parity
        if self.note:
            data["image_runtime_note"] = self.note
        return data


__all__ = [
    "ORT_INSTALL",
    "PARITY_IMAGES",
    "PARITY_MIN_COSINE",
    "RUNTIME_CHOICES",
    "RUNTIME_ENV",
    "TEXT_RUNTIME_CHOICES",
    "TEXT_RUNTIME_ENV",
    "ImageRuntime",
    "RuntimeChoice",
    "RuntimeUnavailable",
    "TextRuntimeChoice",
    "onnxruntime_missing",
    "runtime_choice",
    "text_runtime_choice",
]
