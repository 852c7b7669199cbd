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

    max_distance: float = 0.5
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
        known_vecs = arr[known]
        known_sq = np.einsum("ij,ij->i", known_vecs, known_vecs)
        for start in range(0, waiting.size, _BLOCK):
            block = waiting[start : start + _BLOCK]
            vecs = arr[block]
            dist2 = np.einsum("ij,ij->i", vecs, vecs)[:, None] + known_sq[None, :] - 2.0 * (vecs @ known_vecs.T)
            nearest = dist2.argmin(axis=1)
            close = dist2[np.arange(len(block)), nearest] <= options.max_distance**2
            labels[block[close]] = labels[known[nearest[close]]]
    still = np.flatnonzero(labels == NOBODY)
    if still.size:
        fresh = _dbscan(arr[still], options)
        base = max(int(labels.max()) + 1, first_new)  # 0 where nobody has a person yet
        founded = fresh != NOBODY
        labels[still[founded]] = fresh[founded] + base
    return labels
