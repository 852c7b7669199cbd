"""int8 inference for CLIP towers on the CPU that keeps every vector a function of its input alone.

``torch.ao.quantization.quantize_dynamic`` (fbgemm) quantises a layer's activations with one
scale for the whole batch, so an image's vector moved with its batch-mates (by up to 5e-3 in a
coordinate, ``benchmarks/bench_int8.py``) and an update could not equal a rebuild. Here, as in torchao's
``int8_dynamic_activation_int8_weight``, every *row* (token) gets its own scale:

- weights: int8, symmetric, one scale per output channel, quantised once;
- activations: uint8 codes per row, asymmetric (``scale = (max - min) / 254``, min and max
  widened to include 0), the zero point folded into a rank-one correction after the product;
- products: oneDNN's uint8 x int8 linear (``torch.ops.onednn.qlinear_pointwise``), which
  applies the weight scales in the kernel and returns float32; ``torch._int_mm`` where that op
  is missing (not x86);
- activation codes: 8 bits (254 steps) where the CPU has int8 dot products (VNNI, AMX); 7 bits
  (126 steps) elsewhere, e.g. AVX2, whose ``vpmaddubsw`` sums pairs in 16 bits with saturation:
  full 8-bit codes gave errors of 40 % of the output's range there (``ONEDNN_MAX_CPU_ISA=AVX2``,
  tested), 7-bit codes exact integer sums (:func:`current_kernel`, :mod:`.cpu`);
- integer accumulation is exact whatever the blocking, and every float step is per row, so a
  row's result is bit-identical in any batch (tested, transformers' CLIP), not just close. In
  open_clip's towers the final projection (``x @ proj``, a float32 product) still rounds with
  the batch size, as in fp32 (~1e-7); every int8 layer before it sees the same codes.

Also converted: a patch-embedding ``Conv2d`` whose stride equals its kernel (a matrix product over
unfolded patches) and open_clip's ``nn.MultiheadAttention`` self-attention, so no large float
product is left whose rounding depends on the batch; and a
quick-GELU MLP (``x * sigmoid(1.702 x)``, CLIP's activation) becomes ``silu`` in place, with the
1.702 folded into the two layers' scales (per-row quantisation does not see a row's scale).
transformers' q/k/v projections share one quantised input and one product.

``benchmarks/bench_int8.py`` measures this scheme against fp32, fbgemm's per-batch int8 and ONNX
Runtime's dynamic int8 (speed and cosine to fp32); its figures are in benchmarks/README.md.
"""

from __future__ import annotations

import copy
import functools
import itertools
import platform
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

# Activations CLIP writes as x * sigmoid(1.702 x): transformers' and open_clip's classes.
_QUICK_GELU = ("QuickGELUActivation", "QuickGELU")
_QUICK_GELU_ALPHA = 1.702
# (first layer, activation, second layer) attribute names of an MLP: transformers, open_clip.
_MLP_NAMES = (("fc1", "activation_fn", "fc2"), ("c_fc", "gelu", "c_proj"))


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel symmetric int8 codes of a ``(out, in)`` weight and their scales."""
    w = weight.detach().to(torch.float32)
    scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127.0
    codes = torch.div(w, scale[:, None]).round_().clamp_(-127, 127).to(torch.int8)
    return codes, scale


# Steps per row range. 8-bit codes: 254, not 255, so that round(x / scale) + zero provably
# stays in 0..255 (float error in x / scale is far below the half step left over) and no clamp
# pass is needed. 7-bit codes (0..126, same reasoning) where the CPU has no int8 dot product:
# its kernels sum uint8 x int8 pairs in 16 bits with saturation (``vpmaddubsw``; oneDNN's
# "nuances of int8 computations"), and 2 * 126 * 127 stays below 2**15 - 1.
FULL_STEPS = 254
REDUCED_STEPS = 126


@dataclass(frozen=True)
class Int8Kernel:
    """How an :class:`Int8Linear` multiplies: fixed when the layer is made, so that a model's
    arithmetic (and so its vectors) does not change while it runs.

    ``onednn``: oneDNN's uint8 x int8 linear (weight scales applied in the kernel), else
    ``torch._int_mm``. ``steps``: activation code range per row, :data:`FULL_STEPS` (8 bits,
    codes stored shifted by -128 as int8) or :data:`REDUCED_STEPS` (7 bits, codes as they are).
    """

    onednn: bool
    steps: int

    @property
    def offset(self) -> int:
        """What is subtracted from a code to store it as int8."""
        return 128 if self.steps == FULL_STEPS else 0


def current_kernel() -> Int8Kernel:
    """The kernel for this CPU (:mod:`retrieval.encoders.cpu`, caps applied): 8-bit activations
    only where the level has int8 dot products and the kernel, tried once, did not saturate
    (:func:`full_codes_saturate`)."""
    from . import cpu

    onednn = _onednn_available()
    full = cpu.has_int8_dot() and not full_codes_saturate(onednn)
    return Int8Kernel(onednn=onednn, steps=FULL_STEPS if full else REDUCED_STEPS)


@functools.lru_cache(maxsize=2)
def full_codes_saturate(onednn: bool) -> bool:
    """Whether this process's int8 product (oneDNN's, else ``torch._int_mm``) saturates with
    8-bit codes: measured once on a product built to overflow 16-bit pair sums (codes 254,
    weights 127: pairs of 64,516), so that a kernel without int8 dot products is caught whatever
    the CPU tables say (a new CPU, a kernel library told to use other instructions)."""
    layer = nn.Linear(64, 16, bias=False)
    with torch.no_grad():
        layer.weight.fill_(1.0)
    try:
        with torch.inference_mode():
            out = Int8Linear(layer, kernel=Int8Kernel(onednn=onednn, steps=FULL_STEPS))(torch.ones(2, 64))
    except RuntimeError:
        return True  # the kernel cannot run at all: never choose it for 8-bit codes
    return not bool(torch.allclose(out, torch.full_like(out, 64.0), rtol=1e-3))


def _shifted_row_codes(
    x: torch.Tensor, *, steps: int = FULL_STEPS, in_place: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # codes - offset as int8: a float -> int8 conversion is faster than float -> uint8 here.
    # ``in_place`` overwrites ``x`` (for an input nobody reads afterwards).
    # amin and amax separately: aminmax over a dimension is much slower here (torch 2.14 CPU).
    lo = x.amin(dim=1, keepdim=True).clamp_(max=0.0)
    hi = x.amax(dim=1, keepdim=True).clamp_(min=0.0)
    scale = (hi - lo).div_(float(steps)).clamp_(min=1e-12)
    inv = scale.reciprocal()
    zero = torch.round(lo * inv).neg_()
    offset = 128.0 if steps == FULL_STEPS else 0.0
    # One out-of-place pass, then in-place ones: an out-of-place pass costs more than an in-place one.
    scaled = x.mul_(inv) if in_place else torch.mul(x, inv)
    shifted = scaled.add_(zero - offset).round_().to(torch.int8)
    return shifted, scale, zero


def quantize_rows(x: torch.Tensor, steps: int = FULL_STEPS) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row asymmetric uint8 codes of a 2-D float tensor: ``x ~= (codes - zero) * scale``.

    Each row's range (widened to include 0, so zeros are exact) is split into ``steps`` steps
    (254: codes in 0..255; 126: codes in 0..127); the codes are ``round(x / scale) + zero``.
    Returns ``(codes, scale, zero)`` with ``scale`` and ``zero`` of shape ``(rows, 1)``
    (``zero`` holds integers, as floats).
    """
    shifted, scale, zero = _shifted_row_codes(x, steps=steps)
    codes = shifted.view(torch.uint8)
    return (codes.bitwise_xor_(128) if steps == FULL_STEPS else codes), scale, zero


@functools.lru_cache(maxsize=1)
def _onednn_available() -> bool:
    """Whether oneDNN's int8 linear (uint8 x int8 -> float, dequantised in the kernel) exists here."""
    if platform.machine().lower() not in ("x86_64", "amd64") or not torch.backends.mkldnn.is_available():
        return False
    try:
        torch.ops.onednn.qlinear_pointwise  # noqa: B018 - raises where this build lacks the op
    except (AttributeError, RuntimeError):
        return False
    return True


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


def _uninitialised_linear(in_features: int, out_features: int, *, bias: bool = True) -> nn.Linear:
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
        shifted, scale, zero = _shifted_row_codes(rows, steps=self.kernel.steps, in_place=self.consumes_input)
        out = self._scaled_product(shifted.contiguous())
        # Elementwise only, per row (a BLAS call here took another path for one row than for
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


class Int8PatchEmbedding(nn.Module):
    """A ``Conv2d`` with stride == kernel, no padding: an :class:`Int8Linear` over unfolded patches."""

    def __init__(self, conv: nn.Conv2d, kernel: Int8Kernel | None = None) -> None:
        super().__init__()
        self.kernel = tuple(conv.kernel_size)
        out_channels = conv.out_channels
        linear = _uninitialised_linear(conv.weight[0].numel(), out_channels, bias=conv.bias is not None)
        with torch.no_grad():
            linear.weight.copy_(conv.weight.reshape(out_channels, -1))
            if conv.bias is not None:
                linear.bias.copy_(conv.bias)
        self.linear = Int8Linear(linear, kernel=kernel)
        # Callers read the convolution's weight (transformers casts its input to weight.dtype).
        self.register_buffer("weight", conv.weight.detach().to(torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        kh, kw = self.kernel
        gh, gw = h // kh, w // kw
        # Like the convolution, a remainder smaller than the kernel is dropped.
        patches = x[:, :, : gh * kh, : gw * kw].reshape(b, c, gh, kh, gw, kw).permute(0, 2, 4, 1, 3, 5)
        out = self.linear(patches.reshape(b * gh * gw, c * kh * kw))
        return out.reshape(b, gh, gw, -1).permute(0, 3, 1, 2)


class Int8SelfAttention(nn.Module):
    """``nn.MultiheadAttention`` used as self-attention, with :class:`Int8Linear` projections.

    open_clip's blocks call it as ``attn(x, x, x, need_weights=False, attn_mask=mask)``; any
    other call (cross-attention, padding masks, attention weights) goes to the original fp32
    module, kept for that.
    """

    def __init__(self, mha: nn.MultiheadAttention, kernel: Int8Kernel | None = None) -> None:
        super().__init__()
        embed = mha.embed_dim
        self.heads = mha.num_heads
        self.batch_first = mha.batch_first
        in_proj = _uninitialised_linear(embed, 3 * embed, bias=mha.in_proj_bias is not None)
        out_proj = _uninitialised_linear(embed, embed, bias=mha.out_proj.bias is not None)
        with torch.no_grad():
            in_proj.weight.copy_(mha.in_proj_weight)
            out_proj.weight.copy_(mha.out_proj.weight)
            if mha.in_proj_bias is not None:
                in_proj.bias.copy_(mha.in_proj_bias)
            if mha.out_proj.bias is not None:
                out_proj.bias.copy_(mha.out_proj.bias)
        self.in_proj = Int8Linear(in_proj, kernel=kernel)
        self.out_proj = Int8Linear(out_proj, kernel=kernel)
        self.fallback = mha

    @staticmethod
    def supports(mha: nn.Module) -> bool:
        return (
            type(mha) is nn.MultiheadAttention
            and mha._qkv_same_embed_dim
            and mha.bias_k is None
            and mha.bias_v is None
            and not mha.add_zero_attn
        )

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if key is not query or value is not query or key_padding_mask is not None or need_weights or query.dim() != 3:
            return self.fallback(query, key, value, key_padding_mask=key_padding_mask, need_weights=need_weights,
                                 attn_mask=attn_mask, average_attn_weights=average_attn_weights, is_causal=is_causal)
        x = query if self.batch_first else query.transpose(0, 1)
        n, length, embed = x.shape
        q, k, v = self.in_proj(x).view(n, length, 3, self.heads, embed // self.heads).permute(2, 0, 3, 1, 4)
        mask = attn_mask
        if mask is not None:
            if mask.dtype == torch.bool:
                mask = ~mask  # nn.MultiheadAttention: True = masked; sdpa: True = attends
            if mask.dim() == 3:
                mask = mask.view(n, self.heads, length, -1)
        out = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal and mask is None)
        out = self.out_proj(out.transpose(1, 2).reshape(n, length, embed))
        return (out if self.batch_first else out.transpose(0, 1)), None


class _FusedProjections(nn.Module):
    """Sibling projections of one input (transformers' ``q_proj``/``k_proj``/``v_proj``) as one
    :class:`Int8Linear`: the input is quantised once and multiplied once, and each sibling
    gets its columns. Bit-identical to separate layers (per-channel weights, per-row inputs).

    The product is kept only until every sibling has taken its part from the same input
    object; any other call order just computes again.
    """

    def __init__(self, linears: list[nn.Linear], kernel: Int8Kernel | None = None) -> None:
        super().__init__()
        fused = _uninitialised_linear(linears[0].in_features, sum(lin.out_features for lin in linears))
        with torch.no_grad():
            fused.weight.copy_(torch.cat([lin.weight for lin in linears]))
            fused.bias.copy_(torch.cat([
                lin.bias if lin.bias is not None else torch.zeros(lin.out_features) for lin in linears
            ]))
        self.linear = Int8Linear(fused, kernel=kernel)
        ends = torch.tensor([lin.out_features for lin in linears]).cumsum(0).tolist()
        self.bounds = list(itertools.pairwise([0, *ends]))
        self._input: torch.Tensor | None = None
        self._output: torch.Tensor | None = None
        self._unserved: set[int] = set()

    def part(self, index: int, x: torch.Tensor) -> torch.Tensor:
        if x is not self._input or index not in self._unserved:
            self._output = self.linear(x)
            self._input, self._unserved = x, set(range(len(self.bounds)))
        self._unserved.discard(index)
        start, stop = self.bounds[index]
        out = self._output[..., start:stop]  # type: ignore[index]  # _output is set above or kept from the same _input
        if not self._unserved:
            self._input = self._output = None
        return out


class _ProjectionPart(nn.Module):
    def __init__(self, fused: _FusedProjections, index: int) -> None:
        super().__init__()
        self.fused = fused
        self.index = index
        self.in_features = fused.linear.in_features
        start, stop = fused.bounds[index]
        self.out_features = stop - start
        self.int8_original_dtype = torch.float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fused.part(self.index, x)


_SIBLING_PROJECTIONS = ("q_proj", "k_proj", "v_proj")


def _fuse_projections(root: nn.Module, kernel: Int8Kernel | None = None) -> None:
    for module in list(root.modules()):
        layers = [getattr(module, name, None) for name in _SIBLING_PROJECTIONS]
        if all(type(layer) is nn.Linear for layer in layers) and (
            len({layer.in_features for layer in layers}) == 1  # type: ignore[union-attr]  # all() above ruled out None
        ):
            fused = _FusedProjections(layers, kernel)  # type: ignore[arg-type]  # checked above: all three are nn.Linear
            for index, name in enumerate(_SIBLING_PROJECTIONS):
                setattr(module, name, _ProjectionPart(fused, index))


class _SiluInPlace(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.silu(x, inplace=True)


def _is_patch_conv(module: nn.Module) -> bool:
    return (
        type(module) is nn.Conv2d
        and tuple(module.stride) == tuple(module.kernel_size)
        and tuple(module.dilation) == (1, 1)
        and module.groups == 1
        and not isinstance(module.padding, str)
        and tuple(module.padding) == (0, 0)
    )


def _fold_quick_gelu(root: nn.Module, kernel: Int8Kernel) -> None:
    # quick_gelu(h) = silu(a h) / a: the first layer emits a h, the second takes silu(a h) and
    # divides by a in its scales.
    for module in list(root.modules()):
        for first, act, second in _MLP_NAMES:
            layers = [getattr(module, name, None) for name in (first, act, second)]
            if (
                type(layers[0]) is nn.Linear
                and type(layers[2]) is nn.Linear
                and type(layers[1]).__name__ in _QUICK_GELU
            ):
                setattr(module, first, Int8Linear(layers[0], out_scale=_QUICK_GELU_ALPHA, kernel=kernel))
                setattr(module, act, _SiluInPlace())
                # The activation's output (in place) is read by the second layer alone.
                setattr(module, second, Int8Linear(layers[2], in_scale=_QUICK_GELU_ALPHA, consumes_input=True, kernel=kernel))


def quantize_int8(module: Any, kernel: Int8Kernel | None = None) -> Any:
    """A CPU copy of ``module`` with every ``nn.Linear`` (exact type), ``nn.MultiheadAttention``
    (as self-attention) and patch-embedding ``Conv2d`` replaced by per-row int8 versions, all
    multiplying with ``kernel`` (this CPU's, :func:`current_kernel`, by default); for inference only."""
    kernel = kernel if kernel is not None else current_kernel()
    root = copy.deepcopy(module).cpu().eval()
    _fold_quick_gelu(root, kernel)
    _fuse_projections(root, kernel)
    for parent in list(root.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, Int8Linear(child, kernel=kernel))
            elif Int8SelfAttention.supports(child):
                setattr(parent, name, Int8SelfAttention(child, kernel))
            elif _is_patch_conv(child):
                setattr(parent, name, Int8PatchEmbedding(child, kernel))
    return root


__all__ = [
    "Int8Linear",
    "Int8PatchEmbedding",
    "Int8SelfAttention",
    "current_kernel",
    "full_codes_saturate",
    "quantize_int8",
    "quantize_rows",
    "quantize_weight",
]
