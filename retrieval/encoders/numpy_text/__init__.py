"""A query-only CLIP text tower in plain numpy: text queries without importing torch.

Importing torch and transformers takes seconds; the text tower of ``clipsearch search INDEX
"a banana"`` takes milliseconds. This package runs the same tower from the checkpoint's own
files and needs neither:

- the tokenizer is the checkpoint's ``tokenizer.json`` through the ``tokenizers`` library, set
  up the way transformers 5's ``CLIPTokenizer`` sets it up (its normaliser, pre-tokeniser and
  BOS/EOS post-processor over the file's vocabulary and merges), truncated to the context length;
- the weights are read from ``model.safetensors`` (or its shards), memory-mapped: only the text
  tower's tensors, and of the token embedding only the rows a query uses;
- the forward pass is ``CLIPTextModelWithProjection``'s in float32 (or, with ``precision`` ``int8``
  or ``auto``, its 48 matrix products in int8 on torch's kernels, :mod:`.int8`): token + position
  embeddings, pre-LN blocks with causal self-attention (the tokenizer's mask on the keys),
  final LayerNorm, the pooled token (the first EOS, or transformers' legacy argmax for
  ``eos_token_id == 2``), projection. Each text runs at its own length up to the pooled token:
  the causal mask makes later positions irrelevant to it.

In a long-lived process the float32 forward pass runs on ONNX Runtime instead where it is
installed and its export of the tower matches these vectors (:func:`retrieval.encoders.text_choice.choose_text_runtime`);
the tokenizer, the truncation and the normalisation stay this package's.

Only checkpoints whose configuration this fully understands take this path (see
:func:`check_text_config`); everything else keeps the torch path, and :func:`text_path` says
which one a query would take and why. Vectors agree with the torch fp32 path to ~1e-6.

The package's modules (none imports torch but :mod:`.int8`, and it only when an int8 tower is
made; ``tokenizers`` and ``huggingface_hub`` only when a checkpoint is opened):

- :mod:`.tower_config`: :class:`TextTowerConfig`, :func:`check_text_config`, :class:`UnsupportedTextTower`;
- :mod:`.weights`: :class:`SafetensorsReader` and loading the tower's tensors;
- :mod:`.clip_tokenizer`: :func:`load_clip_tokenizer`, CLIP's tokenizer rebuilt from ``tokenizer.json``;
- :mod:`.tower`: :class:`NumpyTextTower`, the forward pass;
- :mod:`.int8`: the int8 matrix products (torch's dynamic int8 linear), one query at a time;
- :mod:`.encoder`: :class:`NumpyTextEncoder`, what a text query runs;
- :mod:`.path`: :func:`local_checkpoint` and :func:`text_path`, which path a query takes.
"""

from __future__ import annotations

from ..chooser import TEXT_PATH_ENV
from .clip_tokenizer import load_clip_tokenizer
from .encoder import NumpyTextEncoder
from .path import TextPath, fast_path_refusal, local_checkpoint, text_path
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
