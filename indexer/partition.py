"""``split_index``, ``join_indexes`` and ``add_to_partitions``: an index split into N shard
indexes, separately built indexes joined into one set, and new images added to one shard
(``clipsearch shard``; the set's manifest and its search: :mod:`retrieval.partition_set`,
:mod:`retrieval.partitions`).

A split gives shard ``j`` the ids ``j * n // N .. (j + 1) * n // N - 1`` (balanced to one image),
each a normal index directory: its rows copied with every column (paths, photo facts, captions,
recognised text), renumbered from 0, its keyword side rebuilt from them and its FAISS index
built with the source's options (an ``auto`` index chooses for the shard's size). No image is
read and no model loaded. Adding images takes the rows of an index of them (built with the
set's model) into the smallest shard as one more generation of that shard, its FAISS index
extended; the other shards are not touched, and the new images get the set's next ids.

A join writes only the set's manifest: each index stays where it is (built on another machine,
copied over), named by its path relative to the set, and its ids follow those of the indexes
before it (the second index's id 0 is the set's ``count of the first``): the ids one index built
from the same images in the same order would give.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from retrieval import store
from retrieval.checks import is_positive_int
from retrieval.errors import IndexDirError, IndexFormatError, InvalidArgumentError, NotAnIndexError, TooFewTrainingVectorsError
from retrieval.layout import EMBEDDINGS_DIR, STAGING_PREFIX, Manifest, is_index_dir, part_name, read_manifest
from retrieval.partition_set import (
    IdRange,
    PartitionSet,
    ShardRef,
    check_shards,
    is_partition_set,
    read_partition_set,
    write_partition_set,
)

from . import ann
from .commit import GenerationWriter, IndexMeta
from .faces.side import NAME as FACES
from .lock import IndexLock
from .reindex import recorded_meta
from .sides.registry import side_writers
from .writer import PartWriter

# Rows copied into one part at a time (what memory holds of a shard being written).
PART_ROWS = 65_536


@dataclass(frozen=True)
class ShardReport:
    """What ``clipsearch shard --json`` prints: the set, and each shard's name and images."""

    out: str
    count: int
    shards: dict[str, int]

    def to_dict(self) -> dict[str, object]:
        return {"out": self.out, "count": self.count, "shards": dict(self.shards)}


def split_index(index_dir: str | os.PathLike[str], shards: int, out: str | os.PathLike[str]) -> ShardReport:
    """Split the index at ``index_dir`` into ``shards`` shard indexes under ``out`` (a new or
    empty directory), with the set's ``partitions.json``.

    Raises:
        InvalidArgumentError: ``shards`` below 1 or above the index's image count.
        TooFewTrainingVectorsError: shards too small to train the index type the source records.
        NotAnIndexError, IndexFormatError: no complete, readable index at ``index_dir``.
        IndexDirError: ``out`` exists and is not an empty directory.
        IndexLockedError: another process is writing the index.
    """
    source = Path(index_dir)
    base = read_manifest(source)
    if not is_positive_int(shards):
        raise InvalidArgumentError(f"--shards must be an integer >= 1, got {shards!r}")
    if shards > base.count:
        raise InvalidArgumentError(f"--shards {shards} is more than the index's {base.count} images: give at most {base.count}")
    if not base.complete:
        raise IndexFormatError(f"{source} holds an interrupted build; finish it first by running the same `clipsearch index` command again")
    # Each shard's FAISS index is built with the source's options: one the smallest shard cannot
    # train fails now, before any shard is written.
    try:
        ann.check_options(ann.choose_options(base), base.dim, base.count // shards)
    except TooFewTrainingVectorsError as exc:
        raise TooFewTrainingVectorsError(
            f"--shards {shards} gives shards of {base.count // shards} images: {exc} (reindex {source} with it first), or give fewer shards"
        ) from exc
    target = Path(out)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise IndexDirError(f"{target} exists and is not an empty directory; choose a new OUT")
    created = not target.exists()
    target.mkdir(parents=True, exist_ok=True)
    try:
        with IndexLock(source):
            base = read_manifest(source)
            store.check_files(source, base)
            parts = store.open_parts(source, base)
            refs = []
            for j in range(shards):
                first, stop = j * base.count // shards, (j + 1) * base.count // shards
                name = f"shard-{j:04d}"
                _write_shard(target / name, _meta(base), _rows(parts, base, first, stop))
                refs.append(ShardRef(name, name, (IdRange(first, 0, stop - first),)))
        made = PartitionSet(base.model, base.model_fingerprint, base.dim, tuple(refs))
        write_partition_set(target, made)
    except BaseException:
        # Nothing half-made is left: a set is written whole or not at all.
        if created:
            shutil.rmtree(target, ignore_errors=True)
        else:
            for child in target.iterdir():
                shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink()
        raise
    return ShardReport(str(target), made.count, {s.name: s.count for s in made.shards})


def join_indexes(indexes: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str]) -> ShardReport:
    """Make a shard set at ``out`` (a new or empty directory) of the separately built
    ``indexes``, in order: ``out/partitions.json`` names each index where it is (by its path
    relative to ``out``) as shard ``shard-NNNN``, its ids after those of the indexes before it.
    Nothing is copied and no index is changed.

    Raises:
        InvalidArgumentError: no index, or one index given twice.
        NotAnIndexError: a path that holds no index (a shard set included), named.
        IndexFormatError: an index of another model or dimension than the first, an empty or
            interrupted one, named with its shard name and what to do.
        IndexDirError: ``out`` exists and is not an empty directory.
    """
    if not indexes:
        raise InvalidArgumentError("give the indexes to join: clipsearch shard --join INDEX_DIR... OUT")
    target = Path(out)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise IndexDirError(f"{target} exists and is not an empty directory; choose a new OUT")
    dirs = [Path(i) for i in indexes]
    seen: dict[Path, Path] = {}
    for d in dirs:
        if d.resolve() in seen:
            raise InvalidArgumentError(f"{d} is given twice (as {seen[d.resolve()]}): join each index once")
        seen[d.resolve()] = d
    refs, first, at = [], None, 0
    for j, d in enumerate(dirs):
        name = f"shard-{j:04d}"
        if is_partition_set(d):
            raise NotAnIndexError(f"shard {name!r} ({d}) is a shard set, not an index: join the indexes of its shards")
        manifest = read_manifest(d)
        first = first or (manifest, d)
        if manifest.model_fingerprint != first[0].model_fingerprint or manifest.dim != first[0].dim:
            raise IndexFormatError(
                f"shard {name!r} ({d}) was embedded with {manifest.model} (dim {manifest.dim}), {first[1]} with "
                f"{first[0].model} (dim {first[0].dim}): every shard of a set needs the same model; "
                f"index it again with --model {first[0].model}"
            )
        if not manifest.complete:
            raise IndexFormatError(f"shard {name!r} ({d}) holds an interrupted build; finish it first with `clipsearch index`")
        if not manifest.count:
            raise IndexFormatError(f"shard {name!r} ({d}) holds no images: leave it out")
        refs.append(ShardRef(name, os.path.relpath(d.resolve(), target.resolve()), (IdRange(at, 0, manifest.count),)))
        at += manifest.count
    assert first is not None
    made = PartitionSet(first[0].model, first[0].model_fingerprint, first[0].dim, tuple(refs))
    target.mkdir(parents=True, exist_ok=True)
    write_partition_set(target, made)
    return ShardReport(str(target), made.count, {s.name: s.count for s in made.shards})


def add_to_partitions(set_dir: str | os.PathLike[str], new_index: str | os.PathLike[str]) -> ShardReport:
    """Add the images of the index ``new_index`` (built with the set's model) to the smallest
    shard of the set at ``set_dir``; they get the set's next ids.

    Raises:
        NotAnIndexError: no set at ``set_dir``, a missing shard, no index at ``new_index``.
        IndexFormatError: a shard that disagrees with the set; ``new_index`` embedded with
            another model or dimension, or interrupted.
        IndexLockedError: another process is writing the shard.
    """
    root = Path(set_dir)
    parts = read_partition_set(root)
    check_shards(root, parts)
    new = read_manifest(Path(new_index))
    if new.model_fingerprint != parts.model_fingerprint or new.dim != parts.dim:
        raise IndexFormatError(
            f"{new_index} was embedded with {new.model} (dim {new.dim}), the set with {parts.model} (dim {parts.dim}): "
            f"index the new images with --model {parts.model}"
        )
    if not new.complete:
        raise IndexFormatError(f"{new_index} holds an interrupted build; finish it first with `clipsearch index`")
    if not new.count:
        return ShardReport(str(root), parts.count, {s.name: s.count for s in parts.shards})
    smallest = min(range(len(parts.shards)), key=lambda n: (parts.shards[n].count, n))
    shard = parts.shards[smallest]
    shard_dir = root / shard.path
    with IndexLock(shard_dir):
        base = read_manifest(shard_dir)
        if base.count != shard.count:
            raise IndexFormatError(f"shard {shard.name!r} changed meanwhile: run the command again")
        writer = GenerationWriter(shard_dir, _meta(base), base, side_writers)
        writer.record_skips(store.read_skipped(shard_dir / base.skipped_file))
        _adopt(writer, shard_dir, base.dim, _rows(store.open_parts(Path(new_index), new), new, 0, new.count))
        writer.finish()
    grown = ShardRef(shard.name, shard.path, (*shard.ranges, IdRange(parts.count, shard.count, new.count)))
    shards = tuple(grown if n == smallest else s for n, s in enumerate(parts.shards))
    made = PartitionSet(parts.model, parts.model_fingerprint, parts.dim, shards, parts.generation + 1)
    write_partition_set(root, made)
    return ShardReport(str(root), made.count, {s.name: s.count for s in made.shards})


def _meta(base: Manifest) -> IndexMeta:
    # The shard keeps what its source recorded; the faces side is not carried (find faces on a
    # shard with `clipsearch index --faces`).
    meta = recorded_meta(base)
    return dataclasses.replace(meta, sides={name: s for name, s in meta.sides.items() if name != FACES})


def _rows(parts: list[pq.ParquetFile], manifest: Manifest, first: int, stop: int) -> Iterator[pa.Table]:
    """The rows of ids ``first .. stop - 1``, every column, a row group at a time."""
    for pf, ref in zip(parts, manifest.parts, strict=True):
        lo = ref.first_id
        if lo + ref.rows <= first or lo >= stop:
            continue
        with store.reading(pf):
            for batch in pf.iter_batches(batch_size=PART_ROWS):
                a, b = lo, lo + batch.num_rows
                lo = b
                s, e = max(a, first), min(b, stop)
                if s < e:
                    yield pa.Table.from_batches([batch.slice(s - a, e - s)])


def _write_shard(shard_dir: Path, meta: IndexMeta, rows: Iterator[pa.Table]) -> Manifest:
    if shard_dir.exists() and (is_index_dir(shard_dir) or any(shard_dir.iterdir())):
        raise IndexDirError(f"{shard_dir} exists; choose a new OUT")
    shard_dir.mkdir(parents=True, exist_ok=True)
    with IndexLock(shard_dir):
        writer = GenerationWriter(shard_dir, meta, None, side_writers)
        _adopt(writer, shard_dir, meta.dim, rows)
        return writer.finish()


def _adopt(writer: GenerationWriter, shard_dir: Path, dim: int, rows: Iterator[pa.Table]) -> None:
    """Write ``rows`` as parts in a staging folder of the shard and link them as its next ids
    (the writer's next commit links them; a crash leaves only a staging folder, removed by the next writer)."""
    stage = shard_dir / f"{STAGING_PREFIX}shard-{uuid.uuid4().hex}"
    (stage / EMBEDDINGS_DIR).mkdir(parents=True)
    writer.live_staging.add(stage.name)
    try:
        number, part, path = 0, None, None
        for table in rows:
            if part is not None and part.count + table.num_rows > PART_ROWS:
                _link(writer, part, path)
                part = None
            if part is None:
                path = stage / EMBEDDINGS_DIR / part_name(number)
                part, number = PartWriter(path, dim, uuid.uuid4().hex), number + 1
            part.write_table(table)
        if part is not None:
            _link(writer, part, path)
    finally:
        writer.live_staging.discard(stage.name)


def _link(writer: GenerationWriter, part: PartWriter, path: Path | None) -> None:
    assert path is not None
    writer.adopt_part(path, part.close(), part.file_id)


__all__ = ["PART_ROWS", "ShardReport", "add_to_partitions", "is_partition_set", "join_indexes", "split_index"]
