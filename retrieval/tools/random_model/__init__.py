"""Randomly initialised Hugging Face CLIP checkpoints, built offline, with the real CLIP tokenizer.

Tests, benchmarks and the offline demo need a checkpoint directory that loads exactly like
``openai/clip-vit-base-patch32`` (``CLIPModel``, ``CLIP*ModelWithProjection``, ``CLIPProcessor``,
``AutoTokenizer``) without network access. The weights here are random, but everything around
them is real:

* the tokenizer is OpenAI's CLIP BPE (49,408 ids), rebuilt from the vocabulary file that
  ``open_clip`` ships (``bpe_simple_vocab_16e6.txt.gz``), so token ids equal ``open_clip``'s
  (where they differ and why: :mod:`.tokenizer`);
* the image processor uses OpenAI's resize / crop / mean / std settings;
* the text config's ``eos_token_id`` is the tokenizer's end-of-text id, so the text tower pools
  at the first end-of-text token, also in batches padded with end-of-text.

The package's modules:

- :mod:`.specs`: :class:`RandomClipSpec` and the :data:`PRESETS`, as data;
- :mod:`.tokenizer`: the CLIP tokenizer rebuilt from open_clip's BPE file;
- :mod:`.checkpoint`: :func:`clip_config` and :func:`make_random_clip`, which writes a checkpoint;
- :mod:`.siglip`: :func:`make_random_siglip`, a SigLIP checkpoint laid out like SigLIP 2 FixRes
  (``SiglipModel``, ``SiglipProcessor``, a small Gemma-style tokenizer: see the module);
- :mod:`.cli`: the command line.

Nothing is imported from torch / transformers / open_clip at import time: importing this package
must stay free for code that only wants :data:`PRESETS`.

Command line::

    python -m retrieval.tools.random_model OUT_DIR [--preset tiny|vit-b-32|vit-l-14|siglip-tiny] [--seed 0]
"""

from __future__ import annotations

from .cli import main
from .offline_tokenizer import (
    BOS_TOKEN,
    BOS_TOKEN_ID,
    CLIP_NUM_MERGES,
    CLIP_VOCAB_SIZE,
    EOS_TOKEN,
    EOS_TOKEN_ID,
    build_clip_tokenizer,
    clean_text_like_open_clip,
)
from .random_clip import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, PROCESSOR_LAYOUTS, clip_config, make_random_clip
from .siglip import SIGLIP_PRESETS, RandomSiglipSpec, make_random_siglip
from .specs import PRESETS, RandomClipSpec

__all__ = [
    "BOS_TOKEN",
    "BOS_TOKEN_ID",
    "CLIP_NUM_MERGES",
    "CLIP_VOCAB_SIZE",
    "EOS_TOKEN",
    "EOS_TOKEN_ID",
    "OPENAI_CLIP_MEAN",
    "OPENAI_CLIP_STD",
    "PRESETS",
    "PROCESSOR_LAYOUTS",
    "RandomClipSpec",
    "RandomSiglipSpec",
    "SIGLIP_PRESETS",
    "build_clip_tokenizer",
    "clean_text_like_open_clip",
    "clip_config",
    "main",
    "make_random_clip",
    "make_random_siglip",
]
