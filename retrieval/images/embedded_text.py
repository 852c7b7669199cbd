"""The words a photo file carries about itself: a description and keywords, from EXIF
(ImageDescription, XPKeywords), XMP (``dc:description``, ``dc:subject``) and IPTC (Caption,
Keywords), as Lightroom, digiKam and phones write them.

XMP is parsed with ``defusedxml`` (no DTDs, no entities, no external references), so an entity
bomb or a reference to a local file is refused rather than expanded. A block that is malformed,
or larger than :data:`MAX_XMP_BYTES`, or text longer than :data:`MAX_TEXT_CHARS`, is ignored and
the reason returned as a note; reading never raises.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from PIL import Image

# An XMP packet larger than this is not a photo's metadata (nor is a description this long).
MAX_XMP_BYTES = 1 << 20
MAX_TEXT_CHARS = 20_000

_IMAGE_DESCRIPTION, _XP_KEYWORDS, _XMP_TAG = 0x010E, 0x9C9E, 0x02BC
_DC = "{http://purl.org/dc/elements/1.1/}"
_RDF_LI = "{http://www.w3.org/1999/02/22-rdf-syntax-ns#}li"
# IPTC IIM records (dataset 2): 25 keywords, 120 caption/abstract.
_IPTC_KEYWORDS, _IPTC_CAPTION = (2, 25), (2, 120)


@dataclass(frozen=True)
class EmbeddedText:
    """A file's own words: ``description`` and ``keywords`` (one per line), None where it has
    none; ``note`` says what was ignored and why (None when nothing was)."""

    description: str | None = None
    keywords: str | None = None
    note: str | None = None


NO_TEXT = EmbeddedText()


def exif_string(value: Any) -> str | None:
    """An EXIF string value as text (bytes as UTF-8, NULs as spaces, trimmed); None when empty
    or not text. Shared with :mod:`.exif`'s date, camera and GPS fields."""
    if isinstance(value, tuple) and all(isinstance(v, int) for v in value):
        value = bytes(value)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        return None
    text = value.replace("\x00", " ").strip()
    return text or None


def _xp(value: Any) -> str | None:
    # Windows XP tags: UTF-16LE bytes (PIL may give them as a tuple of ints), ';'-separated.
    if isinstance(value, tuple) and all(isinstance(v, int) for v in value):
        value = bytes(value)
    if isinstance(value, bytes):
        value = value.decode("utf-16-le", "replace")
    text = exif_string(value)
    return "\n".join(w.strip() for w in text.split(";") if w.strip()) if text else None


def _xmp_packet(img: Image.Image, exif: Any) -> bytes | None:
    for key in ("xmp", "XML:com.adobe.xmp"):
        value = img.info.get(key)
        if value:
            return value.encode("utf-8") if isinstance(value, str) else bytes(value)
    value = exif.get(_XMP_TAG) if exif is not None else None
    if isinstance(value, tuple) and all(isinstance(v, int) for v in value):
        value = bytes(value)
    return value if isinstance(value, bytes) and value else None


def parse_xmp(packet: bytes) -> tuple[list[str], list[str]]:
    """``(descriptions, subjects)`` of an XMP packet.

    Raises:
        ValueError: the packet is too large, malformed, or declares a DTD or entities (the
            message says which).
    """
    import defusedxml.ElementTree as SafeET
    from defusedxml import DefusedXmlException

    if len(packet) > MAX_XMP_BYTES:
        raise ValueError(f"XMP of {len(packet)} bytes is over the {MAX_XMP_BYTES} byte limit")
    # The packet wrapper (<?xpacket ...?>) and padding are fine for the parser; trailing NULs are not.
    packet = packet.strip(b"\x00 \n\r\t")
    try:
        root = SafeET.fromstring(packet, forbid_dtd=True)
    except DefusedXmlException as exc:
        raise ValueError(f"XMP refused ({type(exc).__name__})") from None
    except SafeET.ParseError as exc:
        raise ValueError(f"malformed XMP ({exc})") from None
    descriptions: list[str] = []
    subjects: list[str] = []
    for name, out in ((f"{_DC}description", descriptions), (f"{_DC}subject", subjects)):
        for el in root.iter(name):
            items = [li.text for li in el.iter(_RDF_LI)] or [el.text]
            out.extend(t.strip() for t in items if t and t.strip())
    return descriptions, subjects


def _iptc_decode(value: Any) -> Any:
    # IIM text is UTF-8 when the writer said so (record 1:90), but older tools (and many cameras'
    # companions) wrote Latin-1 without saying: bytes that are not valid UTF-8 are read as Latin-1
    # rather than turned into replacement characters.
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value.decode("latin-1")
    return value


def _iptc(img: Image.Image) -> tuple[list[str], list[str]]:
    from PIL import IptcImagePlugin

    info = IptcImagePlugin.getiptcinfo(img) or {}  # type: ignore[arg-type]  # any opened image: None when it has no IPTC

    def texts(key: tuple[int, int]) -> list[str]:
        value = info.get(key)
        values = value if isinstance(value, list) else [value] if value is not None else []
        return [t for t in (exif_string(_iptc_decode(v)) for v in values) if t]

    return texts(_IPTC_CAPTION), texts(_IPTC_KEYWORDS)


def read_embedded_text(img: Image.Image) -> EmbeddedText:
    """The :class:`EmbeddedText` of an opened image. Never raises."""
    notes: list[str] = []
    descriptions: list[str] = []
    keywords: list[str] = []
    try:
        exif = img.getexif()
    except Exception:  # noqa: BLE001 - a broken EXIF block: its text is unknown
        exif = None
    if exif is not None:
        for value, out in ((exif_string(exif.get(_IMAGE_DESCRIPTION)), descriptions), (_xp(exif.get(_XP_KEYWORDS)), keywords)):
            if value:
                out.append(value)
    try:
        packet = _xmp_packet(img, exif)
        if packet:
            xmp_descriptions, subjects = parse_xmp(packet)
            descriptions += xmp_descriptions
            keywords += subjects
    except ValueError as exc:
        notes.append(str(exc))
    except Exception as exc:  # noqa: BLE001 - any other failure of one file's XMP is that file's alone
        notes.append(f"XMP unreadable ({type(exc).__name__})")
    try:
        captions, iptc_keywords = _iptc(img)
        descriptions += captions
        keywords += iptc_keywords
    except Exception as exc:  # noqa: BLE001 - a broken IPTC block
        notes.append(f"IPTC unreadable ({type(exc).__name__})")
    description = _dedup(descriptions, " ")
    keyword_text = _dedup(keywords, "\n")
    kept: list[str | None] = []
    for what, text in (("description", description), ("keywords", keyword_text)):
        if text is not None and len(text) > MAX_TEXT_CHARS:
            notes.append(f"{what} of {len(text)} characters ignored (over {MAX_TEXT_CHARS})")
            text = None
        kept.append(text)
    return EmbeddedText(kept[0], kept[1], "; ".join(notes) or None)


def _dedup(values: list[str], sep: str) -> str | None:
    seen = dict.fromkeys(v for v in values if v)
    return sep.join(seen) if seen else None


__all__ = ["MAX_TEXT_CHARS", "MAX_XMP_BYTES", "NO_TEXT", "EmbeddedText", "exif_string", "parse_xmp", "read_embedded_text"]
