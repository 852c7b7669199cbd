"""How each runtime other than torch makes and runs an exported image tower: :data:`RUNTIMES`.

Which of them runs a tower, in which mode and on which CPU, is decided by
:mod:`retrieval.encoders.chooser` (its ``CANDIDATES`` table and its one check); this module only
says, per runtime, how to tell it is installed, load its tower in a mode, name its version and
find the file a mode's tower runs from (what a passed check is remembered by).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from . import ORT_INSTALL, OV_INSTALL, onnxruntime_missing, openvino_int8_missing, openvino_missing

if TYPE_CHECKING:
    import torch

Tower = Callable[["torch.Tensor | np.ndarray"], np.ndarray]


@dataclass(frozen=True)
class Runtime:
    """A runtime that can run an exported image tower in some of the modes."""

    name: str
    label: str
    install: str
    missing: Callable[[], str | None]
    # (export, mode, activation group of an int8 tower) -> the tower in that mode.
    load: Callable[[Path, str, int], Tower]
    version: Callable[[], str]
    modes: tuple[str, ...] = ("fp32",)
    # Why the int8 tower cannot be made here (its extra packages), where it needs more than ``missing``.
    int8_missing: Callable[[], str | None] | None = None
    # export -> the file the int8 tower is made from (what its checks are remembered by).
    int8_file: Callable[[Path], Path] | None = None

    def missing_for(self, mode: str) -> str | None:
        """Why this runtime cannot run ``mode``'s tower here (a package missing), or None."""
        return (self.int8_missing if mode == "int8" and self.int8_missing else self.missing)()

    def tower_file(self, export: Path, mode: str) -> Path:
        """The file ``mode``'s tower runs from: the export, or for int8 the file made from it."""
        return self.int8_file(export) if mode == "int8" and self.int8_file is not None else export


def _ort_tower(path: Path, mode: str, group: int) -> Tower:
    from .ort_tower import OrtImageTower

    return OrtImageTower(path)


def _ort_version() -> str:
    import onnxruntime

    return str(onnxruntime.__version__)


def _ov_tower(path: Path, mode: str, group: int) -> Tower:
    from .ov_tower import OvImageTower, int8_model

    if mode == "int8":
        return OvImageTower(int8_model(path), mode="int8", int8_group=group)
    return OvImageTower(path, mode=mode)


def _ov_version() -> str:
    from .ov_tower import openvino_version

    return openvino_version()


def _ov_int8_file(export: Path) -> Path:
    from .ov_tower import int8_path

    return int8_path(export)


RUNTIMES: dict[str, Runtime] = {
    "openvino": Runtime(
        "openvino", "OpenVINO", OV_INSTALL, openvino_missing, _ov_tower, _ov_version, ("fp32", "bf16", "int8"),
        openvino_int8_missing, _ov_int8_file,
    ),
    "onnxruntime": Runtime("onnxruntime", "ONNX Runtime", ORT_INSTALL, onnxruntime_missing, _ort_tower, _ort_version),
}


__all__ = ["RUNTIMES", "Runtime", "Tower"]
