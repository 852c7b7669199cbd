"""The faces side as a side stage of the build (:mod:`indexer.sides.contract`): ``--faces``,
its recorded face options, and the faces found after the embedding (:mod:`indexer.faces.stage`)
written into every generation by the writer's faces side (:class:`indexer.faces.side.FaceWriter`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retrieval.layout import Manifest

from ..build_config import BuildConfig
from ..dataset import Item
from ..faces import detect
from ..faces.side import NAME, FaceWriter, face_options
from ..faces.stage import CHUNK, read_missing_faces
from .contract import SideRun, SideStats


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


__all__ = ["FaceStage"]
