"""Reading the data files a manifest names: Parquet parts, skip list, FAISS.

Shared by readers (:class:`retrieval.index.ImageIndex`) and the writer (which carries rows and
vectors from one generation to the next), so both apply the same checks.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from . import faiss_index
from .errors import IndexFormatError
from .layout import FILE_ID_KEY, Manifest, PartRef

REBUILD_HINT = "rebuild the index with `clipsearch index --rebuild`"


def open_part(index_dir: Path, ref: PartRef) -> pq.ParquetFile:
    """Open one part and check it is the file the manifest names (id, row count, id range)."""
    path = index_dir / ref.path
    if not path.is_file():
        raise IndexFormatError(f"{path} is missing; {REBUILD_HINT}")
    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for bad files
        raise IndexFormatError(f"{path} is damaged ({exc}); {REBUILD_HINT}") from exc
    found = (pf.schema_arrow.metadata or {}).get(FILE_ID_KEY, b"").decode()
    if found != ref.file_id:
        raise IndexFormatError(f"{path} is not the part the manifest names (file id {found or 'missing'}); {REBUILD_HINT}")
    if pf.metadata.num_rows != ref.rows:
        raise IndexFormatError(f"{path} has {pf.metadata.num_rows} rows but the manifest says {ref.rows}; {REBUILD_HINT}")
    ids = pf.read(columns=["id"]).column("id").to_numpy()
    if not np.array_equal(ids, np.arange(ref.first_id, ref.first_id + ref.rows, dtype=np.int64)):
        raise IndexFormatError(
            f"{path}: ids are not {ref.first_id}..{ref.first_id + ref.rows - 1} in row order; {REBUILD_HINT}"
        )
    return pf


def open_parts(index_dir: Path, manifest: Manifest) -> list[pq.ParquetFile]:
    """Open every part of a generation (checked)."""
    return [open_part(index_dir, ref) for ref in manifest.parts]


def read_column(parts: Sequence[pq.ParquetFile], name: str) -> pa.ChunkedArray:
    """One column over all parts, in id order."""
    chunks = [pf.read(columns=[name]).column(name) for pf in parts]
    if not chunks:
        return pa.chunked_array([], type=pa.null())
    return pa.chunked_array([c for ch in chunks for c in ch.chunks], type=chunks[0].type)


def vectors_of(table_column: pa.ChunkedArray | pa.Array, dim: int) -> np.ndarray:
    """A fixed_size_list<float32>[dim] column as an ``(n, dim)`` float32 array."""
    arr = table_column.combine_chunks() if isinstance(table_column, pa.ChunkedArray) else table_column
    if len(arr) == 0:
        return np.empty((0, dim), np.float32)
    return arr.values.to_numpy(zero_copy_only=False).reshape(-1, dim).astype(np.float32, copy=False)


def iter_vectors(
    parts: Sequence[pq.ParquetFile], dim: int, start_id: int = 0, batch_rows: int = 65536
) -> Iterator[tuple[int, np.ndarray]]:
    """Yield ``(first_id, vectors)`` chunks of at most ``batch_rows`` rows, from ``start_id`` on."""
    first = 0
    for pf in parts:
        rows = pf.metadata.num_rows
        if first + rows <= start_id:
            first += rows
            continue
        for batch in pf.iter_batches(batch_size=batch_rows, columns=["embedding"]):
            n = batch.num_rows
            if first + n > start_id:
                vecs = vectors_of(batch.column(0), dim)
                skip = max(0, start_id - first)
                yield first + skip, vecs[skip:]
            first += n


def load_faiss(index_dir: Path, manifest: Manifest, parts: Sequence[pq.ParquetFile], mmap: bool = False) -> Any:
    """The generation's FAISS index, complete: rows missing from the file are added from the parts.

    A generation committed while a build was running names a FAISS file that covers only its
    first rows, or none (then a flat index is built from the stored vectors).
    """
    ref = manifest.faiss
    if ref is None:
        index = faiss_index.build(np.empty((0, manifest.dim), np.float32), manifest.index_type)
        start = 0
    else:
        path = index_dir / ref.path
        # A memory-mapped index is read-only; it can be mapped only if nothing is to be added.
        index = faiss_index.read(path, mmap=mmap and ref.rows == manifest.count)
        if index.ntotal != ref.rows or index.d != manifest.dim:
            raise IndexFormatError(
                f"{path} holds {index.ntotal} vectors of dim {index.d}, but the manifest says "
                f"{ref.rows} of dim {manifest.dim}; {REBUILD_HINT}"
            )
        start = ref.rows
    if start < manifest.count:
        for _, vecs in iter_vectors(parts, manifest.dim, start_id=start):
            faiss_index.add(index, vecs)
    return index
