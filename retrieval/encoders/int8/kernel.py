"""An int8 product's kind: oneDNN's or ``torch._int_mm``, 8-bit or 7-bit activation codes; which one this
process runs is measured on the layer itself (:func:`.linear.current_kernel`)."""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass

import torch

from .codes import FULL_STEPS


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
