"""How many images one forward pass of a CPU image tower takes.

A build hands the encoder batches of ``--batch-size`` images (64 by default), which suits a GPU
and the decoders. On the CPU, one forward pass over all of them allocates activations of
``images x tokens x width`` floats per layer, afresh for every layer: a ViT's MLP activations
at that batch size run to tens of megabytes, and glibc serves every block over its mmap threshold
(at most 32 MB) with fresh pages from the kernel, which zeroes each on first touch and takes them
back at ``free``: page faults, time in which no product runs (measured in ``benchmarks/README.md``,
"Page faults"). Below the threshold, freed blocks are reused.
A build also keeps freed memory in the process (:mod:`indexer.heap`); this bound holds for every
other caller too (the Python API, image queries, the server), without touching malloc's settings.

So CPU towers run a batch as several calls of :func:`images_per_call` images each, which keeps
the widest activation of a call within :data:`CPU_CALL_BYTES`. Nothing about a vector changes
beyond what the batch size already changes: int8 towers give bit-identical vectors in any batch
(per-row arithmetic), fp32 ones vary in the last bits with the batch size as torch's do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

# Half of glibc's largest mmap threshold (32 MB on 64-bit), so that every activation of a call,
# and the int8 codes beside it, stay in reused heap memory.
CPU_CALL_BYTES = 16 << 20


def images_per_call(tokens: int, width: int, limit: int = CPU_CALL_BYTES) -> int:
    """Images per forward pass whose widest float32 activation (``tokens x width`` per image)
    fits in ``limit`` bytes; at least 1."""
    if tokens < 1 or width < 1:
        raise ValueError("tokens and width must be >= 1")
    return max(1, limit // (tokens * width * 4))


def grid_tokens(pixel_values: torch.Tensor, patch: tuple[int, int]) -> int:
    """Tokens per image of a ViT on ``pixel_values``: its patch grid plus the class token."""
    return (int(pixel_values.shape[-2]) // patch[0]) * (int(pixel_values.shape[-1]) // patch[1]) + 1


def in_calls(pixel_values: torch.Tensor, per_call: int, embed: Callable[[torch.Tensor], np.ndarray]) -> np.ndarray:
    """``embed`` over ``pixel_values`` in calls of at most ``per_call`` images (as even as the
    count allows: 64 at 27 per call is 22 + 21 + 21, not 27 + 27 + 10), rows in order."""
    n = len(pixel_values)
    if n <= per_call:
        return embed(pixel_values)
    import torch

    return np.concatenate([embed(part) for part in torch.tensor_split(pixel_values, -(-n // per_call))])


__all__ = ["CPU_CALL_BYTES", "grid_tokens", "images_per_call", "in_calls"]
