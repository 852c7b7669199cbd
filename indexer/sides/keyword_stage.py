"""The keyword side as a side stage of the build (:mod:`indexer.sides.contract`): the FTS5 file
of every generation (the writer's keyword side, :class:`indexer.keywords.KeywordWriter`), and its
setting, ``--ocr`` (whether OCR reads the text in the pixels: while embedding, in the decoders;
for rows embedded without it, by :mod:`indexer.backfill` before new rows are appended).

The manifest records ``keywords.ocr`` True only once OCR has read every row: until then the
writer's side is ``pending`` and its generations say OCR has not covered the index.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retrieval import keywords as fts
from retrieval.layout import Manifest

from .. import ocr
from ..backfill import read_missing_text
from ..build_config import BuildConfig
from ..dataset import Item
from ..keywords import NAME, KeywordWriter
from .contract import SideRun, SideStats


@dataclass(frozen=True)
class KeywordStage:
    """The keyword side and ``--ocr``."""

    name: str = NAME

    def check(self, cfg: BuildConfig) -> None:
        fts.check_engine()  # this Python's SQLite has FTS5 with trigrams
        if cfg.ocr:
            ocr.check_engine()

    def setting(self, cfg: BuildConfig, previous: Manifest | None) -> bool:
        # Not asked: what the index recorded (on an index embedded without it, the backfill
        # reads the text of its rows).
        return cfg.ocr if cfg.ocr is not None else previous is not None and self.complete(previous, True)

    def decode_options(self, setting: Any) -> dict[str, Any]:
        return {"ocr": bool(setting)}

    def embedded(self, items: Iterable[Item]) -> dict[str, int]:
        notes = found = 0
        for it in items:
            notes += it.meta.note is not None
            found += it.meta.ocr_text is not None
        return {"text_notes": notes, "with_ocr_text": found}

    def side_writer(self, index_dir: Path, base: Manifest | None) -> KeywordWriter:
        return KeywordWriter(index_dir, base)

    def complete(self, previous: Manifest, setting: Any) -> bool:
        # An index without its keyword side (built before it) or another --ocr gets a generation.
        return previous.keywords is not None and previous.keywords.ocr == bool(setting)

    def before_embedding(self, run: SideRun) -> SideStats:
        text = read_missing_text(run.cfg, run.preprocess, run.images, run.writer, recorded=run.recorded, stop=run.stop)
        return SideStats({"text_read": text.read, "with_ocr_text": text.with_text, "text_notes": text.notes})

    def after_embedding(self, run: SideRun) -> SideStats:
        return SideStats()

    def report(self, stats: SideStats, current: Manifest | None) -> dict[str, Any]:
        return {
            "text_read": stats.counts.get("text_read", 0),
            "with_ocr_text": stats.counts.get("with_ocr_text", 0),
            "text_notes": stats.counts.get("text_notes", 0),
            "text_seconds": round(stats.seconds, 3),
        }


__all__ = ["KeywordStage"]
