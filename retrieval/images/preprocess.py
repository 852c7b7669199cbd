"""CLIP preprocessing in torch: decoded RGB images to ``pixel_values`` (see :mod:`.config`).

torch is imported inside the functions, never at import time. torchvision is not imported at
all: its resize and pad are torch's ``interpolate`` and ``pad`` called as torchvision calls them
(:func:`resize`, :func:`_center_crop`), bit for bit (``tests/test_preprocess_tensor.py``);
importing torchvision costs a cold process about 1.5 s (it imports ``torch._dynamo``), which
an image query that runs on OpenVINO or ONNX Runtime need not pay.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, BinaryIO

import numpy as np
from PIL import Image

from .decode import DEFAULT_MAX_PIXELS, DecodedImage, decode_image, to_rgb
from .preprocess_config import PreprocessConfig, naflex_size

if TYPE_CHECKING:
    import torch


def resize_output_size(height: int, width: int, cfg: PreprocessConfig) -> tuple[int, int]:
    """(height, width) after the resize step, with the reference implementations' rounding."""
    if cfg.naflex:
        return naflex_size(height, width, cfg.patch_size, cfg.max_num_patches)  # type: ignore[arg-type]  # naflex: both set
    if cfg.shortest_edge is not None:
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = cfg.shortest_edge, int(cfg.shortest_edge * long / short)
        return (new_long, new_short) if width <= height else (new_short, new_long)
    if cfg.resize_to is not None:
        return cfg.resize_to
    if cfg.keep_ratio_size is not None:
        # open_clip's ResizeKeepRatio: one factor, from the shorter or the longer side.
        ratio_h, ratio_w = height / cfg.keep_ratio_size[0], width / cfg.keep_ratio_size[1]
        ratio = max(ratio_h, ratio_w) if cfg.keep_ratio_fit == "longest" else min(ratio_h, ratio_w)
        # At least one pixel: a 1000x1 strip would otherwise resize to nothing.
        return max(1, round(height / ratio)), max(1, round(width / ratio))
    return height, width


def preprocess_tensor(images: torch.Tensor, cfg: PreprocessConfig) -> torch.Tensor:
    """Resize, center-crop and normalise a batch of RGB image tensors, on any device.

    Built only from differentiable torch operations (antialiased resize, slicing, padding,
    affine normalisation), so float input can sit inside autograd, e.g. to score rendered
    images with CLIP in a training loop; the indexer's GPU path runs it on CUDA.

    Args:
        images: ``(N, 3, H, W)`` or ``(3, H, W)``; uint8 in 0..255 (bit-identical to the
            checkpoint's ``CLIPImageProcessor``) or float in 0..255 (clamped to 0..255 after
            the resize like the reference, but not rounded to integers: from the
            reference's normalised values at most 0.04, about 2.4 grey levels, measured in
            tests/test_preprocess_tensor.py).
        cfg: the checkpoint's preprocessing (``encoder.preprocess``).

    Returns:
        float32 ``pixel_values`` of shape ``(N, 3, h, w)`` (or ``(3, h, w)``); float64 input
        stays float64. For NaFlex (``cfg.naflex``) the patches packed by :func:`pack_patches`.

    Raises:
        ValueError: not an RGB image tensor.
    """
    import torch

    if images.ndim not in (3, 4) or images.shape[-3] != 3:
        raise ValueError(f"expected (N, 3, H, W) or (3, H, W) RGB tensors, got shape {tuple(images.shape)}")
    height, width = images.shape[-2:]
    new_size = resize_output_size(int(height), int(width), cfg)
    if new_size != (height, width):
        images = resize(images, new_size, cfg.resample)
        if images.is_floating_point():
            # The reference's uint8 resize saturates bicubic overshoot at 0 and 255; so do we.
            images = images.clamp(0.0, 255.0)
    if cfg.crop_size is not None:
        images = _center_crop(images, cfg.crop_size, rounding=cfg.crop_rounding, fill=cfg.pad_fill)
    dtype = torch.float64 if images.dtype == torch.float64 else torch.float32
    # From uint8 the float tensor is a new one, ours to normalise in place (same arithmetic);
    # float input may be a caller's autograd leaf, so it is not touched.
    own = images.dtype == torch.uint8
    out = images.to(dtype, memory_format=torch.contiguous_format)
    if cfg.mean is not None and cfg.std is not None:
        scale = 1.0 / cfg.rescale_factor if cfg.rescale_factor else 1.0
        mean = torch.tensor(cfg.mean, dtype=torch.float32, device=out.device).to(dtype) * scale
        std = torch.tensor(cfg.std, dtype=torch.float32, device=out.device).to(dtype) * scale
        if own:
            out = out.sub_(mean[:, None, None]).div_(std[:, None, None])
        else:
            out = (out - mean[:, None, None]) / std[:, None, None]
    elif cfg.rescale_factor is not None:
        out = out * cfg.rescale_factor
    if cfg.naflex:
        return pack_patches(out, cfg.patch_size, cfg.max_num_patches)  # type: ignore[arg-type]  # naflex: both set
    return out


def pack_patches(images: torch.Tensor, patch_size: int, max_num_patches: int) -> torch.Tensor:
    """NaFlex input as one fixed-shape tensor, so that images of any aspect stack into a batch.

    ``(..., 3, hp * p, wp * p)`` becomes ``(..., 3, max_num_patches + 1, p * p)``: row ``n`` holds
    patch ``n`` (row-major over the grid, as Siglip2ImageProcessor orders them), zeros after the
    last one; the extra last row holds the grid's ``(hp, wp)`` in channel 0. The encoder unpacks
    it into ``pixel_values``, ``pixel_attention_mask`` and ``spatial_shapes``.

    Raises:
        ValueError: sides that are not multiples of the patch size, or too many patches.
    """
    height, width = images.shape[-2:]
    hp, wp = int(height) // patch_size, int(width) // patch_size
    if hp * patch_size != height or wp * patch_size != width or hp * wp > max_num_patches:
        raise ValueError(f"a {height}x{width} image is not a grid of at most {max_num_patches} {patch_size}px patches")
    lead = images.shape[:-3]
    grid = images.reshape(*lead, 3, hp, patch_size, wp, patch_size).transpose(-3, -2)
    patches = grid.reshape(*lead, 3, hp * wp, patch_size * patch_size)
    out = images.new_zeros((*lead, 3, max_num_patches + 1, patch_size * patch_size))
    out[..., : hp * wp, :] = patches
    out[..., 0, max_num_patches, 0] = hp
    out[..., 0, max_num_patches, 1] = wp
    return out


def unpack_patches(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(N, 3, M + 1, p * p)`` from :func:`pack_patches` -> Siglip2's ``pixel_values``
    ``(N, M, p * p * 3)``, ``pixel_attention_mask`` ``(N, M)`` and ``spatial_shapes`` ``(N, 2)``."""
    import torch

    count = packed.shape[-2] - 1
    shapes = packed[:, 0, count, :2].round().long()
    pixel_values = packed[:, :, :count, :].permute(0, 2, 3, 1).reshape(packed.shape[0], count, -1)
    mask = (torch.arange(count, device=packed.device)[None, :] < (shapes[:, 0] * shapes[:, 1])[:, None]).long()
    return pixel_values, mask, shapes


# The interpolations torch's resize runs on tensors (torchvision refuses the others for tensors).
TENSOR_RESAMPLES = ("nearest", "bilinear", "bicubic")


def resize(images: torch.Tensor, size: tuple[int, int], resample: str) -> torch.Tensor:
    """``(..., C, H, W)`` resized to ``size`` (height, width), antialiased: what torchvision's
    ``v2.functional.resize(images, size, InterpolationMode(resample), antialias=True)`` returns,
    bit for bit, without importing torchvision.

    uint8 stays uint8 where torch has a native uint8 kernel (bicubic; bilinear on AVX2, AVX-512
    and ARM CPUs; nearest), else it goes through float32, rounded back (bicubic clamped first).

    Raises:
        ValueError: an interpolation torch does not run on tensors (lanczos, box, hamming).
    """
    import platform

    import torch
    from torch.nn.functional import interpolate

    if resample not in TENSOR_RESAMPLES:
        raise ValueError(f"resample {resample!r} is not available for tensors (use one of {', '.join(TENSOR_RESAMPLES)})")
    shape, numel = images.shape, images.numel()
    channels, height, width = (int(n) for n in shape[-3:])
    if (height, width) == tuple(size):
        return images
    if numel == 0:
        return images.reshape((*shape[:-3], channels, *size))
    antialias = resample != "nearest"
    dtype = images.dtype
    native = dtype in (torch.float32, torch.float64)
    if dtype == torch.uint8 and images.device.type == "cpu":
        native = resample != "bilinear" or torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") or (
            platform.machine() in ("aarch64", "arm64")
        )
    elif dtype == torch.uint8:
        native = resample == "nearest"
    batch = images.reshape(-1, channels, height, width)
    strides = batch.stride()
    if batch.is_contiguous(memory_format=torch.channels_last) and batch.shape[0] == 1 and numel != strides[0]:
        # One channels-last image: restrided so that interpolate returns channels last too
        # (pytorch/pytorch#68430), as torchvision does; the uint8 kernels are faster on it.
        batch = batch.as_strided((1, channels, height, width), [numel, *strides[1:]])
    if not native:
        batch = batch.to(torch.float32)
    out = interpolate(batch, size=list(size), mode=resample, align_corners=False if antialias else None, antialias=antialias)
    if not native:
        if resample == "bicubic" and dtype == torch.uint8:
            out = out.clamp_(min=0, max=255)
        if not dtype.is_floating_point:
            out = out.round_()
        out = out.to(dtype)
    return out.reshape((*shape[:-3], channels, *size))


def crop_plan(height: int, width: int, size: tuple[int, int], rounding: str = "floor") -> tuple[tuple[int, int, int, int], int, int]:
    """Where the center crop to ``size`` (height, width) cuts an image of ``height`` x
    ``width``: the padding first added around a smaller image (left, top, right, bottom), as
    the references (transformers and torchvision alike) add it, and the crop's top and left
    in the padded image."""
    crop_h, crop_w = size
    left, top = (crop_w - width) // 2 if crop_w > width else 0, (crop_h - height) // 2 if crop_h > height else 0
    right = (crop_w - width + 1) // 2 if crop_w > width else 0
    bottom = (crop_h - height + 1) // 2 if crop_h > height else 0
    height, width = height + top + bottom, width + left + right
    if rounding == "round":
        # torchvision's CenterCrop: round half to even, so an odd margin of 3 puts 2 on top.
        return (left, top, right, bottom), int(round((height - crop_h) / 2.0)), int(round((width - crop_w) / 2.0))
    return (left, top, right, bottom), int((height - crop_h) / 2.0), int((width - crop_w) / 2.0)


def _center_crop(images: torch.Tensor, size: tuple[int, int], rounding: str = "floor", fill: int = 0) -> torch.Tensor:
    from torch.nn.functional import pad

    (left, top_pad, right, bottom), top, crop_left = crop_plan(int(images.shape[-2]), int(images.shape[-1]), size, rounding)
    if left or top_pad or right or bottom:
        lead = images.shape[:-3]
        flat = images.reshape(-1, *images.shape[-3:])
        padded = pad(flat, [left, right, top_pad, bottom], mode="constant", value=float(fill))
        images = padded.reshape(*lead, *padded.shape[-3:])
    return images[..., top : top + size[0], crop_left : crop_left + size[1]]


def pil_to_tensor(img: Image.Image) -> torch.Tensor:
    """RGB PIL image -> uint8 tensor (3, H, W) sharing no memory with PIL.

    Its memory stays height x width x channel (a permuted view, no copy): torch's uint8
    antialiased resize is faster on that layout than on a contiguous (3, H, W) copy, with
    identical output (measured: benchmarks/README.md, "Measurements behind choices in the code").
    """
    import torch

    arr = np.array(img, dtype=np.uint8, copy=True)
    return torch.from_numpy(arr).permute(2, 0, 1)


def load_pixels(
    source: str | bytes | os.PathLike[str] | BinaryIO,
    cfg: PreprocessConfig,
    *,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    draft: bool = True,
    name: str | None = None,
) -> tuple[torch.Tensor, int, int]:
    """Decode and preprocess one image: returns ``(pixel_values (3,h,w), width, height)``.

    ``draft`` as in :func:`load_photo`.

    Raises:
        ImageDecodeError: see :func:`decode_image`.
    """
    pixels, decoded = load_photo(source, cfg, max_pixels=max_pixels, draft=draft, name=name)
    return pixels, decoded.width, decoded.height


def load_photo(
    source: str | bytes | os.PathLike[str] | BinaryIO,
    cfg: PreprocessConfig,
    *,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    draft: bool = True,
    name: str | None = None,
    keep_edge: int | None = None,
) -> tuple[torch.Tensor, DecodedImage]:
    """:func:`load_pixels` that also returns the decoded image's facts (its size and
    :class:`~retrieval.images.exif.PhotoMeta`): what the indexer stores in a row.

    ``draft``: decode JPEGs at the smallest DCT scale that keeps the model's resize target and
    box-reduce other large images before the resize (:func:`reduce_for_resize`): fast, but not
    the pixels of the checkpoint's own processor. False decodes in full, so the pixels equal
    the reference's (what ``--decode full`` and ``--precision fp32`` build with).

    ``keep_edge``: the caller reads ``decoded.image`` too (OCR) and needs at least this shorter
    side. The returned ``decoded.image`` is then the file decoded as ``decode_image(min_edge=
    keep_edge)`` decodes it, whatever ``draft`` says, and the model's pixels never depend on
    ``keep_edge``: a file's vector is the same with or without the caller, and the caller's
    image the same in either decode mode. Where the model's decode is not that image (a JPEG
    drafted for the model, or decoded in full and larger than twice ``keep_edge``), the file is
    decoded a second time.

    Raises:
        ImageDecodeError: see :func:`decode_image`.
    """
    start = source.tell() if hasattr(source, "tell") else None
    decoded = decode_image(source, min_edge=cfg.min_decode_edge, max_pixels=max_pixels, name=name, draft=draft)
    image = reduce_for_resize(decoded.image, cfg.min_decode_edge) if draft else decoded.image
    pixels = preprocess_tensor(pil_to_tensor(image), cfg)
    if keep_edge is not None and not _same_as_kept(decoded, keep_edge):
        if start is not None:
            source.seek(start)  # type: ignore[union-attr]  # a file object: tell() was there, so is seek()
        larger = decode_image(source, min_edge=keep_edge, max_pixels=max_pixels, name=name)
        decoded = dataclasses.replace(decoded, image=larger.image)
    return pixels, decoded


def _same_as_kept(decoded: DecodedImage, keep_edge: int) -> bool:
    """Whether ``decoded.image`` is what ``decode_image(min_edge=keep_edge)`` gives: a RAW file's
    image (its preview or demosaic is picked by the model's edge either way), or a full decode
    that no DCT scale could reduce (PIL drafts only a side at least twice the request)."""
    if decoded.meta.raw_source is not None:
        return True
    full = decoded.image.size == (decoded.width, decoded.height)
    return full and min(decoded.width, decoded.height) < 2 * keep_edge


# Reduced images keep at least this many times the resize target on their shorter side, so the
# antialiased resize still does the last (and decisive) step: PIL's own ``reducing_gap`` idea.
REDUCING_GAP = 2


def reduce_for_resize(img: Image.Image, min_edge: int) -> Image.Image:
    """Box-reduce a large image by an integer factor before the resize (draft mode only).

    ``Image.reduce`` averages k x k blocks in one cheap pass; a 4000x3000 PNG bound for 224 px
    then resizes from 666x500 instead of from 12 megapixels. The result keeps at least
    ``REDUCING_GAP`` times ``min_edge`` on its shorter side; images already that small (JPEGs
    after draft decoding, nearly always) are returned as they are.
    """
    factor = min(img.size) // (REDUCING_GAP * min_edge)
    return img.reduce(factor) if factor >= 2 else img


def preprocess_images(images: Sequence[Image.Image], cfg: PreprocessConfig) -> torch.Tensor:
    """Preprocess already-open PIL images into a ``(N, 3, h, w)`` batch."""
    import torch

    return torch.stack([preprocess_tensor(pil_to_tensor(to_rgb(img)), cfg) for img in images])
