"""Committing generations: the writer side of :mod:`retrieval.layout`.

:class:`GenerationWriter` carries an index from one generation to the next. Each
:meth:`~GenerationWriter.commit` publishes a complete, searchable generation holding every row
committed so far; parts that did not change are hard-linked, never copied, so committing a chunk
costs only the new rows. The caller holds the index lock. The writer decides what a generation
holds (its rows, parts, FAISS file, sides and manifest); :mod:`indexer.new_generation` writes
those files under a staging name and publishes them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import shutil
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from indexer.index_types import IndexOptions
from retrieval import store
from retrieval.errors import TooFewTrainingVectorsError
from retrieval.faults import crash_point
from retrieval.layout import STAGING_PREFIX, FaissRef, FileChecksum, Manifest, PartRef, format_version_for, paths_file_of
from retrieval.version import __version__

from . import ann
from .ann import FaissInfo
from .new_generation import NewGeneration, remove_stale
from .parts import PartSource, group_parts
from .plan import IndexedFacts
from .side_writer import SideWriter, SideWriters
from .writer import FileRecord, SkipRecord, records_table


@dataclass(frozen=True)
class IndexMeta:
    """What every generation of one index repeats in its manifest."""

    model: str
    model_fingerprint: str
    backend: str
    dim: int
    preprocess: Mapping[str, Any]
    source_root: str
    model_info: Mapping[str, Any] = field(default_factory=dict)
    index_options: Mapping[str, Any] = field(default_factory=dict)
    discovery: Mapping[str, Any] = field(default_factory=dict)
    # Each side stage's setting for this build, by the stage's name (indexer.sides.registry),
    # recorded in the stage's manifest entry; a stage not named here has its default (off).
    sides: Mapping[str, Any] = field(default_factory=dict)


_Side = TypeVar("_Side", bound=SideWriter)


class GenerationWriter:
    """Append rows, drop rows, and publish generations of one index directory.

    ``sides`` makes the sides the writer carries from ``base`` into each generation, by the
    stage's name (:mod:`indexer.side_writer`; the build's stages:
    :func:`indexer.sides.registry.side_writers`).
    """

    def __init__(self, index_dir: Path, meta: IndexMeta, base: Manifest | None, sides: SideWriters) -> None:
        self.dir = index_dir
        self.meta = meta
        self.current = base
        # (reference, file) of every committed part, in id order.
        self._parts: list[tuple[PartRef, Path]] = [(p, index_dir / p.path) for p in base.parts] if base else []
        self._faiss: tuple[FaissRef, Path] | None = None
        self._faiss_info = FaissInfo()
        if base is not None and base.faiss is not None:
            self._faiss = (base.faiss, index_dir / base.faiss.path)
            self._faiss_info = FaissInfo(base.index_type, dict(base.search_params), dict(base.index_tuning))
        self._committed = base.count if base else 0
        # What a run records if the options it was given cannot be built (see finish).
        self._base_options = dict(base.index_options) if base is not None else IndexOptions().to_dict()
        # Each side stage's part (indexer.sides): the last generation's side, carried into the next.
        self.sides: dict[str, SideWriter] = dict(sides(index_dir, base))
        # Whether the index holds a video's rows (format 5): once it has, it stays so.
        self._videos = base is not None and base.format_version >= 5
        # Checksums of the committed files by path, carried to the next generation with the
        # files it links (a generation of a version-2 index written before checksums has none:
        # its files are hashed when first linked, which is how such an index gets them).
        self._sums: dict[str, FileChecksum] = dict(base.checksums) if base else {}
        self._records: list[FileRecord] = []
        self._vectors: list[np.ndarray] = []
        # Kept rows of rewritten parts (after compact), written as one part at the next commit.
        self._rewrite_tail: pa.Table | None = None
        # The skip list every commit writes; callers add to it with record_skips().
        self.skipped: list[SkipRecord] = []
        self.commits = 0
        # Staging folders a run is still writing parts into (indexer.ray_parts): kept by commits.
        self.live_staging: set[str] = set()

    @property
    def count(self) -> int:
        """Rows committed plus rows waiting for the next commit."""
        return self._committed + len(self._records)

    @property
    def pending(self) -> int:
        return len(self._records)

    def side(self, name: str, kind: type[_Side]) -> _Side:
        """The side of stage ``name`` this writer carries, a ``kind``."""
        side = self.sides[name]
        if not isinstance(side, kind):
            raise TypeError(f"the {name!r} side is a {type(side).__name__}, not a {kind.__name__}")
        return side

    # -- reading the base ----------------------------------------------------------------------

    def _open_parts(self) -> list[pq.ParquetFile]:
        # Pages are checked against their CRC: a damaged part fails the update, never carries
        # its damage into a new part with fresh checksums.
        return [store.open_parquet(path) for _, path in self._parts]

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
        for side in self.sides.values():
            side.rows_renumbered(first)
        split = 0
        while split < len(self._parts) and self._parts[split][0].first_id + self._parts[split][0].rows <= first:
            split += 1
        tail = self._parts[split:]
        self._parts = self._parts[:split]
        base_id = self._parts[-1][0].first_id + self._parts[-1][0].rows if self._parts else 0
        tables = []
        for ref, path in tail:
            pf = store.open_parquet(path)
            with store.reading(pf):
                table = pf.read()
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

    @property
    def parts(self) -> list[tuple[PartRef, Path]]:
        """The committed parts (reference, file), in id order (after :meth:`compact`, those kept)."""
        return list(self._parts)

    def replace_parts(self, start: int, stop: int, parts: Sequence[tuple[PartRef, Path]]) -> None:
        """Put ``parts`` in place of the committed parts ``start:stop`` at the next commit.

        ``parts`` are files the caller wrote outside any generation (in a staging-named folder,
        so that a crash leaves nothing a later writer keeps) holding the same ids, in order, with
        the same vectors: the FAISS file stays valid, the sides are told (:mod:`indexer.sides`).
        """
        old = self._parts[start:stop]
        if self._records or self._rewrite_tail is not None or not old:
            raise RuntimeError("replace_parts() takes committed parts, before rows are appended")
        first, end = old[0][0].first_id, old[-1][0].first_id + old[-1][0].rows
        next_id = first
        for ref, _ in parts:
            if ref.first_id != next_id:
                raise ValueError(f"replacement parts do not cover ids {first}..{end - 1} in order")
            next_id += ref.rows
        if next_id != end:
            raise ValueError(f"replacement parts hold ids {first}..{next_id - 1}, not {first}..{end - 1}")
        self._parts[start:stop] = list(parts)
        for side in self.sides.values():
            side.rows_rewritten(first)

    def append(self, records: Sequence[FileRecord], vectors: np.ndarray) -> None:
        """Queue new rows for the next commit."""
        self._videos = self._videos or any(r.frame is not None for r in records)
        self._records.extend(records)
        self._vectors.append(np.asarray(vectors, dtype=np.float32))

    @property
    def tail_pending(self) -> bool:
        """Rows queued as tables (appended, or kept by :meth:`compact`) for the next commit."""
        return bool(self._records) or self._rewrite_tail is not None

    def adopt_part(self, path: Path, rows: int, file_id: str) -> PartRef:
        """Make the part file ``path`` (written in a staging-named folder under the index, with
        stored ids ``0 .. rows - 1``) the next ``rows`` ids, linked by the next commit with
        ``id_offset`` = its first id (format 4): its rows are not read or written again here."""
        if self.tail_pending:
            raise RuntimeError("adopt_part() needs the queued rows committed first")
        first = self._committed
        rel = path.relative_to(self.dir).as_posix()
        ref = PartRef(rel, rows, first, file_id, paths_file_of(rel), id_offset=first)
        self._parts.append((ref, path))
        self._committed += rows
        return ref

    def record_skips(self, records: Iterable[SkipRecord]) -> None:
        """Add files to the skip list that the next commit writes (files with no row)."""
        self.skipped.extend(records)

    def set_model_info(self, model_info: Mapping[str, Any]) -> None:
        """Record ``model_info`` (e.g. the precision a run resolved) in every later manifest."""
        self.meta = dataclasses.replace(self.meta, model_info=dict(model_info))

    # -- publishing ----------------------------------------------------------------------------

    def commit(
        self,
        complete: bool = False,
        faiss: Any = None,
        faiss_info: FaissInfo | None = None,
        merge: bool = False,
        faiss_file: Path | None = None,
    ) -> Manifest:
        """Publish a generation with every row so far; ``faiss`` (covering all rows) if given,
        moved from ``faiss_file`` where it is already written there (same file system).

        ``merge`` also rewrites runs of small parts into bigger ones (see :mod:`indexer.parts`).
        """
        new = NewGeneration(self.dir, self._sums)
        try:
            new_parts = new.add_parts(self._groups(merge), self.meta.dim)
            count = new_parts[-1][0].first_id + new_parts[-1][0].rows if new_parts else 0
            # Each side's manifest entry, by its field (the stage's name).
            entries = {name: side.write(new.staging, new.rel, count, new.part_files, self.meta.sides.get(name))
                       for name, side in self.sides.items()}
            faiss_ref: FaissRef | None = None
            info = FaissInfo()
            if faiss is not None:
                faiss_ref = new.write_faiss(faiss, count, faiss_file)
                info = faiss_info or FaissInfo()
            elif self._faiss is not None:
                faiss_ref = new.link_faiss(*self._faiss)
                info = self._faiss_info
            skipped_file = new.add_skipped(self.skipped)
            manifest = Manifest(
                model=self.meta.model,
                model_fingerprint=self.meta.model_fingerprint,
                backend=self.meta.backend,
                dim=self.meta.dim,
                count=count,
                skipped=len(self.skipped),
                preprocess=dict(self.meta.preprocess),
                index_type=info.factory,
                generation=new.generation,
                source_root=self.meta.source_root,
                created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                tool_version=__version__,
                parts=tuple(ref for ref, _ in new_parts),
                faiss=faiss_ref,
                skipped_file=skipped_file,
                complete=complete,
                model_info=dict(self.meta.model_info),
                index_options=dict(self.meta.index_options),
                search_params=dict(info.search_params),
                index_tuning=dict(info.tuning),
                checksums=new.sums,
                discovery=dict(self.meta.discovery),
                # A side with no entry (None) leaves its field unset: a stage need not have one.
                **{name: entry for name, entry in entries.items() if entry is not None},
                format_version=format_version_for(info.factory, [ref for ref, _ in new_parts], self._videos),
            )
            new.publish(manifest)
        except BaseException:
            new.discard()
            raise
        self._parts = new_parts
        self._faiss = (faiss_ref, self.dir / faiss_ref.path) if faiss_ref is not None else None
        self._faiss_info = info
        self._sums = new.sums
        for name, side in self.sides.items():
            side.committed(entries[name], self.dir, count)
        self._committed = count
        self._records, self._vectors, self._rewrite_tail = [], [], None
        self.current = manifest
        self.commits += 1
        crash_point("commit")
        remove_stale(self.dir, keep=new.generation, live=self.live_staging)
        return manifest

    def finish(self, progress: ann.Progress | None = None) -> Manifest:
        """Commit the remaining rows with a FAISS index over all rows, marked complete.

        Whether the previous generation's FAISS file is extended (and re-tuned) or a new one
        built from the stored vectors is :func:`indexer.ann.update`'s decision; it is made
        here once, with what this writer knows: the file still valid for the first rows, if any.
        """
        previous = None
        if self._faiss is not None:
            previous = ann.PreviousFaiss(self._faiss[1], self._faiss[0].rows, self._faiss_info)
        options = IndexOptions.from_dict(self.meta.index_options)
        # Where a re-ranked index is written while it is built (its vectors streamed, not held
        # in RAM; made only then); a staging name, so that the next writer removes what a crash
        # leaves there.
        scratch = self.dir / f"{STAGING_PREFIX}faiss-{uuid.uuid4().hex}"
        try:
            try:
                updated = ann.update(previous, self._chunks, self.meta.dim, self.count, options, progress=progress, scratch=scratch)
            except TooFewTrainingVectorsError as exc:
                raise self._keep_rows_without(options, exc) from exc
            crash_point("finish")
            return self.commit(complete=True, faiss=updated.index, faiss_info=updated.info, merge=True, faiss_file=updated.path)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _keep_rows_without(self, options: IndexOptions, exc: TooFewTrainingVectorsError) -> TooFewTrainingVectorsError:
        """Commit the rows of a build whose index type turned out untrainable (fewer images
        decoded than were found), with the options the index had before this run (else ``auto``):
        recorded, the failing ones would be reused by every later run and fail it again."""
        if self.current is not None and self.current.complete and not self.pending:
            return exc  # nothing new to keep; the published generation keeps its own options
        fallback = self._base_options
        if fallback.get("index_type") == options.index_type:
            fallback = dataclasses.replace(options, index_type="auto").to_dict()
        self.meta = dataclasses.replace(self.meta, index_options=fallback)
        self.commit(complete=False)
        named = fallback.get("index_type", "flat")  # a version-1 index's empty options: flat
        return TooFewTrainingVectorsError(
            f"{exc}; the {self.count} rows are kept: run again with one of those, or without --index-type for {named}"
        )

    def drop_faiss(self, index_options: Mapping[str, Any]) -> None:
        """Forget the FAISS file (and switch options): the next :meth:`finish` builds a new one."""
        self.meta = dataclasses.replace(self.meta, index_options=dict(index_options))
        self._faiss = None
        self._faiss_info = FaissInfo()

    # -- helpers -------------------------------------------------------------------------------

    def _chunks(self, start: int = 0) -> Iterator[tuple[int, np.ndarray]]:
        """Every row's vector from id ``start`` on: committed parts, then rows not yet written."""
        yield from store.iter_vectors(self._open_parts(), self.meta.dim, start_id=start)
        first = self._parts[-1][0].first_id + self._parts[-1][0].rows if self._parts else 0
        pending = [store.vectors_of(self._rewrite_tail.column("embedding"), self.meta.dim)] if self._rewrite_tail is not None else []
        pending += self._vectors
        for vecs in pending:
            if first + len(vecs) > start and len(vecs):
                skip = max(0, start - first)
                yield first + skip, vecs[skip:]
            first += len(vecs)

    def _tail_tables(self) -> list[pa.Table]:
        tables = [] if self._rewrite_tail is None else [self._rewrite_tail]
        if self._records:
            columns: dict[str, Any] = {}
            for name, side in self.sides.items():
                columns.update(side.row_columns(self.meta.sides.get(name)))
            tables.append(records_table(self._records, np.concatenate(self._vectors), self.meta.dim, **columns))
        return tables

    def _groups(self, merge: bool) -> list[list[PartSource]]:
        """Which sources become which new part: one part each, or runs of small ones merged."""
        return group_parts([*self._parts, *self._tail_tables()], merge)


__all__ = ["GenerationWriter", "IndexMeta"]
