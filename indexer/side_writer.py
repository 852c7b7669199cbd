"""What a :class:`~indexer.commit.GenerationWriter` asks of each side it carries
(:class:`SideWriter`), and how it is given them (:data:`SideWriters`).

A side is what one side stage (:mod:`indexer.sides.contract`) keeps beside the rows of every
generation: the keyword side's FTS5 file (:class:`indexer.keywords.KeywordWriter`), the faces
side's tables (:class:`indexer.faces.side.FaceWriter`). The writer knows no stage: whoever opens
it hands it the sides to carry, by the stage's name (the build's stages through
:func:`indexer.sides.registry.side_writers`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

from retrieval.layout import Manifest


class SideWriter(Protocol):
    """A stage's part of a :class:`~indexer.commit.GenerationWriter`: the last generation's side,
    carried into the next one."""

    def rows_renumbered(self, first: int) -> None:
        """Rows from id ``first`` on were dropped or renumbered (an update's compaction)."""
        ...

    def rows_rewritten(self, first: int) -> None:
        """The parts from id ``first`` on were written again, same ids and vectors (a backfill)."""
        ...

    def row_columns(self, setting: Any) -> dict[str, Any]:
        """Keyword arguments of :func:`indexer.writer.records_table` for rows this run appends."""
        ...

    def write(self, staging: Path, gen_rel: str, count: int, sources: Sequence[pa.Table | Path], setting: Any) -> Any:
        """Write (or link) the side of a generation of ``count`` rows (``sources``: its rows in id
        order) into ``staging``; returns its manifest entry (None: none this generation, the
        manifest's field left unset, so a stage that writes no file needs no field)."""
        ...

    def committed(self, entry: Any, index_dir: Path, count: int) -> None:
        """The generation holding ``entry`` is published: it is the last generation's side now."""
        ...


# Every side a writer over (index folder, base manifest; None: a new index) carries, by the
# stage's name: the writer calls it once, when it opens.
SideWriters = Callable[[Path, Manifest | None], Mapping[str, SideWriter]]


__all__ = ["SideWriter", "SideWriters"]
