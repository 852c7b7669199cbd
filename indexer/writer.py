"""Parquet writers for the embeddings table and the skip list.

Rows get consecutive ids in the order they are added, starting at 0, so that id i is also
FAISS row i. Rows are buffered and written in row groups, so memory stays bounded.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from retrieval.layout import GENERATION_KEY, SKIPPED_SCHEMA, display_path, embeddings_schema

ROW_GROUP_SIZE = 16_384


class EmbeddingWriter:
    """Append rows to ``embeddings.parquet`` (``add``, ``flush``, ``close``)."""

    def __init__(self, path: str | os.PathLike[str], dim: int, generation: str, row_group_size: int = ROW_GROUP_SIZE) -> None:
        if row_group_size < 1:
            raise ValueError("row_group_size must be >= 1")
        self.dim = dim
        self.schema = embeddings_schema(dim).with_metadata({GENERATION_KEY: generation.encode()})
        self._writer = pq.ParquetWriter(os.fspath(path), self.schema, compression="zstd")
        self._row_group_size = row_group_size
        self._pending: list[tuple[list[bytes], list[int], list[int], np.ndarray]] = []
        self._pending_rows = 0
        self.count = 0

    def add(self, paths: Sequence[bytes], widths: Sequence[int], heights: Sequence[int], embeddings: np.ndarray) -> None:
        """Queue rows; ``paths`` are relative file-system paths (bytes)."""
        embeddings = np.asarray(embeddings, dtype=np.float32)
        if embeddings.shape != (len(paths), self.dim) or len(widths) != len(paths) or len(heights) != len(paths):
            raise ValueError(f"row batch shapes disagree: {len(paths)} paths, embeddings {embeddings.shape}")
        self._pending.append((list(paths), list(widths), list(heights), embeddings))
        self._pending_rows += len(paths)
        if self._pending_rows >= self._row_group_size:
            self.flush()

    def flush(self) -> None:
        """Write queued rows as one row group."""
        if not self._pending_rows:
            return
        paths = [p for chunk in self._pending for p in chunk[0]]
        widths = [w for chunk in self._pending for w in chunk[1]]
        heights = [h for chunk in self._pending for h in chunk[2]]
        emb = np.concatenate([chunk[3] for chunk in self._pending])
        n = len(paths)
        table = pa.table(
            {
                "id": pa.array(np.arange(self.count, self.count + n, dtype=np.int64)),
                "path": pa.array([display_path(p) for p in paths], pa.string()),
                "path_bytes": pa.array(paths, pa.binary()),
                "width": pa.array(widths, pa.int32()),
                "height": pa.array(heights, pa.int32()),
                "embedding": pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), self.dim),
            },
            schema=self.schema,
        )
        self._writer.write_table(table)
        self.count += n
        self._pending.clear()
        self._pending_rows = 0

    def close(self) -> int:
        """Flush and close; returns the number of rows written."""
        self.flush()
        self._writer.close()
        return self.count


def write_skipped(path: str | os.PathLike[str], skipped: Sequence[tuple[bytes, str]], generation: str) -> None:
    """Write the skip list (relative path bytes, reason) to ``skipped.parquet``."""
    schema = SKIPPED_SCHEMA.with_metadata({GENERATION_KEY: generation.encode()})
    table = pa.table(
        {
            "path": pa.array([display_path(p) for p, _ in skipped], pa.string()),
            "path_bytes": pa.array([p for p, _ in skipped], pa.binary()),
            "reason": pa.array([r for _, r in skipped], pa.string()),
        },
        schema=schema,
    )
    pq.write_table(table, os.fspath(path), compression="zstd")
