"""Search results: :class:`Hit`, the relevance cut-off and the orders a search may return.

A search selects its hits one of two ways: the ``k`` best (FAISS top-k), or with a
``min_score`` every image scoring at least that (FAISS range search, capped at ``k`` when one
is given). :func:`make_hits` then orders them (``score``: best first; ``taken``: newest photo
first, undated last) and attaches the stored paths and photo facts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

from .checks import is_positive_int
from .errors import InvalidArgumentError
from .moments import Moment

Sort = Literal["score", "taken"]
SORTS: tuple[str, ...] = ("score", "taken")
# Results of a search that gives neither k nor min_score.
DEFAULT_K = 10


@dataclass(frozen=True)
class HitFace:
    """A face in a hit's image: its box (pixels of the original: left, top, right, bottom) and
    whose it is (``person`` and ``name``; None for a face of nobody or of a hidden person)."""

    box: tuple[float, float, float, float]
    person: int | None
    name: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"box": [round(v, 1) for v in self.box], "person": self.person, "name": self.name}


@dataclass(frozen=True)
class Hit:
    """One search result: ``score`` is the cosine similarity (higher is better).

    ``taken`` (ISO 8601), ``camera`` and ``gps`` (``(latitude, longitude)``) are the photo's
    EXIF facts, None where it has none (or the index predates them).

    A text search in ``hybrid`` or ``keyword`` mode (:mod:`retrieval.hybrid`) also says which
    query words matched the image's text, by source (``matched``: ``{"ocr": ("4711",)}``;
    sources in :data:`retrieval.keywords.SOURCES`) and the image's recognised text
    (``ocr_text``); ``score`` is always the cosine of the vector side, whatever ranked the hit.
    Where hybrid ranking fused the two sides, ``fused`` is the score the hits are ordered by
    (:func:`retrieval.keywords.fuse`), and ``keyword`` the share of the query's words the
    image's text matches (0 to 1); both are None elsewhere.
    ``caption`` and ``url`` came with an image from a WebDataset shard (its ``.txt`` and
    img2dataset's ``.json``), None for an image from a folder.
    A video's hit (``media`` ``"video"``; None for an image) is its best moment
    (:mod:`retrieval.moments`): ``start`` and ``end`` in seconds, ``frame_time`` the time of its
    best frame, whose row ``id`` and ``score`` are the hit's; ``moments`` are all the video's
    matching moments, the best first.
    ``faces`` are the faces in the image, largest first, in an index built with ``--faces``
    ("who is in this photo"; None in an index without faces). A search without a query (the
    images a filter keeps, newest first: :func:`browse`) has no ``score`` (None).
    """

    id: int
    path: str
    score: float | None
    taken: str | None = None
    camera: str | None = None
    gps: tuple[float, float] | None = None
    matched: Mapping[str, tuple[str, ...]] | None = None
    ocr_text: str | None = None
    caption: str | None = None
    url: str | None = None
    fused: float | None = None
    keyword: float | None = None
    media: str | None = None
    start: float | None = None
    end: float | None = None
    frame_time: float | None = None
    moments: tuple[Moment, ...] | None = None
    faces: tuple[HitFace, ...] | None = None

    def to_dict(self, facts: bool = False) -> dict[str, Any]:
        """``id``, ``path``, ``score``, and the photo facts and text fields it has (with
        ``facts``: every key, None where unknown, as ``clipsearch search --json`` prints them); ``caption`` and ``url``
        where present; a video's ``media``, ``start``, ``end``, ``frame_time`` and ``moments``."""
        out: dict[str, Any] = {"id": self.id, "path": self.path, "score": self.score}
        known = {
            "taken": self.taken, "camera": self.camera, "gps": list(self.gps) if self.gps is not None else None,
            "matched": {k: list(v) for k, v in self.matched.items()} if self.matched is not None else None,
            "ocr_text": self.ocr_text, "keyword": self.keyword, "fused": self.fused,
        }
        out.update(known if facts else {k: v for k, v in known.items() if v is not None})
        out.update({k: v for k, v in (("caption", self.caption), ("url", self.url)) if v is not None})
        if self.media is not None:
            out.update(media=self.media, start=self.start, end=self.end, frame_time=self.frame_time,
                       moments=[m.to_dict() for m in self.moments or ()])
        if self.faces is not None:
            out["faces"] = [f.to_dict() for f in self.faces]
        return out

    @property
    def people(self) -> list[str]:
        """The people in the image as they are shown: a name, else ``#N`` (hidden people and
        faces of nobody left out)."""
        return [f.name or f"#{f.person}" for f in self.faces or () if f.person is not None]


class HitSource(Protocol):
    """What :func:`make_hits` reads: :class:`~retrieval.rows.Rows`."""

    def paths_of(self, ids: Sequence[int] | np.ndarray) -> list[str]: ...

    def photo_meta(self, ids: Sequence[int] | np.ndarray) -> list[dict[str, Any]]: ...

    def sample_meta(self, ids: Sequence[int] | np.ndarray) -> list[dict[str, Any]]: ...

    def taken_us(self) -> np.ndarray: ...

    def faces_in(self, ids: Sequence[int] | np.ndarray) -> list[tuple[HitFace, ...]] | None: ...


@dataclass(frozen=True)
class Cut:
    """Which hits a search returns: ``k`` (None: no cap), ``min_score`` (None: the ``k`` best)
    and their ``sort``."""

    k: int | None
    min_score: float | None
    sort: str

    @property
    def top_k(self) -> int:
        """The k of a top-k search (without ``min_score``)."""
        return self.k if self.k is not None else DEFAULT_K

    @property
    def cap(self) -> int | None:
        """How many hits are returned at most: ``k``; without it :data:`DEFAULT_K`, or no cap
        with ``min_score``."""
        return self.k if self.k is not None or self.min_score is not None else DEFAULT_K


def check_cut(k: int | None, min_score: float | None, sort: str) -> Cut:
    """The checked :class:`Cut` of a search's ``k``, ``min_score`` and ``sort``.

    Raises:
        InvalidArgumentError: k below 1, min_score not a number in [-1, 1], an unknown sort.
    """
    if k is not None and not is_positive_int(k):
        raise InvalidArgumentError(f"k must be an integer >= 1, got {k!r}")
    if min_score is not None:
        if isinstance(min_score, bool) or not isinstance(min_score, (int, float, np.floating, np.integer)):
            raise InvalidArgumentError(f"min_score must be a number in [-1, 1], got {min_score!r}")
        if not (math.isfinite(float(min_score)) and -1.0 <= float(min_score) <= 1.0):
            raise InvalidArgumentError(f"min_score must be in [-1, 1] (scores are cosines), got {min_score!r}")
        min_score = float(min_score)
    if sort not in SORTS:
        raise InvalidArgumentError(f"sort must be one of {', '.join(SORTS)}, got {sort!r}")
    return Cut(k, min_score, sort)


def newest_first(taken_us: np.ndarray, *ties: np.ndarray) -> np.ndarray:
    """The order that puts photos taken at ``taken_us`` newest first, undated last
    (``HitSource.taken_us``'s int64 minimum); equal times in the order of ``ties`` (lexsort
    keys, the last one first)."""
    undated = taken_us == np.iinfo(np.int64).min
    return np.lexsort((*ties, -np.where(undated, 0, taken_us), undated))


def make_hits(rows: HitSource, ids: np.ndarray, scores: np.ndarray, cut: Cut) -> list[Hit]:
    """The hits of one query from its selected ``ids`` and ``scores`` (best first, ties by id):
    ordered by ``cut.sort``, capped at ``cut.k``, with their paths and photo facts."""
    ids = np.asarray(ids, np.int64)
    scores = np.asarray(scores, np.float32)
    if cut.sort == "taken" and len(ids):
        # Equal times keep the score order.
        order = newest_first(rows.taken_us()[ids], ids, -scores)
        ids, scores = ids[order], scores[order]
    if cut.cap is not None:
        ids, scores = ids[: cut.cap], scores[: cut.cap]
    return hits_of(rows, ids, scores)


def browse(rows: HitSource, allowed: np.ndarray, cut: Cut) -> list[Hit]:
    """The images of the mask ``allowed`` without a query: newest photo first, undated last, then
    by id; at most ``cut.cap`` of them, each without a score."""
    ids = np.flatnonzero(allowed).astype(np.int64)
    ids = ids[newest_first(rows.taken_us()[ids], ids)]
    if cut.cap is not None:
        ids = ids[: cut.cap]
    return hits_of(rows, ids, None)


def hits_of(rows: HitSource, ids: np.ndarray, scores: np.ndarray | None) -> list[Hit]:
    """The hits of ``ids`` with their ``scores`` (None: hits without a score), in the order given,
    with their paths, photo facts and faces."""
    ids = np.asarray(ids, np.int64)
    paths = rows.paths_of(ids)
    metas = rows.photo_meta(ids)
    samples = rows.sample_meta(ids)
    found = rows.faces_in(ids)
    faces: list[tuple[HitFace, ...] | None] = [None] * len(ids) if found is None else list(found)
    values: list[float | None] = [None] * len(ids) if scores is None else np.asarray(scores, np.float32).tolist()
    return [
        Hit(int(i), p, s, m["taken"], m["camera"], tuple(m["gps"]) if m["gps"] is not None else None,
            caption=x["caption"], url=x["url"], faces=f)
        for i, s, p, m, x, f in zip(ids.tolist(), values, paths, metas, samples, faces, strict=True)
    ]


__all__ = [
    "DEFAULT_K", "SORTS", "Cut", "Hit", "HitFace", "HitSource", "Sort", "browse", "check_cut", "hits_of", "make_hits",
    "newest_first",
]
