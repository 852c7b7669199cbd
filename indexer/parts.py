"""A new generation's part files: which sources each is written from (:func:`group_parts`),
and writing one (:func:`write_part`) or linking one unchanged from the last generation
(:func:`link_part`).

Chunk commits leave one small part each; finishing a build merges runs of at least
``MERGE_MIN_PARTS`` consecutive parts smaller than ``MERGE_TARGET_ROWS`` into parts of up to
``MERGE_TARGET_ROWS`` rows, so that a 10M-image index is not thousands of open files.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

import pyarrow as pa

from retrieval import store
from retrieval.layout import PartRef, paths_file_of

from .writer import ROW_GROUP_SIZE, PartWriter, write_paths_column

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


__all__ = ["MERGE_MIN_PARTS", "MERGE_TARGET_ROWS", "PartSource", "WrittenPart", "group_parts", "rows_of"]


def link_part(index_dir: Path, ref: PartRef, src: Path, staging: Path, gen_rel: str, name: str) -> tuple[PartRef, Path]:
    """Hard-link the committed part ``ref`` (file ``src``) and its path file into ``staging`` as
    ``name``; returns its reference and file in the generation ``gen_rel`` once published."""
    os.link(src, staging / name)
    paths_name = paths_file_of(name)
    (staging / paths_name).parent.mkdir(exist_ok=True)
    if ref.paths is not None:
        os.link(index_dir / ref.paths, staging / paths_name)
    else:
        # A version-1 part: give it the path side file that version 2 readers use.
        pf = store.open_parquet(src)
        with store.reading(pf):
            chunks = pf.read(columns=["path"]).column("path").chunks
        write_paths_column(staging / paths_name, ref.file_id, chunks)
    new_ref = PartRef(f"{gen_rel}/{name}", ref.rows, ref.first_id, ref.file_id, f"{gen_rel}/{paths_name}", ref.id_offset)
    return new_ref, index_dir / gen_rel / name


def write_part(path: Path, rel: str, dim: int, first_id: int, sources: Sequence[PartSource]) -> PartRef:
    """Write ``sources`` (tables, or part files streamed a row group at a time) as one new part
    at ``path`` (``rel`` in the index) with ids from ``first_id``."""
    file_id = uuid.uuid4().hex
    part = PartWriter(path, dim, file_id, first_id=first_id)
    for src in sources:
        if isinstance(src, pa.Table):
            part.write_table(src)
        else:
            # Streamed a row group at a time: merging never holds a whole part in memory.
            pf = store.open_parquet(src[1])
            with store.reading(pf):
                for batch in pf.iter_batches(batch_size=ROW_GROUP_SIZE):
                    part.write_table(pa.Table.from_batches([batch]))
    rows = part.close()
    return PartRef(rel, rows, first_id, file_id, paths_file_of(rel))


@dataclass(frozen=True)
class WrittenPart:
    """A part written into a run's stage ahead of the commit (by a Ray actor or the driver): its name there, rows, file id."""

    name: str
    rows: int
    file_id: str
