"""``quantize_int8``: a float tower copied with its float products replaced by per-row int8 ones."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from .kernel import Int8Kernel
from .linear import Int8Linear, current_kernel
from .modules import FusedProjections, Int8PatchEmbedding, Int8SelfAttention, ProjectionPart

# Activations CLIP writes as x * sigmoid(1.702 x): transformers' and open_clip's classes.
_QUICK_GELU = ("QuickGELUActivation", "QuickGELU")
_QUICK_GELU_ALPHA = 1.702
# (first layer, activation, second layer) attribute names of an MLP: transformers, open_clip.
_MLP_NAMES = (("fc1", "activation_fn", "fc2"), ("c_fc", "gelu", "c_proj"))

_SIBLING_PROJECTIONS = ("q_proj", "k_proj", "v_proj")


def fuse_projections(root: nn.Module, kernel: Int8Kernel | None = None) -> None:
    """Replace, in place, every module's ``q_proj``/``k_proj``/``v_proj`` of one input width by
    parts of one :class:`~.modules.FusedProjections`."""
    for module in list(root.modules()):
        layers = [getattr(module, name, None) for name in _SIBLING_PROJECTIONS]
        if all(type(layer) is nn.Linear for layer in layers) and (
            len({layer.in_features for layer in layers}) == 1  # type: ignore[union-attr]  # all() above ruled out None
        ):
            fused = FusedProjections(layers, kernel)  # type: ignore[arg-type]  # checked above: all three are nn.Linear
            for index, name in enumerate(_SIBLING_PROJECTIONS):
                setattr(module, name, ProjectionPart(fused, index))


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


# Linear layers left in float32: SigLIP 2 NaFlex's patch embedding is a Linear whose caller reads
# its ``weight.dtype`` to cast the patches (Siglip2VisionEmbeddings), which an int8 layer has not.
_KEPT_LINEARS = frozenset({"patch_embedding"})


def quantize_int8(module: Any, kernel: Int8Kernel | None = None) -> Any:
    """A CPU copy of ``module`` with every ``nn.Linear`` (exact type), ``nn.MultiheadAttention``
    (as self-attention) and patch-embedding ``Conv2d`` replaced by per-row int8 versions, all
    multiplying with ``kernel`` (this CPU's, :func:`current_kernel`, by default); for inference only."""
    kernel = kernel if kernel is not None else current_kernel()
    root = copy.deepcopy(module).cpu().eval()
    _fold_quick_gelu(root, kernel)
    fuse_projections(root, kernel)
    for parent in list(root.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and name in _KEPT_LINEARS:
                continue
            if type(child) is nn.Linear:
                setattr(parent, name, Int8Linear(child, kernel=kernel))
            elif Int8SelfAttention.supports(child):
                setattr(parent, name, Int8SelfAttention(child, kernel))
            elif _is_patch_conv(child):
                setattr(parent, name, Int8PatchEmbedding(child, kernel))
    return root
