"""CLIP preprocessing in numpy, bit for bit what :mod:`.preprocess` computes in torch, for a
process that needs no torch otherwise: an image query on an index's recorded tower
(:mod:`retrieval.encoders.recorded_tower`), where importing torch would be half of a cold
``clipsearch search --image``.

The resize is torch's uint8 antialiased kernel (Pillow-SIMD's integer arithmetic): per output
pixel, weights from the filter (bicubic with a = -0.5, or bilinear) over the input pixels its
support covers, normalised, scaled to int16 at the largest precision that keeps every weight
below 2^15; a pass sums ``pixel * weight`` in integers from half a unit, shifts back and clamps to
0..255. Horizontal pass first, then vertical, through a uint8 image, as torch runs them. The
crop and the normalisation follow :func:`.preprocess.preprocess_tensor` in float32. Covered:
uint8 RGB images, bicubic and bilinear, fixed-size models; :func:`numpy_preprocessing` says
whether a checkpoint's settings are (NaFlex and other filters take the torch path).
``tests/test_preprocess_numpy.py`` holds it to the torch path on many sizes and settings.
"""

from __future__ import annotations

import functools
import math
import os
from typing import BinaryIO

import numpy as np

from .decode import DEFAULT_MAX_PIXELS, decode_image
from .preprocess import crop_plan, reduce_for_resize, resize_output_size
from .preprocess_config import PreprocessConfig

# torch's uint8 kernels: the filter's support in input pixels at scale 1, and the filter.
_A = -0.5


def _bicubic(x: float) -> float:
    x = abs(x)
    if x < 1.0:
        return ((_A + 2.0) * x - (_A + 3.0)) * x * x + 1.0
    if x < 2.0:
        return (((x - 5.0) * x + 8.0) * x - 4.0) * _A
    return 0.0


def _bilinear(x: float) -> float:
    x = abs(x)
    return 1.0 - x if x < 1.0 else 0.0


_FILTERS = {"bicubic": (4, _bicubic), "bilinear": (2, _bilinear)}
NUMPY_RESAMPLES: tuple[str, ...] = tuple(_FILTERS)


def numpy_preprocessing(cfg: PreprocessConfig) -> bool:
    """Whether :func:`preprocess_array` computes ``cfg`` (else the torch path does)."""
    return not cfg.naflex and cfg.resample in NUMPY_RESAMPLES


@functools.lru_cache(maxsize=32)
def _weights(in_size: int, out_size: int, resample: str) -> tuple[np.ndarray, np.ndarray, int]:
    """(first input index per output pixel, int16-valued weights (out, k), precision), as
    torch's ``_compute_indices_int16_weights_aa`` makes them (Python floats are C doubles)."""
    interp, filter_fn = _FILTERS[resample]
    scale = in_size / out_size
    support = interp * 0.5 * scale if scale >= 1.0 else interp * 0.5
    kmax = int(math.ceil(support)) * 2 + 1
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    starts = np.zeros(out_size, dtype=np.int64)
    weights = np.zeros((out_size, kmax), dtype=np.float64)
    for i in range(out_size):
        center = scale * (i + 0.5)
        xmin = max(int(center - support + 0.5), 0)  # int(): C's truncation toward zero
        count = min(int(center + support + 0.5), in_size) - xmin
        row = [filter_fn((j + xmin - center + 0.5) * invscale) for j in range(count)]
        total = 0.0
        for w in row:
            total += w
        weights[i, :count] = [w / total for w in row] if total != 0.0 else row
        starts[i] = xmin
    w_max = float(weights.max()) if weights.size else 0.0
    precision = 0
    while precision < 22 and int(0.5 + w_max * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    scaled = weights * (1 << precision)
    ints = np.where(weights < 0, np.trunc(-0.5 + scaled), np.trunc(0.5 + scaled)).astype(np.int64)
    return starts, ints, precision


def _resize_axis(image: np.ndarray, axis: int, out_size: int, resample: str) -> np.ndarray:
    starts, weights, precision = _weights(int(image.shape[axis]), out_size, resample)
    lines = np.moveaxis(image, axis, 0).astype(np.int32)
    # Rows past the end are zeros with zero weight: every output pixel takes the same count.
    padded = np.concatenate([lines, np.zeros((weights.shape[1], *lines.shape[1:]), dtype=np.int32)])
    acc = np.full((out_size, *lines.shape[1:]), 1 << (precision - 1) if precision else 0, dtype=np.int64)
    for k in range(weights.shape[1]):
        acc += weights[:, k].reshape(-1, *([1] * (lines.ndim - 1))) * padded[starts + k]
    return np.moveaxis(np.clip(acc >> precision, 0, 255).astype(np.uint8), 0, axis)


def resize_uint8(image: np.ndarray, size: tuple[int, int], resample: str) -> np.ndarray:
    """An ``(H, W, C)`` uint8 image resized to ``size`` (height, width), antialiased: what
    :func:`.preprocess.resize` gives for the same uint8 image, bit for bit.

    Raises:
        ValueError: a filter other than :data:`NUMPY_RESAMPLES`.
    """
    if resample not in _FILTERS:
        raise ValueError(f"resample {resample!r} has no numpy kernel (one of {', '.join(NUMPY_RESAMPLES)})")
    out = image
    if size[1] != image.shape[1]:
        out = _resize_axis(out, 1, size[1], resample)
    if size[0] != image.shape[0]:
        out = _resize_axis(out, 0, size[0], resample)
    return out


def preprocess_array(image: np.ndarray, cfg: PreprocessConfig) -> np.ndarray:
    """An ``(H, W, 3)`` uint8 RGB image -> float32 ``pixel_values`` ``(3, h, w)``, equal to
    :func:`.preprocess.preprocess_tensor` of the same image.

    Raises:
        ValueError: settings :func:`numpy_preprocessing` refuses, or not an RGB uint8 image.
    """
    if not numpy_preprocessing(cfg):
        raise ValueError(f"numpy preprocessing computes {', '.join(NUMPY_RESAMPLES)} of fixed-size models only")
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(f"expected an (H, W, 3) uint8 image, got {image.dtype} {image.shape}")
    height, width = image.shape[:2]
    new_size = resize_output_size(height, width, cfg)
    if new_size != (height, width):
        image = resize_uint8(image, new_size, cfg.resample)
    if cfg.crop_size is not None:
        (left, top_pad, right, bottom), top, crop_left = crop_plan(image.shape[0], image.shape[1], cfg.crop_size, cfg.crop_rounding)
        if left or top_pad or right or bottom:
            image = np.pad(image, ((top_pad, bottom), (left, right), (0, 0)), constant_values=cfg.pad_fill)
        image = image[top : top + cfg.crop_size[0], crop_left : crop_left + cfg.crop_size[1]]
    out = np.ascontiguousarray(image.transpose(2, 0, 1), dtype=np.float32)
    if cfg.mean is not None and cfg.std is not None:
        # float32 throughout, as torch computes it (the scale times the float32 mean and std).
        scale = np.float32(1.0 / cfg.rescale_factor if cfg.rescale_factor else 1.0)
        mean = np.asarray(cfg.mean, dtype=np.float32) * scale
        std = np.asarray(cfg.std, dtype=np.float32) * scale
        out -= mean[:, None, None]
        out /= std[:, None, None]
    elif cfg.rescale_factor is not None:
        out *= np.float32(cfg.rescale_factor)
    return out


def load_pixels_array(
    source: str | bytes | os.PathLike[str] | BinaryIO, cfg: PreprocessConfig, *, max_pixels: int = DEFAULT_MAX_PIXELS,
    draft: bool = True,
) -> np.ndarray:
    """Decode and preprocess one image as :func:`.preprocess.load_pixels` does (JPEG draft
    decoding where ``draft``), in numpy: float32 ``(3, h, w)``.

    Raises:
        ImageDecodeError: see :func:`.decode.decode_image`.
        ValueError: settings :func:`numpy_preprocessing` refuses.
    """
    decoded = decode_image(source, min_edge=cfg.min_decode_edge, max_pixels=max_pixels, draft=draft)
    image = reduce_for_resize(decoded.image, cfg.min_decode_edge) if draft else decoded.image
    return preprocess_array(np.array(image, dtype=np.uint8, copy=True), cfg)


__all__ = ["NUMPY_RESAMPLES", "load_pixels_array", "numpy_preprocessing", "preprocess_array", "resize_uint8"]
