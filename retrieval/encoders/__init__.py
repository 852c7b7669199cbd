"""CLIP encoders: a model name in, L2-normalised float32 vectors out.

Only this package imports torch, transformers and open_clip (and only when a model is used,
never at import). Vectors are normalised here, once, so that inner product is cosine
similarity everywhere else. Backends, behind the one :class:`Encoder` interface:

- ``hf`` (:mod:`.hf`): Hugging Face CLIP and SigLIP checkpoints (``model_type`` ``clip``,
  ``siglip``, which includes SigLIP 2 FixRes, or ``siglip2``, SigLIP 2 NaFlex), by hub id or
  local directory; every name without a backend prefix.
- ``open_clip`` (:mod:`.openclip`): names starting with ``open_clip:``, e.g.
  ``open_clip:ViT-B-32/laion2b_s34b_b79k`` or ``open_clip:ViT-B-32@/path/to/weights.pt``.

Beside them, :mod:`.numpy_text` runs the fp32 text tower of a Hugging Face CLIP checkpoint in
numpy, without torch: what a text search uses where the checkpoint allows it (see
``ImageIndex.text_path``).
"""

from __future__ import annotations

from .base import Encoder, TextEncoder, file_sha256, hub_reachable, l2_normalize, resolve_device
from .hf import (
    DEFAULT_MODEL,
    HFClipEncoder,
    ImageProcessorConfig,
    checkpoint_fingerprint,
    read_image_processor_config,
    resolve_checkpoint,
)
from .openclip import OpenClipEncoder, is_open_clip_name
from .precision import MODES, PRECISIONS, GateResult, Mode, Precision, parse_mode, parse_precision


def load_encoder(model: str = DEFAULT_MODEL, device: str = "auto", precision: str = "fp32") -> Encoder:
    """Open the encoder for ``model``: ``open_clip:...`` names open_clip, anything else Hugging Face.

    Args:
        model: a Hugging Face hub id or checkpoint directory, or an ``open_clip:`` name.
        device: ``auto`` (CUDA when available), ``cpu`` or ``cuda[:N]``.
        precision: ``fp32`` (exact), ``bf16``, ``fp16``, ``int8`` or ``auto`` (the fastest mode
            that passes the quality gate), for both towers; see :mod:`.precision`.

    Returns:
        An encoder whose weights load on first use.

    Raises:
        ModelLoadError: the model cannot be found, fetched or understood.
        InvalidArgumentError: a malformed name, a bad device or precision.
    """
    # Each backend's ``load`` is a public entry too and parses ``precision`` first thing, so
    # it is checked there, once, before anything else.
    if is_open_clip_name(model):
        return OpenClipEncoder.load(model, device=device, precision=precision)
    return HFClipEncoder.load(model, device=device, precision=precision)


__all__ = [
    "DEFAULT_MODEL",
    "Encoder",
    "GateResult",
    "HFClipEncoder",
    "ImageProcessorConfig",
    "MODES",
    "Mode",
    "OpenClipEncoder",
    "PRECISIONS",
    "Precision",
    "TextEncoder",
    "checkpoint_fingerprint",
    "file_sha256",
    "hub_reachable",
    "l2_normalize",
    "load_encoder",
    "parse_mode",
    "parse_precision",
    "read_image_processor_config",
    "resolve_checkpoint",
    "resolve_device",
]
