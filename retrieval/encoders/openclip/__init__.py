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

:func:`write_random_weights` gives a ``local-dir:`` folder random weights (for the offline
test checkpoints of :mod:`retrieval.tools.random_model`).
"""

from __future__ import annotations

import os
from pathlib import Path

from .encoder import OpenClipEncoder
from .names import PREFIX, OpenClipSpec, is_open_clip_name, parse_spec
from .quiet import _quiet_open_clip


def write_random_weights(folder: str | os.PathLike[str], seed: int = 0) -> Path:
    """Write randomly initialised weights (``open_clip_pytorch_model.bin``) for the
    ``open_clip_config.json`` in ``folder``, whose Hugging Face text tower (if any) is read from
    local files, not fetched. Returns the weights file."""
    import open_clip
    import torch

    torch.manual_seed(seed)
    with _quiet_open_clip():
        model = open_clip.create_model(f"local-dir:{folder}", load_weights=False, pretrained_text=False)
    out = Path(folder) / "open_clip_pytorch_model.bin"
    torch.save(model.state_dict(), out)
    return out


__all__ = ["write_random_weights", "OpenClipEncoder", "OpenClipSpec", "PREFIX", "is_open_clip_name", "parse_spec"]
