"""``index --faces``: the faces of every row not read yet, found after the embedding stage.

The detector reads each image again from the photos (or the shards), and for a video's row the
frame at its time, decoded at the video's own resolution (:func:`indexer.video.frame_at`), so a
person's page lists the moments of videos they appear in. A decode costs little next to
detection, and reading after the embedding means one pass serves a new build, an update and an
index embedded without ``--faces`` alike (no image is embedded again). It runs in worker
processes of this machine (dlib holds the interpreter while it works), for any engine.

Every ``chunk`` images the faces found join the side (:mod:`indexer.faces.side`) and a generation
is committed; a crash or Ctrl-C loses only the chunk in flight, and the next run reads the rows
still unread. The new faces join or found people (:func:`indexer.faces.grouping.assign_new`) once,
when the stage ends: until then the generations committed show them as nobody's. The stage is a
side stage of the build (:mod:`indexer.sides.face_stage`).
"""

from __future__ import annotations

import io
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
from PIL import Image

from retrieval import store
from retrieval.faces.edits import PeopleEdits, face_keys, load_edits
from retrieval.faults import crash_point
from retrieval.images import decode_image
from retrieval.images.decode import DEFAULT_MAX_PIXELS
from retrieval.layout import FACES_READ_SCHEMA, FACES_SCHEMA
from retrieval.shards import SampleMeta

from ..commit import GenerationWriter
from ..discover import ImageFile
from ..shard_reader import ShardReader
from .detect import Face, FaceFinder, FaceOptions
from .grouping import NOBODY, ClusterOptions, assign_new
from .side import NAME, FaceTables, FaceWriter, face_options

# Most images read between two commits (a few minutes of detection on one core at most); a
# build's --commit-every lowers it.
CHUNK = 256

_S = TypeVar("_S", FaceOptions, ClusterOptions)


def _settings(kind: type[_S], options: Mapping[str, Any]) -> _S:
    """The :class:`FaceOptions` or :class:`ClusterOptions` part of recorded ``options``."""
    return kind(**{f.name: options[f.name] for f in fields(kind)})


@dataclass
class FaceStats:
    """What the faces stage did in one run."""

    read: int = 0
    faces: int = 0
    notes: int = 0
    seconds: float = 0.0


# -- the worker side ---------------------------------------------------------------------------

_worker: tuple[FaceFinder, bytes, ShardReader | None, int] | None = None


def _init_worker(options: FaceOptions, root: bytes, shards: ShardReader | None, max_pixels: int,
                 lifeline: tuple[int, int] | None) -> None:
    global _worker
    if lifeline is not None:
        read_end, write_end = lifeline
        os.close(write_end)  # the write end left open must be the build's alone
        threading.Thread(target=_leave_with_build, args=(read_end,), name="clipsearch-faces-lifeline", daemon=True).start()
    _worker = (FaceFinder(options), root, shards, max_pixels)


def _leave_with_build(read_end: int) -> None:
    # A worker waiting on the pool's queue never sees its build killed (SIGKILL, the OOM killer):
    # forked, it holds the queue's write end itself, so no end of file comes there, and it would
    # live on with dlib's models loaded. Only the build holds the lifeline's write end, so its
    # end of file says the build is gone (the pool's own shutdown stops the workers before it).
    while os.read(read_end, 1):
        pass
    os._exit(1)


def _find(job: tuple[ImageFile, float | None]) -> tuple[list[Face], str | None]:
    """The faces of one file (a video's: of its frame at the row's time), or a note saying why it
    could not be read."""
    assert _worker is not None
    finder, root, shards, max_pixels = _worker
    file, at = job
    try:
        if at is not None:
            return finder.find(_frame(file, at, shards if shards is not None else Path(os.fsdecode(root)))), None
        if shards is not None:
            data = shards.read(file)
        else:
            with open(os.path.join(root, file.rel), "rb") as fh:
                data = fh.read()
        image = decode_image(io.BytesIO(data), max_pixels=max_pixels, name=file.rel.decode("utf-8", "backslashreplace"),
                             draft=False).image
        return finder.find(image), None
    except Exception as exc:  # noqa: BLE001 - one unreadable file is a note, never a failed build
        return [], f"faces not read: {type(exc).__name__}: {exc}"[:500]


def _frame(file: ImageFile, at: float, images: Path | ShardReader) -> Image.Image:
    # Imported here: PyAV (the video extra) is needed only by an index with videos.
    from ..video import NATIVE_SIDE, frame_at
    from ..video.source import name_of, opened

    with opened(file, images) as source:
        return frame_at(source, at, max_side=NATIVE_SIDE, name=name_of(file))


# -- the driver side ---------------------------------------------------------------------------


def _unread(writer: GenerationWriter, read_ids: np.ndarray) -> tuple[np.ndarray, pa.Table]:
    """Ids of the committed rows not read yet, and the columns that find their files."""
    cols = ["path_bytes", "content_hash", "size", "mtime_ns", "shard", "key", "member_offset", "frame_time"]
    kinds = {"member_offset": pa.int64(), "frame_time": pa.float64()}
    tables = []
    for _, path in writer.parts:
        pf = store.open_parquet(path)
        names = pf.schema_arrow.names
        with store.reading(pf):
            table = pf.read(columns=[c for c in cols if c in names])
        for c in cols:
            if c not in table.column_names:
                table = table.append_column(c, pa.nulls(table.num_rows, kinds.get(c, pa.string())))
        tables.append(table.select(cols))
    rows = pa.concat_tables(tables) if tables else pa.table({c: pa.array([]) for c in cols})
    unread = np.ones(rows.num_rows, dtype=bool)
    unread[read_ids[read_ids < rows.num_rows]] = False
    return np.flatnonzero(unread), rows


def _file(rows: pa.Table, i: int) -> tuple[ImageFile, float | None]:
    """The file of row ``i``, and the time of its frame for a video's row (None: an image)."""
    row = {c: rows.column(c)[i].as_py() for c in ("path_bytes", "size", "mtime_ns", "shard", "key", "member_offset", "frame_time")}
    sample = SampleMeta(row["shard"], row["key"] or "", int(row["member_offset"] or 0)) if row["shard"] is not None else None
    return ImageFile(row["path_bytes"], int(row["size"]), int(row["mtime_ns"]), sample), row["frame_time"]


def _tables_of(ids: list[int], rows: pa.Table, found: list[tuple[list[Face], str | None]]) -> tuple[pa.Table, pa.Table]:
    face_rows: dict[str, list[Any]] = {name: [] for name in FACES_SCHEMA.names}
    for i, (faces, _) in zip(ids, found, strict=True):
        for n, face in enumerate(faces):
            left, top, right, bottom = face.box
            values = (i, rows.column("path_bytes")[i].as_py(), rows.column("content_hash")[i].as_py(), n, left, top, right,
                      bottom, face.score, face.landmarks.reshape(-1).tolist(), face.descriptor.tolist(), NOBODY)
            for name, value in zip(FACES_SCHEMA.names, values, strict=True):
                face_rows[name].append(value)
    read = pa.table({
        "id": pa.array(ids, pa.int64()),
        "path_bytes": rows.column("path_bytes").take(pa.array(ids, pa.int64())),
        "content_hash": rows.column("content_hash").take(pa.array(ids, pa.int64())),
        "faces": pa.array([len(f) for f, _ in found], pa.int16()),
        "note": pa.array([note for _, note in found], pa.string()),
    }, schema=FACES_READ_SCHEMA)
    return pa.table(face_rows, schema=FACES_SCHEMA), read


def _with_people(faces: pa.Table, options: Mapping[str, Any], edits: PeopleEdits) -> pa.Table:
    """``faces`` with every face's person: the user's edits first (merges, faces moved by hand),
    then new faces joining or founding people; faces moved to nobody by hand stay there."""
    if faces.num_rows == 0:
        return faces
    keys = face_keys(faces)
    people = edits.apply(faces.column("person").to_numpy(), keys)
    free = np.array([edits.faces.get(k, 0) != NOBODY for k in keys])  # not pinned to nobody
    descriptors = np.asarray(faces.column("descriptor").combine_chunks().flatten(), dtype=np.float32).reshape(faces.num_rows, -1)
    people[free] = assign_new(descriptors[free], people[free], _settings(ClusterOptions, options), first_new=edits.next_person)
    return faces.set_column(faces.schema.get_field_index("person"), "person", pa.array(people, pa.int64())).cast(FACES_SCHEMA)


def read_missing_faces(
    writer: GenerationWriter,
    images: Path | ShardReader,
    *,
    workers: int,
    commit: Callable[[], object],
    chunk: int = CHUNK,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    progress: bool = False,
    stop: Callable[[], bool] | None = None,
) -> FaceStats:
    """Find the faces of every committed row not read yet, committing every ``chunk`` images,
    then group the new faces into people once.

    Args:
        writer: the writer over the index; its ``meta.sides["faces"]`` holds the settings (None: no faces).
        images: the photos folder or the shard reader the rows' paths are relative to.
        workers: detector processes.
        commit: publishes a generation (the build's chunk commit).
        chunk: images read between two commits.
        max_pixels: images with more pixels are noted, not read.
        progress: a progress bar on stderr.
        stop: asked between chunks (watch mode's Ctrl-C); the rest is read by a later run.
    """
    stats = FaceStats()
    options = writer.meta.sides.get(NAME)
    if options is None:
        return stats
    if writer.tail_pending:
        commit()
    side = writer.side(NAME, FaceWriter)
    tables = side.tables(writer)
    todo, rows = _unread(writer, tables.read.column("id").to_numpy())
    if not len(todo):
        return stats
    if progress:
        print(f"clipsearch: finding faces in {len(todo)} images", file=sys.stderr, flush=True)
    root = b"" if isinstance(images, ShardReader) else os.fsencode(images)
    shards = images if isinstance(images, ShardReader) else None
    from tqdm import tqdm

    bar = tqdm(total=len(todo), unit="img", desc="faces", disable=not progress, dynamic_ncols=True)
    start = time.perf_counter()
    # A forked worker inherits the lifeline's two ends; another start method passes no descriptor.
    method = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    lifeline = os.pipe() if method == "fork" else None
    # The platform's default start method, as the decode workers' DataLoader uses: "spawn" would
    # run an API caller's unguarded script again in every worker.
    pool = ProcessPoolExecutor(max(1, workers), initializer=_init_worker,
                               initargs=(_settings(FaceOptions, options), root, shards, max_pixels, lifeline))
    try:
        for at in range(0, len(todo), chunk):
            if stop is not None and stop():
                break
            ids = [int(i) for i in todo[at : at + chunk]]
            found = list(pool.map(_find, [_file(rows, i) for i in ids], chunksize=4))
            new_faces, new_read = _tables_of(ids, rows, found)
            # Committed as nobody's: the faces found are kept if the run stops here, and the
            # people are formed once, below (a resumed run groups them with its own).
            faces = pa.concat_tables([tables.faces, new_faces]).sort_by([("id", "ascending"), ("face", "ascending")])
            read = pa.concat_tables([tables.read, new_read]).sort_by("id")
            tables = FaceTables(faces, read, dict(options))
            side.set_tables(writer, tables)
            stats.read += len(ids)
            stats.faces += new_faces.num_rows
            stats.notes += sum(note is not None for _, note in found)
            bar.update(len(ids))
            crash_point("faces")
            if at + chunk < len(todo):  # the last chunk is the build's own final commit
                commit()
    finally:
        pool.shutdown(cancel_futures=True)
        for end in lifeline or ():
            os.close(end)
        bar.close()
    # Every face without a person (this run's, and those a stopped or killed run committed) joins
    # or founds one, once per run rather than once per chunk.
    side.set_tables(writer, FaceTables(_with_people(tables.faces, options, load_edits(writer.dir)), tables.read, dict(options)))
    stats.seconds = time.perf_counter() - start
    return stats


__all__ = ["CHUNK", "FaceStats", "face_options", "read_missing_faces"]
