"""open_clip models behind the same :class:`~retrieval.encoders.base.Encoder` interface.

A model is named ``open_clip:`` followed by one of::

    ARCH/TAG                  built-in architecture with open_clip's pretrained weights
                              (e.g. ViT-B-32/laion2b_s34b_b79k; cached or downloaded)
    ARCH@/path/weights.pt     built-in architecture with local weights
    ARCH/TAG@/path/weights    local copy of TAG's weights, with TAG's preprocessing
    /path/arch.json@/path/w   an architecture given as an open_clip model-config JSON file
    hf-hub:ORG/NAME           an open_clip repository on the Hugging Face Hub
    local-dir:/path/dir       a directory with open_clip_config.json and the weights

The package's modules, the only ones in clipsearch that import open_clip (and only when a
model is used, never at import):

- :mod:`.names`: the name syntax (:func:`parse_spec`, :class:`OpenClipSpec`) and lookups
  in open_clip's registry of architectures and tags;
- :mod:`.hub`: fetching config and weights files, the local cache first, the network only
  when it can be reached;
- :mod:`.encoder`: :class:`OpenClipEncoder`;
- :mod:`.quiet`: keeping open_clip's logging off the user's terminal.
"""

from __future__ import annotations

from .encoder import OpenClipEncoder
from .names import PREFIX, OpenClipSpec, is_open_clip_name, parse_spec

__all__ = ["OpenClipEncoder", "OpenClipSpec", "PREFIX", "is_open_clip_name", "parse_spec"]
