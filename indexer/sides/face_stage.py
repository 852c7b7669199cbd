"""The faces side as a side stage of the build (:mod:`indexer.sides.contract`): ``--faces``,
its recorded face options, and the faces found after the embedding (:mod:`indexer.faces.stage`)
written into every generation (:mod:`indexer.faces.side`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from retrieval.layout import FacesRef, Manifest

from ..build_config import BuildConfig
from ..dataset import Item
from ..faces import detect
from ..faces.side import FaceTables, PreviousFaces, face_options, rekeyed, row_keys, write_side
from .contract import SideRun, SideStats

if TYPE_CHECKING:
    from ..commit import GenerationWriter

NAME = "faces"


class FaceWriter:
    """The faces side a :class:`~indexer.commit.GenerationWriter` carries: the last generation's
    side and how many of its first ids still hold, and the tables the faces stage made for the
    next commit."""

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


def face_writer(writer: GenerationWriter) -> FaceWriter:
    """The faces side of ``writer``."""
    side = writer.sides[NAME]
    assert isinstance(side, FaceWriter)
    return side


@dataclass(frozen=True)
class FaceStage:
    """The faces side and ``--faces``."""

    name: str = NAME

    def check(self, cfg: BuildConfig) -> None:
        if cfg.faces:
            detect.check_engine()

    def setting(self, cfg: BuildConfig, previous: Manifest | None) -> dict[str, Any] | None:
        # Not asked: what the index recorded; an index that recorded settings keeps them.
        recorded = previous.faces.options if previous is not None and previous.faces is not None else None
        wanted = cfg.faces if cfg.faces is not None else recorded is not None
        return face_options(recorded) if wanted else None

    def decode_options(self, setting: Any) -> dict[str, Any]:
        return {}  # the detector decodes each image again after the embedding

    def embedded(self, items: Iterable[Item]) -> dict[str, int]:
        return {}

    def side_writer(self, index_dir: Path, base: Manifest | None) -> FaceWriter:
        return FaceWriter(index_dir, base)

    def complete(self, previous: Manifest, setting: Any) -> bool:
        # --faces turned on or off, or faces still to find.
        return (previous.faces is None) == (setting is None) and (previous.faces is None or previous.faces.complete)

    def before_embedding(self, run: SideRun) -> SideStats:
        return SideStats()

    def after_embedding(self, run: SideRun) -> SideStats:
        from ..faces.stage import CHUNK, read_missing_faces

        found = read_missing_faces(
            run.writer, run.images, workers=os.cpu_count() or 1, commit=lambda: run.writer.commit(complete=False),
            chunk=min(run.cfg.commit_every, CHUNK), max_pixels=run.cfg.max_pixels, progress=run.cfg.progress, stop=run.stop,
        )
        return SideStats({"faces_read": found.read, "faces_found": found.faces, "faces_notes": found.notes})

    def report(self, stats: SideStats, current: Manifest | None) -> dict[str, Any]:
        side = current.faces if current is not None else None
        return {
            "faces_read": stats.counts.get("faces_read", 0),
            "faces_found": stats.counts.get("faces_found", 0),
            "faces_notes": stats.counts.get("faces_notes", 0),
            "faces_seconds": round(stats.seconds, 3),
            "faces": side.faces if side is not None else 0,
            "people": side.people if side is not None else 0,
        }


__all__ = ["NAME", "FaceStage", "FaceWriter", "face_writer"]
