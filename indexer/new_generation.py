"""One new generation of an index, written under a staging name and published last.

:class:`NewGeneration` is the folder a :meth:`indexer.commit.GenerationWriter.commit` fills:
part files linked unchanged from the last generation (their recorded checksums carried along)
or written anew (hashed once, while they are in the page cache), the FAISS file and the skip
list; :meth:`~NewGeneration.publish` then renames the folder into place and switches the
manifest to it, the one step that makes it the index's (what a reader opens:
:mod:`retrieval.generation`). :func:`remove_stale` removes the generations and staging folders
that no manifest names any more.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from retrieval import faiss_index
from retrieval.faults import crash_point
from retrieval.layout import (
    EMBEDDINGS_DIR,
    FAISS_FILE,
    GENERATION_PREFIX,
    SKIPPED_FILE,
    STAGING_PREFIX,
    FaissRef,
    FileChecksum,
    Manifest,
    PartRef,
    checksum_file,
    generation_dir,
    part_name,
    paths_file_of,
    publish_generation,
    write_manifest,
)

from .parts import PartSource, link_part, write_part
from .writer import SkipRecord, write_skipped


class NewGeneration:
    """The staging folder of one generation while its files are written, and their checksums.

    ``carried`` holds the checksums the last generation recorded, by path: a file linked from
    it keeps its checksum rather than being read again. Only the holder of the index lock
    makes one; a folder left by a crash keeps its staging name, which the next writer removes.
    """

    def __init__(self, index_dir: Path, carried: Mapping[str, FileChecksum]) -> None:
        self.index_dir = index_dir
        self.generation = uuid.uuid4().hex
        self.staging = index_dir / f"{STAGING_PREFIX}{self.generation}"
        # The folder's name once published: where the manifest's paths point.
        self.rel = generation_dir(self.generation)
        self._carried = carried
        # Every file of the new generation by path: what its manifest records.
        self.sums: dict[str, FileChecksum] = {}
        # The part files written or linked so far, in id order (what the sides read rows from).
        self.part_files: list[Path] = []
        (self.staging / EMBEDDINGS_DIR).mkdir(parents=True)

    def add_parts(self, groups: Iterable[Sequence[PartSource]], dim: int) -> list[tuple[PartRef, Path]]:
        """One part per group, ids in order from 0: a lone committed part is hard-linked, never
        copied; anything else (tables, or a run of small parts merged) is written anew.

        Returns each part's reference and its file once published.
        """
        parts: list[tuple[PartRef, Path]] = []
        for group in groups:
            first_id = parts[-1][0].first_id + parts[-1][0].rows if parts else 0
            name = f"{EMBEDDINGS_DIR}/{part_name(len(parts))}"
            source = group[0]
            if len(group) == 1 and not isinstance(source, pa.Table):
                old, src = source
                ref, path = link_part(self.index_dir, old, src, self.staging, self.rel, name)
                self.sums[ref.path] = self._carried_sum(old.path, self.staging / name)
                self.sums[str(ref.paths)] = self._carried_sum(old.paths, self.staging / paths_file_of(name))
            else:
                ref = write_part(self.staging / name, f"{self.rel}/{name}", dim, first_id, group)
                path = self.index_dir / ref.path
                self.sums[ref.path] = checksum_file(self.staging / name)
                self.sums[str(ref.paths)] = checksum_file(self.staging / paths_file_of(name))
            parts.append((ref, path))
            self.part_files.append(self.staging / name)
        return parts

    def write_faiss(self, index: Any, rows: int, written: Path | None = None) -> FaissRef:
        """The generation's FAISS file for ``rows`` rows: ``index`` written, or moved from
        ``written`` where it already is (on the same file system).

        Raises:
            RuntimeError: ``index`` does not hold ``rows`` vectors.
        """
        if index.ntotal != rows:
            raise RuntimeError(f"faiss index holds {index.ntotal} vectors for {rows} rows")
        if written is not None:
            os.replace(written, self.staging / FAISS_FILE)
        else:
            faiss_index.write(index, self.staging / FAISS_FILE)
        ref = FaissRef(f"{self.rel}/{FAISS_FILE}", rows)
        self.sums[ref.path] = checksum_file(self.staging / FAISS_FILE)
        return ref

    def link_faiss(self, old: FaissRef, path: Path) -> FaissRef:
        """The last generation's FAISS file ``old`` (at ``path``), still valid, hard-linked."""
        os.link(path, self.staging / FAISS_FILE)
        ref = FaissRef(f"{self.rel}/{FAISS_FILE}", old.rows)
        self.sums[ref.path] = self._carried_sum(old.path, self.staging / FAISS_FILE)
        return ref

    def add_skipped(self, skipped: Sequence[SkipRecord]) -> str:
        """The skip list, written; returns its path in the index."""
        write_skipped(self.staging / SKIPPED_FILE, skipped)
        rel = f"{self.rel}/{SKIPPED_FILE}"
        self.sums[rel] = checksum_file(self.staging / SKIPPED_FILE)
        return rel

    def publish(self, manifest: Manifest) -> None:
        """Rename the folder to its generation name, then make ``manifest`` the index's.

        Until the manifest is switched, readers and a crash see the previous generation; a
        failure to switch it removes the published folder again.
        """
        crash_point("staged")
        publish_generation(self.index_dir, self.staging, self.generation)
        crash_point("publish")
        try:
            write_manifest(self.index_dir, manifest)
        except BaseException:
            shutil.rmtree(self.index_dir / self.rel, ignore_errors=True)
            raise

    def discard(self) -> None:
        """Remove what was staged (after a failure before :meth:`publish`)."""
        shutil.rmtree(self.staging, ignore_errors=True)

    def _carried_sum(self, rel: str | None, linked: Path) -> FileChecksum:
        # The recorded checksum of a file linked from the last generation; hashed when that
        # generation recorded none (written before checksums, or a version-1 part's new paths).
        recorded = self._carried.get(rel) if rel is not None else None
        return recorded if recorded is not None else checksum_file(linked)


def remove_stale(index_dir: Path, keep: str | None, live: Iterable[str] = ()) -> None:
    """Remove generations other than ``keep`` and leftover staging directories (but the
    ``live`` ones, which the running writer still fills).

    Only the lock holder calls this; readers of a removed generation keep their open files.
    """
    for path in index_dir.iterdir():
        name = path.name
        if not path.is_dir() or name in live:
            continue
        if name.startswith(STAGING_PREFIX) or (name.startswith(GENERATION_PREFIX) and name != GENERATION_PREFIX + (keep or "")):
            shutil.rmtree(path, ignore_errors=True)


__all__ = ["NewGeneration", "remove_stale"]
