"""Near-duplicate groups (``clipsearch duplicates``: :mod:`clipsearch.cli.duplicates`), linked transitively.

Images whose embeddings have cosine >= a threshold, in groups.

Pairs come from a FAISS range search of every (filtered) image against the index, in batches
of stored vectors; candidates are re-scored exactly against the stored float32 vectors, so an
approximate index can only miss pairs (never report a false one). Pairs are linked into
connected components; in each group the image to keep is the one with the most pixels, then the
largest file, then the first path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from . import store
from .errors import InvalidArgumentError
from .index import Hit

if TYPE_CHECKING:
    from .filters import Filter
    from .index import ImageIndex

DEFAULT_THRESHOLD = 0.95
# Stored vectors range-searched per FAISS call.
DEFAULT_BATCH_ROWS = 4096
# An approximate index's scores are off by up to a few hundredths (PQ codes); candidates are
# gathered this far below the threshold and then re-scored exactly.
_APPROX_MARGIN = 0.05
# More candidate pairs than this means a threshold far too low for duplicate finding.
MAX_PAIRS = 50_000_000


@dataclass(frozen=True)
class DuplicateGroup:
    """Images linked by cosine >= threshold: the one to keep (score 1.0) and the others, each
    with its cosine to the kept one, by descending score."""

    keep: Hit
    duplicates: tuple[Hit, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"keep": {"id": self.keep.id, "path": self.keep.path}, "duplicates": [d.to_dict() for d in self.duplicates]}


@dataclass(frozen=True)
class DuplicateReport:
    """What ``clipsearch duplicates --json`` prints (plus ``exact``: False for an approximate index)."""

    threshold: float
    groups: tuple[DuplicateGroup, ...]
    pairs: int
    exact: bool

    @property
    def images_in_groups(self) -> int:
        return sum(1 + len(g.duplicates) for g in self.groups)

    def to_dict(self) -> dict[str, Any]:
        return {
            "threshold": self.threshold,
            "groups": [g.to_dict() for g in self.groups],
            "images_in_groups": self.images_in_groups,
            "groups_count": len(self.groups),
            "pairs": self.pairs,
            "exact": self.exact,
        }


def check_threshold(threshold: float) -> float:
    """A cosine threshold in (0, 1].

    Raises:
        InvalidArgumentError: outside (0, 1] or not a number.
    """
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold) or not 0 < threshold <= 1:
        raise InvalidArgumentError(f"the threshold is a cosine in (0, 1], got {threshold!r}")
    return float(threshold)


def duplicate_pairs(
    index: ImageIndex, threshold: float = DEFAULT_THRESHOLD, where: Filter | None = None, batch_rows: int = DEFAULT_BATCH_ROWS
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs ``(a, b, cosine)`` with ``a < b`` and exact cosine >= ``threshold`` among the images
    passing ``where``, sorted by ``(a, b)``.

    Raises:
        InvalidArgumentError: a bad threshold, or more than :data:`MAX_PAIRS` candidates.
    """
    pairs = _scored_pairs(index, check_threshold(threshold), where, batch_rows, index.vectors.exact_scores)
    return pairs.a, pairs.b, pairs.scores


@dataclass(frozen=True)
class _Pairs:
    """Pairs at or above the threshold, and the stored vectors of every image in a candidate
    pair (``members`` sorted), gathered once for both the re-scoring and the groups."""

    a: np.ndarray
    b: np.ndarray
    scores: np.ndarray
    members: np.ndarray
    vectors: np.ndarray

    def vectors_of(self, ids: np.ndarray) -> np.ndarray:
        return self.vectors[np.searchsorted(self.members, ids)]


def _scored_pairs(index: ImageIndex, threshold: float, where: Filter | None, batch_rows: int, exact: bool) -> _Pairs:
    radius = threshold if exact else max(threshold - _APPROX_MARGIN, 0.0)
    found_a: list[np.ndarray] = []
    found_b: list[np.ndarray] = []
    total = 0
    for ids, vectors in index.vectors.iter_vectors(where, batch_rows=batch_rows):
        for query, (hits, _) in zip(ids, index.vectors.search_range(vectors, radius, where=where), strict=True):
            later = hits[hits > query]  # each pair once, and never an image with itself
            if len(later):
                found_a.append(np.full(len(later), query, np.int64))
                found_b.append(later)
                total += len(later)
        if total > MAX_PAIRS:
            raise InvalidArgumentError(f"more than {MAX_PAIRS:,} image pairs reach cosine {threshold}: raise the threshold")
    if not found_a:
        empty = np.empty(0, np.int64)
        return _Pairs(empty, empty, np.empty(0, np.float32), empty, np.empty((0, index.dim), np.float32))
    a, b = np.concatenate(found_a), np.concatenate(found_b)
    # One streaming pass over the stored vectors gathers every image that is in a pair.
    members = np.unique(np.concatenate([a, b]))
    vectors = store.gather_vectors(index.vectors.iter_embeddings(), index.dim, members)
    va, vb = (vectors[np.searchsorted(members, side)].astype(np.float64) for side in (a, b))
    scores = np.einsum("ij,ij->i", va, vb).astype(np.float32)
    keep = scores >= threshold
    a, b, scores = a[keep], b[keep], scores[keep]
    order = np.lexsort((b, a))
    return _Pairs(a[order], b[order], scores[order], members, vectors)


def _other_files(index: ImageIndex, pairs: _Pairs) -> _Pairs:
    # An index with videos: the frames of one video are alike by nature, not duplicates.
    paths = dict(zip(pairs.members.tolist(), index.metadata.paths_of(pairs.members), strict=True))
    keep = np.fromiter((paths[x] != paths[y] for x, y in zip(pairs.a.tolist(), pairs.b.tolist(), strict=True)), bool, len(pairs.a))
    return _Pairs(pairs.a[keep], pairs.b[keep], pairs.scores[keep], pairs.members, pairs.vectors)


def components(a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
    """Connected components (of two or more ids) of the graph with edges ``a[i] - b[i]``,
    each sorted, ordered by their smallest id."""
    nodes, inverse = np.unique(np.concatenate([a, b]), return_inverse=True)
    if not len(nodes):
        return []
    ea, eb = inverse[: len(a)], inverse[len(a) :]
    label = np.arange(len(nodes))
    while True:
        # Each edge pulls both ends to the smaller label; pointer jumping flattens chains.
        low = np.minimum(label[ea], label[eb])
        np.minimum.at(label, ea, low)
        np.minimum.at(label, eb, low)
        jumped = label[label]
        if np.array_equal(jumped, label) and np.array_equal(label[ea], label[eb]):
            break
        label = jumped
    order = np.lexsort((nodes, label))
    starts = np.flatnonzero(np.r_[True, label[order][1:] != label[order][:-1]])
    return [nodes[g] for g in np.split(order, starts[1:])]


def find_duplicates(
    index: ImageIndex, threshold: float = DEFAULT_THRESHOLD, where: Filter | None = None, batch_rows: int = DEFAULT_BATCH_ROWS
) -> DuplicateReport:
    """Groups of near-duplicate images of ``index`` (those passing ``where``).

    Raises:
        InvalidArgumentError: a bad threshold, or a threshold so low that pairs explode.
    """
    threshold = check_threshold(threshold)
    exact = index.vectors.exact_scores
    pairs = _scored_pairs(index, threshold, where, batch_rows, exact)
    if index.metadata.has_videos:
        pairs = _other_files(index, pairs)
    groups = components(pairs.a, pairs.b)
    if not groups:
        return DuplicateReport(threshold, (), 0, exact)
    members = np.sort(np.concatenate(groups))
    rows = index.rows(members, columns=("path", "width", "height", "size"))
    facts = {int(m): row for m, row in zip(members, rows, strict=True)}
    vector_of = {int(m): v for m, v in zip(members, pairs.vectors_of(members), strict=True)}
    out = []
    for group in groups:
        # Most pixels, then the largest file, then the first path.
        keep = min(group.tolist(), key=lambda i: (-facts[i]["width"] * facts[i]["height"], -facts[i]["size"], facts[i]["path"]))
        kv = vector_of[keep].astype(np.float64)
        others = [Hit(i, facts[i]["path"], float(np.float32(kv @ vector_of[i]))) for i in group.tolist() if i != keep]
        others.sort(key=lambda d: (-(d.score or 0.0), d.id))
        # A video is listed once (its best frame), and never as a duplicate of itself.
        listed, unique = {facts[keep]["path"]}, []
        for d in others:
            if d.path not in listed:
                listed.add(d.path)
                unique.append(d)
        if not unique:
            continue
        others = unique
        out.append(DuplicateGroup(Hit(keep, facts[keep]["path"], 1.0), tuple(others)))
    out.sort(key=lambda g: (-len(g.duplicates), g.keep.path))
    return DuplicateReport(threshold, tuple(out), len(pairs.a), exact)


__all__ = [
    "DEFAULT_THRESHOLD",
    "DuplicateGroup",
    "DuplicateReport",
    "check_threshold",
    "components",
    "duplicate_pairs",
    "find_duplicates",
]
