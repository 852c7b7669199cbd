"""Which decoder a file needs beyond PIL's own, and the optional decoders themselves.

- HEIC/HEIF: PIL through pillow-heif's opener (the ``heic`` extra), registered on the first
  HEIF file, never at import;
- AVIF: Pillow's own plugin (Pillow >= 11.3 built with libavif);
- camera RAW (DNG, CR2, CR3, NEF, ARW, RAF, ORF, RW2): rawpy (LibRaw, the ``raw`` extra): the
  embedded preview when it is at least the size the model needs, else the sensor data
  demosaiced with the camera's white balance; :class:`RawImage` says which.

A file of a known extension whose decoder is missing or fails raises
:class:`~retrieval.errors.ImageDecodeError` with the reason (and the extra to install).
"""

from __future__ import annotations

import io
import os
import threading
from dataclasses import dataclass
from typing import Any, BinaryIO

from PIL import Image, ImageOps

from ..errors import ImageDecodeError

HEIF_EXTENSIONS = frozenset({".heic", ".heif", ".hif"})
AVIF_EXTENSIONS = frozenset({".avif"})
RAW_EXTENSIONS = frozenset({".dng", ".cr2", ".cr3", ".nef", ".arw", ".raf", ".orf", ".rw2"})
HEIF_EXTRA = "HEIC needs pillow-heif: pip install 'clipsearch[heic]'"
RAW_EXTRA = "camera RAW needs rawpy: pip install 'clipsearch[raw]'"
AVIF_MISSING = "AVIF needs Pillow built with AVIF support (Pillow >= 11.3)"
# ISO-BMFF brands (the ``ftyp`` box) of HEIF stills and sequences.
_HEIF_BRANDS = frozenset({b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"mif1", b"msf1", b"mif2"})
_AVIF_BRANDS = frozenset({b"avif", b"avis"})

_heif_lock = threading.Lock()
_heif_registered = False


def kind_of(name: str, head: bytes) -> str | None:
    """``"heif"``, ``"avif"``, ``"raw"`` or None (PIL's own formats) for a file called ``name``
    that starts with ``head`` (its first 12 bytes or more). HEIF and AVIF are known by their
    ``ftyp`` brand, whatever the name; RAW files by their extension (most are TIFFs inside)."""
    if len(head) >= 12 and head[4:8] == b"ftyp":
        brand = head[8:12]
        if brand in _AVIF_BRANDS:
            return "avif"
        if brand in _HEIF_BRANDS:
            return "heif"
    ext = os.path.splitext(name)[1].lower()
    if ext in RAW_EXTENSIONS:
        return "raw"
    if ext in HEIF_EXTENSIONS:
        return "heif"
    if ext in AVIF_EXTENSIONS:
        return "avif"
    return None


def ensure_decoder(kind: str | None, label: str) -> None:
    """Make PIL able to open ``kind`` (register pillow-heif's opener once for HEIF).

    Raises:
        ImageDecodeError: the decoder is not installed (the reason names the extra).
    """
    global _heif_registered
    if kind == "heif" and not _heif_registered:
        with _heif_lock:
            if not _heif_registered:
                try:
                    import pillow_heif
                except ImportError:
                    raise ImageDecodeError(label, HEIF_EXTRA) from None
                pillow_heif.register_heif_opener()
                _heif_registered = True
    elif kind == "avif":
        from PIL import features

        if not features.check("avif"):
            raise ImageDecodeError(label, AVIF_MISSING)


@dataclass(frozen=True)
class RawImage:
    """A RAW file's image, oriented as the camera was held, and which one it is."""

    image: Image.Image
    source: str  # "preview" or "demosaic"


# LibRaw's ``flip`` (0, 3, 5, 6) as the PIL transpose that undoes it.
_FLIP = {3: Image.Transpose.ROTATE_180, 5: Image.Transpose.ROTATE_90, 6: Image.Transpose.ROTATE_270}


def decode_raw(data: bytes, label: str, min_edge: int | None) -> RawImage:
    """Decode a camera RAW file's bytes with rawpy.

    Args:
        data: the whole file.
        label: how errors name the file.
        min_edge: the shorter side the model needs: an embedded preview at least this large
            is used; otherwise (or with None) the sensor data is demosaiced.

    Raises:
        ImageDecodeError: rawpy is not installed, or LibRaw finds no image it can decode.
    """
    try:
        import rawpy
    except ImportError:
        raise ImageDecodeError(label, RAW_EXTRA) from None
    try:
        with rawpy.imread(io.BytesIO(data)) as raw:
            flip = int(raw.sizes.flip)
            preview = _preview(raw, rawpy) if min_edge is not None else None
            if preview is not None and min(preview.size) >= min_edge:  # type: ignore[operator]  # None handled above
                oriented = preview.transpose(_FLIP[flip]) if flip in _FLIP else preview
                return RawImage(oriented, "preview")
            # postprocess applies the camera's orientation itself.
            rgb = raw.postprocess(use_camera_wb=True, output_bps=8)
    except ImageDecodeError:
        raise
    except Exception as exc:  # noqa: BLE001 - LibRaw's errors are many classes of one meaning
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if text.startswith(("b'", 'b"')) and len(text) > 3:
            text = text[2:-1]  # LibRaw's messages come as bytes reprs
        raise ImageDecodeError(label, f"RAW decode failed: {text}") from None
    return RawImage(Image.fromarray(rgb, "RGB"), "demosaic")


def _preview(raw: Any, rawpy: Any) -> Image.Image | None:
    try:
        thumb = raw.extract_thumb()
    except Exception:  # noqa: BLE001 - no preview, or one LibRaw cannot unpack: demosaic instead
        return None
    try:
        if thumb.format == rawpy.ThumbFormat.JPEG:
            with Image.open(io.BytesIO(thumb.data)) as img:
                img.load()
                # A preview JPEG's own EXIF orientation (rare) is applied before the RAW's flip.
                return ImageOps.exif_transpose(img).convert("RGB")
        if thumb.format == rawpy.ThumbFormat.BITMAP:
            return Image.fromarray(thumb.data).convert("RGB")
    except Exception:  # noqa: BLE001 - a damaged preview: demosaic instead
        return None
    return None


def peek(source: str | bytes | os.PathLike[str] | os.PathLike[bytes] | BinaryIO, n: int = 16) -> bytes:
    """The first ``n`` bytes of a path or a seekable file object (the position is kept); b""
    when they cannot be read (the decoder then reports why)."""
    try:
        if isinstance(source, (str, bytes, os.PathLike)):
            with open(source, "rb") as fh:
                return fh.read(n)
        pos = source.tell()
        head = source.read(n)
        source.seek(pos)
        return head
    except (OSError, AttributeError, ValueError):
        return b""


def read_all(source: str | bytes | os.PathLike[str] | os.PathLike[bytes] | BinaryIO) -> bytes:
    """The whole of a path or a file object (RAW files are decoded from memory)."""
    if isinstance(source, (str, bytes, os.PathLike)):
        with open(source, "rb") as fh:
            return fh.read()
    return source.read()


__all__ = [
    "AVIF_EXTENSIONS",
    "HEIF_EXTENSIONS",
    "RAW_EXTENSIONS",
    "RAW_EXTRA",
    "HEIF_EXTRA",
    "RawImage",
    "decode_raw",
    "ensure_decoder",
    "kind_of",
    "peek",
    "read_all",
]
