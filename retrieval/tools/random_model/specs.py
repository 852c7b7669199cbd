"""The shapes of a random CLIP model, and the named presets: data, no weights."""

from __future__ import annotations

from dataclasses import dataclass, fields

from ...checks import is_positive_int
from ...errors import InvalidArgumentError


@dataclass(frozen=True)
class RandomClipSpec:
    """Shapes of a CLIP model (vision ViT + text transformer + projections).

    Raises:
        InvalidArgumentError: (a ``ValueError``) if a field is not a positive int, a hidden size
            is not divisible by its head count, ``image_size`` is not a multiple of
            ``patch_size``, or ``max_length`` < 2 (start- and end-of-text need two positions).
    """

    image_size: int
    patch_size: int
    vision_hidden: int
    vision_layers: int
    vision_heads: int
    vision_intermediate: int
    text_hidden: int
    text_layers: int
    text_heads: int
    text_intermediate: int
    projection_dim: int
    max_length: int

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            # True as a layer count is a bug, not a shape (is_positive_int refuses bools).
            if not is_positive_int(value):
                raise InvalidArgumentError(f"RandomClipSpec.{f.name} must be a positive int, got {value!r}")
        if self.vision_hidden % self.vision_heads:
            raise InvalidArgumentError(
                f"vision_hidden ({self.vision_hidden}) must be divisible by vision_heads ({self.vision_heads})"
            )
        if self.text_hidden % self.text_heads:
            raise InvalidArgumentError(
                f"text_hidden ({self.text_hidden}) must be divisible by text_heads ({self.text_heads})"
            )
        if self.image_size % self.patch_size:
            # HF would silently drop the border pixels; a test model should not hide that.
            raise InvalidArgumentError(
                f"image_size ({self.image_size}) must be a multiple of patch_size ({self.patch_size})"
            )
        if self.max_length < 2:
            raise InvalidArgumentError(f"max_length must be >= 2, got {self.max_length}")


PRESETS: dict[str, RandomClipSpec] = {
    # Small enough to build, save and load on the CPU in every test that needs a model.
    "tiny": RandomClipSpec(
        image_size=64,
        patch_size=16,
        vision_hidden=32,
        vision_layers=2,
        vision_heads=2,
        vision_intermediate=64,
        text_hidden=32,
        text_layers=2,
        text_heads=2,
        text_intermediate=64,
        projection_dim=48,
        max_length=77,
    ),
    # The shapes of openai/clip-vit-base-patch32 (151M parameters, ~605 MB in float32), for
    # benchmarks whose timings must be representative of the real model.
    "vit-b-32": RandomClipSpec(
        image_size=224,
        patch_size=32,
        vision_hidden=768,
        vision_layers=12,
        vision_heads=12,
        vision_intermediate=3072,
        text_hidden=512,
        text_layers=12,
        text_heads=8,
        text_intermediate=2048,
        projection_dim=512,
        max_length=77,
    ),
    # The shapes of openai/clip-vit-large-patch14 (428M parameters, ~1.7 GB in float32): far
    # more vision compute per image than ViT-B/32 (257 tokens of 1024 against 50 of 768), for
    # telling a model-bound build from a feeding-bound one on a GPU.
    "vit-l-14": RandomClipSpec(
        image_size=224,
        patch_size=14,
        vision_hidden=1024,
        vision_layers=24,
        vision_heads=16,
        vision_intermediate=4096,
        text_hidden=768,
        text_layers=12,
        text_heads=12,
        text_intermediate=3072,
        projection_dim=768,
        max_length=77,
    ),
}


def resolve_spec(preset: str | RandomClipSpec) -> RandomClipSpec:
    """Map a preset name or spec to a spec.

    Raises:
        InvalidArgumentError: (a ``ValueError``) for an unknown name or a value of another type.
    """
    if isinstance(preset, RandomClipSpec):
        return preset
    if isinstance(preset, str):
        try:
            return PRESETS[preset]
        except KeyError:
            raise InvalidArgumentError(
                f"unknown preset {preset!r}; choose one of: {', '.join(sorted(PRESETS))}"
            ) from None
    raise InvalidArgumentError(f"preset must be a preset name or a RandomClipSpec, got {type(preset).__name__}")
