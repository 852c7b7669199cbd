"""The runtimes other than torch that run a tower on the CPU: OpenVINO and ONNX Runtime.

Which runs which tower, in which mode and on which CPU, and the check it must pass, are
:mod:`retrieval.encoders.chooser`'s; this package makes and runs the towers: :mod:`.export` the
ONNX files (cached in the user's cache), :mod:`.image` the image runtimes' table,
:mod:`.ov_tower`, :mod:`.ort_tower` and :mod:`.ort_text` the compiled models and sessions, the
only modules that import openvino, nncf and onnxruntime (inside the functions that make a tower).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import numpy as np

from ...errors import ModelLoadError
from ..base import first_line

ORT_INSTALL = "pip install 'clipsearch[onnx]' (or: pip install onnxruntime onnx)"
OV_INSTALL = "pip install 'clipsearch[openvino]' (or: pip install openvino nncf onnx)"


class RuntimeUnavailable(ModelLoadError):
    """A runtime asked for by name (``CLIPSEARCH_TEXT_RUNTIME=onnxruntime``) cannot be used here;
    unlike other load errors of the numpy text tower, this one is not answered by the torch path."""


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
    "RuntimeUnavailable",
    "as_float32",
    "package_not_found",
    "packages_missing",
    "tower_threads",
]
