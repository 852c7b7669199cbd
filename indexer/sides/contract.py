"""What a side stage of the build implements (:class:`SideStage`), and what a build hands it
(:class:`SideRun`) and gets back (:class:`SideStats`); its part of a commit implements
:class:`~indexer.side_writer.SideWriter`.

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
6. :meth:`SideStage.report`: its :class:`~indexer.build_report.BuildReport` fields.

Every :class:`~indexer.commit.GenerationWriter` a build opens is given one
:class:`~indexer.side_writer.SideWriter` per stage (by name, made by
:meth:`SideStage.side_writer`): told when rows move, it writes (or links) the stage's files into
each generation and returns the manifest entry recorded under the stage's ``name`` (a field of
:class:`~retrieval.layout.Manifest`, with its own checksums). The stage finds it again with
:meth:`~indexer.commit.GenerationWriter.side`.

A third stage (say, the moments of a video) is one more class implementing both, and one more
entry in the registry: a field of the manifest for its entry (none if it writes no file), and
fields of the report for its counts. A stage reads rows that exist; what turns one file into several rows (video frames, each
with a time) is a *source* of the embedding (the plan and the decoders), not a side stage.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from retrieval.images import PreprocessConfig
from retrieval.layout import Manifest

from ..build_config import BuildConfig
from ..commit import GenerationWriter
from ..dataset import Item
from ..shard_reader import ShardReader
from ..side_writer import SideWriter


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
    """What a side stage did in one run: its counts by :class:`~indexer.build_report.BuildReport`
    field, and the seconds it took (its commits included)."""

    counts: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def add(self, counts: Mapping[str, int]) -> None:
        for name, n in counts.items():
            self.counts[name] = self.counts.get(name, 0) + n


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
        """Its :class:`~indexer.build_report.BuildReport` fields, from this run's ``stats`` and
        the last generation committed."""
        ...


__all__ = ["SideRun", "SideStage", "SideStats"]
