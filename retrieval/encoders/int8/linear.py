"""``Int8Linear``: an ``nn.Linear`` with int8 weights and per-row quantised uint8 activations."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from .codes import FULL_STEPS, REDUCED_STEPS, quantize_weight, shifted_row_codes
from .kernel import Int8Kernel, onednn_available


class _PackedWeight:
    """oneDNN's packed copy of an int8 weight, made on first use. It is an opaque tensor that
    cannot be deep-copied or pickled, so a copy starts empty and packs again."""

    def __init__(self) -> None:
        self.tensor: torch.Tensor | None = None

    def get(self, codes: torch.Tensor) -> torch.Tensor:
        if self.tensor is None:
            self.tensor = torch.ops.onednn.qlinear_prepack(codes, None)
        return self.tensor

    def __deepcopy__(self, memo: dict[int, Any]) -> _PackedWeight:
        return _PackedWeight()

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.tensor = None


def uninitialised_linear(in_features: int, out_features: int, *, bias: bool = True) -> nn.Linear:
    # A layer whose weights are copied in next: its random initialisation would be wasted work.
    return nn.utils.skip_init(nn.Linear, in_features, out_features, bias=bias)


class Int8Linear(nn.Module):
    """``nn.Linear`` with int8 weights and per-row dynamically quantised uint8 activations.

    ``out_scale`` multiplies the output and ``in_scale`` is the factor the caller's input carries
    relative to the original layer's (both folded into the scales, at no cost per call).
    ``consumes_input``: the caller's input is dead after the call (the output of an in-place
    activation only this layer reads), so it is quantised in place, saving a pass.
    ``kernel``: how to multiply; :func:`current_kernel` (this CPU's) when not given.
    """

    # Buffers (register_buffer), declared so that they type as tensors rather than `Tensor | Module`.
    weight_codes: torch.Tensor
    col_scale: torch.Tensor
    neg_code_sums: torch.Tensor
    bias: torch.Tensor
    weight_zero: torch.Tensor

    def __init__(
        self,
        linear: nn.Linear,
        *,
        out_scale: float = 1.0,
        in_scale: float = 1.0,
        consumes_input: bool = False,
        kernel: Int8Kernel | None = None,
    ) -> None:
        super().__init__()
        self.consumes_input = consumes_input
        self.kernel = kernel if kernel is not None else current_kernel()
        codes, scale = quantize_weight(linear.weight)
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        # open_clip reads this (its hook for int8 layers) to pick the dtype of its inputs.
        self.int8_original_dtype = torch.float32
        col_scale = scale * (out_scale / in_scale)
        bias = torch.zeros(self.out_features) if linear.bias is None else linear.bias.detach().float() * out_scale
        self.register_buffer("weight_codes", codes)  # (out, in)
        self.register_buffer("col_scale", col_scale)
        # Zero-point correction per output: minus the sum of its codes, times its scale.
        # Summed as floats: exact below 2**24, and faster than an int8 sum.
        self.register_buffer("neg_code_sums", codes.float().sum(dim=1).mul_(col_scale).neg_())
        self.register_buffer("bias", bias)
        self.register_buffer("weight_zero", torch.zeros(self.out_features, dtype=torch.long))
        self._packed = _PackedWeight()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features).to(torch.float32)
        if rows.shape[0] == 0:
            return rows.new_zeros(*lead, self.out_features)
        shifted, scale, zero = shifted_row_codes(rows, steps=self.kernel.steps, in_place=self.consumes_input)
        out = self._scaled_product(shifted.contiguous())
        # Elementwise only, per row (a BLAS call can take another path for one row than for
        # many, changing the last bit): out = scale * (product - zero * code_sums) + bias.
        out.addcmul_(zero, self.neg_code_sums)
        return torch.addcmul(self.bias, out, scale, out=out).reshape(*lead, self.out_features)

    def _scaled_product(self, shifted: torch.Tensor) -> torch.Tensor:
        """``col_scale * (codes @ weight_codes.T)`` in float32, codes = ``shifted + offset``."""
        offset = self.kernel.offset
        if self.kernel.onednn:
            codes = shifted.view(torch.uint8)
            if offset:
                codes.bitwise_xor_(128)
            # Integer sums are exact and each is dequantised alone, so a row's values do not
            # depend on the other rows (tested); one kernel pass instead of four.
            return torch.ops.onednn.qlinear_pointwise(
                codes, 1.0, 0, self._packed.get(self.weight_codes), self.col_scale, self.weight_zero,
                None, 1.0, 0, torch.float32, "none", [], "",
            )
        acc = torch._int_mm(shifted, self.weight_codes.t()).to(torch.float32)
        if not offset:
            return acc.mul_(self.col_scale)
        # (codes - 128) @ W.T, plus 128 * code_sums: the shift back.
        return torch.addcmul(self.neg_code_sums.mul(-float(offset)), acc, self.col_scale)

    def extra_repr(self) -> str:
        kernel = "oneDNN" if self.kernel.onednn else "_int_mm"
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-row, {self.kernel.steps} steps, {kernel}"


def current_kernel() -> Int8Kernel:
    """The kernel for this CPU (:mod:`retrieval.encoders.cpu`, caps applied): 8-bit activations
    only where the level has int8 dot products and the kernel, tried once, did not saturate
    (:func:`full_codes_saturate`)."""
    from .. import cpu

    onednn = onednn_available()
    full = cpu.has_int8_dot() and not full_codes_saturate(onednn)
    return Int8Kernel(onednn=onednn, steps=FULL_STEPS if full else REDUCED_STEPS)


@functools.lru_cache(maxsize=2)
def full_codes_saturate(onednn: bool) -> bool:
    """Whether this process's int8 product (oneDNN's, else ``torch._int_mm``) saturates with
    8-bit codes: measured once on a product built to overflow 16-bit pair sums (codes 254,
    weights 127: pairs of 64,516), so that a kernel without int8 dot products is caught whatever
    the CPU tables say (a new CPU, a kernel library told to use other instructions)."""
    # The probe runs the layer the model will run, so it measures exactly that arithmetic.
    layer = nn.Linear(64, 16, bias=False)
    with torch.no_grad():
        layer.weight.fill_(1.0)
    try:
        with torch.inference_mode():
            out = Int8Linear(layer, kernel=Int8Kernel(onednn=onednn, steps=FULL_STEPS))(torch.ones(2, 64))
    except RuntimeError:
        return True  # the kernel cannot run at all: never choose it for 8-bit codes
    return not bool(torch.allclose(out, torch.full_like(out, 64.0), rtol=1e-3))
