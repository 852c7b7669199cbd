"""Reading the data files a manifest names: Parquet parts, skip list, FAISS.

Shared by readers (:mod:`retrieval.generation`, :mod:`retrieval.rows`) and the writer (which carries rows and
vectors from one generation to the next), so both apply the same checks.
"""

from __future__ import annotations

import contextlib
import mmap
import shlex
import weakref
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from . import faiss_index
from .errors import IndexCorruptError, IndexFormatError
from .layout import FILE_ID_KEY, PATHS_CRC_MAGIC, PATHS_HEADER, PATHS_MAGIC, Manifest, PartRef, SkipRecord
from .layout.manifest import UNKNOWN_MODEL_NOTE

REBUILD_HINT = "rebuild the index with `clipsearch index PHOTOS_DIR INDEX_DIR --rebuild`"

# Which file (and which repair) each opened Parquet file is, so that a page that fails its
# checksum while being read is reported by name, wherever the read happens.
_SOURCES: weakref.WeakKeyDictionary[pq.ParquetFile, tuple[Path, str]] = weakref.WeakKeyDictionary()


def rebuild_hint(index_dir: Path, manifest: Manifest | None) -> str:
    """The command that rebuilds ``index_dir`` from its images (from the folder it recorded), or
    from the embeddings it was imported from.

    The rebuild embeds with the model the manifest records; the command says when that needs
    ``--model``: the manifest is unreadable, or the model's local files are no longer there.
    """
    if manifest is not None and manifest.model_info.get("imported_from"):
        source = shlex.quote(str(manifest.model_info.get("imported_source") or "SOURCE"))
        return (
            f"import the embeddings again into a new directory with "
            f"`clipsearch import {source} NEW_INDEX_DIR --model {shlex.quote(manifest.model)}`"
        )
    photos = shlex.quote(manifest.source_root) if manifest is not None and manifest.source_root else "PHOTOS_DIR"
    command = f"clipsearch index {photos} {shlex.quote(str(index_dir))} --rebuild"
    if manifest is None:
        return f"rebuild the index with `{command}`{UNKNOWN_MODEL_NOTE}"
    gone = _gone_model_path(manifest.model)
    if gone is not None:
        return (
            f"rebuild the index with `{command} --model MODEL`, MODEL where its model is now "
            f"({gone}, where the index records it, no longer exists)"
        )
    return f"rebuild the index with `{command}`"


def _gone_model_path(model: str) -> str | None:
    """A local file or folder that the model's recorded name points to and that no longer
    exists. Recorded names hold absolute paths: a checkpoint directory, or open_clip's
    ``local-dir:DIR``, ``ARCH@WEIGHTS`` and ``CONFIG.json@WEIGHTS``."""
    name = model.removeprefix("open_clip:").removeprefix("local-dir:")
    for piece in name.split("@"):
        if Path(piece).is_absolute() and not Path(piece).exists():
            return piece
    return None


def fix_for(index_dir: Path, manifest: Manifest, rel: str) -> str:
    """How to repair damage to the generation's file ``rel``: a FAISS file is rebuilt from the
    stored vectors (``reindex``, which refuses an interrupted build); anything else needs the
    images again."""
    if manifest.faiss is not None and rel == manifest.faiss.path and manifest.complete:
        return f"rebuild its FAISS index from the stored vectors with `clipsearch reindex {shlex.quote(str(index_dir))}`"
    return rebuild_hint(index_dir, manifest)


def check_files(index_dir: Path, manifest: Manifest, faiss: bool = True) -> None:
    """The cheap part of the checksums, done on every open: each recorded file exists and has
    its recorded size (one ``stat`` per file; a truncated or extended file fails here).
    ``faiss=False`` leaves the FAISS file out (``reindex`` replaces it, damaged or not).

    Raises:
        IndexCorruptError: a file is missing or has another size.
    """
    recorded_files = dict(manifest.checksums)
    if manifest.keywords is not None:
        recorded_files[manifest.keywords.path] = manifest.keywords.checksum
    for rel, recorded in recorded_files.items():
        if not faiss and manifest.faiss is not None and rel == manifest.faiss.path:
            continue
        path = index_dir / rel
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise IndexCorruptError(path, "missing", fix_for(index_dir, manifest, rel)) from None
        except OSError as exc:
            raise IndexCorruptError(path, f"cannot be read: {exc.strerror}", fix_for(index_dir, manifest, rel)) from exc
        if size != recorded.size:
            raise IndexCorruptError(
                path, f"{size} bytes, the manifest records {recorded.size}", fix_for(index_dir, manifest, rel)
            )


def open_parquet(path: Path, fix: str = REBUILD_HINT) -> pq.ParquetFile:
    """Open a Parquet file of the index whose pages are checked against their CRC on every read.

    Raises:
        IndexCorruptError: the file is missing or its footer cannot be read.
    """
    if not path.is_file():
        raise IndexCorruptError(path, "missing", fix)
    try:
        pf = pq.ParquetFile(path, page_checksum_verification=True)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for bad files
        raise IndexCorruptError(path, f"unreadable: {exc}", fix) from exc
    _SOURCES[pf] = (path, fix)
    return pf


@contextlib.contextmanager
def reading(pf: pq.ParquetFile) -> Iterator[None]:
    """Turn a failed read of ``pf`` (a page failing its CRC, an undecodable page) into an
    :class:`IndexCorruptError` naming the file: damaged data is raised, never returned."""
    try:
        yield
    except (IndexFormatError, MemoryError):
        raise  # out of memory (ArrowMemoryError too) is not damage
    except (OSError, pa.ArrowException) as exc:
        path, fix = _SOURCES.get(pf, ("a Parquet file of the index", REBUILD_HINT))
        raise IndexCorruptError(path, f"unreadable: {exc}", fix) from exc


# Columns of skipped.parquet every version wrote; the file facts came later (read as None).
_SKIPPED_REQUIRED = ("path_bytes", "reason")
_SKIPPED_FACTS = ("size", "mtime_ns", "content_hash")


def read_skipped(source: Path | pq.ParquetFile, fix: str = REBUILD_HINT) -> list[SkipRecord]:
    """Every row of a skip list (``skipped.parquet``, :data:`retrieval.layout.SKIPPED_SCHEMA`).

    ``source`` is the file, or the file already opened with :func:`open_parquet` (a reader
    keeps the files of the generation it opened). Every column is read, so every page is
    checked against its CRC.

    Raises:
        IndexCorruptError: the file is missing, damaged, or not a skip list.
    """
    pf = source if isinstance(source, pq.ParquetFile) else open_parquet(Path(source), fix)
    names = set(pf.schema_arrow.names)
    for name in _SKIPPED_REQUIRED:
        if name not in names:
            path, fix = _SOURCES.get(pf, ("the skip list of the index", fix))
            raise IndexCorruptError(path, f"not a skip list: no {name!r} column", fix)
    with reading(pf):
        table = pf.read()
    nones: list[None] = [None] * table.num_rows
    facts = [table.column(name).to_pylist() if name in names else nones for name in _SKIPPED_FACTS]
    return [
        SkipRecord(path, reason, size, mtime_ns, content_hash)
        for path, reason, size, mtime_ns, content_hash in zip(
            table.column("path_bytes").to_pylist(), table.column("reason").to_pylist(), *facts, strict=True
        )
    ]


def open_part(index_dir: Path, ref: PartRef, fix: str = REBUILD_HINT) -> pq.ParquetFile:
    """Open one part and check it is the file the manifest names (id, row count, id range)."""
    path = index_dir / ref.path
    pf = open_parquet(path, fix)
    found = (pf.schema_arrow.metadata or {}).get(FILE_ID_KEY, b"").decode()
    if found != ref.file_id:
        raise IndexCorruptError(path, f"not the part the manifest names: file id {found or 'missing'}", fix)
    if pf.metadata.num_rows != ref.rows:
        raise IndexCorruptError(path, f"{pf.metadata.num_rows} rows, the manifest says {ref.rows}", fix)
    _check_ids(path, pf, ref, fix)
    return pf


def _check_ids(path: Path, pf: pq.ParquetFile, ref: PartRef, fix: str) -> None:
    # The id range from the row groups' statistics (the footer alone): opening an index costs
    # O(parts), not O(rows). Ids are written consecutively, so first/last/count pin them down.
    # A part linked with an id_offset (format 4) stores its ids less that offset.
    meta = pf.metadata
    expected = ref.stored_first_id
    col = pf.schema_arrow.get_field_index("id")
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        stats = rg.column(col).statistics if col >= 0 else None
        if stats is None or not stats.has_min_max:
            with reading(pf):
                ids = pf.read_row_group(i, columns=["id"]).column("id").to_numpy()
            ok = np.array_equal(ids, np.arange(expected, expected + rg.num_rows, dtype=np.int64))
        else:
            ok = stats.min == expected and stats.max == expected + rg.num_rows - 1
        if not ok:
            first = ref.stored_first_id
            raise IndexCorruptError(path, f"ids are not {first}..{first + ref.rows - 1} in row order", fix)
        expected += rg.num_rows


class PathTable:
    """One part's paths, memory-mapped from its side file: ``table[i]`` reads row ``i`` only,
    and checks it against its CRC-32 (files written before the CRC trailer: unchecked)."""

    def __init__(self, path: Path, ref: PartRef, fix: str = REBUILD_HINT) -> None:
        self.path = path
        self.fix = fix
        if not path.is_file():
            raise IndexCorruptError(path, "missing", fix)
        try:
            with open(path, "rb") as fh:
                self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            raise IndexCorruptError(path, f"cannot be read: {exc}", fix) from exc
        size = PATHS_HEADER.size
        if len(self._map) < size:
            raise IndexCorruptError(path, "too short", fix)
        magic, file_id, count = PATHS_HEADER.unpack_from(self._map, 0)
        if magic != PATHS_MAGIC or file_id.decode("ascii", "replace") != ref.file_id or count != ref.rows:
            raise IndexCorruptError(path, f"its header is not that of the paths file of {ref.path}", fix)
        if len(self._map) < size + 8 * (count + 1):
            raise IndexCorruptError(path, "truncated", fix)
        self._offsets = np.frombuffer(self._map, dtype="<u8", count=count + 1, offset=size)
        self._data = size + 8 * (count + 1)
        self._end = self._data + int(self._offsets[-1])
        if self._end > len(self._map):
            raise IndexCorruptError(path, "truncated", fix)
        trailer = self._end + 4 * count + len(PATHS_CRC_MAGIC)
        self._crcs: np.ndarray | None = None
        if len(self._map) == trailer and self._map[trailer - len(PATHS_CRC_MAGIC) : trailer] == PATHS_CRC_MAGIC:
            self._crcs = np.frombuffer(self._map, dtype="<u4", count=count, offset=self._end)

    @property
    def well_formed(self) -> bool:
        """Whether the file ends right after its paths or with a complete CRC trailer."""
        return self._crcs is not None or len(self._map) == self._end

    @property
    def has_crcs(self) -> bool:
        return self._crcs is not None

    @property
    def offsets(self) -> np.ndarray:
        """The ``count + 1`` offsets of the paths into :attr:`data`."""
        return self._offsets

    @property
    def data(self) -> memoryview:
        """The UTF-8 bytes of every path, concatenated."""
        return memoryview(self._map)[self._data : self._end]

    def first_bad_row(self) -> int | None:
        """The first row whose bytes fail their CRC (a full pass), or None."""
        if self._crcs is None:
            return None
        for row in range(len(self._offsets) - 1):
            if self._crc_fails(row):
                return row
        return None

    def _crc_fails(self, row: int) -> bool:
        start, end = int(self._offsets[row]), int(self._offsets[row + 1])
        return self._crcs is not None and zlib.crc32(self._map[self._data + start : self._data + end]) != int(self._crcs[row])

    def __getitem__(self, row: int) -> str:
        start, end = int(self._offsets[row]), int(self._offsets[row + 1])
        if end < start or self._data + end > self._end:
            raise IndexCorruptError(self.path, f"the offsets of row {row} are out of range", self.fix)
        raw = self._map[self._data + start : self._data + end]
        # A damaged path is raised, never returned as another file's name.
        if self._crcs is not None and zlib.crc32(raw) != int(self._crcs[row]):
            raise IndexCorruptError(self.path, f"the path of row {row} fails its CRC", self.fix)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise IndexCorruptError(self.path, f"the path of row {row} is not UTF-8", self.fix) from exc


def open_paths(index_dir: Path, ref: PartRef, fix: str = REBUILD_HINT) -> PathTable | None:
    """The part's path side file, or None for a version-1 part that has none."""
    return PathTable(index_dir / ref.paths, ref, fix) if ref.paths is not None else None


def open_parts(index_dir: Path, manifest: Manifest) -> list[pq.ParquetFile]:
    """Open every part of a generation (checked)."""
    fix = rebuild_hint(index_dir, manifest)
    return [open_part(index_dir, ref, fix) for ref in manifest.parts]


def read_column(parts: Sequence[pq.ParquetFile], name: str) -> pa.ChunkedArray:
    """One column over all parts, in id order."""
    chunks = []
    for pf in parts:
        with reading(pf):
            chunks.append(pf.read(columns=[name]).column(name))
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
                with reading(pf):
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


def maps_faiss(manifest: Manifest, mmap: bool) -> bool:
    """Whether :func:`load_faiss` memory-maps the generation's FAISS file when asked to: only
    if the file covers every row (a mapped index is read-only, so nothing can be added)."""
    return mmap and manifest.faiss is not None and manifest.faiss.rows == manifest.count


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
        fix = fix_for(index_dir, manifest, ref.path)
        if not path.is_file():
            raise IndexCorruptError(path, "missing", fix)
        try:
            index = faiss_index.read(path, mmap=maps_faiss(manifest, mmap))
        except IndexFormatError as exc:
            raise IndexCorruptError(path, "FAISS cannot read it", fix) from exc
        if index.ntotal != ref.rows or index.d != manifest.dim:
            raise IndexCorruptError(
                path, f"{index.ntotal} vectors of dim {index.d}, the manifest says {ref.rows} of dim {manifest.dim}", fix
            )
        start = ref.rows
    if start < manifest.count:
        for _, vecs in iter_vectors(parts, manifest.dim, start_id=start):
            faiss_index.add(index, vecs)
    if ref is not None:
        faiss_index.set_search_params(index, manifest.search_params)
    return index
