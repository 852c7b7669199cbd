"""Image decoding and CLIP preprocessing, shared by the indexer and image queries.

One import path, :mod:`retrieval.images`, for what lives in six modules:

- :mod:`.config`: :class:`PreprocessConfig`, a checkpoint's preprocessing, read from its
  ``CLIPImageProcessor`` settings or an open_clip ``PreprocessCfg`` (pure configuration);
- :mod:`.decode`: PIL decoding to RGB (EXIF orientation, transparency onto white, 16-bit and
  float scaled, first frame, JPEG draft decoding, the decompression-bomb limit);
- :mod:`.preprocess`: resize, center crop and normalise in torch, bit-identical to the
  reference processor on uint8;
- :mod:`.nvjpeg`: JPEG decoding on the model's device for the indexer's GPU path;
- :mod:`.formats`: HEIF/HEIC (pillow-heif), AVIF and camera RAW (rawpy) dispatch;
- :mod:`.exif`: when and with what a photo was taken (:class:`PhotoMeta`).

torch and torchvision are imported inside the functions that use them, never at import.
"""

from __future__ import annotations

from .decode import DEFAULT_MAX_PIXELS, IMAGE_EXTENSIONS, DecodedImage, decode_image, probe_image, probe_photo, to_rgb
from .exif import NO_META, PhotoMeta, iso_taken, read_meta
from .formats import AVIF_EXTENSIONS, HEIF_EXTENSIONS, RAW_EXTENSIONS
from .nvjpeg import JPEG_MAGIC, decode_jpegs_on_device, is_jpeg, jpeg_has_end, preprocess_on_device
from .preprocess import (
    REDUCING_GAP,
    load_photo,
    load_pixels,
    pil_to_tensor,
    preprocess_images,
    preprocess_tensor,
    reduce_for_resize,
    resize_output_size,
)
from .preprocess_config import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, PreprocessConfig

__all__ = [
    "AVIF_EXTENSIONS",
    "DEFAULT_MAX_PIXELS",
    "HEIF_EXTENSIONS",
    "NO_META",
    "RAW_EXTENSIONS",
    "PhotoMeta",
    "iso_taken",
    "load_photo",
    "probe_photo",
    "read_meta",
    "IMAGE_EXTENSIONS",
    "JPEG_MAGIC",
    "OPENAI_CLIP_MEAN",
    "OPENAI_CLIP_STD",
    "REDUCING_GAP",
    "DecodedImage",
    "PreprocessConfig",
    "decode_image",
    "decode_jpegs_on_device",
    "is_jpeg",
    "jpeg_has_end",
    "load_pixels",
    "pil_to_tensor",
    "preprocess_images",
    "preprocess_on_device",
    "preprocess_tensor",
    "probe_image",
    "reduce_for_resize",
    "resize_output_size",
    "to_rgb",
]
