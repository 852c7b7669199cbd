"""Writing a random CLIP checkpoint: its ``CLIPConfig``, seeded weights, image processor and tokenizer."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ...checks import is_int
from ...encoders.base import quiet_transformers
from ...errors import InvalidArgumentError
from .offline_tokenizer import BOS_TOKEN_ID, CLIP_VOCAB_SIZE, EOS_TOKEN_ID, build_clip_tokenizer
from .specs import RandomClipSpec, resolve_spec

if TYPE_CHECKING:
    from transformers import CLIPConfig

#: Where :func:`make_random_clip` puts the image processor settings: ``"hub"`` a top-level
#: ``preprocessor_config.json`` (like openai/clip-vit-base-patch32), ``"processor"`` what
#: transformers 5's ``CLIPProcessor.save_pretrained`` writes (nested in ``processor_config.json``).
PROCESSOR_LAYOUTS: tuple[str, ...] = ("hub", "processor")

# OpenAI CLIP image normalisation (same numbers as transformers' OPENAI_CLIP_MEAN / _STD).
OPENAI_CLIP_MEAN: tuple[float, float, float] = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD: tuple[float, float, float] = (0.26862954, 0.26130258, 0.27577711)
_BICUBIC: int = 3  # PIL.Image.Resampling.BICUBIC, written as the int the processor config stores


def clip_config(preset: str | RandomClipSpec) -> CLIPConfig:
    """The ``CLIPConfig`` of a preset or spec, as :func:`make_random_clip` saves it.

    Raises:
        InvalidArgumentError: (a ``ValueError``) for an unknown preset.
    """
    from transformers import CLIPConfig

    spec = resolve_spec(preset)
    text_config = {
        "vocab_size": CLIP_VOCAB_SIZE,
        "hidden_size": spec.text_hidden,
        "intermediate_size": spec.text_intermediate,
        "num_hidden_layers": spec.text_layers,
        "num_attention_heads": spec.text_heads,
        "max_position_embeddings": spec.max_length,
        # transformers 5 builds CLIPTextModelWithProjection from text_config alone, so the
        # projection width must be there too, not only at the top level.
        "projection_dim": spec.projection_dim,
        "bos_token_id": BOS_TOKEN_ID,
        # Not 2 (the legacy value that switches CLIPTextTransformer to "argmax of input_ids"
        # pooling): with 49407 it pools at the *first* end-of-text token, which stays right for
        # batches padded with end-of-text (our pad token) and for added tokens.
        "eos_token_id": EOS_TOKEN_ID,
        # The model never reads pad_token_id; it is set to what the tokenizer pads with so that
        # code padding by hand from the config agrees with the tokenizer (HF's default is 1).
        "pad_token_id": EOS_TOKEN_ID,
    }
    vision_config = {
        "hidden_size": spec.vision_hidden,
        "intermediate_size": spec.vision_intermediate,
        "num_hidden_layers": spec.vision_layers,
        "num_attention_heads": spec.vision_heads,
        "image_size": spec.image_size,
        "patch_size": spec.patch_size,
        "projection_dim": spec.projection_dim,  # see text_config: needed by the WithProjection class
    }
    return CLIPConfig(text_config=text_config, vision_config=vision_config, projection_dim=spec.projection_dim)


def make_random_clip(
    out_dir: str | os.PathLike[str],
    preset: str | RandomClipSpec = "tiny",
    seed: int = 0,
    processor_layout: str = "hub",
) -> Path:
    """Write a randomly initialised CLIP checkpoint (model + processor) to ``out_dir``.

    The directory then holds ``config.json``, ``model.safetensors``, ``preprocessor_config.json``
    (``processor_config.json`` instead with ``processor_layout="processor"``),
    ``tokenizer.json`` and ``tokenizer_config.json`` (transformers 5 writes no ``vocab.json`` /
    ``merges.txt``: ``tokenizer.json`` holds both), and loads with ``CLIPModel``,
    ``CLIPVisionModelWithProjection``, ``CLIPTextModelWithProjection``, ``CLIPProcessor`` and
    ``AutoTokenizer``. The same spec and seed give byte-identical ``model.safetensors``.

    Args:
        out_dir: directory to write; created (with parents) if missing, files in it overwritten.
        preset: a name from :data:`PRESETS` or a :class:`RandomClipSpec`.
        seed: seed of the weight initialisation (0 <= seed < 2**63).
        processor_layout: one of :data:`PROCESSOR_LAYOUTS`; the weights do not depend on it.

    Returns:
        ``out_dir`` as a ``pathlib.Path``.

    Raises:
        InvalidArgumentError: (a ``ValueError``) for an unknown preset, a bad seed or layout.
        FileNotFoundError: if open_clip (which ships the BPE file) is not installed.
        OSError: if ``out_dir`` cannot be created or written.
    """
    spec = resolve_spec(preset)
    if not is_int(seed) or not 0 <= seed < 2**63:
        raise InvalidArgumentError(f"seed must be an int in [0, 2**63), got {seed!r}")
    if processor_layout not in PROCESSOR_LAYOUTS:
        raise InvalidArgumentError(f"processor_layout must be one of {PROCESSOR_LAYOUTS}, got {processor_layout!r}")
    out = Path(out_dir)
    # Build the tokenizer first: it is the step that fails without open_clip, before any writing.
    tokenizer = build_clip_tokenizer(spec.max_length)

    import torch
    from transformers import CLIPImageProcessor, CLIPModel, CLIPProcessor

    config = clip_config(spec)

    # fork_rng: seed the initialisation without changing the caller's global RNG state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        # float32 whatever the process default dtype is, so that bytes depend only on the seed.
        model = CLIPModel(config).float().eval()

    image_processor = CLIPImageProcessor(
        size={"shortest_edge": spec.image_size},
        crop_size={"height": spec.image_size, "width": spec.image_size},
        do_resize=True,
        do_center_crop=True,
        resample=_BICUBIC,
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=list(OPENAI_CLIP_MEAN),
        image_std=list(OPENAI_CLIP_STD),
        do_convert_rgb=True,
    )
    # Built before writing, so that it fails here if transformers would not accept the pair.
    processor = CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer)

    out.mkdir(parents=True, exist_ok=True)
    with quiet_transformers():
        model.save_pretrained(out, safe_serialization=True)
    if processor_layout == "processor":
        processor.save_pretrained(out)
    else:
        # Saved piecewise: CLIPProcessor.save_pretrained in transformers 5 writes only the nested
        # layout, while the Hub's openai/clip-vit-base-patch32 has a top-level
        # preprocessor_config.json. clipsearch and CLIPProcessor.from_pretrained read both.
        image_processor.save_pretrained(out)
        tokenizer.save_pretrained(out)
    return out
