"""The quantisation maths: int8 weight codes per output channel, uint8 activation codes per row."""

from __future__ import annotations

import torch

# Steps per row range. 8-bit codes: 254, not 255, so that round(x / scale) + zero provably
# stays in 0..255 (float error in x / scale is far below the half step left over) and no clamp
# pass is needed. 7-bit codes (0..126, same reasoning) where the CPU has no int8 dot product:
# its kernels sum uint8 x int8 pairs in 16 bits with saturation (``vpmaddubsw``; oneDNN's
# "nuances of int8 computations"), and 2 * 126 * 127 stays below 2**15 - 1.
FULL_STEPS = 254
REDUCED_STEPS = 126


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel symmetric int8 codes of a ``(out, in)`` weight and their scales."""
    w = weight.detach().to(torch.float32)
    scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127.0
    codes = torch.div(w, scale[:, None]).round_().clamp_(-127, 127).to(torch.int8)
    return codes, scale


def shifted_row_codes(
    x: torch.Tensor, *, steps: int = FULL_STEPS, in_place: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`quantize_rows`'s codes as int8, shifted by -128 for 8-bit codes (as they are for 7-bit).

    A float -> int8 conversion is faster than float -> uint8, hence the shift. ``in_place``
    overwrites ``x`` (for an input nobody reads afterwards). Returns ``(shifted, scale, zero)``.
    """
    # amin and amax separately: aminmax over a dimension is slower on the CPU.
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
    shifted, scale, zero = shifted_row_codes(x, steps=steps)
    codes = shifted.view(torch.uint8)
    return (codes.bitwise_xor_(128) if steps == FULL_STEPS else codes), scale, zero
