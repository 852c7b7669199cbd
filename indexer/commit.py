"""Committing generations: the writer side of :mod:`retrieval.layout`.

:class:`GenerationWriter` carries an index from one generation to the next. Each
:meth:`~GenerationWriter.commit` publishes a complete, searchable generation holding every row
committed so far; parts that did not change are hard-linked, never copied, so committing a chunk
costs only the new rows. The caller holds the index lock.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from retrieval import faiss_index, store
from retrieval.layout import (
    EMBEDDINGS_DIR,
    FAISS_FILE,
    GENERATION_PREFIX,
    SKIPPED_FILE,
    STAGING_PREFIX,
    FaissRef,
    Manifest,
    PartRef,
    generation_dir,
    part_name,
    publish_generation,
    write_manifest,
)
from retrieval.version import __version__

from .faults import crash_point
from .plan import IndexedFacts
from .writer import EmbeddingWriter, FileRecord, SkipRecord, records_table, write_skipped


@dataclass(frozen=True)
class IndexMeta:
    """What every generation of one index repeats in its manifest."""

    model: str
    model_fingerprint: str
    backend: str
    dim: int
    preprocess: Mapping[str, Any]
    index_type: str
    source_root: str
    model_info: Mapping[str, Any] = field(default_factory=dict)


class GenerationWriter:
    """Append rows, drop rows, and publish generations of one index directory."""

    def __init__(self, index_dir: Path, meta: IndexMeta, base: Manifest | None) -> None:
        self.dir = index_dir
        self.meta = meta
        self.current = base
        # (reference, file) of every committed part, in id order.
        self._parts: list[tuple[PartRef, Path]] = [(p, index_dir / p.path) for p in base.parts] if base else []
        self._faiss: tuple[FaissRef, Path] | None = None
        if base is not None and base.faiss is not None:
            self._faiss = (base.faiss, index_dir / base.faiss.path)
        self._committed = base.count if base else 0
        self._records: list[FileRecord] = []
        self._vectors: list[np.ndarray] = []
        # Kept rows of rewritten parts (after compact), written as one part at the next commit.
        self._rewrite_tail: pa.Table | None = None
        self.skipped: list[SkipRecord] = []
        self.commits = 0

    @property
    def count(self) -> int:
        """Rows committed plus rows waiting for the next commit."""
        return self._committed + len(self._records)

    @property
    def pending(self) -> int:
        return len(self._records)

    # -- reading the base ----------------------------------------------------------------------

    def _open_parts(self) -> list[pq.ParquetFile]:
        return [pq.ParquetFile(path) for _, path in self._parts]

    def facts(self) -> IndexedFacts:
        """Per-row facts of the committed rows, for planning an update."""
        parts = self._open_parts()
        if not parts:
            return IndexedFacts([], np.empty(0, np.int64), np.empty(0, np.int64), [])
        return IndexedFacts(
            paths=store.read_column(parts, "path_bytes").to_pylist(),
            sizes=store.read_column(parts, "size").to_numpy(),
            mtimes_ns=store.read_column(parts, "mtime_ns").to_numpy(),
            hashes=store.read_column(parts, "content_hash").to_pylist(),
        )

    # -- changing rows -------------------------------------------------------------------------

    def compact(self, keep_ids: np.ndarray, refreshed: Mapping[int, int]) -> None:
        """Keep only ``keep_ids`` (renumbered in order) and set refreshed mtimes.

        Parts entirely before the first affected id are kept as they are; the rest are
        rewritten into one new part at the next commit.
        """
        if self._records:
            raise RuntimeError("compact() must come before rows are appended")
        keep = np.zeros(self._committed, dtype=bool)
        keep[keep_ids] = True
        changed = np.flatnonzero(~keep)
        first = int(changed[0]) if len(changed) else self._committed
        if refreshed:
            first = min(first, min(refreshed))
        if first >= self._committed:
            return
        split = 0
        while split < len(self._parts) and self._parts[split][0].first_id + self._parts[split][0].rows <= first:
            split += 1
        tail = self._parts[split:]
        self._parts = self._parts[:split]
        base_id = self._parts[-1][0].first_id + self._parts[-1][0].rows if self._parts else 0
        tables = []
        for ref, path in tail:
            table = pq.read_table(path)
            ids = np.arange(ref.first_id, ref.first_id + ref.rows)
            mtimes = table.column("mtime_ns").to_numpy().copy()
            for j, old_id in enumerate(ids):
                if int(old_id) in refreshed:
                    mtimes[j] = refreshed[int(old_id)]
            table = table.set_column(table.schema.get_field_index("mtime_ns"), "mtime_ns", pa.array(mtimes, pa.int64()))
            tables.append(table.filter(pa.array(keep[ids])))
        self._committed = base_id
        if len(changed):
            # Ids after the first dropped row move: the FAISS file no longer matches.
            self._faiss = None
        merged = pa.concat_tables(tables) if tables else None
        self._rewrite_tail = merged if merged is not None and merged.num_rows else None
        if self._rewrite_tail is not None:
            self._committed += self._rewrite_tail.num_rows

    def append(self, records: Sequence[FileRecord], vectors: np.ndarray) -> None:
        """Queue new rows for the next commit."""
        self._records.extend(records)
        self._vectors.append(np.asarray(vectors, dtype=np.float32))

    # -- publishing ----------------------------------------------------------------------------

    def commit(self, complete: bool = False, faiss: Any = None) -> Manifest:
        """Publish a generation with every row so far; ``faiss`` (covering all rows) if given."""
        generation = uuid.uuid4().hex
        staging = self.dir / f"{STAGING_PREFIX}{generation}"
        gen_rel = generation_dir(generation)
        (staging / EMBEDDINGS_DIR).mkdir(parents=True)
        try:
            new_parts: list[tuple[PartRef, Path]] = []
            for ref, src in self._parts:
                name = f"{EMBEDDINGS_DIR}/{part_name(len(new_parts))}"
                os.link(src, staging / name)
                new_parts.append((PartRef(f"{gen_rel}/{name}", ref.rows, ref.first_id, ref.file_id), self.dir / gen_rel / name))
            for table in self._tail_tables():
                first_id = new_parts[-1][0].first_id + new_parts[-1][0].rows if new_parts else 0
                name = f"{EMBEDDINGS_DIR}/{part_name(len(new_parts))}"
                ref = self._write_part(staging / name, f"{gen_rel}/{name}", first_id, table)
                new_parts.append((ref, self.dir / ref.path))
            count = new_parts[-1][0].first_id + new_parts[-1][0].rows if new_parts else 0
            faiss_ref: FaissRef | None = None
            if faiss is not None:
                if faiss.ntotal != count:
                    raise RuntimeError(f"faiss index holds {faiss.ntotal} vectors for {count} rows")
                faiss_index.write(faiss, staging / FAISS_FILE)
                faiss_ref = FaissRef(f"{gen_rel}/{FAISS_FILE}", count)
            elif self._faiss is not None:
                os.link(self._faiss[1], staging / FAISS_FILE)
                faiss_ref = FaissRef(f"{gen_rel}/{FAISS_FILE}", self._faiss[0].rows)
            write_skipped(staging / SKIPPED_FILE, self.skipped)
            manifest = Manifest(
                model=self.meta.model,
                model_fingerprint=self.meta.model_fingerprint,
                backend=self.meta.backend,
                dim=self.meta.dim,
                count=count,
                skipped=len(self.skipped),
                preprocess=dict(self.meta.preprocess),
                index_type=self.meta.index_type,
                generation=generation,
                source_root=self.meta.source_root,
                created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                tool_version=__version__,
                parts=tuple(ref for ref, _ in new_parts),
                faiss=faiss_ref,
                skipped_file=f"{gen_rel}/{SKIPPED_FILE}",
                complete=complete,
                model_info=dict(self.meta.model_info),
            )
            publish_generation(self.dir, staging, generation)
            crash_point("publish")
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        try:
            write_manifest(self.dir, manifest)
        except BaseException:
            shutil.rmtree(self.dir / gen_rel, ignore_errors=True)
            raise
        self._parts = new_parts
        self._faiss = (faiss_ref, self.dir / faiss_ref.path) if faiss_ref is not None else None
        self._committed = count
        self._records, self._vectors, self._rewrite_tail = [], [], None
        self.current = manifest
        self.commits += 1
        crash_point("commit")
        remove_stale(self.dir, keep=generation)
        return manifest

    def finish(self) -> Manifest:
        """Commit the remaining rows with a FAISS index over all rows, marked complete."""
        committed_parts = self._open_parts()
        if self._faiss is not None:
            index = faiss_index.read(self._faiss[1])
            start = self._faiss[0].rows
        else:
            index = faiss_index.build(np.empty((0, self.meta.dim), np.float32), self.meta.index_type)
            start = 0
        for _, vecs in store.iter_vectors(committed_parts, self.meta.dim, start_id=start):
            faiss_index.add(index, vecs)
        if self._rewrite_tail is not None:
            faiss_index.add(index, store.vectors_of(self._rewrite_tail.column("embedding"), self.meta.dim))
        for vecs in self._vectors:
            faiss_index.add(index, vecs)
        crash_point("finish")
        return self.commit(complete=True, faiss=index)

    # -- helpers -------------------------------------------------------------------------------

    def _tail_tables(self) -> list[pa.Table]:
        tables = [] if self._rewrite_tail is None else [self._rewrite_tail]
        if self._records:
            tables.append(records_table(self._records, np.concatenate(self._vectors), self.meta.dim))
        return tables

    def _write_part(self, path: Path, rel: str, first_id: int, table: pa.Table) -> PartRef:
        file_id = uuid.uuid4().hex
        writer = EmbeddingWriter(path, self.meta.dim, file_id, first_id=first_id)
        writer.write_table(table)
        rows = writer.close()
        return PartRef(rel, rows, first_id, file_id)


def remove_stale(index_dir: Path, keep: str | None) -> None:
    """Remove generations other than ``keep`` and leftover staging directories.

    Only the lock holder calls this; readers of a removed generation keep their open files.
    """
    for path in index_dir.iterdir():
        name = path.name
        if not path.is_dir():
            continue
        if name.startswith(STAGING_PREFIX) or (name.startswith(GENERATION_PREFIX) and name != GENERATION_PREFIX + (keep or "")):
            shutil.rmtree(path, ignore_errors=True)


__all__ = ["GenerationWriter", "IndexMeta", "remove_stale"]
