"""What a side stage of the build implements (:class:`SideStage`), what its part of a commit
implements (:class:`SideWriter`), and what a build hands it (:class:`SideRun`) and gets back
(:class:`SideStats`).

A side stage is something a build makes beside the rows and their vectors, over the rows of the
index: the keyword side (its setting: whether OCR reads the text in the pixels) and the faces
side (its setting: the face options) are the two today (:mod:`indexer.sides.registry`). Its life
in one build, in order:

1. :meth:`SideStage.check` before any work (a missing engine fails in one line naming the extra);
2. :meth:`SideStage.setting`: what this run records in :attr:`indexer.commit.IndexMeta.sides`
   under the stage's ``name`` (asked, else recorded by the previous manifest; None or False: off);
3. :meth:`SideStage.decode_options` and :meth:`SideStage.embedded`: what the decoders of the
   embedding read for it (keyword arguments of :class:`indexer.dataset.ImageDataset`) and what it
   counts in the rows embedded;
4. :meth:`SideStage.before_embedding` (after rows are dropped or renumbered, before new rows are
   appended) and :meth:`SideStage.after_embedding` (every row embedded; the last ones may still
   be queued in the writer, ``writer.tail_pending``, and a stage that reads the parts commits them
   first): it reads the rows it has not read yet, committing as it goes so that a crash loses
   one chunk;
5. :meth:`SideStage.complete`: whether the previous generation is already complete for this run
   (then a run with nothing to embed writes no generation);
6. :meth:`SideStage.report`: its :class:`~indexer.build_config.BuildReport` fields.

Every :class:`~indexer.commit.GenerationWriter` holds one :class:`SideWriter` per stage (by name):
told when rows move, it writes (or links) the stage's files into each generation and returns the
manifest entry recorded under the stage's ``name`` (a field of
:class:`~retrieval.layout.Manifest`, with its own checksums).

A third stage (say, the moments of a video) is one more class implementing both, and one more
entry in the registry: a field of the manifest for its entry (none if it writes no file), and
fields of the report for its counts. A stage reads rows that exist; what turns one file into several rows (video frames, each
with a time) is a *source* of the embedding (the plan and the decoders), not a side stage.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from retrieval.images import PreprocessConfig
from retrieval.layout import Manifest

from ..build_config import BuildConfig
from ..dataset import Item
from ..shards import ShardReader

if TYPE_CHECKING:
    from ..commit import GenerationWriter


@dataclass(frozen=True)
class SideRun:
    """What a build hands a side stage to read its rows: the run's settings, the model's
    preprocessing (the decode path's), where the images are, the writer, whether the previous
    generation was complete for the stage's setting, and the build's ``stop``."""

    cfg: BuildConfig
    preprocess: PreprocessConfig
    images: Path | ShardReader
    writer: GenerationWriter
    recorded: bool
    stop: Callable[[], bool] | None = None


@dataclass
class SideStats:
    """What a side stage did in one run: its counts by :class:`~indexer.build_config.BuildReport`
    field, and the seconds it took (its commits included)."""

    counts: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def add(self, counts: Mapping[str, int]) -> None:
        for name, n in counts.items():
            self.counts[name] = self.counts.get(name, 0) + n


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


class SideStage(Protocol):
    """One side stage of the build (see the module's docstring for when each is asked)."""

    @property
    def name(self) -> str:
        """Its key in :attr:`indexer.commit.IndexMeta.sides` and its field of the manifest."""
        ...

    def check(self, cfg: BuildConfig) -> None:
        """Raise a typed error (one line naming what to install) when ``cfg`` asks for the stage
        and it cannot run here."""
        ...

    def setting(self, cfg: BuildConfig, previous: Manifest | None) -> Any:
        """This run's setting: ``cfg``'s when given, else what ``previous`` recorded."""
        ...

    def decode_options(self, setting: Any) -> dict[str, Any]:
        """What the decoders of the embedding read for the stage, as keyword arguments of
        :class:`indexer.dataset.ImageDataset`."""
        ...

    def embedded(self, items: Iterable[Item]) -> dict[str, int]:
        """Its counts of the rows just embedded (by report field)."""
        ...

    def side_writer(self, index_dir: Path, base: Manifest | None) -> SideWriter:
        """Its part of a writer over ``base`` (None: a new index)."""
        ...

    def complete(self, previous: Manifest, setting: Any) -> bool:
        """Whether ``previous`` is complete for ``setting``: nothing left to read or write."""
        ...

    def before_embedding(self, run: SideRun) -> SideStats:
        """Read the rows not read yet before new rows are appended (after any compaction)."""
        ...

    def after_embedding(self, run: SideRun) -> SideStats:
        """Read the rows not read yet once every row is embedded (rows just embedded included; those
        still queued, ``run.writer.tail_pending``, are committed by ``run.writer.commit`` first)."""
        ...

    def report(self, stats: SideStats, current: Manifest | None) -> dict[str, Any]:
        """Its :class:`~indexer.build_config.BuildReport` fields, from this run's ``stats`` and
        the last generation committed."""
        ...


__all__ = ["SideRun", "SideStage", "SideStats", "SideWriter"]
