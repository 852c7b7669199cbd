"""An exported image tower on OpenVINO's CPU plugin (the only module that imports openvino).

The same ONNX file :mod:`.export` makes for ONNX Runtime, compiled once per tower. Settings
that keep it the exact path:

- ``INFERENCE_PRECISION_HINT=f32`` and ``EXECUTION_MODE_HINT=ACCURACY``: on CPUs with bf16
  (AVX-512 BF16, AMX) the plugin otherwise runs in bf16 by default;
- ``INFERENCE_NUM_THREADS``: torch's count in this process (what ``--threads`` sets), one
  stream, and no CPU pinning, so it does not claim the cores the decode workers run on.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import ModelLoadError
from ..base import first_line, l2_normalize

if TYPE_CHECKING:
    import torch


def compile_tower(path: Path, threads: int) -> Any:
    """OpenVINO's compiled model of ``path`` for the CPU, in float32 on ``threads`` threads.

    Raises:
        ModelLoadError: OpenVINO cannot read or compile the file.
    """
    import openvino as ov

    config = {
        "INFERENCE_PRECISION_HINT": "f32",
        "EXECUTION_MODE_HINT": "ACCURACY",
        "INFERENCE_NUM_THREADS": threads,
        "NUM_STREAMS": 1,
        "ENABLE_CPU_PINNING": False,
    }
    with _signal_stack_kept():
        try:
            return ov.Core().compile_model(str(path), "CPU", config)
        except Exception as exc:  # noqa: BLE001  (openvino raises its own untyped errors)
            raise ModelLoadError(f"OpenVINO cannot load {path}: {first_line(exc)}") from exc


class _StackT(ctypes.Structure):
    _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]


@contextlib.contextmanager
def _signal_stack_kept() -> Iterator[None]:
    """Put back the thread's alternate signal stack after OpenVINO compiles a model.

    compile_model sets a signal stack of its own on the calling thread, and when the compiled
    model is freed it puts back the one it found. Freed in another order than made (two towers,
    an encoder replaced), that is the stack of a model freed earlier: the next signal handled
    on it (Python's handlers use the alternate stack) writes into freed memory or, unmapped,
    kills the process with SIGSEGV (reproduced with the test suite). With the stack put back at
    once, what OpenVINO restores later is always a stack that is still there.
    """
    libc = _libc()
    if libc is None:
        yield
        return
    before = _StackT()
    if libc.sigaltstack(None, ctypes.byref(before)) != 0:
        yield
        return
    try:
        yield
    finally:
        libc.sigaltstack(ctypes.byref(before), None)


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.sigaltstack  # noqa: B018 - raises AttributeError where the C library lacks it
    except (OSError, AttributeError):
        return None
    return libc


class OvImageTower:
    """``tower(pixel_values) -> L2-normalised float32 vectors`` on OpenVINO.

    An infer request holds the memory of every intermediate tensor, so requests are kept and
    reused (a new one per call paid ~150 page faults per image at ViT-B/32); one request serves
    one call at a time, so concurrent callers (image queries in the server) each take an idle
    one or make another.

    Raises:
        ModelLoadError: the file cannot be loaded by OpenVINO.
    """

    def __init__(self, path: Path, threads: int | None = None) -> None:
        import torch

        self.compiled = compile_tower(path, threads or torch.get_num_threads())
        self.path = path
        self._idle: list[Any] = []
        self._lock = threading.Lock()

    def __call__(self, pixel_values: torch.Tensor) -> np.ndarray:
        import torch

        values = pixel_values.to("cpu", torch.float32).contiguous().numpy()
        with self._lock:
            request = self._idle.pop() if self._idle else self.compiled.create_infer_request()
        try:
            request.infer({0: values})
            # The output is the request's own memory, reused by its next call: normalising copies it.
            return l2_normalize(request.get_output_tensor(0).data)
        finally:
            with self._lock:
                self._idle.append(request)


def openvino_version() -> str:
    """The installed OpenVINO's version (what an index records)."""
    import openvino as ov

    return str(ov.get_version()).split("-")[0]
