"""Reading an import's SOURCE: which layout it is, its headers, then its values, checked.

SOURCE is one of two layouts (:func:`inspect_source` tells which):

- **clip-retrieval** inference output: ``img_emb/img_emb_N.npy`` (``(n, d)`` float16 or float32)
  with ``metadata/metadata_N.parquet`` (same N, same row count, an ``image_path`` column), taken
  in the numeric order of N (``img_emb_10`` after ``img_emb_9``);
- **parquet**: one Parquet file, or a folder of them (``*.parquet`` directly inside, names in
  natural order, ``.``/``_`` files ignored), with a ``path`` string column and an ``embedding``
  column (list or fixed_size_list of float16, float32 or float64).

It is read in two checking passes before anything is written (:mod:`indexer.importer`):

1. :func:`inspect_source`, the cheap one: npy headers and Parquet footers (columns, types, row
   counts, the dimension against the model's);
2. :func:`check_values`, a streaming pass over the values, a batch at a time: every vector
   finite, non-zero and of the model's dimension, every path present and unique (a 64-bit hash
   per row is kept, not the paths; only hashes seen twice are looked at again, to name both rows).

:func:`read_batches` streams the rows in source order (npy files memory-mapped), for the checks
and for the writing pass; :func:`unit_vectors` normalises a batch.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from retrieval.errors import ImportSourceError

SourceFormat = Literal["clip-retrieval", "parquet"]
# Rows read, checked and normalised at a time (float64 while normalising: 8192 x 1024-d = 64 MB).
BATCH_ROWS = 8192
LAYOUTS = (
    "SOURCE must be a clip-retrieval output folder (img_emb/img_emb_N.npy with metadata/metadata_N.parquet) "
    "or Parquet (a file, or a folder of *.parquet) with path and embedding columns"
)


@dataclass(frozen=True)
class Shard:
    """One unit of the source, in order: an npy file and its metadata (clip-retrieval), or one
    Parquet file (``vectors`` and ``paths`` the same file). ``rows`` from its header/footer."""

    vectors: Path
    paths: Path
    rows: int


@dataclass(frozen=True)
class Source:
    """A source whose layout and headers passed :func:`inspect_source`."""

    path: Path
    format: SourceFormat
    shards: tuple[Shard, ...]

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.shards)


@dataclass(frozen=True)
class SourceBatch:
    """Consecutive rows of one shard: ``first`` is the row of the first within its files."""

    shard: Shard
    first: int
    paths: pa.Array
    vectors: np.ndarray | None  # as stored (float16/32/64); None when only paths were read


# -- pass 1: layout and headers --------------------------------------------------------------


def inspect_source(source: Path, dim: int, model: str = "the model") -> Source:
    """Which layout ``source`` is, its files in order and their row counts, from headers only.

    Raises:
        ImportSourceError: neither layout, an unreadable file, a missing or mistyped column, a
            row count or dimension that disagrees (``dim`` is the model's), or no rows at all.
    """
    if source.is_file():
        if source.suffix.lower() != ".parquet":
            raise ImportSourceError(source, f"not a Parquet file; {LAYOUTS}")
        found = Source(source, "parquet", (_parquet_shard(source, dim, model),))
    elif (source / "img_emb").is_dir():
        found = Source(source, "clip-retrieval", _clip_retrieval_shards(source, dim, model))
    else:
        files = sorted(
            (p for p in source.iterdir() if p.suffix.lower() == ".parquet" and p.is_file() and not p.name.startswith((".", "_"))),
            key=lambda p: _natural_key(p.name),
        )
        if not files:
            raise ImportSourceError(source, f"holds neither img_emb/ nor *.parquet files; {LAYOUTS}")
        found = Source(source, "parquet", tuple(_parquet_shard(f, dim, model) for f in files))
    if found.rows == 0:
        raise ImportSourceError(source, "holds no rows: nothing to import")
    return found


def _natural_key(name: str) -> list[Any]:
    # "part-10" after "part-9": digit runs compare as numbers (str and int alternate in step).
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _numbered(folder: Path, prefix: str, suffix: str) -> dict[int, Path]:
    pattern = re.compile(rf"{re.escape(prefix)}_(\d+){re.escape(suffix)}")
    found: dict[int, Path] = {}
    if not folder.is_dir():
        return found
    for path in sorted(folder.iterdir()):
        match = pattern.fullmatch(path.name)
        if match is None:
            continue
        number = int(match.group(1))
        if number in found:
            raise ImportSourceError(path, f"has the same number as {found[number].name}")
        found[number] = path
    return found


def _clip_retrieval_shards(root: Path, dim: int, model: str) -> tuple[Shard, ...]:
    vectors = _numbered(root / "img_emb", "img_emb", ".npy")
    metadata = _numbered(root / "metadata", "metadata", ".parquet")
    if not vectors:
        raise ImportSourceError(root / "img_emb", "holds no img_emb_N.npy files")
    for number, path in sorted(vectors.items()):
        if number not in metadata:
            expected = root / "metadata" / f"metadata{path.stem.removeprefix('img_emb')}.parquet"
            raise ImportSourceError(path, f"has no metadata file {expected}")
    for number, path in sorted(metadata.items()):
        if number not in vectors:
            raise ImportSourceError(path, f"has no embeddings file {root / 'img_emb' / f'img_emb_{number}.npy'}")
    shards = []
    for number in sorted(vectors):
        npy, meta = vectors[number], metadata[number]
        shape, dtype = _npy_header(npy)
        if len(shape) != 2 or dtype.kind != "f":
            raise ImportSourceError(npy, f"holds a {dtype} array of shape {shape}, not (n, d) floats")
        if shape[1] != dim:
            raise _dim_error(npy, shape[1], dim, model)
        pf = _open_parquet(meta)
        _check_path_column(pf, meta, "image_path")
        if pf.metadata.num_rows != shape[0]:
            raise ImportSourceError(npy, f"holds {shape[0]} vectors but {meta.name} has {pf.metadata.num_rows} rows")
        shards.append(Shard(npy, meta, shape[0]))
    return tuple(shards)


def _dim_error(path: Path, found: int, dim: int, model: str) -> ImportSourceError:
    return ImportSourceError(path, f"holds {found}-d vectors, but {model} makes {dim}-d ones; pass the --model the vectors came from")


def _npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype[Any]]:
    """Shape and dtype from an .npy header (the data is not read)."""
    try:
        with open(path, "rb") as fh:
            version = np.lib.format.read_magic(fh)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(fh)
            else:
                shape, _, dtype = np.lib.format.read_array_header_2_0(fh)
    except (OSError, ValueError) as exc:
        raise ImportSourceError(path, f"not a readable .npy file ({exc})") from None
    return tuple(shape), np.dtype(dtype)


def _open_parquet(path: Path) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as exc:
        raise ImportSourceError(path, f"not a readable Parquet file ({exc})") from None


def _check_path_column(pf: pq.ParquetFile, path: Path, name: str) -> None:
    schema = pf.schema_arrow
    if name not in schema.names:
        raise ImportSourceError(path, f"has no {name!r} column (columns: {', '.join(schema.names) or 'none'})")
    kind = schema.field(name).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise ImportSourceError(path, f"column {name!r} is {kind}, not string")


def _parquet_shard(path: Path, dim: int, model: str) -> Shard:
    pf = _open_parquet(path)
    _check_path_column(pf, path, "path")
    schema = pf.schema_arrow
    if "embedding" not in schema.names:
        raise ImportSourceError(path, f"has no 'embedding' column (columns: {', '.join(schema.names)})")
    kind = schema.field("embedding").type
    is_list = pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)
    if not is_list or not pa.types.is_floating(kind.value_type):
        raise ImportSourceError(path, f"column 'embedding' is {kind}, not a list of float16, float32 or float64")
    if pa.types.is_fixed_size_list(kind) and kind.list_size != dim:
        raise _dim_error(path, kind.list_size, dim, model)
    return Shard(path, path, pf.metadata.num_rows)


# -- pass 2: values --------------------------------------------------------------------------


def read_batches(source: Source, dim: int, paths_only: bool = False) -> Iterator[SourceBatch]:
    """Every row in source order, ``BATCH_ROWS`` at a time; npy files memory-mapped.

    Raises:
        ImportSourceError: a file that cannot be read, or (Parquet) a null or wrongly sized embedding.
    """
    for shard in source.shards:
        if shard.rows == 0:
            continue
        first = 0
        if source.format == "clip-retrieval":
            mapped = None if paths_only else np.load(shard.vectors, mmap_mode="r", allow_pickle=False)
            pf = _open_parquet(shard.paths)
            for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=["image_path"]):
                n = batch.num_rows
                yield SourceBatch(shard, first, batch.column("image_path"), None if mapped is None else mapped[first : first + n])
                first += n
        else:
            pf = _open_parquet(shard.paths)
            for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=["path"] if paths_only else ["path", "embedding"]):
                vectors = None if paths_only else _list_vectors(batch.column("embedding"), dim, shard.vectors, first)
                yield SourceBatch(shard, first, batch.column("path"), vectors)
                first += batch.num_rows


def _list_vectors(column: pa.Array, dim: int, path: Path, first: int) -> np.ndarray:
    """A list or fixed_size_list column as ``(n, dim)``; a null or a wrong length names its row."""
    if column.null_count:
        row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise ImportSourceError(path, "embedding is null", row=first + row)
    if not pa.types.is_fixed_size_list(column.type):
        lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
        wrong = np.flatnonzero(lengths != dim)
        if len(wrong):
            row = int(wrong[0])
            raise ImportSourceError(path, f"embedding has {lengths[row]} values, but the model's vectors have {dim}", row=first + row)
    values = column.flatten()
    if values.null_count:
        at = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
        raise ImportSourceError(path, "embedding holds a null value", row=first + at // dim)
    return values.to_numpy(zero_copy_only=False).reshape(-1, dim)


def unit_vectors(vectors: np.ndarray, path: Path, first: int) -> np.ndarray:
    """``vectors`` L2-normalised as float32 (computed in float64, scaled by the largest value
    first, so neither a float64 vector beyond float32's range nor tiny values over- or underflow).

    Raises:
        ImportSourceError: a row with NaN or inf, or all zeros (no direction to keep).
    """
    x = np.array(vectors, dtype=np.float64)  # a copy: normalised in place below
    finite = np.isfinite(x).all(axis=1)
    if not finite.all():
        raise ImportSourceError(path, "embedding holds NaN or inf", row=first + int(np.argmin(finite)))
    scale = np.abs(x).max(axis=1) if x.shape[1] else np.zeros(len(x))
    zero = scale == 0
    if zero.any():
        raise ImportSourceError(path, "embedding is all zeros and cannot be normalised", row=first + int(np.argmax(zero)))
    x /= scale[:, None]
    x /= np.linalg.norm(x, axis=1)[:, None]
    return x.astype(np.float32)


def _check_paths(batch: SourceBatch) -> list[str]:
    if batch.paths.null_count:
        row = int(np.flatnonzero(batch.paths.is_null().to_numpy(zero_copy_only=False))[0])
        raise ImportSourceError(batch.shard.paths, "path is null", row=batch.first + row)
    paths: list[str] = batch.paths.to_pylist()
    if not all(paths):
        raise ImportSourceError(batch.shard.paths, "path is empty", row=batch.first + paths.index(""))
    return paths


def check_values(source: Source, dim: int, *, progress: bool = False) -> None:
    """Stream every row once: vectors finite, non-zero, ``dim`` long; paths present and unique.

    Raises:
        ImportSourceError: naming the first bad row's file and row.
    """
    from tqdm import tqdm

    hashes: list[np.ndarray] = []
    with tqdm(total=source.rows, unit="vec", desc="checking", disable=not progress, dynamic_ncols=True) as bar:
        for batch in read_batches(source, dim):
            assert batch.vectors is not None
            unit_vectors(batch.vectors, batch.shard.vectors, batch.first)
            paths = _check_paths(batch)
            hashes.append(np.fromiter((hash(p) for p in paths), np.int64, count=len(paths)))
            bar.update(len(paths))
    ordered = np.sort(np.concatenate(hashes))
    twice = ordered[1:][ordered[1:] == ordered[:-1]]
    if len(twice):
        _name_duplicate(source, dim, set(twice.tolist()))


def _name_duplicate(source: Source, dim: int, suspects: set[int]) -> None:
    """Find the first repeated path among those whose hash was seen twice (a pass over the paths
    only); hash collisions of different paths are not errors."""
    seen: dict[str, tuple[Path, int]] = {}
    for batch in read_batches(source, dim, paths_only=True):
        for j, path in enumerate(batch.paths.to_pylist()):
            if hash(path) not in suspects:
                continue
            if path in seen:
                where, row = seen[path]
                raise ImportSourceError(
                    batch.shard.paths, f"path {path!r} is repeated (first at {where}: row {row})", row=batch.first + j
                )
            seen[path] = (batch.shard.paths, batch.first + j)


__all__ = [
    "BATCH_ROWS",
    "LAYOUTS",
    "Shard",
    "Source",
    "SourceBatch",
    "SourceFormat",
    "check_values",
    "inspect_source",
    "read_batches",
    "unit_vectors",
]
