"""The full integrity check of an index directory, which ``clipsearch verify`` (:mod:`clipsearch.cli.verify`) prints.

Opening an index checks only what is cheap (the manifest's digest, each file's size, the Parquet
footers, the path files' headers, the FAISS count); Parquet pages are checked against their CRC
whenever they are read. :func:`verify_index` checks everything else, reading every byte:

- every file of the generation against the size and sha256 the manifest records;
- every Parquet page (CRC), ids ``0 .. count - 1`` in row order, every embedding finite with
  norm 1, each path file equal to its part's ``path`` column (and each path's CRC), the skip
  list's row count;
- the FAISS file's vector count and dim, and a sample of its vectors against the stored ones.

Damage is reported, not raised: the report names each damaged file and the command that
repairs the index (``clipsearch reindex`` for a FAISS file, a rebuild otherwise).

This module walks the generation and gathers the report; the check of each kind of file is
:mod:`retrieval.tools.verify_checks`'s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import store
from ..errors import ClipSearchError, IndexCorruptError, IndexFormatError, NotAnIndexError, UnsupportedFormatError
from ..layout import MANIFEST_FILE, read_manifest
from .verify_checks import FileCheck, Problem, check_digests, check_faces, check_faiss, check_part, check_skipped

# FAISS vectors compared with the stored ones, spread evenly over the ids.
FAISS_SAMPLE = 64


@dataclass(frozen=True)
class VerifyReport:
    """What :func:`verify_index` found; ``ok`` when no problem was found.

    Attributes:
        index_dir: the directory checked.
        generation: the generation the manifest names (None when the manifest is unreadable).
        count: images in the index.
        checksums: whether the manifest records file checksums (an older format's index records
            none: then only the content checks ran).
        files: each file of the generation and how its digest compared.
        faiss_sampled: FAISS vectors compared with the stored embeddings.
        problems: the damage found, one entry per damaged file.
        notes: what was not checked, and why.
        seconds: how long the check took.
    """

    index_dir: str
    generation: str | None
    count: int
    checksums: bool
    files: tuple[FileCheck, ...]
    faiss_sampled: int
    problems: tuple[Problem, ...]
    notes: tuple[str, ...]
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, object]:
        """The JSON object ``clipsearch verify --json`` prints."""
        return {
            "index_dir": self.index_dir,
            "ok": self.ok,
            "generation": self.generation,
            "count": self.count,
            "checksums": self.checksums,
            "files": [f.to_dict() for f in self.files],
            "faiss_sampled": self.faiss_sampled,
            "problems": [p.to_dict() for p in self.problems],
            "notes": list(self.notes),
            "seconds": self.seconds,
        }


def verify_index(index_dir: str | Path, *, sample: int = FAISS_SAMPLE) -> VerifyReport:
    """Check every file of an index directory, reading all of it.

    Args:
        index_dir: the INDEX_DIR to check.
        sample: how many FAISS vectors to compare with the stored embeddings.

    Returns:
        The report; ``report.ok`` is False when a file is damaged, and each problem names the
        file and the repair.

    Raises:
        NotAnIndexError: there is no index (no manifest) at ``index_dir``.
        UnsupportedFormatError: the index is newer than this code reads.
    """
    start = time.perf_counter()
    root = Path(index_dir)
    # Readers take no lock: a writer may publish a new generation (and remove this one) while
    # it is checked. Its files then vanish mid-check, which is not damage: check the new one.
    for _ in range(3):
        report = _verify_once(root, sample, start)
        if report.generation is None or _current_generation(root) == report.generation:
            break
    return report


def _current_generation(root: Path) -> str | None:
    try:
        return read_manifest(root).generation
    except ClipSearchError:
        return None


def _verify_once(root: Path, sample: int, start: float) -> VerifyReport:
    try:
        manifest = read_manifest(root)
    except (NotAnIndexError, UnsupportedFormatError):
        raise
    except IndexFormatError as exc:
        fix = exc.fix if isinstance(exc, IndexCorruptError) else store.rebuild_hint(root, None)
        broken = Problem(MANIFEST_FILE, "manifest", _detail(exc), fix)
        return VerifyReport(str(root), None, 0, False, (), 0, (broken,), (), _since(start))

    problems: list[Problem] = []
    notes: list[str] = []
    files, damaged = check_digests(root, manifest, problems)
    if not manifest.checksums:
        notes.append(
            "the manifest records no file checksums (the index was written before clipsearch recorded "
            f"them): only the content checks ran; record them with `clipsearch reindex {root}`"
        )
    if not manifest.complete:
        notes.append("the index holds an interrupted build: run the same `clipsearch index` command again to finish it")

    rows = manifest.faiss.rows if manifest.faiss is not None else 0
    want = np.unique(np.linspace(0, rows - 1, num=min(rows, sample)).round().astype(np.int64)) if rows else np.empty(0, np.int64)
    found: dict[int, np.ndarray] = {}
    for ref in manifest.parts:
        if ref.path in damaged:
            continue
        problem = check_part(root, manifest, ref, want, found, check_paths=ref.paths is not None and ref.paths not in damaged)
        if problem is not None:
            problems.append(problem)
            damaged.add(problem.file)
    if manifest.skipped_file not in damaged:
        problem = check_skipped(root, manifest)
        if problem is not None:
            problems.append(problem)
    if manifest.faces is not None and not {manifest.faces.path, manifest.faces.read_path} & damaged:
        problem = check_faces(root, manifest)
        if problem is not None:
            problems.append(problem)
    sampled = 0
    if manifest.faiss is None:
        notes.append("no FAISS file: readers build the index from the stored vectors on open")
    elif manifest.faiss.path not in damaged:
        problem, sampled, note = check_faiss(root, manifest, found)
        if problem is not None:
            problems.append(problem)
        if note:
            notes.append(note)
    return VerifyReport(
        index_dir=str(root),
        generation=manifest.generation,
        count=manifest.count,
        checksums=bool(manifest.checksums),
        files=tuple(files),
        faiss_sampled=sampled,
        problems=tuple(problems),
        notes=tuple(notes),
        seconds=_since(start),
    )


def _since(start: float) -> float:
    return round(time.perf_counter() - start, 3)


def _detail(exc: Exception) -> str:
    return exc.problem if isinstance(exc, IndexCorruptError) else str(exc)


__all__ = ["FileCheck", "Problem", "VerifyReport", "verify_index"]
