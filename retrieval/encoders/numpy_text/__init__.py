"""A query-only CLIP text tower in plain numpy: text queries without importing torch.

``CLIPTextModelWithProjection``'s forward pass (:mod:`.tower`) from the checkpoint's own files:
its ``tokenizer.json`` set up as transformers' ``CLIPTokenizer`` sets it up
(:mod:`.clip_tokenizer`), its safetensors weights memory-mapped (:mod:`.weights`), and with
precision ``int8`` or ``auto`` the matrix products on torch's int8 kernels (:mod:`.int8`, the
only module that imports torch). Each text runs alone at its own length up to the pooled token,
so its vector depends on that text only. Which path a query takes, and where the fp32 forward
pass runs: :mod:`retrieval.encoders.text_choice`; what falls back to torch: docs/performance.md.
"""

from __future__ import annotations

from ..chooser import TEXT_PATH_ENV
from ..text_choice import TextPath, fast_path_refusal, local_checkpoint, text_path
from .clip_tokenizer import load_clip_tokenizer
from .encoder import NumpyTextEncoder
from .tower import NumpyTextTower
from .tower_config import ACTIVATIONS, TextTowerConfig, UnsupportedTextTower, check_text_config
from .weights import SafetensorsReader

__all__ = [
    "ACTIVATIONS",
    "NumpyTextEncoder",
    "NumpyTextTower",
    "SafetensorsReader",
    "TEXT_PATH_ENV",
    "TextPath",
    "TextTowerConfig",
    "UnsupportedTextTower",
    "check_text_config",
    "fast_path_refusal",
    "load_clip_tokenizer",
    "local_checkpoint",
    "text_path",
]
