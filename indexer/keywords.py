"""The keyword side of each generation a :class:`~indexer.commit.GenerationWriter` commits
(:class:`KeywordWriter`, carried by the writer under the stage's name, :data:`NAME`).

Its text comes from the rows themselves (the Parquet parts): the words of each ``path``, the
``description`` and ``keywords`` read from the file, a ``caption`` column where the rows have
one, and ``ocr_text``. So a file's text is read (and recognised) once, when it is embedded, and
every later generation rebuilds or extends the FTS5 file from the rows: a deleted file's text
goes with its row, and an index built before the keyword side gets one from its rows without
embedding anything again (:mod:`retrieval.keywords`).
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from retrieval import store
from retrieval.keywords import SOURCES, extend_keywords, joined, path_text, write_keywords
from retrieval.layout import KEYWORDS_FILE, FileChecksum, KeywordsRef, Manifest, checksum_file

# The keyword stage's name (indexer.sides.keyword_stage): its key in IndexMeta.sides and a
# writer's sides, its field of the manifest.
NAME = "keywords"

# The row columns the keyword side reads (each one optional but ``path``).
_COLUMNS = ("path", "description", "keywords", "caption", "ocr_text")


@dataclass(frozen=True)
class PreviousKeywords:
    """The keyword file of the last generation, and how many of its first ids are still right."""

    ref: KeywordsRef
    path: Path
    valid_rows: int


class KeywordWriter:
    """The keyword side a :class:`~indexer.commit.GenerationWriter` carries
    (:class:`~indexer.side_writer.SideWriter`): the last file and how many of its first
    ids still hold."""

    def __init__(self, index_dir: Path, base: Manifest | None) -> None:
        self.previous: PreviousKeywords | None = None
        if base is not None and base.keywords is not None:
            self.previous = PreviousKeywords(base.keywords, index_dir / base.keywords.path, base.keywords.rows)
        # True while rows embedded without OCR still lack their text (indexer.backfill): the
        # generations committed meanwhile record that OCR has not covered the index.
        self.pending = False

    def rows_renumbered(self, first: int) -> None:
        self._valid_until(first)

    def rows_rewritten(self, first: int) -> None:
        # The rows' text changed (read by the backfill): the file is rebuilt from them.
        self._valid_until(first)

    def _valid_until(self, first: int) -> None:
        if self.previous is not None:
            self.previous = dataclasses.replace(self.previous, valid_rows=min(self.previous.valid_rows, first))

    def row_columns(self, setting: Any) -> dict[str, Any]:
        # Rows embedded with OCR are marked read: the backfill never reads them again.
        return {"ocr_read": True} if setting else {}

    def write(self, staging: Path, gen_rel: str, count: int, sources: Sequence[pa.Table | Path], setting: Any) -> KeywordsRef:
        return write_side(staging, gen_rel, count, sources, self.previous, bool(setting) and not self.pending)

    def committed(self, entry: Any, index_dir: Path, count: int) -> None:
        self.previous = PreviousKeywords(entry, index_dir / entry.path, count)


def _docs(sources: Sequence[pa.Table | Path], start: int) -> Iterator[tuple[int, dict[str, str | None]]]:
    """``(id, {source: text})`` of every row from id ``start`` on, in id order."""
    next_id = 0
    for src in sources:
        batches: Iterator[pa.RecordBatch] | list[pa.RecordBatch]
        if isinstance(src, pa.Table):
            rows = src.num_rows
            batches = src.select([c for c in _COLUMNS if c in src.column_names]).to_batches()
        else:
            pf = store.open_parquet(src)
            rows = pf.metadata.num_rows
            batches = [] if next_id + rows <= start else pf.iter_batches(
                batch_size=8192, columns=[c for c in _COLUMNS if c in pf.schema_arrow.names]
            )
        if next_id + rows <= start:
            next_id += rows
            continue
        for batch in batches:
            data = batch.to_pydict()
            n = batch.num_rows
            for j in range(n):
                i = next_id + j
                if i < start:
                    continue
                cell = {c: data[c][j] if c in data else None for c in _COLUMNS}
                yield i, {
                    "path": path_text(cell["path"] or ""),
                    "embedded": joined((cell["description"], cell["keywords"])),
                    "caption": cell["caption"],
                    "ocr": cell["ocr_text"],
                }
            next_id += n


def write_side(
    staging: Path, gen_rel: str, count: int, sources: Sequence[pa.Table | Path], previous: PreviousKeywords | None, ocr: bool
) -> KeywordsRef:
    """Write the keyword file of a generation of ``count`` rows into ``staging``: linked from the
    previous generation when its rows all still hold, extended when a prefix does, else built.

    Args:
        staging: the generation's staging folder.
        gen_rel: the generation's folder name (the recorded path's prefix).
        count: the generation's rows.
        sources: its rows, in id order: Parquet parts (paths) and tables not yet written.
        previous: the last generation's keyword file, if any.
        ocr: whether this build recognises text (recorded).
    """
    target = staging / KEYWORDS_FILE
    checksum: FileChecksum | None = None
    intact = previous is not None and previous.valid_rows == previous.ref.rows
    if previous is not None and intact and count == previous.ref.rows:
        os.link(previous.path, target)
        checksum = previous.ref.checksum
    elif previous is not None and intact and count > previous.ref.rows > 0:
        extend_keywords(previous.path, target, previous.valid_rows, _docs(sources, previous.valid_rows))
    else:
        write_keywords(target, _docs(sources, 0))
    counts = _counts(target)
    used = tuple(s for s in SOURCES if counts[s] or s == "path" or (s == "ocr" and ocr))
    return KeywordsRef(
        f"{gen_rel}/{KEYWORDS_FILE}", count, checksum or checksum_file(target), used, counts["any"], ocr,
    )


def _counts(path: Path) -> dict[str, int]:
    con = sqlite3.connect(path)
    try:
        cols = ", ".join(f"count({s})" for s in SOURCES)
        others = ", ".join(s for s in SOURCES if s != "path")
        row = con.execute(f"SELECT {cols}, count(coalesce({others})) FROM texts").fetchone()
    finally:
        con.close()
    return {**dict(zip(SOURCES, row[:-1], strict=True)), "any": row[-1]}


__all__ = ["NAME", "KeywordWriter", "PreviousKeywords", "write_side"]
