"""The Parquet schemas of an index's data files, and the rows of its skip list."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

# Parquet key/value metadata that ties a data file to the manifest entry that names it.
FILE_ID_KEY = b"clipsearch.file_id"


def embeddings_schema(dim: int) -> pa.Schema:
    """Schema of the embedding parts for vectors of ``dim`` float32 values.

    ``path`` is the image path relative to the indexed folder, as ``search`` returns it: valid
    UTF-8, with bytes of non-UTF-8 file names written as ``\\xNN``. ``path_bytes`` holds the
    exact file-system bytes of the same relative path, so every file can be opened again.

    Raises:
        ValueError: ``dim`` is below 1.
    """
    if dim < 1:
        raise ValueError(f"embedding dim must be >= 1, got {dim}")
    return pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            pa.field("path", pa.string(), nullable=False),
            pa.field("path_bytes", pa.binary(), nullable=False),
            pa.field("width", pa.int32(), nullable=False),
            pa.field("height", pa.int32(), nullable=False),
            # What was embedded: lets an update skip unchanged files and spot changed ones.
            pa.field("size", pa.int64(), nullable=False),
            pa.field("mtime_ns", pa.int64(), nullable=False),
            pa.field("content_hash", pa.string(), nullable=False),
            *PHOTO_COLUMNS,
            *TEXT_COLUMNS,
            *SAMPLE_COLUMNS,
            *VIDEO_COLUMNS,
            pa.field("embedding", pa.list_(pa.float32(), dim), nullable=False),
        ]
    )


# Photo metadata from EXIF (retrieval.images.exif.PhotoMeta), all nullable. ``taken`` is the UTC
# instant when ``taken_offset`` (minutes) is known, else the camera's wall-clock time read as
# UTC. Latitude and longitude are two float columns rather than a struct: a filter or a sort
# reads them as plain numpy arrays, and a reader that does not know them reads nothing new.
PHOTO_COLUMNS: tuple[pa.Field, ...] = (
    pa.field("taken", pa.timestamp("us", tz="UTC")),
    pa.field("taken_offset", pa.int16()),
    pa.field("camera", pa.string()),
    pa.field("gps_lat", pa.float64()),
    pa.field("gps_lon", pa.float64()),
    pa.field("raw_source", pa.string()),
)

# Words about the photo, all nullable (None: the file has none, or the index predates them):
# ``description`` (EXIF ImageDescription, XMP dc:description), ``keywords`` (EXIF XPKeywords,
# XMP dc:subject, IPTC keywords; one per line) and ``ocr_text`` (text recognised in the pixels,
# ``index --ocr``). A ``caption`` column, where the input brings captions, is read when present.
# ``ocr_read`` is True where OCR has looked at the image (its text, if any, is then ``ocr_text``),
# null where it has not or the row predates the column: ``index --ocr`` on an index embedded
# without it reads the text of the rows not marked, so a killed run resumes where it stopped
# (indexer.backfill). An index whose manifest records ``keywords.ocr`` has read every row.
TEXT_COLUMNS: tuple[pa.Field, ...] = (
    pa.field("description", pa.string()),
    pa.field("keywords", pa.string()),
    pa.field("ocr_text", pa.string()),
    pa.field("ocr_read", pa.bool_()),
)


# What came with an image from a WebDataset shard (retrieval.shards), all nullable and null for
# an image from a folder: the shard (relative to the manifest's source_root), the sample's key,
# where the image's bytes start in the tar, the caption (``KEY.txt``) and img2dataset's ``KEY.json``
# fields (the source url, the size before img2dataset resized it, the sha256 of the download).
# The image's own width and height are the rows' ``width`` and ``height``, as for every image.
SAMPLE_COLUMNS: tuple[pa.Field, ...] = (
    pa.field("shard", pa.string()),
    pa.field("key", pa.string()),
    pa.field("member_offset", pa.int64()),
    pa.field("caption", pa.string()),
    pa.field("url", pa.string()),
    pa.field("original_width", pa.int32()),
    pa.field("original_height", pa.int32()),
    pa.field("sha256", pa.string()),
)


# A video's rows (indexer.video): one per sampled frame, all nullable and null for an image.
# ``media`` is ``video`` (null: an image), ``frame_time`` the frame's time in seconds from the
# start, ``keyframe`` whether the encoder coded it as one; ``duration`` (seconds), ``codec`` and
# ``rotation`` (degrees counter-clockwise the frames were turned upright) are the video's, the
# same on each of its rows. A video's rows share its path, size, mtime_ns and content_hash (the
# file's), its width and height (displayed, after rotation) and its date, camera and place.
VIDEO_COLUMNS: tuple[pa.Field, ...] = (
    pa.field("media", pa.string()),
    pa.field("frame_time", pa.float64()),
    pa.field("keyframe", pa.bool_()),
    pa.field("duration", pa.float64()),
    pa.field("codec", pa.string()),
    pa.field("rotation", pa.int16()),
)


# The faces side of a generation (``index --faces``; indexer.faces). Both files name each image
# by its row ``id`` in this generation and by ``path_bytes`` + ``content_hash``, the key that
# carries a face across an update that renumbers the rows. ``faces.parquet``: one row per face,
# its box in the image's pixels (EXIF-oriented), the detector's score, five landmarks (x, y
# pairs), dlib's 128-d descriptor and its ``person`` (-1: nobody yet). ``faces_read.parquet``: one
# row per image the detector has read, with the faces it kept (0 included) and a ``note`` where it
# could not read the image; an image without a row there has not been read yet.
FACE_KEY_COLUMNS: tuple[pa.Field, ...] = (
    pa.field("id", pa.int64(), nullable=False),
    pa.field("path_bytes", pa.binary(), nullable=False),
    pa.field("content_hash", pa.string(), nullable=False),
)
FACE_DESCRIPTOR_DIM = 128
FACES_SCHEMA = pa.schema(
    [
        *FACE_KEY_COLUMNS,
        pa.field("face", pa.int16(), nullable=False),
        pa.field("left", pa.float32(), nullable=False),
        pa.field("top", pa.float32(), nullable=False),
        pa.field("right", pa.float32(), nullable=False),
        pa.field("bottom", pa.float32(), nullable=False),
        pa.field("score", pa.float32(), nullable=False),
        pa.field("landmarks", pa.list_(pa.float32(), 10), nullable=False),
        pa.field("descriptor", pa.list_(pa.float32(), FACE_DESCRIPTOR_DIM), nullable=False),
        pa.field("person", pa.int64(), nullable=False),
    ]
)
FACES_READ_SCHEMA = pa.schema([*FACE_KEY_COLUMNS, pa.field("faces", pa.int16(), nullable=False), pa.field("note", pa.string())])


SKIPPED_SCHEMA = pa.schema(
    [
        pa.field("path", pa.string(), nullable=False),
        pa.field("path_bytes", pa.binary(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        # Null for entries that are not files (unreadable directories, missing list entries).
        pa.field("size", pa.int64()),
        pa.field("mtime_ns", pa.int64()),
        pa.field("content_hash", pa.string()),
    ]
)


@dataclass(frozen=True)
class SkipRecord:
    """One row of ``skipped.parquet``: a file (or directory) that was not indexed, and why.

    ``path`` is the raw relative path (``path_bytes``; the ``path`` column is its
    :func:`display_path`); the file facts are None for entries that are not files, and in
    skip lists that do not record them.
    """

    path: bytes
    reason: str
    size: int | None = None
    mtime_ns: int | None = None
    content_hash: str | None = None


def display_path(raw: bytes) -> str:
    """The UTF-8 form of a relative path stored in ``path``: undecodable bytes become ``\\xNN``."""
    return raw.decode("utf-8", errors="backslashreplace")
