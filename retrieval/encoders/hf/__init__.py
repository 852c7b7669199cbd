"""Hugging Face CLIP and SigLIP checkpoints: a hub id or a local directory in, normalised vectors out.

The package's modules:

- :mod:`.checkpoint`: finding a checkpoint's directory (local, the Hub cache, the Hub when it
  can be reached, with the offline message otherwise) and fingerprinting its weight files;
- :mod:`.family`: the model families (CLIP, SigLIP, SigLIP 2 NaFlex) as data: tower classes, text padding,
  scores; the refusal, naming the supported ones, of any other;
- :mod:`.processor`: its image processor settings, from either file layout;
- :mod:`.query_text`: text into the tokenizer unchanged, and the notice where the window cuts it;
- :mod:`.encoder`: :class:`HFClipEncoder`, whose towers load on first use.
"""

from __future__ import annotations

from .checkpoint import checkpoint_fingerprint, looks_like_path, resolve_checkpoint
from .encoder import DEFAULT_MODEL, HFClipEncoder
from .family import FAMILIES, Family, supported_families
from .processor import PREPROCESSOR_FILE, PROCESSOR_FILE, ImageProcessorConfig, read_image_processor_config

__all__ = [
    "DEFAULT_MODEL",
    "FAMILIES",
    "Family",
    "PREPROCESSOR_FILE",
    "PROCESSOR_FILE",
    "HFClipEncoder",
    "ImageProcessorConfig",
    "checkpoint_fingerprint",
    "looks_like_path",
    "read_image_processor_config",
    "resolve_checkpoint",
    "supported_families",
]
