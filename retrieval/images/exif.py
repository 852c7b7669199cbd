"""When and with what a photo was taken, read from its EXIF block: :class:`PhotoMeta`.

``taken`` is ``DateTimeOriginal`` (with ``OffsetTimeOriginal`` when the camera wrote one),
``camera`` is make and model, ``gps`` latitude and longitude in degrees. A value the camera got
wrong (``0000:00:00 00:00:00``, a latitude of 200) is None: a photo is never given a date it
does not carry, and never the file's modification time. Reading never raises.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import warnings
from dataclasses import dataclass
from typing import Any

from PIL import ExifTags, Image

from .embedded_text import NO_TEXT, read_embedded_text
from .embedded_text import exif_string as _text

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
# EXIF tags (CIPA DC-008): IFD0, the Exif IFD and the GPS IFD.
_MAKE, _MODEL = 0x010F, 0x0110
_DATETIME_ORIGINAL, _OFFSET_TIME_ORIGINAL = 0x9003, 0x9011
_GPS_LAT_REF, _GPS_LAT, _GPS_LON_REF, _GPS_LON = 1, 2, 3, 4
# A camera string longer than this is not a make and model (a corrupt block); it is dropped.
_MAX_CAMERA = 200


@dataclass(frozen=True)
class PhotoMeta:
    """What a file says about the photo (None: it does not say, or says nonsense).

    Attributes:
        taken_us: when it was taken, microseconds since the epoch. With ``taken_offset`` this
            is the UTC instant; without it the camera's wall-clock time read as UTC (cameras
            rarely record their zone, and a date filter on wall-clock dates is what people mean).
        taken_offset: the offset from UTC in minutes that the camera recorded, if any.
        camera: make and model, e.g. ``"Canon EOS 5D"``.
        gps_lat: latitude in degrees, north positive (set together with ``gps_lon``).
        gps_lon: longitude in degrees, east positive.
        raw_source: for a camera RAW file, which image was embedded: ``preview`` (the
            camera's embedded JPEG/bitmap) or ``demosaic`` (the sensor data); None otherwise.
        description: the file's own description (EXIF, XMP, IPTC; see
            :mod:`retrieval.images.embedded_text`).
        keywords: its keywords, one per line.
        ocr_text: text recognised in the pixels (``index --ocr``; set by the indexer).
        note: what of the file's metadata was ignored and why (malformed or huge XMP), or that
            OCR could not read the image; never stored in a column.
    """

    taken_us: int | None = None
    taken_offset: int | None = None
    camera: str | None = None
    gps_lat: float | None = None
    gps_lon: float | None = None
    raw_source: str | None = None
    description: str | None = None
    keywords: str | None = None
    ocr_text: str | None = None
    note: str | None = None


NO_META = PhotoMeta()


def read_meta(img: Image.Image) -> PhotoMeta:
    """The :class:`PhotoMeta` of an opened image (any format whose EXIF PIL exposes; HEIC's once
    pillow-heif's opener is registered), with its embedded description and keywords. Never
    raises: a broken block gives None values."""
    text = read_embedded_text(img)
    try:
        exif = img.getexif()
    except Exception:  # noqa: BLE001 - a broken EXIF block must not fail the decode
        meta = NO_META
    else:
        meta = meta_of_exif(exif)
    if text == NO_TEXT:
        return meta
    return dataclasses.replace(meta, description=text.description, keywords=text.keywords, note=text.note)


def read_tiff_meta(data: bytes) -> PhotoMeta:
    """The :class:`PhotoMeta` of a TIFF-based file (DNG, CR2, NEF, ARW, ORF, RW2) from its IFDs,
    without opening it as an image; NO_META for other files. Never raises."""
    if data[:4] not in (b"II*\x00", b"MM\x00*", b"IIRO", b"IIU\x00"):
        return NO_META
    exif = Image.Exif()
    try:
        with warnings.catch_warnings():
            # PIL warns "Corrupt EXIF data" and reads on: the values it could not read are None.
            warnings.simplefilter("ignore", UserWarning)
            exif.load(data)
    except Exception:  # noqa: BLE001 - a broken header: no metadata
        return NO_META
    return meta_of_exif(exif)


def meta_of_exif(exif: Image.Exif) -> PhotoMeta:
    """The :class:`PhotoMeta` of a loaded EXIF block. Never raises."""
    try:
        if not exif:
            return NO_META
    except Exception:  # noqa: BLE001 - a block too broken to count its tags
        return NO_META
    taken_us, offset = _taken(_sub_ifd(exif, ExifTags.IFD.Exif))
    if taken_us is None:
        # TIFF/EP files (DNG and other RAWs) may keep DateTimeOriginal in IFD0 itself.
        taken_us, offset = _taken(dict(exif))
    lat, lon = _gps(_sub_ifd(exif, ExifTags.IFD.GPSInfo))
    return PhotoMeta(taken_us, offset, _camera(exif.get(_MAKE), exif.get(_MODEL)), lat, lon)


def _sub_ifd(exif: Image.Exif, ifd: int) -> dict[int, Any]:
    try:
        return dict(exif.get_ifd(ifd))
    except Exception:  # noqa: BLE001 - an IFD pointer into nowhere
        return {}


def parse_exif_time(value: Any, offset: Any = None) -> tuple[int | None, int | None]:
    """``("2021:05:01 10:00:00", "+02:00")`` -> (microseconds since the epoch, offset minutes).

    Returns ``(None, None)`` for anything that is not a real date (zeros, blanks, a month 13).
    """
    text = _text(value)
    if text is None:
        return None, None
    try:
        when = dt.datetime.strptime(text[:19], "%Y:%m:%d %H:%M:%S")
    except ValueError:
        return None, None
    minutes = _offset_minutes(_text(offset))
    zone = dt.timezone(dt.timedelta(minutes=minutes)) if minutes is not None else dt.timezone.utc
    return (when.replace(tzinfo=zone) - _EPOCH) // dt.timedelta(microseconds=1), minutes


def _offset_minutes(text: str | None) -> int | None:
    # EXIF 2.31: "+HH:MM" or "-HH:MM"; blanks ("   :  ") mean unknown.
    if text is None or len(text) != 6 or text[0] not in "+-" or text[3] != ":":
        return None
    try:
        hours, minutes = int(text[1:3]), int(text[4:6])
    except ValueError:
        return None
    if hours > 14 or minutes > 59:
        return None
    return (hours * 60 + minutes) * (-1 if text[0] == "-" else 1)


def _taken(ifd: dict[int, Any]) -> tuple[int | None, int | None]:
    return parse_exif_time(ifd.get(_DATETIME_ORIGINAL), ifd.get(_OFFSET_TIME_ORIGINAL))


def _camera(make: Any, model: Any) -> str | None:
    make_text, model_text = _text(make), _text(model)
    if make_text and model_text and model_text.lower().startswith(make_text.split()[0].lower()):
        # "Canon" + "Canon EOS 5D": the model already names the make.
        make_text = None
    camera = " ".join(t for t in (make_text, model_text) if t)
    return camera if camera and len(camera) <= _MAX_CAMERA else None


def _degrees(value: Any) -> float | None:
    try:
        parts = [float(v) for v in value]
    except (TypeError, ValueError, ZeroDivisionError):
        return None
    if len(parts) != 3 or not all(math.isfinite(p) and p >= 0 for p in parts):
        return None
    return parts[0] + parts[1] / 60 + parts[2] / 3600


def _gps(ifd: dict[int, Any]) -> tuple[float | None, float | None]:
    lat, lon = _degrees(ifd.get(_GPS_LAT)), _degrees(ifd.get(_GPS_LON))
    if lat is None or lon is None or lat > 90 or lon > 180:
        return None, None
    if _text(ifd.get(_GPS_LAT_REF)) == "S":
        lat = -lat
    if _text(ifd.get(_GPS_LON_REF)) == "W":
        lon = -lon
    return lat, lon


def iso_taken(taken_us: int | None, offset: int | None) -> str | None:
    """``taken`` as ISO 8601: with the camera's offset when it recorded one, else its wall-clock
    time without a zone (``2021-05-01T10:00:00``)."""
    if taken_us is None:
        return None
    when = _EPOCH + dt.timedelta(microseconds=int(taken_us))
    if offset is None:
        return when.replace(tzinfo=None).isoformat()
    return when.astimezone(dt.timezone(dt.timedelta(minutes=int(offset)))).isoformat()


__all__ = ["NO_META", "PhotoMeta", "iso_taken", "meta_of_exif", "parse_exif_time", "read_meta", "read_tiff_meta"]
