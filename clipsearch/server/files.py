"""Originals and thumbnails, reached only by id through the index (never by a path from a request)."""

from __future__ import annotations

import hashlib
import io
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from retrieval.errors import ImageDecodeError, IndexCorruptError, InvalidArgumentError, ShardSourceError, VideoDecodeError
from retrieval.images.decode import decode_image
from retrieval.index import ImageIndex
from retrieval.shard_ranges import ShardMember, VerifiedMembers

from .config import THUMBNAIL_SIZES
from .errors import NotFoundError

# Ids are plain decimal: no sign, no spaces, no exponent, and short enough that int() is cheap.
_ID = re.compile(r"[0-9]{1,18}")
THUMBNAIL_QUALITY = 85
# Thumbnails of a given id can change when a new generation renumbers or replaces the image,
# so they are not immutable: browsers reuse them for a while, then revalidate with the ETag
# (a 304 when the recorded content is unchanged).
THUMBNAIL_CACHE_CONTROL = "private, max-age=300"
ORIGINAL_CACHE_CONTROL = "private, max-age=300"
# A video frame's size limit no video reaches: the frame as decoded, as the faces stage found
# faces in it (indexer.video.NATIVE_SIDE, kept here so the server imports PyAV only when it decodes).
NATIVE_SIDE = 1 << 16


@dataclass(frozen=True)
class ImageFile:
    """The original of an id: its file (or, for an image from a WebDataset shard, its bytes read
    out of the shard; for a video from a shard, where its bytes lie, read by ranges), its content
    type and ETag."""

    path: Path | None
    media_type: str
    etag: str
    data: bytes | None = None
    member: ShardMember | None = None


def parse_id(text: str, index: ImageIndex, name: str) -> int:
    """The id in a URL path: a non-negative decimal below the index's count.

    Anything else (negative, non-numeric, out of range, a path) is 404: there is no such image.
    """
    if not _ID.fullmatch(text) or int(text) >= index.count:
        raise NotFoundError(f"no image {text[:40]!r} in index {name!r} (ids are 0..{index.count - 1})")
    return int(text)


def source_file(index: ImageIndex, image_id: int, name: str) -> Path:
    """The recorded file of ``image_id``, refused unless it lies under the index's source root.

    ``ImageIndex.files.path`` joins the source root with the stored relative path; the check here
    is lexical (no ``..`` can climb out), so a symlink the indexer followed inside the collection
    is still served, as it was indexed.
    """
    try:
        # Its own index's folder (a shard set's shards built apart each have theirs).
        source_root = index.files.root_of(image_id)
        if not source_root:
            # An index made by `clipsearch import`: vectors only, no folder of originals to serve.
            raise NotFoundError(f"index {name!r} holds no image files (it was imported from embeddings)")
        path = index.files.path(image_id)
    except InvalidArgumentError:
        raise NotFoundError(f"no image {image_id} in index {name!r}") from None
    except IndexCorruptError:
        # The index records a path that leaves its folder: serve nothing for it.
        raise NotFoundError(f"image {image_id} of index {name!r} is recorded outside its source root") from None
    root = os.path.normpath(source_root)
    full = os.path.normpath(os.fspath(path))
    if not full.startswith(root.rstrip(os.sep) + os.sep):
        raise NotFoundError(f"image {image_id} of index {name!r} is recorded outside its source root")
    if not os.path.isfile(full):
        raise NotFoundError(f"the file of image {image_id} is no longer on disk")
    return Path(full)


def shard_bytes(index: ImageIndex, image_id: int, name: str) -> bytes | None:
    """The bytes of an image from a WebDataset shard (None for an image of a folder).

    Raises:
        NotFoundError: the shard cannot be read now, or changed since it was indexed.
    """
    try:
        return index.files.shard_bytes(image_id)
    except InvalidArgumentError:
        raise NotFoundError(f"no image {image_id} in index {name!r}") from None
    except ShardSourceError as exc:
        raise NotFoundError(f"the shard of image {image_id} cannot be read: {exc}") from None


def shard_member(index: ImageIndex, image_id: int, name: str) -> ShardMember | None:
    """Where a video (or image) from a WebDataset shard lies in its shard (None for a folder's file).

    Raises:
        NotFoundError: no such id.
    """
    try:
        return index.files.shard_member(image_id)
    except InvalidArgumentError:
        raise NotFoundError(f"no image {image_id} in index {name!r}") from None


def member_reader(members: VerifiedMembers, member: ShardMember, image_id: int | str) -> Callable[[int, int], bytes]:
    """``read(first, last)``: those bytes of a shard member, read alone once it was checked.

    The reader raises NotFoundError where the shard cannot be read now, or changed since it was indexed.
    """
    def read(start: int, end: int) -> bytes:
        try:
            return members.read(member, start, end)
        except ShardSourceError as exc:
            raise NotFoundError(f"the shard of image {image_id} cannot be read: {exc}") from None

    return read


def original(index: ImageIndex, image_id: int, name: str, members: VerifiedMembers | None = None) -> ImageFile:
    """The original file of an id, with the content type of its image format (from its header).

    A video from a shard, with ``members``, is not read whole here: its member is checked
    (once per version of its shard, see :class:`~retrieval.shard_ranges.VerifiedMembers`) and
    answered by ranges (:func:`member_reader`).
    """
    if members is not None and video_time(index, image_id) is not None:
        member = shard_member(index, image_id, name)
        if member is not None:
            try:
                head = members.check(member)
            except ShardSourceError as exc:
                raise NotFoundError(f"the shard of image {image_id} cannot be read: {exc}") from None
            media_type = _member_type(head, member.name) or "application/octet-stream"
            # The recorded content hash names these exact bytes (check() compared them), as the ETag
            # of a whole read below does.
            return ImageFile(None, media_type, f'"{member.content_hash}"', member=member)
    data = shard_bytes(index, image_id, name)
    if data is not None:
        media_type = (video_member_type(data, index, image_id) if video_time(index, image_id) is not None else None) or ""
        try:
            with Image.open(io.BytesIO(data)) as img:
                media_type = media_type or Image.MIME.get(img.format or "", "application/octet-stream")
        except (OSError, ValueError, SyntaxError):
            media_type = media_type or "application/octet-stream"
        # The recorded content hash names these exact bytes (read_member checked them).
        etag = '"' + hashlib.blake2b(data, digest_size=16).hexdigest() + '"'
        return ImageFile(None, media_type, etag, data)
    path = source_file(index, image_id, name)
    media_type = (video_type(path) if video_time(index, image_id) is not None else None) or image_type(path)
    st = path.stat()
    etag = '"' + hashlib.sha256(f"{st.st_size}-{st.st_mtime_ns}-{st.st_ino}".encode()).hexdigest()[:32] + '"'
    return ImageFile(path, media_type, etag)


def image_type(path: Path) -> str:
    """An image file's content type from its format (its header)."""
    try:
        with Image.open(path) as img:
            return Image.MIME.get(img.format or "", "application/octet-stream")
    except (OSError, ValueError, SyntaxError):
        return "application/octet-stream"


def video_time(index: ImageIndex, image_id: int) -> float | None:
    """The time in seconds of the frame a video's row stands for; None for an image's row."""
    if not index.metadata.has_videos:
        return None
    row = index.rows([image_id], columns=("media", "frame_time"))[0]
    return float(row["frame_time"] or 0.0) if row["media"] == "video" else None


def video_type(path: Path) -> str | None:
    """A video file's content type from its container (indexer.video), None without the video extra."""
    try:
        from indexer.video import probe
    except ImportError:
        return "application/octet-stream"
    return probe.content_type(path)


def video_member_type(data: bytes, index: ImageIndex, image_id: int) -> str | None:
    """A shard member video's content type, from its bytes and its member name."""
    return _member_type(data, str(index.rows([image_id], columns=("path",))[0]["path"]))


def _member_type(head: bytes, name: str) -> str | None:
    try:
        from indexer.video import probe
    except ImportError:
        return "application/octet-stream"
    return probe.content_type_of(head[: probe.HEAD_BYTES], name)


def check_size(size: int) -> int:
    if size not in THUMBNAIL_SIZES:
        raise InvalidArgumentError(f"size must be one of {', '.join(map(str, THUMBNAIL_SIZES))}, got {size}")
    return size


def thumbnail_key(index: ImageIndex, image_id: int, size: int) -> tuple[str, str]:
    """The cache key and ETag of a thumbnail: the content hash the index recorded, and the size.

    Known without touching the file, so a revalidation (``If-None-Match``) costs one row read.
    The same picture in two indexes (or two generations) shares one cached file.
    """
    check_size(size)
    row = index.rows([image_id], columns=("content_hash", "media", "frame_time"))[0]
    key = re.sub(r"[^0-9A-Za-z]", "", str(row["content_hash"] or ""))[:64]
    if not key:
        raise NotFoundError(f"image {image_id} has no recorded content hash; rebuild the index to get thumbnails")
    if row["media"] == "video":  # one picture per frame of the video
        key += f"t{round(float(row['frame_time'] or 0.0) * 1000)}"
    return key, f'"{key}-{size}"'


def thumbnail_file(index: ImageIndex, image_id: int, name: str, size: int, key: str, cache_dir: Path) -> Path:
    """A JPEG of the image no larger than ``size`` on its long side, made once and cached on disk.

    Decoded as the indexer decodes (EXIF orientation applied, transparency composited on white),
    with JPEG draft decoding when the file is far larger than the thumbnail.

    Raises:
        NotFoundError: the file is gone.
        ImageDecodeError: the file no longer decodes.
    """
    cached = cache_dir / key[:2] / f"{key}-{size}.jpg"
    if cached.is_file():
        return cached
    data = shard_bytes(index, image_id, name)
    source: Path | io.BytesIO = io.BytesIO(data) if data is not None else source_file(index, image_id, name)
    at = video_time(index, image_id)
    if at is not None:
        img = video_frame(source, at, size, image_id)
    else:
        try:
            img = decode_image(source, min_edge=size, name=f"image {image_id}").image
        except ImageDecodeError as exc:
            raise ImageDecodeError(exc.path, f"{exc.reason} (the file changed since it was indexed?)") from None
    img.thumbnail((size, size), Image.Resampling.LANCZOS)
    cached.parent.mkdir(parents=True, exist_ok=True)
    # Temp file + rename: a concurrent request (or a crash) never sees half a JPEG.
    fd, tmp = tempfile.mkstemp(dir=cached.parent, prefix=".tmp-", suffix=".jpg")
    try:
        with os.fdopen(fd, "wb") as out:
            img.save(out, "JPEG", quality=THUMBNAIL_QUALITY)
        os.replace(tmp, cached)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return cached


def video_frame(path: Path | io.BytesIO, seconds: float, size: int, image_id: int) -> Image.Image:
    """The frame of a video row's time (indexer.video), from its file or its bytes read out of
    its shard, as an ImageDecodeError when it no longer decodes."""
    try:
        from indexer.video import frame_at
    except ImportError:
        raise ImageDecodeError(f"image {image_id}", "a video frame needs the video extra (pip install clipsearch[video])") from None
    try:
        return frame_at(path, seconds, max_side=size, name=f"image {image_id}")
    except VideoDecodeError as exc:
        raise ImageDecodeError(f"image {image_id}", f"{exc.reason} (the file changed since it was indexed?)") from None


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    """RFC 9110 weak comparison of ``If-None-Match`` against our ETag (``*`` matches any)."""
    if not if_none_match or not etag:
        return False
    tags = [t.strip() for t in if_none_match.split(",")]
    bare = etag.removeprefix("W/")
    return any(t == "*" or t.removeprefix("W/") == bare for t in tags)
