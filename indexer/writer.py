"""Parquet writers for one part of the embeddings table and for the skip list.

Rows get consecutive ids in the order they are added, starting at the part's first id, so
that id i is also FAISS row i. Rows are buffered and written in row groups, so memory stays
bounded.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from retrieval.images import NO_META, PhotoMeta
from retrieval.layout import (
    FILE_ID_KEY,
    SAMPLE_COLUMNS,
    SKIPPED_SCHEMA,
    SkipRecord,
    atomic_write,
    display_path,
    embeddings_schema,
    paths_file_of,
    write_paths_file,
)
from retrieval.shards import SampleMeta

ROW_GROUP_SIZE = 16_384


@dataclass(frozen=True)
class FileRecord:
    """What the index stores about one embedded file besides its vector."""

    path: bytes
    width: int
    height: int
    size: int
    mtime_ns: int
    content_hash: str
    meta: PhotoMeta = NO_META
    # What came with the image from a WebDataset shard (None for a file of a folder).
    sample: SampleMeta | None = None
    # A video's sampled frame (None for an image): the row's VIDEO_COLUMNS.
    frame: FrameFacts | None = None


@dataclass(frozen=True)
class FrameFacts:
    """The video columns (:data:`~retrieval.layout.VIDEO_COLUMNS`) of one sampled frame's row."""

    time: float
    keyframe: bool
    duration: float
    codec: str
    rotation: int = 0


class PartWriter:
    """Write rows to one Parquet part (``append`` or ``write_table``, then ``close``).

    It holds one part; :class:`~indexer.commit.GenerationWriter` holds a whole generation and
    writes its parts through it.

    ``close`` also writes the part's path side file (``part-NNNNN.paths``) next to it.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        dim: int,
        file_id: str,
        first_id: int = 0,
        row_group_size: int = ROW_GROUP_SIZE,
    ) -> None:
        if row_group_size < 1:
            raise ValueError("row_group_size must be >= 1")
        if first_id < 0:
            raise ValueError("first_id must be >= 0")
        self.dim = dim
        self.first_id = first_id
        self.file_id = file_id
        self.path = os.fspath(path)
        self._paths: list[pa.Array] = []
        self.schema = embeddings_schema(dim).with_metadata({FILE_ID_KEY: file_id.encode()})
        # No dictionary for the float vectors: float vectors almost never repeat, so building one
        # costs more time than writing them and makes the file larger.
        dictionary = [name for name in self.schema.names if name != "embedding"]
        # Page CRCs: a reader that checks them (every reader of ours) raises on a damaged page
        # instead of returning the changed values; readers that do not check are unaffected.
        self._writer = pq.ParquetWriter(
            os.fspath(path), self.schema, compression="zstd", use_dictionary=dictionary, write_page_checksum=True
        )
        self._row_group_size = row_group_size
        self.count = 0

    def append(self, records: Sequence[FileRecord], embeddings: np.ndarray) -> None:
        """Write rows: one record per row of ``embeddings`` (``(n, dim)`` float32)."""
        embeddings = np.asarray(embeddings, dtype=np.float32)
        if embeddings.shape != (len(records), self.dim):
            raise ValueError(f"row batch shapes disagree: {len(records)} records, embeddings {embeddings.shape}")
        self.write_table(records_table(records, embeddings, self.dim))

    def write_table(self, table: pa.Table) -> None:
        """Write rows given as a table of the embeddings schema; their ids are renumbered."""
        for start in range(0, table.num_rows, self._row_group_size):
            chunk = table.slice(start, self._row_group_size)
            ids = np.arange(self.first_id + self.count, self.first_id + self.count + chunk.num_rows, dtype=np.int64)
            chunk = chunk.set_column(0, "id", pa.array(ids))
            self._writer.write_table(conform(chunk, self.schema))
            self._paths.extend(chunk.column("path").chunks)
            self.count += chunk.num_rows

    def close(self) -> int:
        """Close the file and write its path side file; returns the number of rows written."""
        self._writer.close()
        target = paths_file_of(self.path)
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        write_paths_column(target, self.file_id, self._paths)
        self._paths = []
        return self.count


def write_paths_column(path: str | os.PathLike[str], file_id: str, chunks: Sequence[pa.Array]) -> None:
    """Write a part's path side file from its ``path`` column (string array chunks, in row order)."""
    paths = pa.concat_arrays([c.cast(pa.large_string()) for c in chunks]) if chunks else pa.array([], pa.large_string())
    # large_string: int64 offsets into one UTF-8 buffer, which is the side file's layout.
    offsets = np.frombuffer(paths.buffers()[1], np.int64)[paths.offset : paths.offset + len(paths) + 1]
    base, end = int(offsets[0]), int(offsets[-1])
    data = paths.buffers()[2]
    blob = memoryview(data)[base:end] if data is not None else b""
    atomic_write(path, lambda fh: write_paths_file(fh, file_id, offsets - base, blob))


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` in ``schema``'s column order and types; a nullable column it lacks (rows of a
    part written before the column existed, copied on a merge or an update) is all nulls."""
    missing = [f for f in schema if f.name not in table.column_names]
    for f in missing:
        if not f.nullable:
            raise ValueError(f"rows lack the column {f.name!r}")
        table = table.append_column(f.name, pa.nulls(table.num_rows, f.type))
    return table.select(schema.names).cast(schema)


def records_table(records: Sequence[FileRecord], vectors: np.ndarray, dim: int, ocr_read: bool | None = None) -> pa.Table:
    """Rows of the embeddings schema for ``records`` (ids 0; writers renumber them); ``ocr_read``:
    True when OCR looked at every one of them (the run recognises text), else None."""
    return pa.table(
        {
            "id": pa.array(np.zeros(len(records), np.int64)),
            "path": pa.array([display_path(r.path) for r in records], pa.string()),
            "path_bytes": pa.array([r.path for r in records], pa.binary()),
            "width": pa.array([r.width for r in records], pa.int32()),
            "height": pa.array([r.height for r in records], pa.int32()),
            "size": pa.array([r.size for r in records], pa.int64()),
            "mtime_ns": pa.array([r.mtime_ns for r in records], pa.int64()),
            "content_hash": pa.array([r.content_hash for r in records], pa.string()),
            "taken": pa.array([r.meta.taken_us for r in records], pa.timestamp("us", tz="UTC")),
            "taken_offset": pa.array([r.meta.taken_offset for r in records], pa.int16()),
            "camera": pa.array([r.meta.camera for r in records], pa.string()),
            "gps_lat": pa.array([r.meta.gps_lat for r in records], pa.float64()),
            "gps_lon": pa.array([r.meta.gps_lon for r in records], pa.float64()),
            "raw_source": pa.array([r.meta.raw_source for r in records], pa.string()),
            "description": pa.array([r.meta.description for r in records], pa.string()),
            "keywords": pa.array([r.meta.keywords for r in records], pa.string()),
            "ocr_text": pa.array([r.meta.ocr_text for r in records], pa.string()),
            "ocr_read": pa.array([ocr_read] * len(records), pa.bool_()),
            **sample_columns(records),
            **video_columns(records),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(vectors, np.float32).reshape(-1)), dim),
        },
        schema=embeddings_schema(dim),
    )


def sample_columns(records: Sequence[FileRecord]) -> dict[str, pa.Array]:
    """The shard columns (:data:`~retrieval.layout.SAMPLE_COLUMNS`) of ``records``: nulls for
    images of a folder."""
    samples = [r.sample for r in records]
    return {
        f.name: pa.array([getattr(s, _SAMPLE_FIELDS.get(f.name, f.name)) if s is not None else None for s in samples], f.type)
        for f in SAMPLE_COLUMNS
    }


def video_columns(records: Sequence[FileRecord]) -> dict[str, pa.Array]:
    """The video columns of ``records``: nulls for images."""
    frames = [r.frame for r in records]
    return {
        "media": pa.array(["video" if f is not None else None for f in frames], pa.string()),
        "frame_time": pa.array([f.time if f is not None else None for f in frames], pa.float64()),
        "keyframe": pa.array([f.keyframe if f is not None else None for f in frames], pa.bool_()),
        "duration": pa.array([f.duration if f is not None else None for f in frames], pa.float64()),
        "codec": pa.array([f.codec if f is not None else None for f in frames], pa.string()),
        "rotation": pa.array([f.rotation if f is not None else None for f in frames], pa.int16()),
    }


# Column names that differ from SampleMeta's field names.
_SAMPLE_FIELDS = {"member_offset": "offset"}


def write_skipped(path: str | os.PathLike[str], skipped: Sequence[SkipRecord]) -> None:
    """Write the skip list to ``skipped.parquet``, sorted by path (read back by
    :func:`retrieval.store.read_skipped`, with the same schema)."""
    schema = SKIPPED_SCHEMA
    recs = sorted(skipped, key=lambda r: r.path)
    table = pa.table(
        {
            "path": pa.array([display_path(r.path) for r in recs], pa.string()),
            "path_bytes": pa.array([r.path for r in recs], pa.binary()),
            "reason": pa.array([r.reason for r in recs], pa.string()),
            "size": pa.array([r.size for r in recs], pa.int64()),
            "mtime_ns": pa.array([r.mtime_ns for r in recs], pa.int64()),
            "content_hash": pa.array([r.content_hash for r in recs], pa.string()),
        },
        schema=schema,
    )
    pq.write_table(table, os.fspath(path), compression="zstd", write_page_checksum=True)


# SkipRecord lives with the skip list's schema in retrieval.layout; it is re-exported here,
# where the indexer's record types have always been imported from.
__all__ = [
    "ROW_GROUP_SIZE", "PartWriter", "FileRecord", "FrameFacts", "SkipRecord", "conform", "records_table", "write_paths_column",
    "write_skipped",
]
