"""Parquet writers for the embeddings table and the skip list.

Rows get consecutive ids in the order they are added, starting at 0, so that id i is also
FAISS row i. Rows are buffered and written in row groups, so memory stays bounded.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from retrieval.layout import GENERATION_KEY, SKIPPED_SCHEMA, display_path, embeddings_schema

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


@dataclass(frozen=True)
class SkipRecord:
    """A file (or directory) that was not indexed, and why; file facts when there was a file."""

    path: bytes
    reason: str
    size: int | None = None
    mtime_ns: int | None = None
    content_hash: str | None = None


class EmbeddingWriter:
    """Append rows to ``embeddings.parquet`` (``add``, ``flush``, ``close``)."""

    def __init__(self, path: str | os.PathLike[str], dim: int, generation: str, row_group_size: int = ROW_GROUP_SIZE) -> None:
        if row_group_size < 1:
            raise ValueError("row_group_size must be >= 1")
        self.dim = dim
        self.schema = embeddings_schema(dim).with_metadata({GENERATION_KEY: generation.encode()})
        self._writer = pq.ParquetWriter(os.fspath(path), self.schema, compression="zstd")
        self._row_group_size = row_group_size
        self._records: list[FileRecord] = []
        self._vectors: list[np.ndarray] = []
        self.count = 0

    def add(self, records: Sequence[FileRecord], embeddings: np.ndarray) -> None:
        """Queue rows: one record per row of ``embeddings`` (``(n, dim)`` float32)."""
        embeddings = np.asarray(embeddings, dtype=np.float32)
        if embeddings.shape != (len(records), self.dim):
            raise ValueError(f"row batch shapes disagree: {len(records)} records, embeddings {embeddings.shape}")
        self._records.extend(records)
        self._vectors.append(embeddings)
        if len(self._records) >= self._row_group_size:
            self.flush()

    def flush(self) -> None:
        """Write queued rows as one row group."""
        if not self._records:
            return
        recs = self._records
        n = len(recs)
        emb = np.concatenate(self._vectors)
        table = pa.table(
            {
                "id": pa.array(np.arange(self.count, self.count + n, dtype=np.int64)),
                "path": pa.array([display_path(r.path) for r in recs], pa.string()),
                "path_bytes": pa.array([r.path for r in recs], pa.binary()),
                "width": pa.array([r.width for r in recs], pa.int32()),
                "height": pa.array([r.height for r in recs], pa.int32()),
                "size": pa.array([r.size for r in recs], pa.int64()),
                "mtime_ns": pa.array([r.mtime_ns for r in recs], pa.int64()),
                "content_hash": pa.array([r.content_hash for r in recs], pa.string()),
                "embedding": pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), self.dim),
            },
            schema=self.schema,
        )
        self._writer.write_table(table)
        self.count += n
        self._records = []
        self._vectors = []

    def close(self) -> int:
        """Flush and close; returns the number of rows written."""
        self.flush()
        self._writer.close()
        return self.count


def write_skipped(path: str | os.PathLike[str], skipped: Sequence[SkipRecord], generation: str) -> None:
    """Write the skip list to ``skipped.parquet``, sorted by path."""
    schema = SKIPPED_SCHEMA.with_metadata({GENERATION_KEY: generation.encode()})
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
    pq.write_table(table, os.fspath(path), compression="zstd")
