"""The checks :func:`retrieval.tools.verify.verify_index` runs, one per kind of file of a generation.

Each reads its file whole and returns what it found damaged as a :class:`Problem` (the file, the
check, what was found, the repair), or None: the recorded size and sha256 of every file
(:func:`check_digests`, which also lists each file as a :class:`FileCheck`), a Parquet part's
pages, ids, norms and path side file (:func:`check_part`), the skip list's rows
(:func:`check_skipped`), the faces side's counts, ids and descriptors (:func:`check_faces`), and
the FAISS file's count, dim and a sample of its vectors (:func:`check_faiss`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import faiss_index, store
from ..errors import IndexCorruptError, IndexFormatError
from ..layout import FACES_READ_SCHEMA, FACES_SCHEMA, Manifest, PartRef, checksum_file

# Stored embeddings are L2-normalised in float32: their norms are 1 within a few ulps. A flipped
# exponent bit gives inf or a norm far from 1; a flipped low mantissa bit is left to the digest.
NORM_TOLERANCE = 1e-3
# Flat storage holds the very vectors that were added.
EXACT_TOLERANCE = 1e-6


@dataclass(frozen=True)
class Problem:
    """One damaged file: ``file`` relative to INDEX_DIR, the ``check`` it failed (``missing``,
    ``size``, ``checksum``, ``unreadable``, ``ids``, ``norms``, ``paths``, ``rows``,
    ``faiss``, ``manifest``), what was found, and the command that repairs the index."""

    file: str
    check: str
    detail: str
    fix: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    def message(self) -> str:
        return f"{self.file} is damaged ({self.detail}); {self.fix}"


@dataclass(frozen=True)
class FileCheck:
    """One file of the generation: ``digest`` is ``ok``, ``mismatch``, ``absent`` (the manifest
    records none), or ``not checked`` (missing, or already wrong in size)."""

    path: str
    kind: str
    size: int | None
    digest: str

    def to_dict(self) -> dict[str, object]:
        return asdict(self)



def check_digests(root: Path, manifest: Manifest, problems: list[Problem]) -> tuple[list[FileCheck], set[str]]:
    """Each file exists, has its recorded size and digest. Returns the checks and the damaged."""
    files: list[FileCheck] = []
    damaged: set[str] = set()
    recorded_sums = dict(manifest.checksums)
    kinds = manifest.files()
    if manifest.keywords is not None:
        # The keyword side carries its own checksum (see retrieval.layout.KeywordsRef).
        kinds[manifest.keywords.path] = "keywords"
        recorded_sums[manifest.keywords.path] = manifest.keywords.checksum
    if manifest.faces is not None:
        # So does the faces side, one checksum per file (see retrieval.layout.FacesRef).
        kinds[manifest.faces.path] = "faces"
        recorded_sums[manifest.faces.path] = manifest.faces.checksum
        kinds[manifest.faces.read_path] = "faces_read"
        recorded_sums[manifest.faces.read_path] = manifest.faces.read_checksum
    for rel, kind in kinds.items():
        path = root / rel
        fix = store.fix_for(root, manifest, rel)
        recorded = recorded_sums.get(rel)
        if not path.is_file():
            problems.append(Problem(rel, "missing", "missing", fix))
            damaged.add(rel)
            files.append(FileCheck(rel, kind, None, "not checked"))
            continue
        size = path.stat().st_size
        if recorded is None:
            files.append(FileCheck(rel, kind, size, "absent"))
            continue
        if size != recorded.size:
            problems.append(Problem(rel, "size", f"{size} bytes, the manifest records {recorded.size}", fix))
            damaged.add(rel)
            files.append(FileCheck(rel, kind, size, "not checked"))
            continue
        try:
            actual = checksum_file(path)
        except OSError as exc:
            problems.append(Problem(rel, "unreadable", f"cannot be read: {exc.strerror}", fix))
            damaged.add(rel)
            files.append(FileCheck(rel, kind, size, "not checked"))
            continue
        if actual.digest != recorded.digest:
            problems.append(Problem(rel, "checksum", f"its {recorded.algorithm} differs from the one the manifest records", fix))
            damaged.add(rel)
            files.append(FileCheck(rel, kind, size, "mismatch"))
        else:
            files.append(FileCheck(rel, kind, size, "ok"))
    return files, damaged


def check_part(
    root: Path, manifest: Manifest, ref: PartRef, want: np.ndarray, found: dict[int, np.ndarray], check_paths: bool
) -> Problem | None:
    """Read every page of one part (CRC-checked): ids, norms, and its path file's contents.

    Vectors of the ids in ``want`` are put in ``found`` for the FAISS comparison.
    """
    fix = store.rebuild_hint(root, manifest)
    try:
        pf = store.open_part(root, ref, fix)
        first = ref.first_id
        chunks: list[pa.Array] = []
        with store.reading(pf):
            for g in range(pf.metadata.num_row_groups):
                table = pf.read_row_group(g)  # every column: every page's CRC is checked
                n = table.num_rows
                # A part linked with an id_offset (format 4) stores its ids less that offset.
                stored = first - ref.id_offset
                if not np.array_equal(table.column("id").to_numpy(), np.arange(stored, stored + n, dtype=np.int64)):
                    return Problem(ref.path, "ids", f"ids of row group {g} are not {stored}..{stored + n - 1}", fix)
                vecs = store.vectors_of(table.column("embedding"), manifest.dim)
                with np.errstate(over="ignore", invalid="ignore"):
                    norms = np.linalg.norm(vecs, axis=1)
                bad = ~(np.abs(norms - 1.0) <= NORM_TOLERANCE)  # NaN and inf compare False
                if bad.any():
                    j = int(np.argmax(bad))
                    return Problem(ref.path, "norms", f"the embedding of id {first + j} has norm {norms[j]:.6g}, not 1", fix)
                for i in want[(want >= first) & (want < first + n)].tolist():
                    found[i] = vecs[i - first].copy()
                chunks.extend(table.column("path").chunks)
                first += n
    except IndexCorruptError as exc:
        return Problem(ref.path, "unreadable", exc.problem, fix)
    if not check_paths or ref.paths is None:
        return None
    try:
        table_of_paths = store.open_paths(root, ref, fix)
    except IndexCorruptError as exc:
        return Problem(ref.paths, "unreadable", exc.problem, fix)
    assert table_of_paths is not None
    if not table_of_paths.well_formed:
        return Problem(ref.paths, "paths", "unexpected bytes after its paths (a damaged CRC trailer?)", fix)
    row = _first_difference(table_of_paths, chunks)
    if row is not None:
        return Problem(ref.paths, "paths", f"path of row {row} differs from the part's path column", fix)
    row = table_of_paths.first_bad_row()
    if row is not None:
        return Problem(ref.paths, "paths", f"the path of row {row} fails its CRC", fix)
    return None


def _first_difference(paths: store.PathTable, chunks: Sequence[pa.Array]) -> int | None:
    """The first row whose path in the side file differs from the Parquet column, or None."""
    column = pa.concat_arrays([c.cast(pa.large_string()) for c in chunks]) if chunks else pa.array([], pa.large_string())
    raw = np.frombuffer(column.buffers()[1], np.int64)[column.offset : column.offset + len(column) + 1]
    base, end = int(raw[0]), int(raw[-1])
    offsets = raw - base
    data_buf = column.buffers()[2]
    expected = np.frombuffer(data_buf, np.uint8)[base:end] if data_buf is not None else np.empty(0, np.uint8)
    stored_offsets = paths.offsets.astype(np.int64)
    stored = np.frombuffer(paths.data, np.uint8)
    if len(stored_offsets) != len(offsets):
        return 0
    diff = np.flatnonzero(stored_offsets != offsets)
    if len(diff):
        return max(0, int(diff[0]) - 1)
    if len(stored) != len(expected):
        # Extra bytes after the last path: the file was extended.
        return len(offsets) - 2 if len(offsets) > 1 else 0
    byte = np.flatnonzero(stored != expected)
    if len(byte):
        return int(np.searchsorted(offsets, byte[0], side="right") - 1)
    return None


def check_faces(root: Path, manifest: Manifest) -> Problem | None:
    """The faces side agrees with its record and the rows: its counts, ids and descriptors."""
    ref = manifest.faces
    assert ref is not None
    fix = store.fix_for(root, manifest, ref.path)
    try:
        faces = pq.read_table(root / ref.path)
        read = pq.read_table(root / ref.read_path)
        faces.cast(FACES_SCHEMA)
        read.cast(FACES_READ_SCHEMA)
    except (OSError, pa.ArrowException) as exc:
        return Problem(ref.path, "unreadable", f"the faces side cannot be read: {exc}", fix)
    ids = read.column("id").to_numpy()
    if read.num_rows != ref.read or faces.num_rows != ref.faces:
        return Problem(ref.path, "rows", f"{faces.num_rows} faces in {read.num_rows} images read, the manifest records "
                       f"{ref.faces} in {ref.read}", fix)
    if len(ids) and (ids.min() < 0 or ids.max() >= manifest.count or len(np.unique(ids)) != len(ids)):
        return Problem(ref.read_path, "ids", f"image ids outside 0..{manifest.count - 1} or repeated", fix)
    face_ids = faces.column("id").to_numpy()
    if not np.isin(face_ids, ids).all():
        return Problem(ref.path, "ids", "faces of images the side does not record as read", fix)
    descriptors = np.asarray(faces.column("descriptor").combine_chunks().flatten(), dtype=np.float32)
    if not np.isfinite(descriptors).all():
        return Problem(ref.path, "values", "face descriptors that are not finite numbers", fix)
    return None


def check_skipped(root: Path, manifest: Manifest) -> Problem | None:
    """The skip list reads (CRC-checked) and holds as many rows as the manifest records."""
    rel = manifest.skipped_file
    fix = store.rebuild_hint(root, manifest)
    try:
        rows = len(store.read_skipped(root / rel, fix))
    except IndexCorruptError as exc:
        return Problem(rel, "unreadable", exc.problem, fix)
    if rows != manifest.skipped:
        return Problem(rel, "rows", f"{rows} rows, the manifest records {manifest.skipped} skipped files", fix)
    return None


def check_faiss(root: Path, manifest: Manifest, found: dict[int, np.ndarray]) -> tuple[Problem | None, int, str]:
    """Count, dim and a sample of vectors against the stored embeddings (from intact parts)."""
    ref = manifest.faiss
    assert ref is not None
    fix = store.fix_for(root, manifest, ref.path)
    try:
        # Mapped, not read: checking a FAISS file bigger than memory must not need that memory.
        index = faiss_index.read(root / ref.path, mmap=True)
    except IndexFormatError:
        return Problem(ref.path, "unreadable", "FAISS cannot read it", fix), 0, ""
    if index.ntotal != ref.rows or index.d != manifest.dim:
        detail = f"{index.ntotal} vectors of dim {index.d}, the manifest says {ref.rows} of dim {manifest.dim}"
        return Problem(ref.path, "faiss", detail, fix), 0, ""
    ids = np.array(sorted(found), dtype=np.int64)
    if not len(ids):
        return None, 0, ""
    got = faiss_index.stored_vectors(index, ids)
    if got is None:
        return None, 0, f"the FAISS index type {manifest.index_type} cannot return its vectors: none were compared"
    stored, exact = got
    want = np.stack([found[int(i)] for i in ids])
    if exact:
        bad = np.flatnonzero(np.abs(stored - want).max(axis=1) > EXACT_TOLERANCE)
    else:
        # Decoded codes are approximations: each must still be nearest to its own stored vector
        # among the sample (catches rows that moved or codes far off; the digest catches the rest).
        scores = stored @ want.T
        bad = np.flatnonzero(np.diag(scores) < scores.max(axis=1) - 1e-6)
    if len(bad):
        i = int(ids[bad[0]])
        what = "differs from" if exact else "is not nearest to"
        return Problem(ref.path, "faiss", f"its vector of id {i} {what} the stored embedding of id {i}", fix), len(ids), ""
    return None, len(ids), ""


__all__ = ["FileCheck", "Problem", "check_digests", "check_faces", "check_faiss", "check_part", "check_skipped"]
