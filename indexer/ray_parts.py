"""Parquet parts written by the actors of a Ray build (``--ray-write auto|actors``).

Without this the driver writes every row the actors embed (~65,000 rows/s of 512-d on one
core): at 10+ GPUs that, not the GPUs, would set the pace. Here each actor writes the rows of
its batches as one Parquet part (and its path side file) into a staging folder of the index
(:class:`Stage`), and sends the driver only what the plan and the run's counters need: every
file's facts and errors, and the part's name, rows and file id. The driver links the parts in
plan order (:meth:`~indexer.commit.GenerationWriter.adopt_part`), assigning their ids then: an
actor does not know a part's first id (the files before it may fail to decode), so it stores
ids ``0 .. rows - 1`` and the manifest records the part's ``id_offset`` (format version 4).

An actor uses the staging folder only when it sees the probe file the driver wrote there (the
same file system); where it does not, it sends its rows back as before and the driver writes
that part (``auto``), or the run fails naming the node (``actors``). The folder is named with
:data:`~retrieval.layout.STAGING_PREFIX`: the commits of the run keep it (it is live), and a
crash leaves nothing a later writer keeps; the next writer removes it.

Nothing here imports ray.
"""

from __future__ import annotations

import math
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retrieval.errors import EngineError
from retrieval.faults import crash_point
from retrieval.layout import EMBEDDINGS_DIR, STAGING_PREFIX

from . import parts
from .commit import GenerationWriter
from .discover import ImageFile
from .embed import EmbeddedBatch, file_record
from .parts import WrittenPart
from .writer import FileRecord, records_table

STAGE_PREFIX = f"{STAGING_PREFIX}ray-"
PROBE_FILE = "probe"
# Columns an actor's answer carries when it wrote its part (besides every file's facts).
PART_COLUMN, PART_ROWS_COLUMN, FILE_ID_COLUMN = "part", "part_rows", "file_id"
# The column of an answer whose actor could not reach the folder: its node's name.
UNREACHED_COLUMN = "unreached"


@dataclass(frozen=True)
class StageRef:
    """Where actors write their parts: the staging folder (bytes, as the actors' file system
    spells it) and the token its probe file holds."""

    path: bytes
    token: str

    def reachable(self) -> bool:
        """Whether this process sees the folder the driver made (the probe file, with its token)."""
        try:
            with open(os.path.join(self.path, PROBE_FILE.encode()), "rb") as fh:
                return fh.read() == self.token.encode()
        except OSError:
            return False



class Stage:
    """The driver's side of a run's staging folder: made with its probe, kept by the writer's
    commits while the run links parts from it, handed to the next commit to remove."""

    def __init__(self, writer: GenerationWriter, required: bool) -> None:
        self.writer = writer
        self.name = f"{STAGE_PREFIX}{uuid.uuid4().hex}"
        self.dir = writer.dir / self.name
        (self.dir / EMBEDDINGS_DIR).mkdir(parents=True)
        token = uuid.uuid4().hex
        (self.dir / PROBE_FILE).write_bytes(token.encode())
        self.ref = StageRef(os.fsencode(self.dir.resolve()), token)
        # ray_write "actors": an actor that cannot reach the folder fails the run (the driver
        # raises: an actor's own exception reaches the driver only as Ray's traceback text).
        self.required = required
        writer.live_staging.add(self.name)
        self.by_actors = 0
        self.by_driver = 0

    def release(self) -> None:
        """The run links no more parts: the writer's next commit (which links the last ones)
        removes the folder, as it does any staging folder."""
        self.writer.live_staging.discard(self.name)

    def discard(self) -> None:
        """Remove the folder now (a failed run: nothing in it is linked by a later commit)."""
        self.release()
        shutil.rmtree(self.dir, ignore_errors=True)

    def fallback_note(self) -> str:
        """The line that says the driver wrote some parts, and why."""
        return (f"the driver wrote {self.by_driver} of {self.by_driver + self.by_actors} parts: the index directory is "
                "not reachable from some actors")

    @property
    def written_by(self) -> str:
        """Who wrote the parts: ``actors``, ``driver`` or ``actors+driver``; "" for none."""
        if self.by_actors and self.by_driver:
            return "actors+driver"
        return "actors" if self.by_actors else ("driver" if self.by_driver else "")

    def check_answer(self, cols: Mapping[str, np.ndarray]) -> None:
        """Fail the run at an answer sent back by an actor that could not reach the folder, where
        the run requires the actors to write.

        Raises:
            EngineError: naming the node.
        """
        if self.required and UNREACHED_COLUMN in cols and len(cols[UNREACHED_COLUMN]):
            raise EngineError(
                f"node {cols[UNREACHED_COLUMN][0]} cannot reach the index directory {self.writer.dir} to write its parts; "
                "use --ray-write auto (the driver writes those) or driver"
            )

    def link(self, batches: Iterable[EmbeddedBatch], files: list[ImageFile], ocr: bool, dim: int) -> Iterator[EmbeddedBatch]:
        """``batches`` with their rows linked into the writer as parts (in order), written here
        by the driver where an actor sent its rows back; each yielded without vectors, for the
        run's counters and skip records (:func:`indexer.embed.write_batches`)."""
        last = ""
        for batch in batches:
            part = batch.part
            if part is None and batch.vectors is not None and len(batch.vectors):
                records = [file_record(files[it.index], it) for it in batch.good]
                part = write_part(self.dir, records, batch.vectors, dim, ocr)
                self.by_driver += 1
            elif part is not None and part.name == last:
                # The rest of a part whose answer Ray delivered in two blocks: linked already.
                yield EmbeddedBatch(batch.items, None, batch.decode_seconds, batch.encode_seconds, linked=True)
                continue
            elif part is not None:
                self.by_actors += 1
            if part is not None:
                last = part.name
                if self.writer.tail_pending:
                    # Rows queued as a table (an update's rewritten tail) come first in id order.
                    self.writer.commit(complete=False)
                crash_point("adopt")
                self.writer.adopt_part(self.dir / part.name, part.rows, part.file_id)
            yield EmbeddedBatch(batch.items, None, batch.decode_seconds, batch.encode_seconds, linked=part is not None)


def part_rows(batch_size: int, files: int, actors: int, commit_every: int) -> int:
    """Images per actor-written part (a Ray batch of whole model batches): a chunk commit's worth
    (as many parts as the driver would write), fewer where that would leave actors idle."""
    per_actor = math.ceil(files / (actors * batch_size))
    return batch_size * max(1, min(commit_every // batch_size, per_actor))


def write_part(stage: str | bytes | os.PathLike[str], records: list[FileRecord], vectors: np.ndarray, dim: int,
               ocr: bool) -> WrittenPart:
    """Write ``records`` and their vectors as a part (stored ids ``0 .. n - 1``) in ``stage``."""
    name = f"{EMBEDDINGS_DIR}/{uuid.uuid4().hex}.parquet"
    # ocr_read as GenerationWriter writes queued rows: True when the run recognises text.
    table = records_table(records, vectors, dim, True if ocr else None)
    ref = parts.write_part(Path(os.fsdecode(stage)) / name, name, dim, 0, [table])
    return WrittenPart(name, ref.rows, ref.file_id)


def part_columns(part: WrittenPart | None, n: int) -> dict[str, np.ndarray]:
    """The columns that name an actor's part in its answer (one value repeated per file)."""
    return {
        PART_COLUMN: np.full(n, part.name if part else "", dtype=object),
        PART_ROWS_COLUMN: np.full(n, part.rows if part else 0, np.int64),
        FILE_ID_COLUMN: np.full(n, part.file_id if part else "", dtype=object),
    }


def by_part(cols: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """A block of answers split where the part changes (Ray may deliver two actors' answers as
    one block): each piece names one part, or none."""
    names = cols.get(PART_COLUMN)
    if names is None or len(names) < 2:
        return [dict(cols)]
    starts = [0, *(int(i) + 1 for i in np.flatnonzero(names[1:] != names[:-1])), len(names)]
    if len(starts) == 2:
        return [dict(cols)]
    return [{k: v[a:b] for k, v in cols.items()} for a, b in zip(starts[:-1], starts[1:], strict=True)]


def part_of(cols: Mapping[str, np.ndarray]) -> WrittenPart | None:
    """The part an actor's answer names (:func:`part_columns`), None where it wrote none."""
    if PART_COLUMN not in cols or not len(cols[PART_COLUMN]) or not str(cols[PART_COLUMN][0]):
        return None
    return WrittenPart(str(cols[PART_COLUMN][0]), int(cols[PART_ROWS_COLUMN][0]), str(cols[FILE_ID_COLUMN][0]))


__all__ = ["PROBE_FILE", "STAGE_PREFIX", "Stage", "StageRef", "by_part", "part_columns", "part_of", "part_rows",
           "write_part"]
