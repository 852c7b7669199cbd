"""int8 inference for CLIP towers on the CPU that keeps every vector a function of its input alone.

``torch.ao.quantization.quantize_dynamic`` (fbgemm) quantises a layer's activations with one
scale for the whole batch, so an image's vector would move with its batch-mates and an update
could not equal a rebuild. Here, as in torchao's ``int8_dynamic_activation_int8_weight``, every
*row* (token) gets its own scale:

- weights: int8, symmetric, one scale per output channel, quantised once;
- activations: uint8 codes per row, asymmetric (``scale = (max - min) / 254``, min and max
  widened to include 0), the zero point folded into a rank-one correction after the product;
- products: oneDNN's uint8 x int8 linear (``torch.ops.onednn.qlinear_pointwise``), which
  applies the weight scales in the kernel and returns float32; ``torch._int_mm`` where that op
  is missing (not x86);
- activation codes: 8 bits where the CPU has int8 dot products, else 7 bits, which keep the
  integer sums exact in kernels that saturate (:mod:`.codes`, :func:`current_kernel`);
- integer accumulation is exact whatever the blocking, and every float step is per row, so a
  row's result is bit-identical in any batch (tested, transformers' CLIP), not just close. In
  open_clip's towers the final projection (``x @ proj``, a float32 product) still rounds with
  the batch size, as in fp32; every int8 layer before it sees the same codes.

Also converted: a patch-embedding ``Conv2d`` whose stride equals its kernel (a matrix product over
unfolded patches) and open_clip's ``nn.MultiheadAttention`` self-attention, so no large float
product is left whose rounding depends on the batch; and a quick-GELU MLP
(``x * sigmoid(1.702 x)``, CLIP's activation) becomes ``silu`` in place, with the 1.702 folded
into the two layers' scales (per-row quantisation does not see a row's scale). transformers'
q/k/v projections share one quantised input and one product.

Every module here imports torch; :mod:`retrieval.encoders.precision` imports this package only
when an int8 tower is made. Measured speed and accuracy against fp32 and other int8 schemes: docs/performance.md.
"""

from __future__ import annotations

from .codes import FULL_STEPS, REDUCED_STEPS, quantize_rows, quantize_weight
from .convert import quantize_int8
from .kernel import Int8Kernel
from .linear import Int8Linear, current_kernel, full_codes_saturate
from .modules import Int8PatchEmbedding, Int8SelfAttention

__all__ = [
    "FULL_STEPS",
    "REDUCED_STEPS",
    "Int8Kernel",
    "Int8Linear",
    "Int8PatchEmbedding",
    "Int8SelfAttention",
    "current_kernel",
    "full_codes_saturate",
    "quantize_int8",
    "quantize_rows",
    "quantize_weight",
]
