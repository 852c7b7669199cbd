"""Which side stages a build runs (:data:`SIDE_STAGES`: the keyword side with ``--ocr``, the
faces side with ``--faces``), and the loops over them that :mod:`indexer.build` and
:mod:`indexer.embed` call, and the sides every writer is given (:func:`side_writers`), so that
none of those, nor :mod:`indexer.commit`, names a stage. A new
stage is one more entry, implementing :class:`~indexer.sides.contract.SideStage`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from retrieval.layout import Manifest

from ..build_config import BuildConfig
from ..dataset import Item
from ..side_writer import SideWriter
from .contract import SideStage
from .face_stage import FaceStage
from .keyword_stage import KeywordStage

# In the order they run (and write their side into each commit). Each name is a field of the
# manifest and a key of IndexMeta.sides.
SIDE_STAGES: tuple[SideStage, ...] = (KeywordStage(), FaceStage())


def check(cfg: BuildConfig) -> None:
    """Every stage's check of ``cfg`` before any work (a missing engine fails in one line)."""
    for stage in SIDE_STAGES:
        stage.check(cfg)


def settings(cfg: BuildConfig, previous: Manifest | None) -> dict[str, Any]:
    """This run's setting of every stage, by name (as :attr:`indexer.commit.IndexMeta.sides` records them)."""
    return {stage.name: stage.setting(cfg, previous) for stage in SIDE_STAGES}


def decode_options(sides: Mapping[str, Any]) -> dict[str, Any]:
    """What the embedding's decoders read for the stages with these settings (keyword arguments
    of :class:`indexer.dataset.ImageDataset`)."""
    options: dict[str, Any] = {}
    for stage in SIDE_STAGES:
        options.update(stage.decode_options(sides.get(stage.name)))
    return options


def side_writers(index_dir: Path, base: Manifest | None) -> dict[str, SideWriter]:
    """Each stage's part of a writer over ``base``, by name: what every
    :class:`~indexer.commit.GenerationWriter` of an index is given to carry
    (``GenerationWriter(index_dir, meta, base, side_writers)``), so that no generation drops a side."""
    return {stage.name: stage.side_writer(index_dir, base) for stage in SIDE_STAGES}


def count_embedded(items: Iterable[Item]) -> dict[str, dict[str, int]]:
    """Each stage's counts of the rows just embedded, by name."""
    good = list(items)
    return {stage.name: stage.embedded(good) for stage in SIDE_STAGES}


def complete(previous: Manifest, sides: Mapping[str, Any]) -> bool:
    """Whether ``previous`` is complete for every stage's setting."""
    return all(stage.complete(previous, sides.get(stage.name)) for stage in SIDE_STAGES)


__all__ = ["SIDE_STAGES", "check", "complete", "count_embedded", "decode_options", "settings", "side_writers"]
