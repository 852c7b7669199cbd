"""``clipsearch people recluster``: every face of an index grouped into people again, on request.

:func:`recluster` reads the current generation's faces side, groups every face from nothing with
:func:`indexer.faces.grouping.regroup` (new ``max_distance`` / ``min_faces`` if given) and
commits a new generation through :class:`indexer.commit.GenerationWriter`, the path a build
commits by: under the index lock, staged then published, so a crash leaves the old generation or
the new one. Only the faces side is written again; the rows, vectors, FAISS and keyword files
are linked from the last generation, byte for byte. The settings used are recorded with the
faces, so later ``index`` runs group new faces with them.

The user's word (``people.json``, :mod:`retrieval.faces.edits`) stays final: the faces of people
the user named, hid, merged into, split off or moved faces to keep their person, faces moved by
hand stay moved, and every other group keeps the number (and so the name) of the person it
overlaps most. The people file is held locked meanwhile, so no edit slips in between.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from retrieval import store
from retrieval.errors import IndexFormatError, NoFacesError
from retrieval.faces.edits import PeopleEdits, editing, face_keys
from retrieval.layout import FACES_SCHEMA, FacesRef, Manifest, read_manifest

from ..commit import GenerationWriter, remove_stale
from ..lock import IndexLock
from ..reindex import recorded_meta
from ..sides.registry import side_writers
from .grouping import NOBODY, ClusterOptions, regroup
from .side import NAME as FACES
from .side import FaceTables, FaceWriter, PreviousFaces


@dataclass(frozen=True)
class ReclusterReport:
    """What ``clipsearch people recluster --json`` prints.

    ``kept`` faces stayed with the person the user vouched for; ``people_before`` and ``people``
    count the people (hidden ones included) before and after; ``new_people`` the people with a
    number no person had before; ``options`` the grouping settings now recorded.
    """

    index_dir: str
    faces: int
    kept: int
    people_before: int
    people: int
    new_people: int
    nobody: int
    options: dict[str, Any]
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def vouched_for(edits: PeopleEdits) -> set[int]:
    """The people the user has said something about: named, hidden, merged into, or given faces
    by hand (a split, a move). Their faces are theirs until the user says otherwise."""
    people = {*edits.names, *edits.hidden, *edits.merged.values(), *(p for p in edits.faces.values() if p != NOBODY)}
    return {edits.resolve(p) for p in people}


def _first_new(edits: PeopleEdits, stored: np.ndarray) -> int:
    """A number above every person the grouping or the user ever used: a new group never takes
    the number of a person the user named, merged away or made by hand."""
    used = [*edits.names, *edits.hidden, *edits.merged, *edits.merged.values(), *edits.faces.values(), edits.next_person - 1]
    if len(stored):
        used.append(int(stored.max()))
    return max(used, default=-1) + 1


def _options(recorded: Mapping[str, Any], max_distance: float | None, min_faces: int | None) -> tuple[dict[str, Any], ClusterOptions]:
    """The recorded face settings with the new grouping ones; checked."""
    current = ClusterOptions(**{k: recorded[k] for k in ("max_distance", "min_faces") if k in recorded})
    cluster = ClusterOptions(
        max_distance=current.max_distance if max_distance is None else max_distance,
        min_faces=current.min_faces if min_faces is None else min_faces,
    )
    return {**dict(recorded), **asdict(cluster)}, cluster


def _faces_of(out: Path, base: Manifest | None = None) -> FacesRef:
    """The faces side of the index at ``out`` (its manifest ``base`` if read already)."""
    faces = (base or read_manifest(out)).faces
    if faces is None:
        raise NoFacesError(f"{out} holds no faces: run `clipsearch index PHOTOS_DIR {out} --faces` to find them")
    return faces


def _people(labels: np.ndarray) -> set[int]:
    return {int(p) for p in np.unique(labels[labels != NOBODY])}


def recluster(
    index_dir: str | os.PathLike[str], *, max_distance: float | None = None, min_faces: int | None = None,
) -> ReclusterReport:
    """Group every face of the index at ``index_dir`` into people again, keeping the user's edits.

    Args:
        index_dir: an index built with ``--faces``.
        max_distance: the largest distance between two faces of one person (None: the recorded one).
        min_faces: faces within ``max_distance`` needed to found a person (None: the recorded one).

    Raises:
        NotAnIndexError, IndexFormatError: no readable index there, or its build was interrupted.
        NoFacesError: the index was built without ``--faces``.
        InvalidArgumentError: a bad ``max_distance`` or ``min_faces``.
        IndexLockedError: another process is writing the index.
    """
    start = time.perf_counter()
    out = Path(index_dir)
    _options(_faces_of(out).options, max_distance, min_faces)  # bad settings fail before the lock
    with IndexLock(out), editing(out) as box:
        base = read_manifest(out)
        ref = _faces_of(out, base)
        if not base.complete:
            raise IndexFormatError(
                f"{out} holds an interrupted build; finish it first by running the same `clipsearch index` command again"
            )
        store.check_files(out, base)
        options, cluster = _options(ref.options, max_distance, min_faces)
        remove_stale(out, keep=base.generation)
        edits = box[0]
        previous = PreviousFaces(ref, out / ref.path, out / ref.read_path, ref.rows).tables()
        faces = previous.faces
        stored = faces.column("person").to_numpy()
        keys = face_keys(faces)
        before = edits.apply(stored, keys)
        kept = np.isin(before, list(vouched_for(edits))) | np.array([k in edits.faces for k in keys], dtype=bool)
        descriptors = np.asarray(faces.column("descriptor").combine_chunks().flatten(), dtype=np.float32).reshape(faces.num_rows, -1) \
            if faces.num_rows else np.zeros((0, 128), np.float32)
        after = regroup(descriptors, before, kept, cluster, first_new=_first_new(edits, stored))
        regrouped = faces.set_column(faces.schema.get_field_index("person"), "person", pa.array(after, pa.int64())).cast(FACES_SCHEMA)
        meta = recorded_meta(base)
        writer = GenerationWriter(out, dataclasses.replace(meta, sides={**meta.sides, FACES: options}), base, side_writers)
        writer.record_skips(store.read_skipped(out / base.skipped_file))
        writer.side(FACES, FaceWriter).set_tables(writer, FaceTables(regrouped, previous.read, options))
        writer.commit(complete=True)
    people_before, people_after = _people(before), _people(after)
    return ReclusterReport(
        index_dir=str(out), faces=len(after), kept=int(kept.sum()), people_before=len(people_before), people=len(people_after),
        new_people=len(people_after - people_before), nobody=int((after == NOBODY).sum()),
        options={k: options[k] for k in ("max_distance", "min_faces")}, seconds=round(time.perf_counter() - start, 3),
    )


__all__ = ["ReclusterReport", "recluster", "vouched_for"]
