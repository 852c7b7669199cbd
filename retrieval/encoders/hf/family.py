"""The Hugging Face model families the ``hf`` backend embeds with, as data.

A family says which transformers classes hold a checkpoint's towers, where their outputs keep
the embedding, how its text is padded and how its scores are made. Everything else (finding the
checkpoint, preprocessing, precision, batching) is shared: :class:`~.encoder.HFClipEncoder`
runs every family through the same code.

- ``clip``: OpenAI CLIP and its descendants. ``CLIP*ModelWithProjection`` towers; text padded
  to the longest in the batch (the tower pools at the end-of-text token); softmax scores.
- ``siglip``: SigLIP, and SigLIP 2 in its fixed-resolution ("FixRes") form, which Hugging Face
  saves as ``model_type`` ``siglip`` too. ``SiglipVisionModel`` / ``SiglipTextModel``, whose
  ``pooler_output`` is the embedding (the attention-pooling head, the text head on the last
  position); text padded to ``max_length`` because the last position is what the text tower
  pools, so the padding is part of the model; independent sigmoid scores with a learned bias.

- ``siglip2``: SigLIP 2 NaFlex. ``Siglip2VisionModel`` / ``Siglip2TextModel``, as SigLIP,
  but each image keeps its aspect ratio in a grid of at most ``max_num_patches`` patches
  (:attr:`Family.naflex`): the preprocessing packs the patches with their grid
  (:func:`retrieval.images.preprocess.pack_patches`) and the encoder passes the vision tower
  its attention mask and spatial shapes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import ModelLoadError
from ...images import PreprocessConfig


@dataclass(frozen=True)
class Family:
    """How one model family's checkpoint is embedded.

    Attributes:
        name: the ``model_type`` in the checkpoint's ``config.json``, and what an index records.
        label: a human name for messages and docs.
        vision_class, text_class: the transformers classes of the towers.
        image_output, text_output: the output attribute holding the embedding.
        text_padding: ``True`` (pad to the longest) or ``"max_length"`` (pad to the window).
        sigmoid: whether scores are independent sigmoids with a bias (SigLIP) or a softmax (CLIP).
        default_logit_scale, default_logit_bias: what ``from_pretrained`` would initialise
            where the weight files hold no such tensor (the bias only for sigmoid families).
        naflex: images as variable patch grids with a mask (SigLIP 2 NaFlex).
    """

    name: str
    label: str
    vision_class: str
    text_class: str
    image_output: str
    text_output: str
    text_padding: bool | str
    sigmoid: bool
    default_logit_scale: float
    default_logit_bias: float | None
    naflex: bool = False

    def dim(self, config: Any) -> int:
        """The embedding width of a checkpoint of this family, checked across its towers.

        Raises:
            ModelLoadError: the towers disagree on the width (the vectors could not be compared).
        """
        if not self.sigmoid:
            return int(config.projection_dim)
        vision = int(config.vision_config.hidden_size)
        text = int(getattr(config.text_config, "projection_size", None) or config.text_config.hidden_size)
        if vision != text:
            raise ModelLoadError(
                f"the text head's projection_size {text} differs from the vision tower's hidden_size {vision}: "
                "text and image vectors would not be comparable"
            )
        return vision


FAMILIES: dict[str, Family] = {
    "clip": Family(
        name="clip",
        label="CLIP",
        vision_class="CLIPVisionModelWithProjection",
        text_class="CLIPTextModelWithProjection",
        image_output="image_embeds",
        text_output="text_embeds",
        text_padding=True,
        sigmoid=False,
        default_logit_scale=math.log(1 / 0.07),
        default_logit_bias=None,
    ),
    "siglip": Family(
        name="siglip",
        label="SigLIP / SigLIP 2 (fixed resolution)",
        vision_class="SiglipVisionModel",
        text_class="SiglipTextModel",
        image_output="pooler_output",
        text_output="pooler_output",
        text_padding="max_length",
        sigmoid=True,
        # SiglipModel's own initial values (the SigLIP paper's log(10) and -10).
        default_logit_scale=math.log(10.0),
        default_logit_bias=-10.0,
    ),
    "siglip2": Family(
        name="siglip2",
        label="SigLIP 2 NaFlex",
        vision_class="Siglip2VisionModel",
        text_class="Siglip2TextModel",
        image_output="pooler_output",
        text_output="pooler_output",
        text_padding="max_length",
        sigmoid=True,
        default_logit_scale=math.log(10.0),
        default_logit_bias=-10.0,
        naflex=True,
    ),
}

# Families recognised but not embedded, with the reason given to the user (none at present).
UNSUPPORTED: dict[str, str] = {}


def supported_families() -> str:
    """``clip (CLIP), siglip (...)``: the families for error messages."""
    return ", ".join(f"{f.name} ({f.label})" for f in FAMILIES.values())


def family_of(model_type: str | None, name: str) -> Family:
    """The family of a checkpoint whose ``config.json`` says ``model_type``.

    Raises:
        ModelLoadError: a family this backend does not embed, naming the supported ones.
    """
    family = FAMILIES.get(model_type or "")
    if family is not None:
        return family
    why = UNSUPPORTED.get(model_type or "")
    if why is not None:
        raise ModelLoadError(f"{name}: {why}. Supported Hugging Face families: {supported_families()}")
    raise ModelLoadError(
        f"{name} is a {model_type!r} checkpoint, not one of the supported Hugging Face families: "
        f"{supported_families()}; open_clip models load with --model open_clip:..."
    )


def check_processor(family: Family, config: Any, settings: Mapping[str, Any], preprocess: PreprocessConfig, name: str) -> None:
    """Refuse an image processor that disagrees with the model it ships with.

    The vision tower would otherwise interpolate its position embeddings to whatever size the
    processor makes, silently embedding at a size the checkpoint was not trained for. The input
    size is checked for SigLIP only: CLIP checkpoints whose crop differs from ``image_size``
    have always loaded here (embedded with interpolated positions), and still do. A NaFlex
    model sizes each image itself; its processor must be a NaFlex one with the same patch size.

    Raises:
        ModelLoadError: the processor's kind, input size or patch size differs from the model's,
            naming both values.
    """
    vision = config.vision_config
    patch = int(vision.patch_size)
    if family.naflex != preprocess.naflex:
        kind = settings.get("image_processor_type") or "another kind"
        raise ModelLoadError(
            f"{name}: a {family.label} model needs {'a NaFlex' if family.naflex else 'a fixed-size'} image processor, "
            f"but its processor is {kind}"
        )
    if family.sigmoid and not family.naflex:
        image_size = int(vision.image_size)
        height, width = preprocess.input_size
        if (height, width) != (image_size, image_size):
            raise ModelLoadError(
                f"{name}: its image processor makes {height}x{width} inputs but the model's "
                f"image_size is {image_size}; fix the processor settings or the config"
            )
    processor_patch = settings.get("patch_size")
    if processor_patch is not None and int(processor_patch) != patch:
        raise ModelLoadError(
            f"{name}: its image processor's patch_size {processor_patch} differs from the model's patch_size {patch}"
        )
