"""One shard of a set as it answers the router of :mod:`retrieval.partitions`: a search with the
query already embedded, and the rows, vectors and files of its own (local) ids.

:class:`ShardSearcher` runs in the router's process (a set searched in process) or in a Ray
Serve replica of the shard (``clipsearch serve --ray``); it takes its shard's newest generation
once per call, so one answer never mixes two generations of the shard. Its answers hold
numbers, strings and :class:`~retrieval.hits.Hit` values only, so that they cross processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from .filters import Filter
from .generation import SCALE_SAMPLE
from .hits import Cut, Hit
from .hybrid import text_search
from .index import ImageIndex
from .keywords import CosineScale, KeywordIndex
from .live import LiveIndex
from .rows import Rows
from .shard_ranges import ShardMember
from .vector_search import VectorSearch


@dataclass(frozen=True)
class ShardQuery:
    """A search as the router sends it to every shard: the query's embedding ``vector``
    ``(dim,)``, its ``text`` (None but for a text query), the ``mode`` resolved for the set,
    the checked ``cut`` and filter, and the set's :class:`CosineScale` (hybrid fuses on it, so
    that a fused score means the same in every shard)."""

    vector: np.ndarray
    text: str | None
    cut: Cut
    where: Filter | None
    mode: str
    scale: CosineScale | None = None


@dataclass(frozen=True)
class ShardAnswer:
    """A shard's hits (local ids) with what the router merges and pages them by: each hit's
    ``taken`` time (int64 microseconds, the smallest int64 where undated) and ``(width, height)``,
    whether the query's words matched any image of the shard, and the generation that answered."""

    hits: list[Hit]
    taken_us: np.ndarray
    sizes: np.ndarray
    matched: bool
    generation: str
    facts: dict[str, Any] = field(default_factory=dict)


class _Scaled:
    """A shard's vector side that fuses on the set's scale instead of its own."""

    def __init__(self, vectors: VectorSearch, scale: CosineScale | None) -> None:
        self._v = vectors
        self._scale = scale

    @property
    def keywords(self) -> KeywordIndex | None:
        return self._v.keywords

    @property
    def hit_source(self) -> Rows:
        return self._v.hit_source

    def mask(self, where: Filter) -> np.ndarray:
        return self._v.mask(where)

    def hits(self, vectors: np.ndarray, cut: Cut, where: Filter | None = None) -> list[list[Hit]]:
        return self._v.hits(vectors, cut, where)

    def search_range(self, vectors: np.ndarray, min_score: float, where: Filter | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
        return self._v.search_range(vectors, min_score, where)

    def search_ids(self, vectors: np.ndarray, k: int = 10, where: Filter | None = None) -> tuple[np.ndarray, np.ndarray]:
        return self._v.search_ids(vectors, k, where)

    def vectors_of(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        return self._v.vectors_of(ids)

    def cosine_scale(self, vector: np.ndarray) -> CosineScale:
        return self._scale if self._scale is not None else self._v.cosine_scale(vector)


class ShardSearcher:
    """The answers of one shard index directory, followed to its newest generation.

    Args:
        live: the shard, opened (:class:`~retrieval.live.LiveIndex`).
    """

    def __init__(self, live: LiveIndex) -> None:
        self._live = live

    @classmethod
    def open(cls, directory: str | Path, *, mmap: bool | None = None, warm: bool = False) -> ShardSearcher:
        """Open the shard at ``directory`` (no query model is loaded here: the router embeds).

        Raises:
            The errors of :meth:`ImageIndex.open <retrieval.index.ImageIndex.open>`.
        """
        return cls(LiveIndex(directory, device="cpu", precision="fp32", mmap=mmap, query_cache=0, warm=warm))

    def current(self) -> ImageIndex:
        return self._live.current()

    def search(self, query: ShardQuery) -> ShardAnswer:
        """The shard's hits of ``query``, best first by the query's mode (local ids).

        Raises:
            InvalidArgumentError: a vector of another dimension; a filter the shard refuses.
        """
        index = self._live.current()
        vector = np.asarray(query.vector, np.float32)[None]
        if query.text is None or query.mode == "vector" or index.keywords is None:
            hits = index.vectors.hits(vector, query.cut, query.where)[0]
        else:
            searchable = _Scaled(index.vectors, query.scale)
            hits = text_search(searchable, [query.text], vector, query.cut, query.where, query.mode)[0]
        ids = np.array([h.id for h in hits], np.int64)
        taken = index.metadata.taken_us()[ids] if len(ids) else np.empty(0, np.int64)
        return ShardAnswer(
            hits=hits,
            taken_us=np.asarray(taken, np.int64),
            sizes=np.asarray(index.metadata.sizes_of(ids)) if len(ids) else np.empty((0, 2), np.int32),
            matched=any(h.fused is not None or h.keyword is not None for h in hits),
            generation=str(index.manifest.generation),
            facts={"count": index.count},
        )

    def vectors_of(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        return self._live.current().vectors.vectors_of(ids)

    def rows(self, ids: Sequence[int] | np.ndarray, columns: Sequence[str]) -> list[dict[str, Any]]:
        return self._live.current().rows(ids, columns)

    def sizes_of(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        return np.asarray(self._live.current().metadata.sizes_of(ids))

    def paths_of(self, ids: Sequence[int] | np.ndarray) -> list[str]:
        return self._live.current().metadata.paths_of(ids)

    def sample_meta(self, ids: Sequence[int] | np.ndarray) -> list[dict[str, Any]]:
        return self._live.current().metadata.sample_meta(ids)

    def file_path(self, id: int) -> Path:
        return self._live.current().files.path(id)

    def shard_bytes(self, id: int) -> bytes | None:
        return self._live.current().files.shard_bytes(id)

    def shard_member(self, id: int) -> ShardMember | None:
        return self._live.current().files.shard_member(id)

    def moments(self) -> tuple[int, np.ndarray, np.ndarray] | None:
        """``(count, mean, covariance)`` of the shard's stored vectors (their estimate hybrid
        ranking fuses on), None for an empty shard."""
        index = self._live.current()
        if not index.count:
            return None
        # The sample Generation.cosine_moments takes, over this shard's ids.
        ids = np.unique(np.linspace(0, index.count - 1, min(index.count, SCALE_SAMPLE)).astype(np.int64))
        sample = index.vectors.vectors_of(ids).astype(np.float64)
        mean = sample.mean(axis=0)
        centred = sample - mean
        return index.count, mean, (centred.T @ centred) / len(sample)

    def describe(self) -> dict[str, Any]:
        """The shard's count, generation, whether it has a keyword side and whether it holds videos."""
        index = self._live.current()
        return {"count": index.count, "generation": str(index.manifest.generation), "keywords": index.keywords is not None,
                "videos": index.metadata.has_videos}


def with_global_ids(answer: ShardAnswer, global_ids: np.ndarray) -> ShardAnswer:
    """``answer`` with its hits' ids replaced by ``global_ids`` (in the same order)."""
    hits = [replace(h, id=int(g)) for h, g in zip(answer.hits, global_ids.tolist(), strict=True)]
    return replace(answer, hits=hits)


__all__ = ["ShardAnswer", "ShardQuery", "ShardSearcher", "with_global_ids"]
