"""int8 matrix products for the numpy text tower: torch's dynamic int8 linear, one query at a time.

Each product becomes ``torch.ops.quantized.linear_dynamic`` (fbgemm): int8 weights, one scale
per output channel, quantised once; the input quantised on every call with one scale for the
whole input, which is per *query* here: :meth:`~.encoder.NumpyTextEncoder.embed_texts` runs
each text alone, so a text's vector depends on that text only (tested), as per-row scales give
the image tower (:mod:`retrieval.encoders.int8`). Everything else stays float32 numpy.
Activations: 8-bit where fbgemm's kernels have int8 dot products, else 7-bit
(:func:`activation_bits`). torch is imported when an int8 tower is made, never by an fp32
query. Why this kernel, and its figures: docs/performance.md, "int8 text queries".
"""

from __future__ import annotations

import contextlib
import functools
import platform
import warnings
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np

from .. import cpu
from .weights import DenseLinear, LayerWeights


@functools.lru_cache(maxsize=1)
def _kernel_error() -> str | None:
    """Why torch's dynamic int8 linear cannot run here (None: it runs), checked once on a tiny product."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"no int8 text kernel for {platform.machine()} yet"
    try:
        import torch

        if "fbgemm" not in torch.backends.quantized.supported_engines:
            return "this torch has no fbgemm int8 kernels"
        probe = DenseLinear(np.eye(4, dtype=np.float32), np.zeros(4, dtype=np.float32))
        Int8DynamicLinear(probe, reduce_range=True)(np.ones((1, 4), dtype=np.float32))
    except Exception as exc:  # noqa: BLE001 - any failure means: use fp32
        return f"torch's dynamic int8 linear failed here: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    return None


def int8_refusal() -> str | None:
    """Why the text tower cannot take int8 products on this machine (None: it can).

    Reads the CPU level first (its caps included: ``CLIPSEARCH_CPU_CAP=none`` refuses), then
    imports torch and runs a tiny product.
    """
    if not cpu.has_fast_int8():
        return f"no fast int8 on this CPU (level {cpu.cpu_level()})"
    return _kernel_error()


def activation_bits() -> int:
    """8 where fbgemm's int8 products do not saturate (AVX-512 VNNI, AMX, caps included, and
    :func:`full_inputs_saturate` says no), else 7."""
    return 8 if cpu.fbgemm_has_int8_dot() and not full_inputs_saturate() else 7


@functools.lru_cache(maxsize=1)
def full_inputs_saturate() -> bool:
    """Whether fbgemm's product saturates 8-bit inputs in this process: measured once on one
    built to overflow 16-bit pair sums (inputs 255, weights 127), so that AVX2 kernels are caught
    whatever the CPU tables say."""
    probe = DenseLinear(np.ones((64, 16), dtype=np.float32), np.zeros(16, dtype=np.float32))
    try:
        out = Int8DynamicLinear(probe, reduce_range=False)(np.ones((2, 64), dtype=np.float32))
    except Exception:  # noqa: BLE001 - a kernel that cannot run is never chosen for 8 bits
        return True
    return not bool(np.allclose(out, 64.0, rtol=1e-3))


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """Run the products on the calling thread alone.

    A query's products are too small to split: waking two threads per product (the CLI's
    passive OpenMP waiting) made a query slower than one thread does.
    torch's thread count is the calling thread's own (OpenMP), so other threads keep theirs.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class Int8DynamicLinear:
    """``x @ W + b`` with int8 weights (per output channel) and a uint8 input quantised per call.

    Args:
        dense: the float32 product to quantise (``weight`` laid out ``(in, out)``).
        reduce_range: quantise inputs to 7 bits (non-VNNI CPUs) instead of 8.
    """

    def __init__(self, dense: DenseLinear, *, reduce_range: bool) -> None:
        import torch

        weight = torch.tensor(np.ascontiguousarray(dense.weight.T, dtype=np.float32))  # (out, in)
        scale = weight.abs().amax(dim=1).clamp_min(1e-12).div_(127.0).to(torch.float64)
        zero = torch.zeros(weight.shape[0], dtype=torch.long)
        bias = torch.tensor(np.asarray(dense.bias, dtype=np.float32))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            codes = torch.quantize_per_channel(weight, scale, zero, 0, torch.qint8)
            self._packed: Any = torch.ops.quantized.linear_prepack(codes, bias)
        self._op = torch.ops.quantized.linear_dynamic
        self._from_numpy = torch.from_numpy
        # The op's Python binding asks each argument for ``__torch_function__``; the packed
        # weights (a TorchScript object) answer with a C++ exception turned into an
        # AttributeError, on every call. With ``__torch_function__`` off for the call (plain
        # tensors only; no torch function modes are in use) the binding skips the question.
        self._plain_dispatch = torch._C.DisableTorchFunctionSubclass
        self.reduce_range = reduce_range

    def __call__(self, x: np.ndarray) -> np.ndarray:
        rows = np.ascontiguousarray(x, dtype=np.float32)
        with self._plain_dispatch():
            return self._op(self._from_numpy(rows), self._packed, self.reduce_range).numpy()


def quantize_layer(layer: LayerWeights, *, reduce_range: bool) -> LayerWeights:
    """The block with its four float32 products (:class:`DenseLinear`) made int8 (7-bit inputs
    with ``reduce_range``: ``activation_bits() < 8``)."""

    def convert(product: Any) -> Any:
        if not isinstance(product, DenseLinear):
            raise TypeError(f"expected a float32 product, got {type(product).__name__}")
        return Int8DynamicLinear(product, reduce_range=reduce_range)

    return replace(layer, qkv=convert(layer.qkv), out=convert(layer.out), fc1=convert(layer.fc1), fc2=convert(layer.fc2))
