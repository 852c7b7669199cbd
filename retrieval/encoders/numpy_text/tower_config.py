"""The text tower's configuration: which CLIP text towers the numpy path computes.

A checkpoint's ``config.json`` is read into a :class:`TextTowerConfig`; anything this package
does not compute raises :class:`UnsupportedTextTower`, and the caller falls back to torch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The activations of transformers' ACT2FN this tower computes (the ones CLIP checkpoints use).
ACTIVATIONS: tuple[str, ...] = ("quick_gelu", "gelu")
# transformers' pooling switch: with this eos_token_id it pools at the argmax of the ids.
LEGACY_EOS_TOKEN_ID = 2


class UnsupportedTextTower(Exception):
    """The checkpoint's text tower is not one this package computes; the message says why.

    Not a :class:`~retrieval.errors.ClipSearchError`: callers fall back to the torch path.
    """


@dataclass(frozen=True)
class TextTowerConfig:
    """The shapes and conventions of a Hugging Face CLIP text tower (``text_config``).

    Attributes:
        hidden_size: width of the residual stream.
        num_heads: attention heads.
        num_layers: transformer blocks.
        intermediate_size: width of the MLP.
        hidden_act: the MLP's activation, one of :data:`ACTIVATIONS`.
        layer_norm_eps: LayerNorm epsilon.
        max_positions: the context length (``max_position_embeddings``).
        vocab_size: rows of the token embedding.
        eos_token_id: the id the pooled token is found by (2: transformers' legacy argmax).
        projection_dim: width of the output vector.
    """

    hidden_size: int
    num_heads: int
    num_layers: int
    intermediate_size: int
    hidden_act: str
    layer_norm_eps: float
    max_positions: int
    vocab_size: int
    eos_token_id: int
    projection_dim: int

    def __post_init__(self) -> None:
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"activation {self.hidden_act!r} (handled: {', '.join(ACTIVATIONS)})")
        if self.num_heads < 1 or self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by {self.num_heads} heads")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def legacy_pooling(self) -> bool:
        """Whether transformers pools at the argmax of the ids (``eos_token_id == 2``)."""
        return self.eos_token_id == LEGACY_EOS_TOKEN_ID


def check_text_config(config: Mapping[str, Any]) -> TextTowerConfig:
    """Read a checkpoint's ``config.json`` into a :class:`TextTowerConfig`.

    transformers' ``CLIPTextConfig`` defaults fill absent keys, as ``from_pretrained`` does.

    Raises:
        UnsupportedTextTower: not a CLIP checkpoint, or a text tower this package does not compute.
    """
    if config.get("model_type") != "clip":
        raise UnsupportedTextTower(f"model_type {config.get('model_type')!r} is not 'clip' (the numpy text tower computes CLIP's only)")
    text = config.get("text_config") or {}
    if not isinstance(text, Mapping):
        raise UnsupportedTextTower("text_config is not an object")
    if text.get("model_type", "clip_text_model") != "clip_text_model":
        raise UnsupportedTextTower(f"text model_type {text.get('model_type')!r}")
    projection = config.get("projection_dim", 512)
    if int(text.get("projection_dim", projection)) != int(projection):
        # CLIPModel and CLIPTextModelWithProjection would disagree on the projection's width.
        raise UnsupportedTextTower("text_config.projection_dim differs from projection_dim")
    try:
        return TextTowerConfig(
            hidden_size=int(text.get("hidden_size", 512)),
            num_heads=int(text.get("num_attention_heads", 8)),
            num_layers=int(text.get("num_hidden_layers", 12)),
            intermediate_size=int(text.get("intermediate_size", 2048)),
            hidden_act=str(text.get("hidden_act", "quick_gelu")),
            layer_norm_eps=float(text.get("layer_norm_eps", 1e-5)),
            max_positions=int(text.get("max_position_embeddings", 77)),
            vocab_size=int(text.get("vocab_size", 49408)),
            eos_token_id=int(text.get("eos_token_id", 49407)),
            projection_dim=int(projection),
        )
    except (TypeError, ValueError) as exc:
        raise UnsupportedTextTower(f"text_config: {exc}") from exc


def read_checkpoint_config(directory: Path) -> TextTowerConfig:
    """:func:`check_text_config` of ``directory/config.json``.

    Raises:
        UnsupportedTextTower: unreadable config or an unsupported text tower.
    """
    try:
        config = json.loads((directory / "config.json").read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise UnsupportedTextTower(f"unreadable config.json: {exc}") from exc
    if not isinstance(config, dict):
        raise UnsupportedTextTower("config.json is not an object")
    return check_text_config(config)
