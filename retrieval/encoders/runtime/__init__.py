"""Which runtime runs the image tower on the CPU: OpenVINO, ONNX Runtime or torch.

The same fp32 model, three runtimes. OpenVINO and ONNX Runtime ran a ViT image tower faster
than torch's fp32 path on the CPUs measured (``benchmarks/README.md``, "Peers"), with vectors
equal to torch's within float32 rounding, so where one is installed it serves the ``fp32`` mode
of a Hugging Face CLIP or SigLIP (FixRes) image tower on the CPU, after its checks
(:mod:`.image`). The reduced modes of the same towers run on OpenVINO where it was measured
faster and batch-independent: ``bf16`` on CPUs with AMX (the bf16 inference hint), ``int8`` on
CPUs with AVX-512 VNNI (its int8 weights from NNCF, activations quantised per row by the
plugin). Everything else (fp16, CUDA, NaFlex, open_clip, text towers) stays on torch.

``CLIPSEARCH_IMAGE_RUNTIME`` (:data:`RUNTIME_ENV`):

- ``auto`` (default): OpenVINO, else ONNX Runtime, where it applies, is installed, exports and
  passes the checks; else torch, with a one-line notice saying why (package missing, export
  failed naming the model and operator, a check failed);
- ``torch``: always torch;
- ``openvino`` or ``onnxruntime``: that runtime where it applies, an error where it cannot be used.

The checks: the first batch's first 16 images through torch and the runtime, per-image cosine
>= :data:`PARITY_MIN_COSINE`, and the same vectors when some of them run in other batches (an
update must equal a rebuild). The export is cached in the user's cache directory
(:mod:`.export`). What ran is recorded in an index's ``model_info`` as ``image_runtime``.

The exact (fp32) text tower has its own choice, :mod:`.text` (``CLIPSEARCH_TEXT_RUNTIME``,
:data:`TEXT_RUNTIME_ENV`: ``auto``, ``numpy`` or ``onnxruntime``), made when the numpy text
tower (:mod:`retrieval.encoders.numpy_text`) loads in a long-lived process.

:mod:`.export` makes the ONNX file, :mod:`.ov_tower` and :mod:`.ort_tower` run it; openvino, nncf
and onnxruntime are imported only there, and only when a tower is made.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Any, Literal, TypeVar

import numpy as np

from ...errors import InvalidArgumentError, ModelLoadError
from ..base import first_line

RUNTIME_ENV = "CLIPSEARCH_IMAGE_RUNTIME"
RuntimeChoice = Literal["auto", "torch", "onnxruntime", "openvino"]
RUNTIME_CHOICES: tuple[RuntimeChoice, ...] = ("auto", "torch", "onnxruntime", "openvino")
PARITY_MIN_COSINE = 0.99999
PARITY_IMAGES = 16
ORT_INSTALL = "pip install 'clipsearch[onnx]' (or: pip install onnxruntime onnx)"
OV_INSTALL = "pip install 'clipsearch[openvino]' (or: pip install openvino nncf onnx)"

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


def tower_threads() -> int:
    """Threads a runtime's tower runs on when not told: torch's count where torch is imported
    (what ``--threads`` sets), else the cores this process may use."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None:
        return int(torch.get_num_threads())
    from ..cpu import usable_cores

    return usable_cores()


def as_float32(pixel_values: Any) -> np.ndarray:
    """Pixel values (a torch tensor on any device, or an array) as a C-contiguous float32 array."""
    if not isinstance(pixel_values, np.ndarray):
        pixel_values = pixel_values.detach().float().cpu().numpy()  # float() first: bf16 has no numpy type
    return np.ascontiguousarray(pixel_values, dtype=np.float32)


def packages_missing(*packages: str) -> str | None:
    """Why one of ``packages`` cannot be imported here (missing or broken): the first line of
    its ImportError; None when all import."""
    for package in packages:
        try:
            importlib.import_module(package)
        except ImportError as exc:
            return first_line(exc)
    return None


# onnx (which writes the export) and nncf (which makes the int8 weights) are looked for, not
# imported: importing them takes 0.65 s and 3.4 s, and they are needed only when a model's
# files are made, once; every later process reads the cached files.


def onnxruntime_missing() -> str | None:
    """Why ONNX Runtime cannot be used here (onnx writes the export), or None."""
    return packages_missing("onnxruntime") or package_not_found("onnx")


def openvino_missing() -> str | None:
    """Why OpenVINO cannot be used here (onnx writes the export), or None."""
    return packages_missing("openvino") or package_not_found("onnx")


def openvino_int8_missing() -> str | None:
    """Why OpenVINO's int8 image tower cannot be made here (NNCF makes its weights), or None."""
    return openvino_missing() or package_not_found("nncf")


def package_not_found(name: str) -> str | None:
    """Why ``name`` could not be imported, judged without importing it; None where it is there."""
    try:
        found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError) as exc:
        return first_line(exc)
    return None if found else f"No module named '{name}'"


__all__ = [
    "ORT_INSTALL",
    "OV_INSTALL",
    "PARITY_IMAGES",
    "PARITY_MIN_COSINE",
    "RUNTIME_CHOICES",
    "RUNTIME_ENV",
    "TEXT_RUNTIME_CHOICES",
    "TEXT_RUNTIME_ENV",
    "RuntimeChoice",
    "RuntimeUnavailable",
    "TextRuntimeChoice",
    "onnxruntime_missing",
    "openvino_int8_missing",
    "openvino_missing",
    "package_not_found",
    "packages_missing",
    "runtime_choice",
    "text_runtime_choice",
]
