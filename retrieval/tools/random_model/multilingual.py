"""Writing a random open_clip checkpoint with a multilingual Hugging Face text tower, laid out
like open_clip's ``xlm-roberta-base-ViT-B-32`` (preset ``xlm-roberta-tiny``) or
``nllb-clip-base`` (``nllb-clip-tiny``), as an open_clip ``local-dir:`` folder.

The folder holds ``open_clip_config.json`` (its ``text_cfg`` names the folder itself as the
Hugging Face model and tokenizer, so nothing is fetched), ``config.json`` (an
``XLMRobertaConfig`` or ``M2M100Config``), the tokenizer files and
``open_clip_pytorch_model.bin``. The layout is real; the weights and the vocabularies are not:
XLM-R's and NLLB's 250,000-piece vocabularies cannot be rebuilt offline, so each tokenizer is
the real transformers class (``XLMRobertaTokenizer``, a Unigram model; ``NllbTokenizer`` with
its 202 FLORES-200 language tokens) over a small vocabulary with pieces in several scripts.
Load it as ``open_clip:local-dir:FOLDER``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import InvalidArgumentError

# Pieces in the scripts the tests query in, so that those texts are not all <unk>.
_PIECES: tuple[str, ...] = (
    "▁a", "▁photo", "▁of", "▁the", "▁cat", "▁dog", "▁猫", "猫", "狗", "▁кот", "кот", "▁قطة", "قطة", "🐱",
)
_LETTERS = "abcdefghijklmnopqrstuvwxyz0123456789"


@dataclass(frozen=True)
class RandomMultilingualSpec:
    """Shapes of a tiny open_clip model with a Hugging Face text tower."""

    text: str  # "xlm-roberta" or "nllb"
    embed_dim: int = 16
    width: int = 32
    layers: int = 2
    heads: int = 2
    context_length: int = 32
    image_size: int = 32


MULTILINGUAL_PRESETS: dict[str, RandomMultilingualSpec] = {
    "xlm-roberta-tiny": RandomMultilingualSpec("xlm-roberta"),
    "nllb-clip-tiny": RandomMultilingualSpec("nllb"),
}


def make_random_multilingual(out_dir: str | os.PathLike[str], preset: str = "nllb-clip-tiny", seed: int = 0) -> Path:
    """Write a random open_clip checkpoint with a multilingual text tower into ``out_dir``.

    Returns:
        The folder (load it as ``open_clip:local-dir:FOLDER``).

    Raises:
        InvalidArgumentError: an unknown preset.
    """
    if preset not in MULTILINGUAL_PRESETS:
        raise InvalidArgumentError(f"unknown preset {preset!r}; choose one of {', '.join(MULTILINGUAL_PRESETS)}")
    from ...encoders.openclip import write_random_weights

    spec = MULTILINGUAL_PRESETS[preset]
    folder = Path(out_dir).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    text_cfg = _write_text_side(spec, folder)
    model_cfg = {
        "embed_dim": spec.embed_dim,
        "vision_cfg": {"image_size": spec.image_size, "layers": 1, "width": 64, "head_width": 32, "patch_size": 16},
        "text_cfg": text_cfg,
    }
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": model_cfg, "preprocess_cfg": {}}, indent=2), encoding="utf-8")
    write_random_weights(folder, seed)
    return folder


def _write_text_side(spec: RandomMultilingualSpec, folder: Path) -> dict[str, Any]:
    """The tokenizer and the Hugging Face config in ``folder``; the open_clip ``text_cfg`` naming them."""
    from transformers import M2M100Config, NllbTokenizer, XLMRobertaConfig, XLMRobertaTokenizer

    pieces = ["▁", *_PIECES, *(f"▁{c}" for c in _LETTERS), *_LETTERS]
    common = {"hf_model_name": str(folder), "hf_tokenizer_name": str(folder), "context_length": spec.context_length}
    if spec.text == "xlm-roberta":
        # XLM-R's specials first, in its id order; <mask> last, as in the real vocabulary.
        vocab = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
        vocab += [(p, -float(len(p))) for p in dict.fromkeys(pieces)] + [("<mask>", 0.0)]
        tokenizer: Any = XLMRobertaTokenizer(vocab=vocab)
        config: Any = XLMRobertaConfig(
            vocab_size=len(tokenizer), hidden_size=spec.width, num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
            intermediate_size=2 * spec.width, max_position_embeddings=spec.context_length + 2, pad_token_id=1,
        )
        text_cfg = {**common, "hf_pooler_type": "mean_pooler", "hf_proj_type": "mlp"}
    else:
        ids = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
        for p in pieces:
            ids.setdefault(p, len(ids))
        tokenizer = NllbTokenizer(vocab=ids, merges=[])
        config = M2M100Config(
            vocab_size=len(tokenizer), d_model=spec.width, encoder_layers=spec.layers, decoder_layers=1,
            encoder_attention_heads=spec.heads, decoder_attention_heads=spec.heads, encoder_ffn_dim=2 * spec.width,
            decoder_ffn_dim=2 * spec.width, max_position_embeddings=spec.context_length, pad_token_id=1, bos_token_id=0,
            eos_token_id=2,
        )
        text_cfg = {**common, "hf_pooler_type": "cls_pooler", "hf_proj_type": "linear"}
    tokenizer.save_pretrained(folder)
    config.save_pretrained(folder)
    return text_cfg


__all__ = ["MULTILINGUAL_PRESETS", "RandomMultilingualSpec", "make_random_multilingual"]
