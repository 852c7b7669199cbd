"""int8 inference for CLIP towers on the CPU that keeps every vector a function of its input alone.

``torch.ao``'s dynamic quantisation scales a layer's activations per batch, so an image's vector
would move with its batch-mates and an update could not equal a rebuild. Here every *row*
(token) gets its own scale: int8 weights per output channel and uint8 activation codes per row
(:mod:`.codes`), 8-bit codes where the CPU has int8 dot products and 7-bit where its kernels
would saturate (:func:`current_kernel`), products on oneDNN's uint8 x int8 linear or
``torch._int_mm`` (:mod:`.linear`). Integer sums are exact and every float step is per row, so
a row's result is bit-identical in any batch (tested; open_clip's final projection, a float32
product, still rounds with the batch size, as in fp32). Patch embeddings, open_clip's
self-attention, sibling q/k/v projections and quick-GELU MLPs are converted too
(:mod:`.modules`, :mod:`.convert`), so no large float product is left whose rounding depends on
the batch. The scheme and its measurements: docs/performance.md ("Precision modes").

Every module here imports torch; :mod:`retrieval.encoders.precision` imports this package only
when an int8 tower is made.
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
