"""A query-only CLIP text tower in plain numpy (being split into modules; see encoder.py)."""

from __future__ import annotations

from .encoder import (
    ACTIVATIONS,
    TEXT_PATH_ENV,
    NumpyTextEncoder,
    NumpyTextTower,
    SafetensorsReader,
    TextPath,
    TextTowerConfig,
    UnsupportedTextTower,
    check_text_config,
    fast_path_refusal,
    load_clip_tokenizer,
    local_checkpoint,
    text_path,
)

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
