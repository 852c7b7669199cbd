"""Hugging Face CLIP checkpoints: a hub id or a local directory in, normalised vectors out.

The package's modules:

- :mod:`.checkpoint`: finding a checkpoint's directory (local, the Hub cache, the Hub when it
  can be reached, with the offline message otherwise) and fingerprinting its weight files;
- :mod:`.processor`: its ``CLIPImageProcessor`` settings, from either file layout;
- :mod:`.encoder`: :class:`HFClipEncoder`, whose towers load on first use.
"""

from __future__ import annotations

from .checkpoint import checkpoint_fingerprint, looks_like_path, resolve_checkpoint
from .encoder import DEFAULT_MODEL, HFClipEncoder
from .processor import PREPROCESSOR_FILE, PROCESSOR_FILE, ImageProcessorConfig, read_image_processor_config

__all__ = [
    "DEFAULT_MODEL",
    "PREPROCESSOR_FILE",
    "PROCESSOR_FILE",
    "HFClipEncoder",
    "ImageProcessorConfig",
    "checkpoint_fingerprint",
    "looks_like_path",
    "read_image_processor_config",
    "resolve_checkpoint",
]
