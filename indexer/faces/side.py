"""The faces side of each generation a :class:`~indexer.commit.GenerationWriter` commits
(:class:`FaceWriter`, carried by the writer under the stage's name, :data:`NAME`).

Two Parquet files (:data:`~retrieval.layout.FACES_SCHEMA`, :data:`~retrieval.layout.FACES_READ_SCHEMA`)
that name each image by its row ``id`` and by ``path_bytes`` + ``content_hash``. A commit
carries the last generation's side into the new one:

- the faces stage (:mod:`indexer.faces.stage`) handed the writer new tables: they are written;
- else, where the ids of the last side's images still hold (rows were only appended): its
  files are linked, and the rows appended since are simply not read yet;
- else (an update removed or renumbered rows): its entries are matched to the new rows by
  ``path_bytes`` + ``content_hash``, those of files gone or changed dropped, and written again.

So faces are found once per file content, like the text of the keyword side, and a crash between
two commits loses only what was read since the last one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from retrieval import store
from retrieval.layout import FACES_FILE, FACES_READ_FILE, FACES_READ_SCHEMA, FACES_SCHEMA, FacesRef, Manifest, checksum_file

from ..commit import GenerationWriter
from .detect import FaceOptions
from .grouping import NOBODY, ClusterOptions

# The faces stage's name (indexer.sides.face_stage): its key in IndexMeta.sides and a writer's
# sides, its field of the manifest.
NAME = "faces"


def face_options(recorded: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The settings a run finds faces with, as the manifest records them: the recorded ones, else
    the defaults of :class:`FaceOptions` and :class:`ClusterOptions`."""
    if recorded:
        return dict(recorded)
    return {"detector": "dlib-hog", "descriptor": "dlib-resnet-v1", **asdict(FaceOptions()), **asdict(ClusterOptions())}


@dataclass(frozen=True)
class FaceTables:
    """A whole faces side in memory: the faces, the images read, and the settings they were read with."""

    faces: pa.Table
    read: pa.Table
    options: Mapping[str, Any]

    @classmethod
    def empty(cls, options: Mapping[str, Any]) -> FaceTables:
        return cls(FACES_SCHEMA.empty_table(), FACES_READ_SCHEMA.empty_table(), dict(options))

    @property
    def people(self) -> int:
        person = self.faces.column("person").to_numpy()
        return int(np.unique(person[person != NOBODY]).size)


@dataclass(frozen=True)
class PreviousFaces:
    """The last generation's faces side, and how many of its first ids still name the same rows."""

    ref: FacesRef
    faces_path: Path
    read_path: Path
    valid_rows: int

    def tables(self) -> FaceTables:
        return FaceTables(_read(self.faces_path, FACES_SCHEMA), _read(self.read_path, FACES_READ_SCHEMA), dict(self.ref.options))

    def read_with(self, options: Mapping[str, Any]) -> bool:
        """Whether these faces were found with ``options`` (else they are found again from nothing)."""
        return dict(self.ref.options) == dict(options)

    @property
    def ids_hold(self) -> bool:
        return self.valid_rows >= self.ref.rows


class FaceWriter:
    """The faces side a :class:`~indexer.commit.GenerationWriter` carries
    (:class:`~indexer.side_writer.SideWriter`): the last generation's side and how many of
    its first ids still hold, and the tables the faces stage made for the next commit."""

    def __init__(self, index_dir: Path, base: Manifest | None) -> None:
        self.previous: PreviousFaces | None = None
        if base is not None and base.faces is not None:
            self.previous = PreviousFaces(base.faces, index_dir / base.faces.path, index_dir / base.faces.read_path, base.faces.rows)
        self.new: FaceTables | None = None

    def rows_renumbered(self, first: int) -> None:
        if self.previous is not None:
            self.previous = replace(self.previous, valid_rows=min(self.previous.valid_rows, first))

    def rows_rewritten(self, first: int) -> None:
        pass  # same ids, same files: the faces found in them still hold

    def row_columns(self, setting: Any) -> dict[str, Any]:
        return {}

    def write(self, staging: Path, gen_rel: str, count: int, sources: Sequence[pa.Table | Path], setting: Any) -> FacesRef | None:
        return write_side(staging, gen_rel, count, sources, self.previous, self.new, setting)

    def committed(self, entry: Any, index_dir: Path, count: int) -> None:
        self.previous = None if entry is None else PreviousFaces(entry, index_dir / entry.path, index_dir / entry.read_path, count)
        self.new = None

    def tables(self, writer: GenerationWriter) -> FaceTables:
        """The faces side over the committed rows, with their current ids (the tables handed to
        :meth:`set_tables`, else the last side's, matched to the rows again if they moved)."""
        if writer.tail_pending:
            raise RuntimeError("the faces side needs the queued rows committed first")
        if self.new is not None:
            return self.new
        options = dict(writer.meta.sides.get(NAME) or {})
        if self.previous is None or not self.previous.read_with(options):
            return FaceTables.empty(options)
        tables = self.previous.tables()
        return tables if self.previous.ids_hold else rekeyed(tables, row_keys([path for _, path in writer.parts]))

    def set_tables(self, writer: GenerationWriter, tables: FaceTables) -> None:
        """Make ``tables`` (ids of the committed rows) the faces side of the next commit."""
        if writer.tail_pending:
            raise RuntimeError("the faces side needs the queued rows committed first")
        self.new = tables


def _read(path: Path, schema: pa.Schema) -> pa.Table:
    pf = store.open_parquet(path)
    with store.reading(pf):
        return pf.read().cast(schema)


def row_keys(sources: Sequence[pa.Table | Path]) -> tuple[pa.Array, pa.Array]:
    """``path_bytes`` and ``content_hash`` of every row of ``sources`` (parts or tables, in id order)."""
    paths: list[pa.Array] = []
    hashes: list[pa.Array] = []
    for src in sources:
        if isinstance(src, pa.Table):
            table = src.select(["path_bytes", "content_hash"])
        else:
            pf = store.open_parquet(src)
            with store.reading(pf):
                table = pf.read(columns=["path_bytes", "content_hash"])
        paths.extend(table.column("path_bytes").chunks)
        hashes.extend(table.column("content_hash").chunks)
    return (pa.chunked_array(paths, pa.binary()).combine_chunks() if paths else pa.array([], pa.binary()),
            pa.chunked_array(hashes, pa.string()).combine_chunks() if hashes else pa.array([], pa.string()))


def rekeyed(tables: FaceTables, keys: tuple[pa.Array, pa.Array]) -> FaceTables:
    """``tables`` with each image's ``id`` set to its row in ``keys`` (matched by path and
    content); entries of images no longer there are dropped."""
    new_id = {key: i for i, key in enumerate(zip(keys[0].to_pylist(), keys[1].to_pylist(), strict=True))}

    def move(table: pa.Table, schema: pa.Schema) -> pa.Table:
        if table.num_rows == 0:
            return schema.empty_table()
        old = zip(table.column("path_bytes").to_pylist(), table.column("content_hash").to_pylist(), strict=True)
        ids = np.array([new_id.get(key, -1) for key in old], dtype=np.int64)
        kept = table.filter(pa.array(ids >= 0)).set_column(0, "id", pa.array(ids[ids >= 0], pa.int64()))
        order = ["id", "face"] if "face" in schema.names else ["id"]
        return kept.sort_by([(c, "ascending") for c in order]).cast(schema)

    return FaceTables(move(tables.faces, FACES_SCHEMA), move(tables.read, FACES_READ_SCHEMA), tables.options)


def write_side(
    staging: Path, gen_rel: str, count: int, sources: Sequence[pa.Table | Path], previous: PreviousFaces | None,
    new: FaceTables | None, options: Mapping[str, Any] | None,
) -> FacesRef | None:
    """Write (or link) the faces side of a generation of ``count`` rows into ``staging``.

    Args:
        staging: the generation's staging folder.
        gen_rel: the generation's folder name (the recorded paths' prefix).
        count: the generation's rows.
        sources: its rows in id order (parts, tables not yet written).
        previous: the last generation's side, if any.
        new: tables the faces stage made for these rows (ids current), if any.
        options: this run's face settings; None when the run finds no faces (no side).
    """
    if options is None:
        return None
    if new is None and previous is not None and previous.ids_hold and previous.read_with(options):
        os.link(previous.faces_path, staging / FACES_FILE)
        os.link(previous.read_path, staging / FACES_READ_FILE)
        return replace(previous.ref, path=f"{gen_rel}/{FACES_FILE}", read_path=f"{gen_rel}/{FACES_READ_FILE}", rows=count)
    if new is not None:
        tables = new
    elif previous is not None and previous.read_with(options):
        tables = rekeyed(previous.tables(), row_keys(sources))
    else:
        # No side yet, or one read with other settings: read again from nothing.
        tables = FaceTables.empty(options)
    if tables.read.num_rows and pc.max(tables.read.column("id")).as_py() >= count:
        raise RuntimeError(f"the faces side names row ids past the generation's {count} rows")
    pq.write_table(tables.faces, staging / FACES_FILE)
    pq.write_table(tables.read, staging / FACES_READ_FILE)
    return FacesRef(
        f"{gen_rel}/{FACES_FILE}", f"{gen_rel}/{FACES_READ_FILE}", count, tables.read.num_rows, tables.faces.num_rows,
        tables.people, checksum_file(staging / FACES_FILE), checksum_file(staging / FACES_READ_FILE), dict(options),
    )


__all__ = ["NAME", "FaceTables", "FaceWriter", "PreviousFaces", "face_options", "rekeyed", "row_keys", "write_side"]
