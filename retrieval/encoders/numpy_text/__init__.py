"""A query-only CLIP text tower in plain numpy: text queries without importing torch.

Importing torch and transformers takes seconds; the text tower of ``clipsearch search INDEX
"a banana"`` takes milliseconds. This package runs ``CLIPTextModelWithProjection``'s forward
pass from the checkpoint's own files (:mod:`.tower`): the tokenizer is the checkpoint's
``tokenizer.json`` set up as transformers' ``CLIPTokenizer`` sets it up (:mod:`.clip_tokenizer`),
the weights are memory-mapped from its safetensors files (:mod:`.weights`), and with precision
``int8`` or ``auto`` the matrix products may run on torch's int8 kernels (:mod:`.int8`, the only
module that imports torch, and only when an int8 tower is made). Each text runs alone at its own
length up to the pooled token, so its vector depends on that text only.

Only checkpoints whose configuration this fully understands take this path
(:func:`check_text_config`); which path a query takes, and where the fp32 forward pass runs
(numpy or ONNX Runtime), is :mod:`retrieval.encoders.text_choice`'s to say.
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
