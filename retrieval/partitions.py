"""``PartitionedIndex``: a shard set (:mod:`retrieval.partition_set`) searched as one index.

The router embeds the query once, sends it to every shard (:mod:`retrieval.partition_shard`)
at once, and merges their answers (:mod:`retrieval.partition_merge`) in the order the unsharded
index ranks by: the score, ties by the lower id (vector mode; with ``sort=taken`` the newest first
among the same selection), the fused score (hybrid, on the set's cosine scale), keyword coverage
(keyword mode). Exact modes (flat indexes) return the unsharded index's ids and scores;
approximate ones the recall of the shards. Ids are the set's (``0 .. count - 1``), translated from each shard's own.

Each fan-out has a deadline: a shard that has not answered by then, or fails, is left out and
the result says so (:attr:`SetHits.missing`; ``partial``); a search no shard answered, and a
lookup of the rows, vectors or file of an id whose shard does not answer, raise
:class:`~retrieval.errors.ShardUnavailableError`. Where the shards run (this process, or Ray
Serve replicas) is the :class:`ShardClient`'s business.
"""

from __future__ import annotations

import io
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .encoders.query import QueryEncoders
from .errors import ClipSearchError, InvalidArgumentError, ShardUnavailableError
from .hits import Hit
from .keywords import CosineScale, check_mode, check_query_text
from .layout import Manifest
from .partition_merge import merge, only, set_scale
from .partition_set import PartitionSet
from .partition_shard import ShardAnswer, ShardQuery, ShardSearcher, with_global_ids
from .query_terms import embed_terms
from .request import SearchRequest
from .rows import check_id
from .shard_ranges import ShardMember

# Seconds a shard has to answer one call before the result goes on without it.
DEFAULT_DEADLINE_S = 5.0


class Pending(Protocol):
    """A call under way: its value, or its error, within ``timeout`` seconds."""

    def result(self, timeout: float | None = None) -> Any: ...


class ShardClient(Protocol):
    """One shard as the router reaches it: ``call("search", query)`` runs
    :meth:`ShardSearcher.search <retrieval.partition_shard.ShardSearcher.search>` (any of its
    methods, by name) where the shard lives and returns at once."""

    name: str

    def call(self, method: str, *args: Any) -> Pending: ...


class LocalShard:
    """A shard searched in this process, on a thread of the router's pool."""

    def __init__(self, name: str, searcher: ShardSearcher, pool: ThreadPoolExecutor) -> None:
        self.name = name
        self._searcher = searcher
        self._pool = pool

    def call(self, method: str, *args: Any) -> Pending:
        return self._pool.submit(getattr(self._searcher, method), *args)


class SetHits(list[Hit]):
    """A search's hits, with the shards that did not answer in time (empty: the whole set) and
    the generation each shard answered from."""

    missing: tuple[str, ...] = ()
    generations: dict[str, str]

    @property
    def partial(self) -> bool:
        return bool(self.missing)


def coverage(hits: Sequence[Hit]) -> dict[str, Any] | None:
    """What a result says of its shards: ``{"partial", "missing_shards"}`` for a shard set's hits
    (the CLI's and the HTTP API's JSON), None for one index's."""
    if not isinstance(hits, SetHits):
        return None
    return {"partial": hits.partial, "missing_shards": list(hits.missing)}


@dataclass(frozen=True)
class SetFacts:
    """The facts of a set a server lists (as a manifest's): count, model, dim, index type, generation, source root."""

    count: int
    model: str
    model_fingerprint: str
    dim: int
    index_type: str
    generation: str
    source_root: str
    created: str
    shards: tuple[str, ...]


class PartitionedIndex:
    """A shard set, searched as one index; what a server serves in place of an
    :class:`~retrieval.index.ImageIndex` (the same ``search``, ``rows``, ``metadata``, ``files``,
    ``vectors.vectors_of``, ``encoders``, ``manifest`` facts).

    Args:
        parts: the set's manifest.
        shards: a client per shard, in the set's order.
        queries: the query encoders (made for a shard's manifest: every shard has the set's model).
        first: the first shard's manifest (the facts the set repeats).
        deadline_s: seconds each shard has to answer a call.
        roots: each shard's source folder, in the set's order (default: the first shard's for
            all); shards built apart may each have their own.

    Raises:
        ShardUnavailableError: a shard does not answer its description (at open).
    """

    def __init__(self, parts: PartitionSet, shards: Sequence[ShardClient], queries: QueryEncoders, first: Manifest,
                 deadline_s: float = DEFAULT_DEADLINE_S, roots: Sequence[str] | None = None) -> None:
        if not deadline_s > 0:
            raise InvalidArgumentError(f"the shard deadline must be > 0 seconds, got {deadline_s!r}")
        self.parts = parts
        self._shards = list(shards)
        self._queries = queries
        self._deadline_s = deadline_s
        self._keywords = first.keywords is not None
        self.roots = tuple(roots) if roots is not None else (first.source_root,) * len(parts.shards)
        self.manifest = SetFacts(parts.count, parts.model, parts.model_fingerprint, parts.dim, first.index_type,
                                 str(parts.generation), first.source_root, first.created, tuple(s.name for s in parts.shards))
        self._sizes: dict[int, tuple[int, int]] = {}
        self._moments: tuple[np.ndarray, np.ndarray] | None = None
        self._moments_read = False
        self._videos: bool | None = None
        self.metadata = _SetRows(self)
        self.files = _SetFiles(self)
        self.vectors = _SetVectors(self)

    @property
    def count(self) -> int:
        return self.parts.count

    @property
    def dim(self) -> int:
        return self.parts.dim

    def __len__(self) -> int:
        return self.count

    @property
    def encoders(self) -> QueryEncoders:
        return self._queries

    # -- search ---------------------------------------------------------------------------------

    def search(self, query: str | SearchRequest, k: int | None = None, **kwargs: Any) -> SetHits:
        """As :meth:`ImageIndex.search <retrieval.index.ImageIndex.search>`, over every shard;
        the hits say which shards are missing from them.

        Raises:
            The errors of ``ImageIndex.search``; ShardUnavailableError: no shard answered.
        """
        req = query if isinstance(query, SearchRequest) else SearchRequest(text=query, k=k, **kwargs)
        if req.kind == "browse":
            raise InvalidArgumentError("a shard set is searched with a query (text, image, vector or similar_to); "
                                       "a listing by filters alone works on one index, not on a set")
        if req.kind == "text":
            assert req.text is not None
            mode = self._mode(req.mode)
            if mode != "vector":
                check_query_text(req.text)
            if req.vector is not None:
                vector = np.asarray(req.vector, np.float32)
            else:
                vector = self._queries.embed_texts([req.text], req.query_lang)[0]
            return self._fan_search(ShardQuery(vector, req.text, req.cut, req.where, mode, self._scale(mode, vector)))
        if req.kind == "terms":
            for t in req.terms:
                if t.kind == "id":
                    check_id(t.value, self.count)
            vector = embed_terms(req.terms, lambda texts: self._queries.embed_texts(texts, req.query_lang),
                                 lambda image: self._queries.embed_image(_named(image)), self.vectors.vectors_of)
        elif req.kind == "image":
            assert req.image is not None
            vector = self._queries.embed_image(_named(req.image))[0]
        elif req.kind == "similar":
            vector = self.vectors.vectors_of([check_id(req.similar_to, self.count)])[0]
        else:
            vector = np.asarray(req.vector, np.float32).reshape(-1)
            if vector.shape != (self.dim,):
                raise InvalidArgumentError(f"query vectors must have shape (n, {self.dim}), got {(1, *vector.shape)}")
        return self._fan_search(ShardQuery(np.asarray(vector, np.float32).reshape(-1), None, req.cut, req.where, "vector"))

    def search_image(self, image: Any, k: int | None = None, **kwargs: Any) -> SetHits:
        """Image-to-image search, as ``ImageIndex.search_image``."""
        return self.search(SearchRequest(image=image, k=k, **kwargs))

    def _mode(self, mode: str | None) -> str:
        if mode is None:
            return "hybrid" if self._keywords else "vector"
        checked = check_mode(mode)
        if checked == "keyword" and not self._keywords:
            raise InvalidArgumentError("this shard set has no keyword side: make it again from an index built by this clipsearch")
        return checked

    def _scale(self, mode: str, vector: np.ndarray) -> CosineScale | None:
        # The query's scale over the whole set (VectorSearch.cosine_scale's, on the set's moments).
        moments = None if mode == "vector" else self._set_moments()
        if moments is None:
            return None
        q = np.asarray(vector, np.float64)
        mean, cov = moments
        return CosineScale(float(np.einsum("i,i->", q, mean)), float(np.sqrt(max(np.einsum("i,ij,j->", q, cov, q), 0.0))))

    def _set_moments(self) -> tuple[np.ndarray, np.ndarray] | None:
        if not self._moments_read:
            answers, missing = self._fan({n: ("moments",) for n in range(len(self._shards))})
            if missing:
                raise ShardUnavailableError(f"shards {', '.join(missing)} did not answer: hybrid search needs every shard once")
            self._moments = set_scale([answers[n] for n in sorted(answers)])
            self._moments_read = True
        return self._moments

    def _fan_search(self, query: ShardQuery) -> SetHits:
        answers, missing = self._fan({n: ("search", query) for n in range(len(self._shards))})
        if not answers:
            raise ShardUnavailableError(f"no shard answered within {self._deadline_s:g} s ({', '.join(missing)})")
        merged: list[ShardAnswer] = []
        for n, answer in sorted(answers.items()):
            shard = self.parts.shards[n]
            ahead = int(answer.facts.get("count", shard.count)) - shard.count
            if ahead > 0:
                answer = self._without_unlisted(n, query, answer, ahead)
            ids = shard.global_ids(np.array([h.id for h in answer.hits], np.int64))
            merged.append(with_global_ids(answer, ids))
            self._remember_sizes(ids, answer.sizes)
        out = SetHits(merge(merged, query.cut, query.mode, query.scale))
        out.missing = tuple(missing)
        out.generations = {self._shards[n].name: a.generation for n, a in sorted(answers.items())}
        return out

    def _without_unlisted(self, n: int, query: ShardQuery, answer: ShardAnswer, ahead: int) -> ShardAnswer:
        """The answer of shard ``n`` without the images its newer generation holds and this set
        does not list yet (being added: they join once the set's new manifest is read), asked
        again for ``ahead`` more hits where dropping them left fewer than the cut wants: the
        answer the set's generation of the shard gives."""
        count = self.parts.shards[n].count
        known = np.array([h.id < count for h in answer.hits], bool)
        if known.all():
            return answer
        cap = query.cut.cap
        if cap is not None and len(answer.hits) >= cap:
            again, missing = self._fan({n: ("search", replace(query, cut=replace(query.cut, k=cap + ahead)))})
            if not missing:
                answer = again[n]
                known = np.array([h.id < count for h in answer.hits], bool)
        # More than the cut's hits is fine: the merge takes the set's best from any superset.
        return only(answer, known)

    def _fan(self, calls: dict[int, tuple[Any, ...]]) -> tuple[dict[int, Any], list[str]]:
        """Each shard's answer to its call, within the deadline; the names of those that failed
        or did not answer. A refusal (a request the shard finds bad) is raised as it is."""
        started = time.monotonic()
        pending = {n: self._shards[n].call(*call) for n, call in calls.items()}
        answers: dict[int, Any] = {}
        missing: list[str] = []
        for n, call in pending.items():
            try:
                answers[n] = call.result(max(0.001, self._deadline_s - (time.monotonic() - started)))
            except ClipSearchError:
                raise
            except Exception:  # a timeout, a lost replica or node: the shard is missing from this answer
                missing.append(self._shards[n].name)
        return answers, missing

    # -- rows by id -----------------------------------------------------------------------------

    def by_shard(self, ids: Sequence[int] | np.ndarray, method: str, *args: Any) -> list[Any]:
        """``method`` of each id's shard with its local ids (and ``args``), the answers back in
        the order of ``ids``: one call per shard holding any of them.

        Raises:
            InvalidArgumentError: an id outside the set.
            ShardUnavailableError: a shard holding one of them does not answer.
        """
        shard, local = self.parts.locate(ids)
        calls = {int(n): (method, local[shard == n], *args) for n in np.unique(shard)}
        answers, missing = self._fan(calls)
        if missing:
            raise ShardUnavailableError(f"shard {', '.join(missing)} did not answer within {self._deadline_s:g} s: try again")
        out: list[Any] = [None] * len(shard)
        for n, answer in answers.items():
            for at, value in zip(np.flatnonzero(shard == n).tolist(), list(answer), strict=True):
                out[at] = value
        return out

    def one(self, id: int, method: str) -> Any:
        """``method`` of the shard holding ``id``, with its local id."""
        shard, local = self.parts.locate([check_id(id, self.count)])
        answers, missing = self._fan({int(shard[0]): (method, int(local[0]))})
        if missing:
            raise ShardUnavailableError(f"shard {missing[0]} did not answer within {self._deadline_s:g} s: try again")
        return answers[int(shard[0])]

    def rows(self, ids: Sequence[int] | np.ndarray, columns: Sequence[str] = ("id", "path")) -> list[dict[str, Any]]:
        """Metadata of ``ids`` (the set's ids), as ``ImageIndex.rows``."""
        rows = self.by_shard(ids, "rows", tuple(columns))
        wanted = list(np.asarray(ids, np.int64).tolist())
        return [{**row, "id": g} if "id" in row else row for row, g in zip(rows, wanted, strict=True)]

    def _remember_sizes(self, ids: np.ndarray, sizes: np.ndarray) -> None:
        if len(self._sizes) > 100_000:
            self._sizes.clear()  # a bound, not a policy: the next pages fill it again
        self._sizes.update({int(i): (int(s[0]), int(s[1])) for i, s in zip(ids.tolist(), np.asarray(sizes).tolist(), strict=True)})

    def has_videos(self) -> bool:
        """Whether any shard holds the rows of videos (asked of every shard once)."""
        if self._videos is None:
            answers, missing = self._fan({n: ("describe",) for n in range(len(self._shards))})
            if missing:
                raise ShardUnavailableError(f"shards {', '.join(missing)} did not answer within {self._deadline_s:g} s: try again")
            self._videos = any(bool(a.get("videos")) for a in answers.values())
        return self._videos

    def info(self) -> dict[str, Any]:
        """The set's facts (``clipsearch info`` of a set)."""
        return {"count": self.count, "model": self.parts.model, "dim": self.dim, "generation": self.parts.generation,
                "shards": [{"name": s.name, "count": s.count} for s in self.parts.shards]}


class _SetRows:
    def __init__(self, index: PartitionedIndex) -> None:
        self._index = index

    @property
    def has_videos(self) -> bool:
        return self._index.has_videos()

    def sizes_of(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        known = self._index._sizes
        wanted = [int(i) for i in np.asarray(ids, np.int64).tolist()]
        if all(i in known for i in wanted):
            return np.array([known[i] for i in wanted], np.int32).reshape(-1, 2)
        return np.asarray(self._index.by_shard(wanted, "sizes_of"), np.int32).reshape(-1, 2)

    def paths_of(self, ids: Sequence[int] | np.ndarray) -> list[str]:
        return list(self._index.by_shard(ids, "paths_of"))

    def sample_meta(self, ids: Sequence[int] | np.ndarray) -> list[dict[str, Any]]:
        return list(self._index.by_shard(ids, "sample_meta"))


class _SetFiles:
    def __init__(self, index: PartitionedIndex) -> None:
        self._index = index

    def path(self, id: int) -> Path:
        return Path(self._index.one(id, "file_path"))

    def root_of(self, id: int) -> str:
        shard, _ = self._index.parts.locate([check_id(id, self._index.count)])
        return self._index.roots[int(shard[0])]

    def shard_bytes(self, id: int) -> bytes | None:
        data: bytes | None = self._index.one(id, "shard_bytes")
        return data

    def shard_member(self, id: int) -> ShardMember | None:
        member: ShardMember | None = self._index.one(id, "shard_member")
        return member


class _SetVectors:
    def __init__(self, index: PartitionedIndex) -> None:
        self._index = index

    def vectors_of(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        rows = self._index.by_shard(ids, "vectors_of")
        return np.asarray(rows, np.float32).reshape(len(rows), self._index.dim)


def _named(image: Any) -> Any:
    if isinstance(image, bytes):
        buf = io.BytesIO(image)
        buf.name = "the query image"
        return buf
    return image


__all__ = ["DEFAULT_DEADLINE_S", "LocalShard", "PartitionedIndex", "SetFacts", "SetHits", "ShardClient", "coverage"]
