"""Face descriptors grouped into people: all at once, or new faces against the people already found.

Both follow the density rule Immich's users know (a DBSCAN-like pass): a face with at least
``min_faces`` faces (itself included) within ``max_distance`` founds or extends a person, a face
within ``max_distance`` of a person's face joins that person, and the rest belong to nobody yet
(they wait for more photos). Distances are Euclidean between dlib's 128-d descriptors.

- :func:`cluster_all`: the full re-cluster, scikit-learn's ``DBSCAN`` over every face.
- :func:`assign_new`: the incremental step after an update. Faces that already have a person
  keep it (so nothing a user named is renamed or split behind their back); each face without
  one joins the person of its nearest face that has one, if within ``max_distance``; those
  still without a person are clustered among themselves, and each group that forms is a new
  person, numbered after the largest existing one.
- :func:`regroup`: the full re-cluster with the user's word kept: :func:`cluster_all` over every
  face, each group mapped onto the person it overlaps most (so people keep their numbers, and
  with them their names), the faces of the people the user vouched for left where they are.

Person numbers are labels, not names: names and the user's edits live beside them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from retrieval.checks import is_positive_int
from retrieval.errors import InvalidArgumentError

NOBODY = -1
# Faces compared per block in the nearest-person search (a block of distances is this many rows
# by every labelled face).
_BLOCK = 1024


@dataclass(frozen=True)
class ClusterOptions:
    """How close two faces must be to be one person, and how many make a person."""

    max_distance: float = 0.4
    """Largest Euclidean distance between descriptors of one person (dlib's own cut is 0.6;
    lower merges fewer look-alikes and splits more views of one person)."""
    min_faces: int = 3
    """Faces within ``max_distance`` of a face (itself included) needed to found a person."""

    def __post_init__(self) -> None:
        d = self.max_distance
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0.0 < d < 2.0:
            raise InvalidArgumentError(f"max_distance must be a number between 0 and 2, got {d!r}")
        if not is_positive_int(self.min_faces):
            raise InvalidArgumentError(f"min_faces must be a positive integer, got {self.min_faces!r}")


def _descriptors(descriptors: np.ndarray) -> np.ndarray:
    arr = np.asarray(descriptors, dtype=np.float32)
    if arr.ndim != 2 or (arr.size and not np.isfinite(arr).all()):
        raise InvalidArgumentError(f"face descriptors must be a finite (n, dim) array, got shape {arr.shape}")
    return arr


def _dbscan(descriptors: np.ndarray, options: ClusterOptions) -> np.ndarray:
    if len(descriptors) == 0:
        return np.zeros(0, dtype=np.int64)
    from sklearn.cluster import DBSCAN

    labels = DBSCAN(eps=options.max_distance, min_samples=options.min_faces).fit_predict(descriptors)
    return _numbered_by_size(np.asarray(labels, dtype=np.int64))


def _numbered_by_size(labels: np.ndarray) -> np.ndarray:
    """The same groups, numbered 0, 1, ... from the largest (ties: the first face first)."""
    found = labels[labels != NOBODY]
    if found.size == 0:
        return labels
    groups, first, counts = np.unique(found, return_index=True, return_counts=True)
    order = groups[np.lexsort((first, -counts))]
    number = {int(g): i for i, g in enumerate(order)}
    return np.array([number.get(int(x), NOBODY) for x in labels], dtype=np.int64)


def _nearest(arr: np.ndarray, rows: np.ndarray, among: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each face of ``rows``, the position in ``among`` of its nearest face there and the
    squared distance to it (blocks of rows, so memory stays bounded)."""
    vecs_among = arr[among]
    sq_among = np.einsum("ij,ij->i", vecs_among, vecs_among)
    nearest = np.zeros(len(rows), dtype=np.int64)
    dist2 = np.zeros(len(rows), dtype=np.float32)
    for start in range(0, len(rows), _BLOCK):
        vecs = arr[rows[start : start + _BLOCK]]
        block = np.einsum("ij,ij->i", vecs, vecs)[:, None] + sq_among[None, :] - 2.0 * (vecs @ vecs_among.T)
        nearest[start : start + len(vecs)] = block.argmin(axis=1)
        dist2[start : start + len(vecs)] = block[np.arange(len(vecs)), nearest[start : start + len(vecs)]]
    return nearest, dist2


def cluster_all(descriptors: np.ndarray, options: ClusterOptions | None = None) -> np.ndarray:
    """A person number per face (``-1``: nobody), the largest person numbered 0."""
    return _dbscan(_descriptors(descriptors), options or ClusterOptions())


def assign_new(
    descriptors: np.ndarray, people: np.ndarray, options: ClusterOptions | None = None, first_new: int = 0,
) -> np.ndarray:
    """``people`` with its ``-1`` entries filled where a face joins a person or founds one.

    Args:
        descriptors: ``(n, dim)`` descriptors of every face of the index.
        people: ``(n,)`` person numbers; ``-1`` for faces without a person (new faces and the
            ones still waiting). Numbers already there never change.
        options: the distance and density rule.
        first_new: the lowest number a new person may get (numbers below it may be taken by
            people the user made by hand).
    """
    options = options or ClusterOptions()
    arr = _descriptors(descriptors)
    labels = np.asarray(people, dtype=np.int64).copy()
    if labels.shape != (len(arr),):
        raise InvalidArgumentError(f"people must hold one number per face ({len(arr)}), got shape {labels.shape}")
    if (labels < NOBODY).any():
        raise InvalidArgumentError("person numbers are -1 (nobody) or at least 0")
    waiting = np.flatnonzero(labels == NOBODY)
    known = np.flatnonzero(labels != NOBODY)
    if waiting.size and known.size:
        nearest, dist2 = _nearest(arr, waiting, known)
        close = dist2 <= options.max_distance**2
        labels[waiting[close]] = labels[known[nearest[close]]]
    still = np.flatnonzero(labels == NOBODY)
    if still.size:
        fresh = _dbscan(arr[still], options)
        base = max(int(labels.max()) + 1, first_new)  # 0 where nobody has a person yet
        founded = fresh != NOBODY
        labels[still[founded]] = fresh[founded] + base
    return labels


def regroup(
    descriptors: np.ndarray, people: np.ndarray, kept: np.ndarray, options: ClusterOptions | None = None, first_new: int = 0,
) -> np.ndarray:
    """Every face grouped again from nothing, but for the faces in ``kept``.

    The groups :func:`cluster_all` finds over all faces (kept ones included, so a new face next
    to a kept person's faces is dense enough to join them) are matched one to one with the
    people of ``people`` they share most faces with, the largest overlap first (ties: the lower
    person number): a matched group takes that person's number, an unmatched one a new number
    from ``first_new`` on (the largest group first). Faces in no group belong to nobody. In a
    group holding kept faces of more than one person, each other face goes to the person of its
    nearest kept face.

    Args:
        descriptors: ``(n, dim)`` descriptors of every face.
        people: ``(n,)`` each face's person before (``-1``: nobody).
        kept: ``(n,)`` booleans, the faces that keep their person whatever the groups say.
        options: the distance and density rule.
        first_new: the lowest number a new person may get.
    """
    arr = _descriptors(descriptors)
    before = np.asarray(people, dtype=np.int64)
    keep = np.asarray(kept, dtype=bool)
    if before.shape != (len(arr),) or keep.shape != (len(arr),):
        raise InvalidArgumentError(f"people and kept must hold one entry per face ({len(arr)}), got {before.shape} and {keep.shape}")
    if (before < NOBODY).any():
        raise InvalidArgumentError("person numbers are -1 (nobody) or at least 0")
    groups = cluster_all(arr, options)
    both = (groups != NOBODY) & (before != NOBODY)
    pairs, overlap = np.unique(np.stack([groups[both], before[both]], axis=1), axis=0, return_counts=True) \
        if both.any() else (np.zeros((0, 2), np.int64), np.zeros(0, np.int64))
    number: dict[int, int] = {}
    taken: set[int] = set()
    for i in np.lexsort((pairs[:, 1], -overlap)) if len(pairs) else []:
        group, person = int(pairs[i, 0]), int(pairs[i, 1])
        if group not in number and person not in taken:
            number[group] = person
            taken.add(person)
    fresh = max(first_new, int(before.max()) + 1 if len(before) else 0)
    for group in np.unique(groups[groups != NOBODY]):  # numbered from the largest (cluster_all)
        if int(group) not in number:
            number[int(group)] = fresh
            fresh += 1
    out = np.array([number.get(int(g), NOBODY) for g in groups], dtype=np.int64)
    out[keep] = before[keep]
    # A group holding the kept faces of several people (look-alikes a looser threshold joins):
    # its other faces go to the person of their nearest kept face, not all to the one it
    # overlaps most, as a new photo would.
    for group in np.unique(groups[keep & (groups != NOBODY)]):
        anchors = np.flatnonzero((groups == group) & keep & (before != NOBODY))
        free = np.flatnonzero((groups == group) & ~keep)
        if free.size and len(np.unique(before[anchors])) > 1:
            out[free] = before[anchors[_nearest(arr, free, anchors)[0]]]
    return out
