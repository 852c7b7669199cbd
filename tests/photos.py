"""Real photographs for the format tests: scikit-image's bundled photos written out as HEIC, AVIF,
JPEG with EXIF (dates, GPS, each orientation), PNG with alpha, and DNG (a Bayer mosaic with an
embedded preview, or without one) that LibRaw reads.

The photos are read from the files scikit-image ships in ``skimage/data`` (never its fetchers,
which download); each is reduced so that tests stay fast.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np
from PIL import ExifTags, Image

PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png")


def photo(name: str, max_side: int = 160) -> Image.Image:
    """One of scikit-image's bundled photos as RGB, its longer side at most ``max_side``."""
    import skimage

    img = Image.open(os.path.join(os.path.dirname(skimage.__file__), "data", name)).convert("RGB")
    img.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
    return img


def exif_bytes(
    taken: str | None = None,
    offset: str | None = None,
    make: str | None = None,
    model: str | None = None,
    gps: tuple[Any, str, Any, str] | None = None,
    orientation: int | None = None,
) -> bytes:
    """An EXIF block: ``DateTimeOriginal``/``OffsetTimeOriginal``, make, model, GPS as
    ``(lat_dms, "N"|"S", lon_dms, "E"|"W")`` and orientation, where given."""
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
    if make is not None:
        exif[0x010F] = make
    if model is not None:
        exif[0x0110] = model
    if taken is not None or offset is not None:
        ifd = exif.get_ifd(ExifTags.IFD.Exif)
        if taken is not None:
            ifd[0x9003] = taken
        if offset is not None:
            ifd[0x9011] = offset
    if gps is not None:
        ifd = exif.get_ifd(ExifTags.IFD.GPSInfo)
        ifd[1], ifd[2], ifd[3], ifd[4] = gps[1], gps[0], gps[3], gps[2]
    return exif.tobytes()


def save(img: Image.Image, path: Path, fmt: str, **kwargs: Any) -> Path:
    """``img`` saved as ``fmt`` (HEIF through pillow-heif, registered here for the writer)."""
    if fmt == "HEIF":
        import pillow_heif

        pillow_heif.register_heif_opener()
    img.save(path, fmt, **kwargs)
    return path


def oriented_as(img: Image.Image, orientation: int) -> Image.Image:
    """The pixels a camera held with EXIF ``orientation`` stores for the upright ``img``: the
    inverse of ``ImageOps.exif_transpose``."""
    inverse = {
        2: [Image.Transpose.FLIP_LEFT_RIGHT],
        3: [Image.Transpose.ROTATE_180],
        4: [Image.Transpose.FLIP_TOP_BOTTOM],
        5: [Image.Transpose.TRANSPOSE],
        6: [Image.Transpose.ROTATE_90],
        7: [Image.Transpose.TRANSVERSE],
        8: [Image.Transpose.ROTATE_270],
    }
    out = img
    for step in inverse.get(orientation, []):
        out = out.transpose(step)
    return out


def write_dng(path: Path, img: Image.Image, *, preview: bool, make: str = "TestMake", model: str = "Test DNG",
              taken: str | None = None, data: bool = True, orientation: int | None = None) -> Path:
    """A DNG LibRaw reads: an RGGB Bayer mosaic of ``img`` (16-bit, linear), with an RGB preview
    of the same size in IFD0 when ``preview`` (the raw data then in a SubIFD). ``data=False``
    writes the tags of a raw image whose strip is cut off (no decodable image); ``orientation``
    is the TIFF Orientation tag (LibRaw's ``flip``)."""
    import tifffile

    rgb = np.asarray(img.convert("RGB"))
    h, w = rgb.shape[0] // 2 * 2, rgb.shape[1] // 2 * 2
    rgb = rgb[:h, :w]
    linear = (rgb.astype(np.float64) / 255) ** 2.2 * 4000
    cfa = np.zeros((h, w), np.uint16)
    cfa[0::2, 0::2] = linear[0::2, 0::2, 0]
    cfa[0::2, 1::2] = linear[0::2, 1::2, 1]
    cfa[1::2, 0::2] = linear[1::2, 0::2, 1]
    cfa[1::2, 1::2] = linear[1::2, 1::2, 2]
    # ColorMatrix1 (XYZ to camera) as XYZ to linear sRGB: the "camera" sees sRGB primaries.
    xyz_to_srgb = (3.2406, -1.5372, -0.4986, -0.9689, 1.8758, 0.0415, 0.0557, -0.2040, 1.0570)
    matrix = tuple(x for v in xyz_to_srgb for x in (round(v * 10000), 10000))
    common = [
        (50706, "B", 4, (1, 4, 0, 0), True),  # DNGVersion
        (50708, "s", 0, f"{make} {model}", True),  # UniqueCameraModel
        (271, "s", 0, make, True),
        (272, "s", 0, model, True),
        (50721, "2i", 9, matrix, True),  # ColorMatrix1
        (50778, "H", 1, 21, True),  # CalibrationIlluminant1: D65
        (50728, "2I", 3, (1, 1, 1, 1, 1, 1), True),  # AsShotNeutral: the camera's white balance
    ]
    if taken is not None:
        common.append((36867, "s", 0, taken, True))  # DateTimeOriginal, in IFD0 as DNG allows
    if orientation is not None:
        common.append((274, "H", 1, orientation, True))
    raw_tags = [(33421, "H", 2, (2, 2), True), (33422, "B", 4, (0, 1, 1, 2), True), (50717, "I", 1, 4095, True)]
    with tifffile.TiffWriter(path) as tif:
        if preview:
            tif.write(rgb, photometric="rgb", subfiletype=1, subifds=1, extratags=common)
            tif.write(cfa, photometric=32803, subfiletype=0, extratags=raw_tags)
        else:
            tif.write(cfa, photometric=32803, subfiletype=0, extratags=common + raw_tags)
    if not data:
        # Keep the header and tags, lose the pixels: LibRaw finds the raw IFD and no data.
        blob = path.read_bytes()
        path.write_bytes(blob[: len(blob) // 8])
    return path


def png_with_alpha(img: Image.Image) -> Image.Image:
    """``img`` with a transparent band down its left quarter."""
    rgba = img.convert("RGBA")
    alpha = np.full((img.height, img.width), 255, np.uint8)
    alpha[:, : img.width // 4] = 0
    rgba.putalpha(Image.fromarray(alpha))
    return rgba


def encoded(img: Image.Image, fmt: str, **kwargs: Any) -> bytes:
    """``img`` encoded as ``fmt`` in memory."""
    buf = io.BytesIO()
    if fmt == "HEIF":
        import pillow_heif

        pillow_heif.register_heif_opener()
    img.save(buf, fmt, **kwargs)
    return buf.getvalue()


__all__ = ["PHOTOS", "encoded", "exif_bytes", "oriented_as", "photo", "png_with_alpha", "save", "write_dng"]
