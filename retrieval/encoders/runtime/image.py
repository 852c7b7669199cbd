"""How each runtime other than torch makes and runs an exported image tower: :data:`RUNTIMES`.

Which of them runs a tower, in which mode and on which CPU, is :data:`retrieval.encoders.chooser.CANDIDATES`'s
to say; this table says only, per runtime, what it needs installed, how to load its tower in a
mode, its version and the file a mode's tower runs from (what a passed check is remembered by);
:func:`guarded` says what counts as a tower failing on images.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..base import first_line
from . import ORT_INSTALL, OV_INSTALL, package_not_found, packages_missing

if TYPE_CHECKING:
    import torch

Tower = Callable[["torch.Tensor | np.ndarray"], np.ndarray]


class TowerFailed(Exception):
    """A runtime's tower failed on images: it raised (the message is its error's first line) or
    gave other than one vector per image."""


def guarded(tower: Tower) -> Tower:
    """``tower``, its failures as :class:`TowerFailed`: a tower can compile and still fail on its
    first images (OpenVINO's int8 one under a oneDNN ISA cap finds no kernel for a node, or
    answers with no vectors), and then the candidate fails, not the build."""

    def run(pixel_values: Any) -> np.ndarray:
        try:
            vectors = tower(pixel_values)
        except Exception as exc:  # noqa: BLE001  (the runtimes raise their own untyped errors)
            raise TowerFailed(first_line(exc)) from exc
        if vectors.ndim != 2 or len(vectors) != len(pixel_values) or not vectors.shape[1]:
            raise TowerFailed(f"it gave vectors of shape {tuple(vectors.shape)} for {len(pixel_values)} images")
        return vectors

    return run


@dataclass(frozen=True)
class Runtime:
    """A runtime that can run an exported image tower.

    ``imports`` are imported to tell it is usable; ``looks_for`` (and for the int8 tower
    ``int8_looks_for``) only looked for: onnx writes the export and NNCF the int8 weights, once
    per model, and importing them takes seconds that every later process, reading the cached
    files, need not pay.
    """

    name: str
    label: str
    install: str
    imports: tuple[str, ...]
    looks_for: tuple[str, ...]
    # (export, mode, activation group of an int8 tower) -> the tower in that mode.
    load: Callable[[Path, str, int], Tower]
    version: Callable[[], str]
    int8_looks_for: tuple[str, ...] = ()
    # export -> the file the int8 tower is made from (what its checks are remembered by).
    int8_file: Callable[[Path], Path] | None = None

    def missing(self, mode: str = "fp32") -> str | None:
        """Why this runtime cannot run ``mode``'s tower here (a package missing), or None."""
        looked_for = (*self.looks_for, *(self.int8_looks_for if mode == "int8" else ()))
        return packages_missing(*self.imports) or next(filter(None, map(package_not_found, looked_for)), None)

    def tower_file(self, export: Path, mode: str) -> Path:
        """The file ``mode``'s tower runs from: the export, or for int8 the file made from it."""
        return self.int8_file(export) if mode == "int8" and self.int8_file is not None else export


def _in(module: str, function: str) -> Callable[..., Any]:
    """``module.function``, imported on the first call: every process that embeds or queries
    imports this table, and most never make a tower."""
    return lambda *args: getattr(importlib.import_module(f"{__package__}.{module}"), function)(*args)


RUNTIMES: dict[str, Runtime] = {
    "openvino": Runtime(
        "openvino", "OpenVINO", OV_INSTALL, ("openvino",), ("onnx",), _in("ov_tower", "load"), _in("ov_tower", "openvino_version"),
        ("nncf",), _in("ov_tower", "int8_path"),
    ),
    "onnxruntime": Runtime(
        "onnxruntime", "ONNX Runtime", ORT_INSTALL, ("onnxruntime",), ("onnx",), _in("ort_tower", "load"),
        _in("ort_tower", "onnxruntime_version"),
    ),
}


__all__ = ["RUNTIMES", "Runtime", "Tower", "TowerFailed", "guarded"]
