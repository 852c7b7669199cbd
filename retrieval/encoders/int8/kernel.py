"""Which int8 product this process runs: oneDNN's or ``torch._int_mm``, 8-bit or 7-bit activation codes."""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass

import torch
from torch import nn

from .codes import FULL_STEPS, REDUCED_STEPS


@dataclass(frozen=True)
class Int8Kernel:
    """How an :class:`~.linear.Int8Linear` multiplies: fixed when the layer is made, so that a
    model's arithmetic (and so its vectors) does not change while it runs.

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
    # The probe runs the layer the model will run, so it measures exactly that arithmetic; the
    # layer module imports this one for its default kernel, hence the import here.
    from .linear import Int8Linear

    layer = nn.Linear(64, 16, bias=False)
    with torch.no_grad():
        layer.weight.fill_(1.0)
    try:
        with torch.inference_mode():
            out = Int8Linear(layer, kernel=Int8Kernel(onednn=onednn, steps=FULL_STEPS))(torch.ones(2, 64))
    except RuntimeError:
        return True  # the kernel cannot run at all: never choose it for 8-bit codes
    return not bool(torch.allclose(out, torch.full_like(out, 64.0), rtol=1e-3))


@functools.lru_cache(maxsize=1)
def onednn_available() -> bool:
    """Whether oneDNN's int8 linear (uint8 x int8 -> float, dequantised in the kernel) exists here."""
    if platform.machine().lower() not in ("x86_64", "amd64") or not torch.backends.mkldnn.is_available():
        return False
    try:
        torch.ops.onednn.qlinear_pointwise  # noqa: B018 - raises where this build lacks the op
    except (AttributeError, RuntimeError):
        return False
    return True
