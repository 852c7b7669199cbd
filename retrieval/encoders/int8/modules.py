"""The int8 stand-ins for a tower's other float products: patch embedding, self-attention, and
sibling projections fused into one product."""

from __future__ import annotations

import itertools

import torch
from torch import nn

from .kernel import Int8Kernel
from .linear import Int8Linear, uninitialised_linear


class Int8PatchEmbedding(nn.Module):
    """A ``Conv2d`` with stride == kernel, no padding: an :class:`Int8Linear` over unfolded patches."""

    def __init__(self, conv: nn.Conv2d, kernel: Int8Kernel | None = None) -> None:
        super().__init__()
        self.kernel = tuple(conv.kernel_size)
        out_channels = conv.out_channels
        linear = uninitialised_linear(conv.weight[0].numel(), out_channels, bias=conv.bias is not None)
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
        in_proj = uninitialised_linear(embed, 3 * embed, bias=mha.in_proj_bias is not None)
        out_proj = uninitialised_linear(embed, embed, bias=mha.out_proj.bias is not None)
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


class FusedProjections(nn.Module):
    """Sibling projections of one input (transformers' ``q_proj``/``k_proj``/``v_proj``) as one
    :class:`Int8Linear`: the input is quantised once and multiplied once, and each sibling
    gets its columns. Bit-identical to separate layers (per-channel weights, per-row inputs).

    The product is kept only until every sibling has taken its part from the same input
    object; any other call order just computes again.
    """

    def __init__(self, linears: list[nn.Linear], kernel: Int8Kernel | None = None) -> None:
        super().__init__()
        fused = uninitialised_linear(linears[0].in_features, sum(lin.out_features for lin in linears))
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


class ProjectionPart(nn.Module):
    """One sibling's columns of a :class:`FusedProjections`, in that sibling's place."""

    def __init__(self, fused: FusedProjections, index: int) -> None:
        super().__init__()
        self.fused = fused
        self.index = index
        self.in_features = fused.linear.in_features
        start, stop = fused.bounds[index]
        self.out_features = stop - start
        self.int8_original_dtype = torch.float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fused.part(self.index, x)
