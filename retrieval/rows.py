"""The metadata rows of one opened generation: paths, sizes, columns, filters, stored vectors.

:class:`Rows` answers every question about images by id from the Parquet parts, the path side
files and the skip list that :mod:`retrieval.store` opened, reading only what is asked.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import store
from .errors import IndexCorruptError, InvalidArgumentError, NoFacesError
from .faces.current import CurrentPeople
from .filters import Filter
from .hits import HitFace
from .images.exif import iso_taken
from .layout import PHOTO_COLUMNS, SAMPLE_COLUMNS, TEXT_COLUMNS, VIDEO_COLUMNS, Manifest, display_path

# Masks of recent filters, per opened index (a filter is evaluated over whole columns).
MASK_CACHE_SIZE = 8


@dataclass(frozen=True)
class SkippedFile:
    """A file the indexer found but could not decode."""

    path: str
    reason: str


class Rows:
    """Metadata of a generation's images, by id.

    Columns and filter masks are read once and kept; the Parquet readers are used one read at a
    time, so one instance serves many threads.

    Args:
        manifest: the generation's manifest (its parts, count and dim).
        parts: its Parquet parts, opened with :func:`retrieval.store.open_parts`.
        path_tables: each part's path side file (None for a part without one).
        skipped: its skip list, opened with :func:`retrieval.store.open_parquet`.
        people: its people (for filters by person and the faces of hits); None: no faces side.
    """

    def __init__(
        self,
        manifest: Manifest,
        parts: Sequence[pq.ParquetFile],
        path_tables: Sequence[store.PathTable | None],
        skipped: pq.ParquetFile,
        people: CurrentPeople | None = None,
    ) -> None:
        self.manifest = manifest
        self._people = people
        self.parts = list(parts)
        self._path_tables = list(path_tables)
        self._first_ids = [ref.first_id for ref in manifest.parts]
        self._skipped = skipped
        self._paths: list[str] | None = None
        self._columns: dict[str, pa.ChunkedArray] = {}
        self._masks: OrderedDict[Filter, np.ndarray] = OrderedDict()
        self._lock = threading.RLock()
        self._has_samples: bool | None = None
        self._has_videos: bool | None = None

    @classmethod
    def open(cls, directory: Path, manifest: Manifest, parts: Sequence[pq.ParquetFile], skipped: pq.ParquetFile) -> Rows:
        """The rows of ``parts``, with the path side files of ``directory`` mapped.

        Raises:
            IndexCorruptError: a path file is missing or damaged.
        """
        fix = store.rebuild_hint(directory, manifest)
        paths = [store.open_paths(directory, ref, fix) for ref in manifest.parts]
        return cls(manifest, parts, paths, skipped, CurrentPeople(directory, manifest))

    @property
    def count(self) -> int:
        return self.manifest.count

    @property
    def dim(self) -> int:
        return self.manifest.dim

    def column(self, name: str) -> pa.ChunkedArray:
        """One whole column in id order (read once, then kept). A photo or text column
        (:data:`~retrieval.layout.PHOTO_COLUMNS`, :data:`~retrieval.layout.TEXT_COLUMNS`, and
        ``caption``) that a part predates reads as nulls there."""
        with self._lock:
            if name not in self._columns:
                if name in _PHOTO_TYPES:
                    self._columns[name] = _optional_column(self.parts, name, _PHOTO_TYPES[name])
                else:
                    self._columns[name] = store.read_column(self.parts, name)
            return self._columns[name]

    def photo_meta(self, ids: Sequence[int] | np.ndarray) -> list[dict[str, Any]]:
        """``taken`` (ISO 8601), ``camera`` and ``gps`` (``[lat, lon]``) of ``ids`` from the
        photo columns, read once and kept; None where the photo (or an older index) has none."""
        wanted = id_array(ids, self.count)
        if not len(wanted):
            return []
        indices = pa.array(wanted)
        cols = {name: self.column(name).take(indices).to_pylist() for name in ("taken_offset", "camera", "gps_lat", "gps_lon")}
        cols["taken"] = self.column("taken").cast(pa.int64()).take(indices).to_pylist()
        out = []
        for j in range(len(wanted)):
            taken = cols["taken"][j]
            lat, lon = cols["gps_lat"][j], cols["gps_lon"][j]
            out.append({
                "taken": iso_taken(taken, cols["taken_offset"][j]),
                "camera": cols["camera"][j],
                "gps": [lat, lon] if lat is not None and lon is not None else None,
            })
        return out

    def sample_meta(self, ids: Sequence[int] | np.ndarray) -> list[dict[str, Any]]:
        """``caption`` and ``url`` of ``ids`` (what came with an image from a WebDataset shard),
        None where the image (or an older index) has none."""
        wanted = id_array(ids, self.count)
        if not self.has_samples:
            return [{"caption": None, "url": None} for _ in range(len(wanted))]
        # Only the row groups of these ids: a caption column is too large to keep whole.
        return self.rows(wanted, columns=("caption", "url"))

    @property
    def has_samples(self) -> bool:
        """Whether any row came from a shard (its ``shard`` is set), from the parts' statistics:
        a folder's index, or one that predates the shard columns, reads no caption."""
        if self._has_samples is None:
            self._has_samples = any(_has_values(pf, "shard") for pf in self.parts)
        return self._has_samples

    @property
    def has_videos(self) -> bool:
        """Whether any row is a video's frame (its ``media`` is set), from the parts' statistics."""
        if self._has_videos is None:
            self._has_videos = any(_has_values(pf, "media") for pf in self.parts)
        return self._has_videos

    def taken_us(self) -> np.ndarray:
        """``taken`` of every image as int64 microseconds, with the smallest int64 where a photo
        has none (so a newest-first order puts undated images last)."""
        col = self.column("taken").cast(pa.int64())
        return np.asarray(pc.fill_null(col, np.iinfo(np.int64).min).to_numpy(), dtype=np.int64)

    def mask(self, where: Filter) -> np.ndarray:
        """Boolean mask over ids of the images passing ``where`` (recent masks are cached; the
        people of ``where.person`` as the user's edits stand now).

        Raises:
            InvalidArgumentError: ``where`` is not a :class:`~retrieval.filters.Filter`.
            NoFacesError: ``where`` names people, and the index has no faces or not them.
        """
        if not isinstance(where, Filter):
            raise InvalidArgumentError(f"where must be a retrieval.filters.Filter, got {type(where).__name__}")
        if where.person:
            if self._people is None:
                raise NoFacesError("this index holds no faces: build it with `clipsearch index ... --faces`")
            return self._people.mask(where.person, where.only_people) & self.mask(where.metadata_only)
        with self._lock:
            mask = self._masks.get(where)
            if mask is None:
                mask = self._masks[where] = where.mask(self.column, self.count)
                if len(self._masks) > MASK_CACHE_SIZE:
                    self._masks.popitem(last=False)
            else:
                self._masks.move_to_end(where)
            return mask

    def allowed(self, where: Filter | None) -> np.ndarray | None:
        """The mask of an active filter, None when every image passes."""
        return self.mask(where) if where is not None and where.active else None

    @property
    def people(self) -> CurrentPeople | None:
        """The people of this generation as the user's edits stand now (None: opened without a directory)."""
        return self._people

    def faces_in(self, ids: Sequence[int] | np.ndarray) -> list[tuple[HitFace, ...]] | None:
        """The faces of each image of ``ids`` with their people as the edits stand now (hidden
        people and faces of nobody without a person); None in an index without faces."""
        found = self._people.in_images(ids) if self._people is not None else None
        if found is None or self._people is None:
            return None
        edits = self._people.people().edits
        return [
            tuple(HitFace(f.box, None if f.person < 0 or f.person in edits.hidden else f.person,
                          None if f.person in edits.hidden else edits.names.get(f.person)) for f in faces)
            for faces in found
        ]

    def paths_of(self, ids: Sequence[int] | np.ndarray) -> list[str]:
        """Stored paths of ``ids``, reading only those rows (memory-mapped path files)."""
        out: list[str] = []
        missing: list[int] = []
        for i in (int(x) for x in ids):
            if not 0 <= i < self.count:
                raise InvalidArgumentError(f"ids must be in 0..{self.count - 1}")
            part = bisect.bisect_right(self._first_ids, i) - 1
            table = self._path_tables[part]
            if table is None:
                missing.append(len(out))
                out.append("")
            else:
                out.append(table[i - self._first_ids[part]])
        if missing:
            # A version-1 index has no path files: read the rows' row groups instead.
            rows = self.rows([int(ids[j]) for j in missing], columns=("path",))
            for j, row in zip(missing, rows, strict=True):
                out[j] = row["path"]
        return out

    def sizes_of(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """``(n, 2)`` int32 recorded ``(width, height)`` of ``ids``, from the two columns read
        once and kept (8 bytes per image): a result page's sizes without a Parquet read each."""
        wanted = id_array(ids, self.count)
        if not len(wanted):
            return np.empty((0, 2), np.int32)
        indices = pa.array(wanted)
        return np.stack(
            [self.column(name).take(indices).to_numpy().astype(np.int32, copy=False) for name in ("width", "height")], axis=1
        )

    def paths(self) -> list[str]:
        """Every stored path in id order (read once, then cached)."""
        if self._paths is None:
            self._paths = store.read_column(self.parts, "path").to_pylist()
        return self._paths

    def rows(self, ids: Sequence[int] | np.ndarray, columns: Sequence[str] = ("id", "path")) -> list[dict[str, Any]]:
        """Metadata of the given ids (any order; returned in the same order).

        Reads only the row groups that hold the ids, and only the asked columns (a photo column
        that a part predates is None there).
        """
        wanted = id_array(ids, self.count)
        asked = list(dict.fromkeys(["id", *columns]))
        out: dict[int, dict[str, Any]] = {}
        for ref, pf in zip(self.manifest.parts, self.parts, strict=True):
            local = np.unique(wanted[(wanted >= ref.first_id) & (wanted < ref.first_id + ref.rows)] - ref.first_id)
            if not len(local):
                continue
            names = set(pf.schema_arrow.names)
            cols = [c for c in asked if c in names or c not in _PHOTO_TYPES]
            starts = np.cumsum([0] + [pf.metadata.row_group(g).num_rows for g in range(pf.metadata.num_row_groups)])
            groups = np.searchsorted(starts, local, side="right") - 1
            for g in np.unique(groups):
                # A ParquetFile's reader is not documented as thread-safe: one read at a time.
                with self._lock, store.reading(pf):
                    table = pf.read_row_group(int(g), columns=cols)
                for row in table.take(pa.array(local[groups == g] - starts[g])).to_pylist():
                    # The stored id plus the part's id_offset (format 4; 0 for other parts).
                    row["id"] = int(row["id"]) + ref.id_offset
                    out[row["id"]] = {k: row.get(k) for k in columns}
        return [out[int(i)] for i in wanted]

    def vectors_of(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """The stored embeddings of ``ids`` from their rows, ``(n, dim)`` float32, in the given order."""
        rows = self.rows(ids, columns=("embedding",))
        if not rows:
            return np.empty((0, self.dim), np.float32)
        return np.asarray([r["embedding"] for r in rows], dtype=np.float32).reshape(len(rows), self.dim)

    def embeddings(self) -> np.ndarray:
        """All stored embeddings as an ``(count, dim)`` float32 array, in id order."""
        if not self.parts:
            return np.empty((0, self.dim), np.float32)
        return store.vectors_of(store.read_column(self.parts, "embedding"), self.dim)

    def iter_embeddings(self, batch_rows: int = 65536) -> Iterator[tuple[int, np.ndarray]]:
        """Stream the stored embeddings as ``(first_id, (n, dim) float32)`` chunks, in id order."""
        return store.iter_vectors(self.parts, self.dim, batch_rows=batch_rows)

    def iter_vectors(self, where: Filter | None = None, batch_rows: int = 65536) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Stream ``(ids, vectors)`` of the images passing ``where`` (all without it), in id
        order, at most ``batch_rows`` stored rows read at a time; batches with no image passing
        are skipped."""
        mask = self.allowed(where)
        for first, vectors in self.iter_embeddings(batch_rows=batch_rows):
            ids = np.arange(first, first + len(vectors))
            if mask is not None:
                keep = mask[first : first + len(vectors)]
                ids, vectors = ids[keep], vectors[keep]
            if len(ids):
                yield ids, vectors

    def skipped(self) -> list[SkippedFile]:
        """Files that were found but could not be decoded, with the reason."""
        return [SkippedFile(display_path(rec.path), rec.reason) for rec in store.read_skipped(self._skipped)]


# The photo, text, shard and video columns' types, by name: readers fill a part's missing one
# with nulls of its type (the shard columns, ``caption`` among them, are null for a folder's
# images; the video columns for images).
_PHOTO_TYPES = {f.name: f.type for f in (*PHOTO_COLUMNS, *TEXT_COLUMNS, *SAMPLE_COLUMNS, *VIDEO_COLUMNS)}


def _has_values(pf: pq.ParquetFile, name: str) -> bool:
    # True when some row group of ``pf`` holds a non-null ``name`` (or says nothing of its nulls).
    if name not in pf.schema_arrow.names:
        return False
    col = pf.schema_arrow.get_field_index(name)
    for g in range(pf.metadata.num_row_groups):
        group = pf.metadata.row_group(g)
        stats = group.column(col).statistics
        if stats is None or not stats.has_null_count or stats.null_count < group.num_rows:
            return True
    return False


def _optional_column(parts: Sequence[pq.ParquetFile], name: str, kind: pa.DataType) -> pa.ChunkedArray:
    chunks: list[pa.Array] = []
    for pf in parts:
        if name in pf.schema_arrow.names:
            chunks.extend(store.read_column([pf], name).cast(kind).chunks)
        else:
            chunks.append(pa.nulls(pf.metadata.num_rows, kind))
    return pa.chunked_array(chunks, type=kind)


def source_path(directory: Path, manifest: Manifest, id: int, raw: bytes) -> Path:
    """The original file of image ``id`` whose stored relative path is ``raw``: the indexed
    folder (``manifest.source_root``) joined with it, byte for byte.

    Raises:
        IndexCorruptError: the index records no folder, or a path that leaves it.
    """
    relative = os.fsdecode(raw)
    parts = relative.split("/")
    root = manifest.source_root
    if not root or not os.path.isabs(root) or relative.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise IndexCorruptError(
            str(directory / "manifest.json"),
            f"image {id} is recorded as {display_path(raw)!r} under {root!r}, not a file inside the indexed folder",
            store.rebuild_hint(directory, manifest),
        )
    return Path(root, *parts)


def id_array(ids: Sequence[int] | np.ndarray, count: int) -> np.ndarray:
    """``ids`` as an int64 array.

    Raises:
        InvalidArgumentError: an id outside ``0..count-1``.
    """
    wanted = np.asarray(ids, dtype=np.int64)
    if len(wanted) and (wanted.min() < 0 or wanted.max() >= count):
        raise InvalidArgumentError(f"ids must be in 0..{count - 1}")
    return wanted


def check_id(id: object, count: int) -> int:
    """``id`` as an int.

    Raises:
        InvalidArgumentError: not an id of an index of ``count`` images.
    """
    if not isinstance(id, (int, np.integer)) or isinstance(id, bool) or not 0 <= int(id) < count:
        ids = f"ids are 0..{count - 1}" if count else "the index is empty"
        raise InvalidArgumentError(f"no image with id {id!r} ({ids})")
    return int(id)


__all__ = ["MASK_CACHE_SIZE", "Rows", "SkippedFile", "check_id", "id_array", "source_path"]
