"""An exported image tower on OpenVINO's CPU plugin (the only module that imports openvino
and nncf).

The ONNX file of :mod:`.export`, compiled once per tower in a mode (:func:`compile_tower`):
``fp32`` with the float32 and accuracy hints (the plugin would otherwise run bf16 on CPUs with
bf16), ``bf16`` with the bf16 hint (AMX tiles; vectors independent of the batch and the thread
count, unlike torch's bf16 there), ``int8`` from NNCF's ``int8_asym`` weights
(:func:`int8_model`) with each row of a layer's input quantised on its own in groups of the
model's width, so a vector depends on its image alone. Threads: torch's count, one stream, no
pinning (the decode workers share the cores). OpenVINO's own files (the int8 tower) compile
through the plugin's model cache, kept without the weights; the ONNX export compiles without
it (its cached form would be a second copy of the weights). Measurements: docs/performance.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import io
import logging
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import ModelLoadError
from ..base import first_line, l2_normalize
from . import as_float32, tower_threads

if TYPE_CHECKING:
    import torch


# Bumped when the int8 model made from an export changes (NNCF's mode, the saved form).
INT8_VERSION = 1


def compile_tower(path: Path, threads: int, mode: str = "fp32", int8_group: int = 0) -> Any:
    """OpenVINO's compiled model of ``path`` for the CPU on ``threads`` threads, in ``mode``:
    ``fp32`` (float32 throughout), ``bf16`` (the bf16 inference hint), or ``int8`` for
    :func:`int8_model`'s file, its activations quantised per row in groups of ``int8_group``
    features.

    Raises:
        ModelLoadError: OpenVINO cannot read or compile the file.
    """
    import openvino as ov

    config: dict[str, Any] = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "ENABLE_CPU_PINNING": False}
    if mode == "int8":
        from .. import cpu

        config["INFERENCE_PRECISION_HINT"] = "bf16" if cpu.has_bf16() else "f32"
        config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = int8_group
    elif mode == "bf16":
        config["INFERENCE_PRECISION_HINT"] = "bf16"
    else:
        config["INFERENCE_PRECISION_HINT"] = "f32"
        config["EXECUTION_MODE_HINT"] = "ACCURACY"
    with _signal_stack_kept():
        if path.suffix == ".xml":
            # OpenVINO's own files: the compiled model is cached without its weights (read from
            # the .bin), so the next process compiles in a fraction of the time for a few MB.
            from .export import cache_dir

            cached = {**config, "CACHE_DIR": str(cache_dir() / "openvino"), "CACHE_MODE": "OPTIMIZE_SIZE"}
            try:
                return ov.Core().compile_model(str(path), "CPU", cached)
            except Exception:  # noqa: BLE001, S110  (a full or read-only cache: compile without it)
                pass
        try:
            return ov.Core().compile_model(str(path), "CPU", config)
        except Exception as exc:  # noqa: BLE001  (openvino raises its own untyped errors)
            raise ModelLoadError(f"OpenVINO cannot load {path}: {first_line(exc)}") from exc


def int8_model(export: Path) -> Path:
    """The int8 model of an fp32 export (NNCF ``int8_asym`` weights), saved beside it on first
    use as OpenVINO's own files (``.xml`` and ``.bin``) and reused after.

    Raises:
        ModelLoadError: OpenVINO or NNCF cannot read or compress the export.
    """
    import openvino as ov

    dest = int8_path(export)
    if dest.is_file() and dest.with_suffix(".bin").is_file():
        return dest
    with contextlib.redirect_stdout(io.StringIO()):  # NNCF draws its table and progress on stdout
        try:
            import nncf

            nncf.set_log_level(logging.ERROR)
            model = nncf.compress_weights(ov.Core().read_model(str(export)), mode=nncf.CompressWeightsMode.INT8_ASYM)
        except Exception as exc:  # noqa: BLE001  (NNCF and openvino raise their own untyped errors)
            raise ModelLoadError(f"NNCF cannot make the int8 weights of {export}: {first_line(exc)}") from exc
    # Written under temporary names and renamed, the .xml last: a reader that finds it finds both.
    tmp = dest.with_name(f".{dest.stem}-{os.getpid()}-{threading.get_ident()}.xml")
    try:
        ov.save_model(model, str(tmp), compress_to_fp16=False)
        os.replace(tmp.with_suffix(".bin"), dest.with_suffix(".bin"))
        os.replace(tmp, dest)
    except Exception as exc:  # noqa: BLE001  (a full disk, a read-only cache: one typed error)
        raise ModelLoadError(f"cannot save the int8 model of {export} beside it: {first_line(exc)}") from exc
    finally:
        tmp.unlink(missing_ok=True)
        tmp.with_suffix(".bin").unlink(missing_ok=True)
    return dest


def int8_path(export: Path) -> Path:
    """Where :func:`int8_model` keeps the int8 model of ``export`` (whether made yet or not)."""
    return export.with_name(f"{export.stem}-ov-int8-v{INT8_VERSION}-nncf{_nncf_version()}.xml")


def _nncf_version() -> str:
    # From the package's metadata: importing NNCF takes seconds, and a cached model needs none of it.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nncf")
    except PackageNotFoundError:
        return "none"


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
    """``tower(pixel_values) -> L2-normalised float32 vectors`` on OpenVINO, in ``mode``
    (:func:`compile_tower`; for ``int8``, ``path`` is :func:`int8_model`'s file).

    An infer request holds the memory of every intermediate tensor, so requests are kept and
    reused (a new one per call paid page faults for every image); one request serves
    one call at a time, so concurrent callers (image queries in the server) each take an idle
    one or make another.

    Raises:
        ModelLoadError: the file cannot be loaded by OpenVINO.
    """

    def __init__(self, path: Path, threads: int | None = None, mode: str = "fp32", int8_group: int = 0) -> None:
        self.compiled = compile_tower(path, threads or tower_threads(), mode, int8_group)
        self.path = path
        self._idle: list[Any] = []
        self._lock = threading.Lock()

    def __call__(self, pixel_values: torch.Tensor | np.ndarray) -> np.ndarray:
        values = as_float32(pixel_values)
        with self._lock:
            request = self._idle.pop() if self._idle else self.compiled.create_infer_request()
        try:
            # The batch is read in place (no copy into the request's tensor): infer returns before it can change.
            request.infer({0: values}, share_inputs=True)
            # The output is the request's own memory, reused by its next call: normalising copies it.
            return l2_normalize(request.get_output_tensor(0).data)
        finally:
            with self._lock:
                self._idle.append(request)


def load(export: Path, mode: str, group: int) -> OvImageTower:
    """``mode``'s tower of an export (:data:`~.image.RUNTIMES`): for int8, :func:`int8_model`'s."""
    if mode == "int8":
        return OvImageTower(int8_model(export), mode="int8", int8_group=group)
    return OvImageTower(export, mode=mode)


def openvino_version() -> str:
    """The installed OpenVINO's version (what an index records)."""
    import openvino as ov

    return str(ov.get_version()).split("-")[0]
