"""Training images: decoded once, augmented per step, preprocessed exactly like indexing.

Images are decoded with :func:`retrieval.images.decode_image` (EXIF orientation, transparency
composited on white, 16-bit scaled, ...) and every training crop goes through
:func:`retrieval.images.preprocess_tensor` with the checkpoint's own
:class:`~retrieval.images.PreprocessConfig` (resize, center crop, mean/std), so the model is
trained on what ``clipsearch index`` will show it.

The augmentation is chosen not to contradict captions: a random crop that keeps 70-100 % of
the image area with a mildly jittered aspect ratio, nothing else. No colour jitter or hue
change ("a red bus" stays red), no flips (letters, digits, road signs and "left"/"right" must
keep their orientation), no rotation, no distortion of shapes: the crop is resized with one
scale factor like at indexing time.

Decoded images are kept in memory, downscaled once so that their shorter side is at most
twice the model's resize target (with the same antialiased resize as indexing; a 70 % crop is
then still downscaled, never upscaled): about 50 KB per square image for a 64 px model, 600 KB
for a 224 px one, so the whole training set must fit in memory at that size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from retrieval.errors import ImageDecodeError, InvalidArgumentError
from retrieval.images import (
    PreprocessConfig,
    decode_image,
    load_pixels,
    pil_to_tensor,
    preprocess_tensor,
)

if TYPE_CHECKING:
    import torch

# Decoded training images keep at most this multiple of the model's resize target.
CACHE_EDGE_FACTOR = 2


@dataclass(frozen=True)
class AugmentConfig:
    """The random crop applied to training images (validation images are never augmented).

    Attributes:
        enabled: False trains on exactly the indexing preprocessing.
        min_scale, max_scale: fraction of the image area a crop keeps.
        max_aspect: the crop's aspect ratio is the image's times a factor drawn
            log-uniformly from ``[1/max_aspect, max_aspect]``.

    Raises:
        InvalidArgumentError: scales outside ``0 < min_scale <= max_scale <= 1`` or
            ``max_aspect < 1``.
    """

    enabled: bool = True
    min_scale: float = 0.7
    max_scale: float = 1.0
    max_aspect: float = 4 / 3

    def __post_init__(self) -> None:
        if not 0 < self.min_scale <= self.max_scale <= 1:
            raise InvalidArgumentError(
                f"crop scale must satisfy 0 < min <= max <= 1, got min {self.min_scale}, max {self.max_scale}"
            )
        if not self.max_aspect >= 1:
            raise InvalidArgumentError(f"max_aspect must be >= 1, got {self.max_aspect}")

    def to_dict(self) -> dict[str, float | bool]:
        return {
            "enabled": self.enabled,
            "min_scale": self.min_scale,
            "max_scale": self.max_scale,
            "max_aspect": self.max_aspect,
        }


@dataclass(frozen=True)
class DecodeFailure:
    """An image that exists but could not be decoded (``index`` into the input list)."""

    index: int
    file: Path
    reason: str


def _cache_config(cfg: PreprocessConfig) -> PreprocessConfig:
    # The same antialiased resize as indexing, without crop or normalisation: the output is
    # the downscaled image in 0..255.
    return PreprocessConfig(
        shortest_edge=CACHE_EDGE_FACTOR * cfg.min_decode_edge,
        crop_size=None,
        resample=cfg.resample,
        rescale_factor=None,
        mean=None,
        std=None,
    )


def decode_training_images(
    files: Sequence[Path], cfg: PreprocessConfig
) -> tuple[list[torch.Tensor | None], list[DecodeFailure]]:
    """Decode each file once into a uint8 ``(3, H, W)`` tensor for :func:`training_batch`.

    Args:
        files: image files (the same file listed twice is decoded once).
        cfg: the checkpoint's preprocessing (sets the cache size).

    Returns:
        ``(images, failures)``: ``images[i]`` is None where decoding failed.
    """
    import torch

    cache_cfg = _cache_config(cfg)
    limit = cache_cfg.shortest_edge or 0
    decoded: dict[Path, torch.Tensor | str] = {}
    images: list[torch.Tensor | None] = []
    failures: list[DecodeFailure] = []
    for i, file in enumerate(files):
        if file not in decoded:
            try:
                tensor = pil_to_tensor(decode_image(file).image)
                if min(tensor.shape[-2:]) > limit:
                    tensor = preprocess_tensor(tensor, cache_cfg).round_().clamp_(0, 255).to(torch.uint8)
                decoded[file] = tensor
            except ImageDecodeError as exc:
                decoded[file] = exc.reason
        value = decoded[file]
        if isinstance(value, str):
            images.append(None)
            failures.append(DecodeFailure(i, file, value))
        else:
            images.append(value)
    return images, failures


def validation_pixels(files: Sequence[Path], cfg: PreprocessConfig) -> tuple[list[torch.Tensor | None], list[DecodeFailure]]:
    """``pixel_values`` of each file exactly as ``clipsearch index`` computes them (no augmentation).

    Returns:
        ``(pixels, failures)``: ``pixels[i]`` is a float32 ``(3, h, w)`` tensor, or None where
        decoding failed.
    """
    pixels: list[torch.Tensor | None] = []
    failures: list[DecodeFailure] = []
    for i, file in enumerate(files):
        try:
            pixels.append(load_pixels(file, cfg)[0])
        except ImageDecodeError as exc:
            pixels.append(None)
            failures.append(DecodeFailure(i, file, exc.reason))
    return pixels, failures


def random_crop_box(height: int, width: int, aug: AugmentConfig, generator: torch.Generator) -> tuple[int, int, int, int]:
    """``(top, left, crop_height, crop_width)`` of a random crop (see :class:`AugmentConfig`).

    Always draws the same number of random values, so the generator's position after a
    batch does not depend on the image sizes.
    """
    import torch

    u = torch.rand(4, generator=generator, dtype=torch.float64).tolist()
    scale = aug.min_scale + (aug.max_scale - aug.min_scale) * u[0]
    log_aspect = math.log(aug.max_aspect) * (2 * u[1] - 1)
    # Relative to the image's own shape: factor 1 keeps the aspect ratio.
    crop_h = min(height, max(1, round(height * math.sqrt(scale / math.exp(log_aspect)))))
    crop_w = min(width, max(1, round(width * math.sqrt(scale * math.exp(log_aspect)))))
    top = min(height - crop_h, int(u[2] * (height - crop_h + 1)))
    left = min(width - crop_w, int(u[3] * (width - crop_w + 1)))
    return top, left, crop_h, crop_w


def training_batch(
    images: Sequence[torch.Tensor], cfg: PreprocessConfig, aug: AugmentConfig, generator: torch.Generator
) -> torch.Tensor:
    """Augment and preprocess decoded images into a float32 ``(N, 3, h, w)`` batch.

    Args:
        images: uint8 ``(3, H, W)`` tensors from :func:`decode_training_images`.
        cfg: the checkpoint's preprocessing, applied after the crop.
        aug: the crop; with ``aug.enabled`` False the images are only preprocessed.
        generator: the source of randomness (its state is part of a training checkpoint).
    """
    import torch

    out = []
    for img in images:
        if aug.enabled:
            top, left, h, w = random_crop_box(int(img.shape[-2]), int(img.shape[-1]), aug, generator)
            img = img[:, top : top + h, left : left + w]
        out.append(preprocess_tensor(img, cfg))
    return torch.stack(out)
