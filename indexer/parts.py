"""Which sources a new generation's parts are written from: :func:`group_parts`.

Chunk commits leave one small part each; finishing a build merges runs of at least
``MERGE_MIN_PARTS`` consecutive parts smaller than ``MERGE_TARGET_ROWS`` into parts of up to
``MERGE_TARGET_ROWS`` rows, so that a 10M-image index is not thousands of open files.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeAlias

import pyarrow as pa

from retrieval.layout import PartRef

MERGE_TARGET_ROWS = 1 << 20
MERGE_MIN_PARTS = 8

# One input of a new part: an existing part file (reference, path) or a table of rows.
PartSource: TypeAlias = "tuple[PartRef, Path] | pa.Table"


def rows_of(source: PartSource) -> int:
    """Rows ``source`` holds (from its reference, for a part file)."""
    return source.num_rows if isinstance(source, pa.Table) else source[0].rows


def group_parts(sources: list[PartSource], merge: bool) -> list[list[PartSource]]:
    """Which ``sources`` (in id order) become which new part: one part each, or with ``merge``
    runs of small ones merged (a part of ``MERGE_TARGET_ROWS`` rows or more stays as it is)."""
    if not merge:
        return [[src] for src in sources]
    groups: list[list[PartSource]] = []
    run: list[PartSource] = []

    def flush() -> None:
        if len(run) >= MERGE_MIN_PARTS:
            current: list[PartSource] = []
            for src in run:
                if current and sum(map(rows_of, current)) + rows_of(src) > MERGE_TARGET_ROWS:
                    groups.append(current)
                    current = []
                current.append(src)
            groups.append(current)
        else:
            groups.extend([src] for src in run)
        run.clear()

    for src in sources:
        if rows_of(src) < MERGE_TARGET_ROWS:
            run.append(src)
        else:
            flush()
            groups.append([src])
    flush()
    return groups


__all__ = ["MERGE_MIN_PARTS", "MERGE_TARGET_ROWS", "PartSource", "group_parts", "rows_of"]
