"""Writing a random SigLIP checkpoint, laid out like ``google/siglip2-base-patch16-224``
(preset ``siglip-tiny``) or ``google/siglip2-base-patch16-naflex`` (``siglip2-naflex-tiny``).

That checkpoint is SigLIP 2 in its fixed-resolution form: ``model_type`` ``siglip``
(``SiglipModel``), a ``SiglipImageProcessor`` (a squash resize to a square, mean and std 0.5,
no crop) and a Gemma tokenizer with a 64-token window, padded to it. The NaFlex one is
``model_type`` ``siglip2`` (``Siglip2Model``) with a ``Siglip2ImageProcessor`` (aspect kept, at
most ``max_num_patches`` patches). The layout is real; the
weights and the vocabulary are not: the Gemma vocabulary (256,000 pieces) cannot be rebuilt
offline, so the tokenizer here is a transformers ``GemmaTokenizer`` built from a small BPE
vocabulary with Gemma's special tokens (``<pad>`` 0, ``<eos>`` 1, ``<bos>`` 2, ``<unk>`` 3,
``<mask>`` 4) and byte fallback, so that any text in any script tokenizes (to bytes where the
vocabulary has no piece) exactly as a Gemma tokenizer would treat an unknown character.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...checks import is_int
from ...encoders.base import quiet_transformers
from ...errors import InvalidArgumentError

if TYPE_CHECKING:
    from transformers import Siglip2Config, SiglipConfig

# Gemma's special tokens, in Gemma's id order.
GEMMA_SPECIALS: tuple[str, ...] = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>")
# A few word pieces so that ordinary prompts are not only bytes: enough to exercise merges.
_WORDS: tuple[str, ...] = ("a", "photo", "of", "the", "cat", "dog", "car", "tree", "red", "blue", "sky", "house")
_BILINEAR_PIL = 2


@dataclass(frozen=True)
class RandomSiglipSpec:
    """Shapes of a SigLIP model; the text head projects to the vision width (``dim``)."""

    image_size: int
    patch_size: int
    dim: int
    layers: int
    heads: int
    intermediate: int
    max_length: int
    max_num_patches: int | None = None  # NaFlex (siglip2) when set

    def __post_init__(self) -> None:
        if self.image_size % self.patch_size or self.dim % self.heads:
            raise InvalidArgumentError("image_size must be a multiple of patch_size and dim of heads")


SIGLIP_PRESETS: dict[str, RandomSiglipSpec] = {
    # Small enough for every test that needs a SigLIP model; 64-token window as SigLIP 2.
    "siglip-tiny": RandomSiglipSpec(image_size=64, patch_size=16, dim=32, layers=2, heads=2, intermediate=64, max_length=64),
    # A 4x4 position grid interpolated to each image's grid of at most 256 patches (the real
    # checkpoints' budget, and what Siglip2Processor passes whatever the image processor says).
    "siglip2-naflex-tiny": RandomSiglipSpec(
        image_size=64, patch_size=16, dim=32, layers=2, heads=2, intermediate=64, max_length=64, max_num_patches=256
    ),
    # The towers' shapes of google/siglip2-base-patch16-224 and -naflex, for timings (the
    # vocabulary, hence the text embedding table, is this module's small one, not Gemma's).
    "siglip-b-16": RandomSiglipSpec(image_size=224, patch_size=16, dim=768, layers=12, heads=12, intermediate=3072, max_length=64),
    "siglip2-naflex-b-16": RandomSiglipSpec(
        image_size=256, patch_size=16, dim=768, layers=12, heads=12, intermediate=3072, max_length=64, max_num_patches=256
    ),
}


def build_gemma_like_tokenizer(max_length: int = 64) -> Any:
    """A ``GemmaTokenizer`` (transformers 5, tokenizers backend) over a small byte-fallback BPE."""
    from transformers import GemmaTokenizer

    vocab: dict[str, int] = {tok: i for i, tok in enumerate(GEMMA_SPECIALS)}
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    merges: list[tuple[str, str]] = []
    for word in _WORDS:
        piece = "▁"
        vocab.setdefault(piece, len(vocab))
        for ch in word:
            vocab.setdefault(ch, len(vocab))
            merged = piece + ch
            if merged not in vocab:
                merges.append((piece, ch))
                vocab[merged] = len(vocab)
            piece = merged
    with quiet_transformers():
        # Right padding: the text tower pools the last position, and SigLIP was trained with
        # the pad tokens after the text (GemmaTokenizer's own default is left).
        # The annotation says list[str]; the tokenizers backend wants (left, right) pairs.
        return GemmaTokenizer(vocab=vocab, merges=merges, model_max_length=max_length, padding_side="right")  # type: ignore[arg-type]


def siglip_config(spec: RandomSiglipSpec, vocab_size: int) -> SiglipConfig | Siglip2Config:
    """The ``SiglipConfig`` (``Siglip2Config`` for NaFlex) :func:`make_random_siglip` saves for ``spec``."""
    from transformers import Siglip2Config, SiglipConfig

    common = {
        "hidden_size": spec.dim,
        "intermediate_size": spec.intermediate,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
    }
    text = {
        **common,
        "vocab_size": vocab_size,
        "max_position_embeddings": spec.max_length,
        "projection_size": spec.dim,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": 2,
    }
    if spec.max_num_patches is not None:
        grid = {"num_patches": (spec.image_size // spec.patch_size) ** 2, "patch_size": spec.patch_size}
        return Siglip2Config(text_config=text, vision_config={**common, **grid})
    vision = {**common, "image_size": spec.image_size, "patch_size": spec.patch_size}
    return SiglipConfig(text_config=text, vision_config=vision)


def make_random_siglip(out_dir: str | os.PathLike[str], preset: str = "siglip-tiny", seed: int = 0) -> Path:
    """Write a randomly initialised SigLIP checkpoint (model, processor, tokenizer) to ``out_dir``.

    The directory loads with ``SiglipModel``, ``SiglipVisionModel``, ``SiglipTextModel``,
    ``AutoProcessor`` and ``AutoTokenizer``. ``logit_scale`` and ``logit_bias`` are set to
    SigLIP's initial log(10) and -10 (random init leaves them at 0), so sigmoid scores are
    meaningful.

    Raises:
        InvalidArgumentError: (a ``ValueError``) an unknown preset or a bad seed.
        OSError: ``out_dir`` cannot be written.
    """
    spec = SIGLIP_PRESETS.get(preset)
    if spec is None:
        raise InvalidArgumentError(f"unknown SigLIP preset {preset!r}; choose one of: {', '.join(SIGLIP_PRESETS)}")
    if not is_int(seed) or not 0 <= seed < 2**63:
        raise InvalidArgumentError(f"seed must be an int in [0, 2**63), got {seed!r}")
    import torch
    import transformers

    tokenizer = build_gemma_like_tokenizer(spec.max_length)
    config = siglip_config(spec, len(tokenizer))
    naflex = spec.max_num_patches is not None
    prefix = "Siglip2" if naflex else "Siglip"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with quiet_transformers():
            model = getattr(transformers, f"{prefix}Model")(config).float().eval()
        with torch.no_grad():
            model.logit_scale.fill_(math.log(10.0))
            model.logit_bias.fill_(-10.0)
    sizing = (
        {"patch_size": spec.patch_size, "max_num_patches": spec.max_num_patches}
        if naflex
        else {"size": {"height": spec.image_size, "width": spec.image_size}}
    )
    image_processor = getattr(transformers, f"{prefix}ImageProcessor")(
        resample=_BILINEAR_PIL, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5], **sizing
    )
    processor = getattr(transformers, f"{prefix}Processor")(image_processor=image_processor, tokenizer=tokenizer)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with quiet_transformers():
        model.save_pretrained(out, safe_serialization=True)
        processor.save_pretrained(out)
    return out


__all__ = ["GEMMA_SPECIALS", "SIGLIP_PRESETS", "RandomSiglipSpec", "build_gemma_like_tokenizer", "make_random_siglip", "siglip_config"]
