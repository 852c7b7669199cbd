"""An exported image tower on ONNX Runtime's CPU provider (with :mod:`.ort_text`, the only modules that import it).

One session per tower, made once. Threads: torch's count in this process at creation (what
``--threads`` sets for a build), one inter-op thread; the session's threads spin only while it
runs (``allow_spinning`` off), so they do not steal the decode threads' cores between batches.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import ModelLoadError
from ..base import first_line, l2_normalize
from . import as_float32, tower_threads

if TYPE_CHECKING:
    import torch


def cpu_session(path: Path, threads: int) -> Any:
    """An ONNX Runtime CPU session of ``path`` on ``threads`` intra-op threads, one inter-op.

    Raises:
        ModelLoadError: ONNX Runtime cannot load the file.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Between calls the pool's threads sleep instead of spinning on cores the decoders, the
    # server or another tower need.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001  (onnxruntime raises its own untyped errors)
        raise ModelLoadError(f"ONNX Runtime cannot load {path}: {first_line(exc)}") from exc


class OrtImageTower:
    """``tower(pixel_values) -> L2-normalised float32 vectors`` on ONNX Runtime.

    Raises:
        ModelLoadError: the file cannot be loaded by ONNX Runtime.
    """

    def __init__(self, path: Path, threads: int | None = None) -> None:
        self.session = cpu_session(path, threads or tower_threads())
        self.path = path
        self.input_name = self.session.get_inputs()[0].name

    def __call__(self, pixel_values: torch.Tensor | np.ndarray) -> np.ndarray:
        values = as_float32(pixel_values)
        out = self.session.run(None, {self.input_name: values})[0]
        return l2_normalize(out)


def load(path: Path, mode: str, group: int) -> OrtImageTower:
    """The fp32 tower of an export (:data:`~.image.RUNTIMES`; ONNX Runtime runs no other mode)."""
    return OrtImageTower(path)


def onnxruntime_version() -> str:
    """The installed ONNX Runtime's version (what an index records)."""
    import onnxruntime

    return str(onnxruntime.__version__)
