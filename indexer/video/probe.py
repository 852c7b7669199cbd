"""What a video file is, by its content: the container's signature, its video stream and codec,
duration, frame rate, rotation and when and where it was recorded (:class:`VideoInfo`).

A file is a video when its first bytes carry an MP4/QuickTime, Matroska/WebM or AVI signature
(:func:`sniff`) and FFmpeg (PyAV, the ``video`` extra) opens it with a video stream it can
decode; the extension only says where to look. Every refusal is a
:class:`~retrieval.errors.VideoDecodeError` whose ``reason`` is short and stable, the skip
list's reason.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Union

from retrieval.errors import VideoDecodeError
from retrieval.images import PhotoMeta

if TYPE_CHECKING:
    from av.container import InputContainer
    from av.video.stream import VideoStream

VIDEO_EXTENSIONS: frozenset[str] = frozenset({".mp4", ".mov", ".mkv", ".webm", ".m4v", ".avi"})
# QuickTime files may open with any top-level atom; these are the ones writers put first.
_QT_ATOMS = (b"ftyp", b"moov", b"mdat", b"wide", b"free", b"skip", b"pnot")
_EBML = b"\x1a\x45\xdf\xa3"
HEAD_BYTES = 16
# Where a video is read from: a path, or an open binary file positioned anywhere (a member of a
# WebDataset shard: :mod:`indexer.video.source`), which PyAV reads and seeks in.
VideoSource = Union[str, bytes, "os.PathLike[Any]", IO[bytes]]


def source_name(source: VideoSource, name: str | None = None) -> str:
    """What error messages call ``source``: ``name`` if given, else the path (or the file's name)."""
    if name is not None:
        return name
    if isinstance(source, (str, bytes, os.PathLike)):
        return os.fsdecode(source)
    return str(getattr(source, "name", "<video>"))


def read_head(source: VideoSource) -> bytes:
    """The first :data:`HEAD_BYTES` of ``source`` (an open file is left at its start).

    Raises:
        OSError: the file cannot be read.
    """
    if isinstance(source, (str, bytes, os.PathLike)):
        with open(source, "rb") as f:
            return f.read(HEAD_BYTES)
    source.seek(0)
    head = source.read(HEAD_BYTES)
    source.seek(0)
    return head


def sniff(head: bytes) -> str | None:
    """The container family the first bytes of a file announce (``mp4``, ``matroska``, ``avi``),
    or None when they announce none of them (an image, a text file, an empty file)."""
    if len(head) >= 8 and head[4:8] in _QT_ATOMS:
        return "mp4"
    if head.startswith(_EBML):
        return "matroska"
    if len(head) >= 12 and head.startswith(b"RIFF") and head[8:12] == b"AVI ":
        return "avi"
    return None


def is_video_file(path: str | bytes | os.PathLike[Any]) -> bool:
    """Whether the file's first bytes announce a video container (:func:`sniff`); False when it
    cannot be read."""
    try:
        with open(path, "rb") as f:
            return sniff(f.read(HEAD_BYTES)) is not None
    except OSError:
        return False


def content_type(path: str | bytes | os.PathLike[Any]) -> str | None:
    """The HTTP content type of a video file, from its container signature (the name only tells
    QuickTime from MP4 and WebM from other Matroska); None when it is no video container."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
    except OSError:
        return None
    return content_type_of(head, os.fsdecode(path))


def content_type_of(head: bytes, name: str) -> str | None:
    """:func:`content_type` from a video's first bytes and its file (or shard member) name."""
    family = sniff(head)
    suffix = os.path.splitext(name)[1].lower()
    if family == "mp4":
        return "video/quicktime" if suffix == ".mov" else "video/mp4"
    if family == "matroska":
        return "video/webm" if suffix == ".webm" else "video/x-matroska"
    return "video/x-msvideo" if family == "avi" else None


@dataclass(frozen=True)
class VideoInfo:
    """The facts of one video file.

    Attributes:
        container: FFmpeg's name of the container (``mov,mp4,m4a,3gp,3g2,mj2``, ``matroska,webm``).
        codec: the video stream's codec (``h264``, ``hevc``, ``vp9``, ``av1``...).
        width, height: the displayed size, after ``rotation``.
        duration: seconds (0.0 where the container does not say and no frame does).
        fps: the average frame rate (0.0 where unknown).
        rotation: degrees counter-clockwise the frames are turned for display (0, 90, -90, 180).
        taken_us, taken_offset: when it was recorded, as :class:`~retrieval.images.PhotoMeta`
            holds a photo's date (QuickTime's local ``creationdate`` first, else ``creation_time``).
        camera, gps: the phone or camera and the recorded location, where the container says.
        has_audio: whether it also holds an audio stream.
    """

    container: str
    codec: str
    width: int
    height: int
    duration: float
    fps: float
    rotation: int = 0
    taken_us: int | None = None
    taken_offset: int | None = None
    camera: str | None = None
    gps: tuple[float, float] | None = None
    has_audio: bool = False

    def photo_meta(self) -> PhotoMeta:
        """The video's date, camera and place in the shape an image's facts are stored in."""
        lat, lon = self.gps if self.gps is not None else (None, None)
        return PhotoMeta(self.taken_us, self.taken_offset, self.camera, lat, lon)


@contextmanager
def open_video(path: VideoSource, open_timeout: float = 30.0, name: str | None = None) -> Iterator[tuple[InputContainer, VideoStream]]:
    """The opened container and its first video stream, closed on exit. ``path`` may be an open
    binary file (read from its start); ``name`` is what errors call it.

    Raises:
        VideoDecodeError: the file is empty or unreadable, its content is no video container,
            FFmpeg cannot open it (truncated, damaged), it holds no video stream, or no decoder
            here reads its codec.
    """
    import av

    name = source_name(path, name)
    try:
        head = read_head(path)
    except OSError as exc:
        raise VideoDecodeError(name, f"unreadable ({exc.strerror or exc})") from None
    if not head:
        raise VideoDecodeError(name, "empty file")
    if sniff(head) is None:
        raise VideoDecodeError(name, "not a video container (no MP4, QuickTime, Matroska, WebM or AVI signature)")
    try:
        opened = os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else path
        container = av.open(opened, "r", timeout=(open_timeout, open_timeout))
    except (av.FFmpegError, OSError, ValueError) as exc:
        raise VideoDecodeError(name, f"damaged or truncated container ({_short(exc)})") from None
    try:
        if not container.streams.video:
            raise VideoDecodeError(name, "no video stream")
        stream = container.streams.video[0]
        if stream.codec_context is None or not stream.codec_context.name or stream.codec_context.name == "none":
            raise VideoDecodeError(name, f"unsupported codec ({stream.codec_context.name if stream.codec_context else 'unknown'})")
        yield container, stream
    finally:
        container.close()


def describe(container: InputContainer, stream: VideoStream, rotation: int = 0, last_time: float = 0.0) -> VideoInfo:
    """The :class:`VideoInfo` of an opened video; ``rotation`` and ``last_time`` (the time of its
    last decoded frame, the duration where the container gives none) come from its frames."""
    duration = 0.0
    if stream.duration is not None and stream.time_base is not None:
        duration = float(stream.duration * stream.time_base)
    elif container.duration is not None:
        duration = container.duration / 1_000_000
    duration = max(duration, last_time)
    rate = stream.average_rate
    tags = {**{k.lower(): v for k, v in stream.metadata.items()}, **{k.lower(): v for k, v in container.metadata.items()}}
    taken_us, offset = recorded_at(tags)
    width, height = stream.codec_context.width, stream.codec_context.height
    if abs(rotation) == 90:
        width, height = height, width
    return VideoInfo(
        container=container.format.name, codec=stream.codec_context.codec.canonical_name, width=width, height=height,
        duration=duration, fps=float(rate) if rate else 0.0, rotation=rotation, taken_us=taken_us, taken_offset=offset,
        camera=_camera(tags), gps=_location(tags), has_audio=bool(container.streams.audio),
    )


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def recorded_at(tags: Mapping[str, str]) -> tuple[int | None, int | None]:
    """When a video was recorded, from its container tags (lower-case keys): microseconds since
    the epoch and the recorded UTC offset in minutes (None when the tag has none).

    QuickTime's ``com.apple.quicktime.creationdate`` carries the phone's local offset and is
    taken first; ``creation_time`` is UTC. A date before 1971 is an unset clock (MP4's epoch is
    1904, and zeroed fields read as that), not a date."""
    for key in ("com.apple.quicktime.creationdate", "creation_time", "date"):
        text = tags.get(key)
        if not text:
            continue
        try:
            when = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError:
            continue
        offset = None
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.timezone.utc)
        elif key != "creation_time":
            delta = when.utcoffset()
            offset = int(delta.total_seconds() // 60) if delta is not None else None
        if when.year < 1971:
            continue
        return int((when - _EPOCH) / dt.timedelta(microseconds=1)), offset
    return None, None


def _camera(tags: Mapping[str, str]) -> str | None:
    make = tags.get("com.apple.quicktime.make") or tags.get("make")
    model = tags.get("com.apple.quicktime.model") or tags.get("model")
    parts = [p.strip() for p in (make, model) if p and p.strip()]
    if len(parts) == 2 and parts[1].lower().startswith(parts[0].lower()):
        parts = parts[1:]
    return " ".join(parts) or None


_ISO6709 = re.compile(r"^([+-]\d+(?:\.\d+)?)([+-]\d+(?:\.\d+)?)")


def _location(tags: Mapping[str, str]) -> tuple[float, float] | None:
    """The ISO 6709 location phones write (``+48.8584+002.2945+035.000/``), when in range."""
    text = tags.get("com.apple.quicktime.location.iso6709") or tags.get("location")
    match = _ISO6709.match(text.strip()) if text else None
    if match is None:
        return None
    lat, lon = float(match.group(1)), float(match.group(2))
    return (lat, lon) if -90 <= lat <= 90 and -180 <= lon <= 180 else None


def _short(exc: BaseException) -> str:
    text = str(exc).split(":")[0] if isinstance(exc, OSError) and getattr(exc, "strerror", None) else str(exc)
    return " ".join(text.split())[:120]


__all__ = [
    "HEAD_BYTES", "VIDEO_EXTENSIONS", "VideoInfo", "VideoSource", "content_type", "content_type_of", "describe", "is_video_file",
    "open_video", "read_head", "recorded_at", "sniff", "source_name",
]
