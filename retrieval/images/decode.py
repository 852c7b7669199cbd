"""Decoding any file PIL can read into an RGB image the way a person would expect.

EXIF orientation applied, transparency composited onto white, 16-bit and float images scaled
to 8 bits rather than clipped, the first frame of animations, and JPEGs decoded at a reduced
DCT scale (draft mode) when the model needs far fewer pixels than the file has. Every failure
is an :class:`~retrieval.errors.ImageDecodeError` naming the file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np
from PIL import Image, ImageOps

from ..errors import ImageDecodeError
from .exif import NO_META, PhotoMeta, read_meta, read_tiff_meta
from .formats import AVIF_EXTENSIONS, HEIF_EXTENSIONS, RAW_EXTENSIONS, decode_raw, ensure_decoder, kind_of, peek, read_all

# File extensions the indexer looks at (compared lower-case). HEIF, AVIF and RAW files are
# listed whether or not their decoder is installed: without it they become skip records that
# say what to install, rather than files nobody is told about.
IMAGE_EXTENSIONS: frozenset[str] = (
    frozenset({".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff"})
    | HEIF_EXTENSIONS
    | AVIF_EXTENSIONS
    | RAW_EXTENSIONS
)

# PIL's own limit: images above it are refused as decompression bombs (PIL only warns between
# 1x and 2x of it; a long build must not be stalled by a 200-megapixel decode either).
DEFAULT_MAX_PIXELS: int = Image.MAX_IMAGE_PIXELS or 89_478_485


@dataclass(frozen=True)
class DecodedImage:
    """An RGB image plus the size of the original after EXIF orientation, and what the file
    says about the photo (:class:`~retrieval.images.exif.PhotoMeta`).

    ``image`` may be smaller than ``width`` x ``height`` when JPEG draft decoding was used, or
    a RAW file's embedded preview.
    """

    image: Image.Image
    width: int
    height: int
    meta: PhotoMeta = NO_META


def _scale_to_uint8(img: Image.Image) -> Image.Image:
    # PIL's own convert("L") clips 16-bit and float pixels at 255, turning most of a 16-bit
    # photo white; scale the real value range instead.
    arr = np.asarray(img)
    if img.mode == "F":
        arr = arr.astype(np.float64)
        finite = arr[np.isfinite(arr)]
        top = float(finite.max()) if finite.size else 1.0
        scale = 255.0 if top <= 1.0 else (255.0 / 65535.0 if top > 255.0 else 1.0)
        out = np.clip(np.nan_to_num(arr) * scale, 0, 255)
    else:
        arr = arr.astype(np.int64)
        # I;16 is always 16-bit; mode I (32-bit) from PNG/TIFF holds 16-bit samples in practice.
        sixteen = img.mode.startswith("I;16") or int(arr.max(initial=0)) > 255
        out = np.clip(arr, 0, 65535) / 257.0 if sixteen else np.clip(arr, 0, 255)
    return Image.fromarray(np.rint(out).astype(np.uint8), "L")


def to_rgb(img: Image.Image) -> Image.Image:
    """Convert any PIL image to RGB, compositing transparency onto a white background."""
    has_alpha = "A" in img.getbands() or "transparency" in img.info
    if img.mode == "RGB" and not has_alpha:
        return img
    if img.mode in ("I", "F") or img.mode.startswith("I;16"):
        return _scale_to_uint8(img).convert("RGB")
    if has_alpha:
        # Same rule as transformers' convert_to_rgb, so transparent images keep parity too.
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return img.convert("RGB")


def _oriented_size(img: Image.Image) -> tuple[int, int]:
    # EXIF orientations 5..8 swap width and height.
    try:
        orientation = img.getexif().get(0x0112, 1)
    except Exception:  # noqa: BLE001 - a broken EXIF block must not fail the decode
        orientation = 1
    w, h = img.size
    return (h, w) if orientation in (5, 6, 7, 8) else (w, h)


@contextlib.contextmanager
def _pixel_limit(max_pixels: int) -> Iterator[None]:
    # PIL checks its module-global limit inside Image.open (warning above it, error above
    # twice it); make that limit ours, so a caller's higher max_pixels is honoured too.
    previous = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = max_pixels
    try:
        yield
    finally:
        Image.MAX_IMAGE_PIXELS = previous


def decode_image(
    source: str | bytes | os.PathLike[str] | os.PathLike[bytes] | BinaryIO,
    *,
    min_edge: int | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    name: str | None = None,
    draft: bool = True,
) -> DecodedImage:
    """Open and decode one image file to RGB.

    HEIF/HEIC, AVIF and camera RAW files are decoded too (see :mod:`retrieval.images.formats`).

    Args:
        source: a path (str or bytes) or a binary file object.
        min_edge: if given, JPEGs are decoded at the smallest DCT scale (1/2, 1/4, 1/8) whose
            shorter side is still >= ``min_edge`` pixels, and a RAW file's embedded preview is
            used when its shorter side is at least this (else the sensor data is demosaiced).
        max_pixels: images with more pixels are refused as decompression bombs.
        name: how to name the file in error messages (defaults to the path).
        draft: False decodes JPEGs in full whatever ``min_edge`` (which then only picks a
            RAW file's preview): the pixels a reference processor decodes.

    Returns:
        The RGB image with its original (EXIF-oriented) width and height.

    Raises:
        ImageDecodeError: the file is empty, truncated, not an image, too large or unreadable,
            or needs a decoder that is not installed (the reason names the extra).
    """
    label = name if name is not None else _label(source)
    kind: str | None = None
    try:
        kind = kind_of(label, peek(source))
        ensure_decoder(kind, label)
        if kind == "raw":
            return _decode_raw(read_all(source), label, min_edge, max_pixels)
        with warnings.catch_warnings(), _pixel_limit(max_pixels):
            # Image.open warns each plugin's complaint about a damaged file (pillow-heif's
            # "Unexpected end of file"); the skip record's reason says it once, without them.
            warnings.simplefilter("ignore", UserWarning)
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(source) as img:
                meta = read_meta(img)
                width, height = _oriented_size(img)
                if width * height > max_pixels:
                    raise ImageDecodeError(
                        label,
                        f"decompression bomb: {width}x{height} pixels exceeds the limit of {max_pixels}",
                    )
                if getattr(img, "n_frames", 1) > 1:
                    img.seek(0)
                if draft and min_edge is not None and img.format == "JPEG":
                    # draft() picks the largest reduction that keeps both sides >= the request.
                    img.draft(img.mode, (min_edge, min_edge))
                img.load()
                oriented = ImageOps.exif_transpose(img)
                rgb = to_rgb(oriented)
                rgb.load()
                if rgb is img:
                    rgb = img.copy()
    except ImageDecodeError:
        raise
    except FileNotFoundError:
        raise ImageDecodeError(label, "file not found") from None
    except PermissionError:
        raise ImageDecodeError(label, "permission denied") from None
    except IsADirectoryError:
        raise ImageDecodeError(label, "is a directory") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        # PIL's text ends in ", could be decompression bomb DOS attack."; keep the numbers.
        detail = str(exc).split(", could be")[0].rstrip(".")
        raise ImageDecodeError(label, f"decompression bomb: {detail}") from None
    except Image.UnidentifiedImageError:
        if _is_empty(source):
            reason = "empty file"
        elif kind in ("heif", "avif"):
            # Its ftyp box says HEIF/AVIF, yet the decoder found no image: cut off or damaged.
            reason = f"damaged or truncated {kind.upper()} file"
        else:
            reason = "not an image (unrecognised format)"
        raise ImageDecodeError(label, reason) from None
    except (OSError, SyntaxError, ValueError, EOFError, MemoryError, TypeError, IndexError, RuntimeError) as exc:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "truncated" in text:
            text = "truncated file"
        if kind in ("heif", "avif"):
            raise ImageDecodeError(label, f"damaged or truncated {kind.upper()} file: {text}") from None
        raise ImageDecodeError(label, f"decode failed: {text}") from None
    return DecodedImage(image=rgb, width=width, height=height, meta=meta)


def _decode_raw(data: bytes, label: str, min_edge: int | None, max_pixels: int) -> DecodedImage:
    if not data:
        raise ImageDecodeError(label, "empty file")
    raw = decode_raw(data, label, min_edge)
    width, height = raw.image.size
    if width * height > max_pixels:
        raise ImageDecodeError(label, f"decompression bomb: {width}x{height} pixels exceeds the limit of {max_pixels}")
    # Most RAW formats are TIFFs whose IFDs hold the EXIF; the others (CR3, RAF) carry none
    # that PIL can reach, so their rows have no date or camera.
    meta = dataclasses.replace(read_tiff_meta(data), raw_source=raw.source)
    return DecodedImage(image=raw.image, width=width, height=height, meta=meta)


def _label(source: Any) -> str:
    if isinstance(source, bytes):
        return os.fsdecode(source)
    if isinstance(source, (str, os.PathLike)):
        return os.fsdecode(source)
    return getattr(source, "name", "<stream>")


def _is_empty(source: Any) -> bool:
    try:
        if isinstance(source, (str, bytes, os.PathLike)):
            return os.path.getsize(source) == 0
        if isinstance(source, io.BytesIO):
            return len(source.getbuffer()) == 0
    except OSError:
        return False
    return False


def probe_image(data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS, name: str | None = None) -> tuple[int, int]:
    """(width, height) after EXIF orientation from the header alone, with the bomb check.

    Raises:
        ImageDecodeError: not an image, or more than ``max_pixels`` pixels.
    """
    width, height, _ = probe_photo(data, max_pixels=max_pixels, name=name)
    return width, height


def probe_photo(data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS, name: str | None = None) -> tuple[int, int, PhotoMeta]:
    """:func:`probe_image` and the photo's :class:`~retrieval.images.exif.PhotoMeta`, from the
    header alone (the indexer's GPU path decodes the pixels elsewhere).

    Raises:
        ImageDecodeError: not an image, or more than ``max_pixels`` pixels.
    """
    label = name if name is not None else "<bytes>"
    try:
        with warnings.catch_warnings(), _pixel_limit(max_pixels):
            warnings.simplefilter("ignore", UserWarning)  # as in decode_image
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as img:
                meta = read_meta(img)
                width, height = _oriented_size(img)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        detail = str(exc).split(", could be")[0].rstrip(".")
        raise ImageDecodeError(label, f"decompression bomb: {detail}") from None
    except Image.UnidentifiedImageError:
        raise ImageDecodeError(label, "empty file" if not data else "not an image (unrecognised format)") from None
    except (OSError, SyntaxError, ValueError, EOFError, TypeError, IndexError) as exc:
        raise ImageDecodeError(label, f"decode failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    if width * height > max_pixels:
        raise ImageDecodeError(label, f"decompression bomb: {width}x{height} pixels exceeds the limit of {max_pixels}")
    return width, height, meta
