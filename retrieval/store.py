"""Reading the data files a manifest names: Parquet parts, skip list, FAISS.

Shared by readers (:class:`retrieval.index.ImageIndex`) and the writer (which carries rows and
vectors from one generation to the next), so both apply the same checks.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from . import faiss_index
from .errors import IndexFormatError
from .layout import FILE_ID_KEY, PATHS_HEADER, PATHS_MAGIC, Manifest, PartRef

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
    _check_ids(path, pf, ref)
    return pf


def _check_ids(path: Path, pf: pq.ParquetFile, ref: PartRef) -> None:
    # The id range from the row groups' statistics (the footer alone): opening an index costs
    # O(parts), not O(rows). Ids are written consecutively, so first/last/count pin them down.
    meta = pf.metadata
    expected = ref.first_id
    col = pf.schema_arrow.get_field_index("id")
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        stats = rg.column(col).statistics if col >= 0 else None
        if stats is None or not stats.has_min_max:
            ids = pf.read_row_group(i, columns=["id"]).column("id").to_numpy()
            ok = np.array_equal(ids, np.arange(expected, expected + rg.num_rows, dtype=np.int64))
        else:
            ok = stats.min == expected and stats.max == expected + rg.num_rows - 1
        if not ok:
            raise IndexFormatError(
                f"{path}: ids are not {ref.first_id}..{ref.first_id + ref.rows - 1} in row order; {REBUILD_HINT}"
            )
        expected += rg.num_rows


class PathTable:
    """One part's paths, memory-mapped from its side file: ``table[i]`` reads row ``i`` only."""

    def __init__(self, path: Path, ref: PartRef) -> None:
        try:
            with open(path, "rb") as fh:
                self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            raise IndexFormatError(f"{path} cannot be read ({exc}); {REBUILD_HINT}") from exc
        size = PATHS_HEADER.size
        if len(self._map) < size:
            raise IndexFormatError(f"{path} is damaged (too short); {REBUILD_HINT}")
        magic, file_id, count = PATHS_HEADER.unpack_from(self._map, 0)
        if magic != PATHS_MAGIC or file_id.decode("ascii", "replace") != ref.file_id or count != ref.rows:
            raise IndexFormatError(f"{path} is not the paths file of {ref.path}; {REBUILD_HINT}")
        self._offsets = np.frombuffer(self._map, dtype="<u8", count=count + 1, offset=size)
        self._data = size + 8 * (count + 1)
        if self._data + int(self._offsets[-1]) > len(self._map):
            raise IndexFormatError(f"{path} is damaged (truncated); {REBUILD_HINT}")

    def __getitem__(self, row: int) -> str:
        start, end = int(self._offsets[row]), int(self._offsets[row + 1])
        return self._map[self._data + start : self._data + end].decode("utf-8")


def open_paths(index_dir: Path, ref: PartRef) -> PathTable | None:
    """The part's path side file, or None for a version-1 part that has none."""
    return PathTable(index_dir / ref.paths, ref) if ref.paths is not None else None


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
    """Yield ``(first_id, vectors)`` chunks of at most ``batch_rows`` rows, from ``start_id`` on.

    Reads one row group at a time (16,384 rows as the indexer writes them), so memory stays at
    a few row groups whatever the size of a part; Arrow's pool is trimmed after each part.
    """
    first = 0
    for pf in parts:
        meta = pf.metadata
        if first + meta.num_rows <= start_id:
            first += meta.num_rows
            continue
        for g in range(meta.num_row_groups):
            n = meta.row_group(g).num_rows
            if first + n > start_id:
                vecs = vectors_of(pf.read_row_group(g, columns=["embedding"]).column(0), dim)
                for lo in range(max(0, start_id - first), n, batch_rows):
                    yield first + lo, vecs[lo : lo + batch_rows]
            first += n
        pa.default_memory_pool().release_unused()


def gather_vectors(chunks: Iterable[tuple[int, np.ndarray]], dim: int, ids: np.ndarray) -> np.ndarray:
    """The vectors of ``ids`` (sorted, unique), in that order, from one pass over ``chunks``
    (``(first_id, vectors)`` in id order, as :func:`iter_vectors` yields them)."""
    ids = np.asarray(ids, dtype=np.int64)
    out = np.empty((len(ids), dim), np.float32)
    if not len(ids):
        return out
    for first, vecs in chunks:
        lo, hi = np.searchsorted(ids, [first, first + len(vecs)])
        if hi > lo:
            out[lo:hi] = vecs[ids[lo:hi] - first]
        if hi == len(ids):
            break
    return out


def load_faiss(index_dir: Path, manifest: Manifest, parts: Sequence[pq.ParquetFile], mmap: bool = False) -> Any:
    """The generation's FAISS index, complete: rows missing from the file are added from the parts.

    A generation committed while a build was running names a FAISS file that covers only its
    first rows, or none (then an exact flat index is built from the stored vectors). The
    manifest's tuned search parameters are applied.
    """
    ref = manifest.faiss
    if ref is None:
        index = faiss_index.build(np.empty((0, manifest.dim), np.float32), faiss_index.DEFAULT_INDEX_TYPE)
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
    if ref is not None:
        faiss_index.set_search_params(index, manifest.search_params)
    return index
