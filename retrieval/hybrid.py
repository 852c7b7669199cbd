"""Text search by mode: ``vector`` (the embedding alone), ``keyword`` (the images whose words
match), ``hybrid`` (both sides fused, :func:`retrieval.keywords.fuse`).

Hybrid takes the vector ranking's first :data:`DEPTH` images (or every image at or above
``min_score``) and the keyword matches (their best :data:`KEYWORD_DEPTH`), and orders their
union by the fused score of each image's cosine and keyword coverage. Where no word of the
query matches, the result is the vector search's, exactly. Keyword mode orders the matches by
coverage, then cosine. Filters apply to both sides; every mode returns ``k`` hits (default
:data:`~retrieval.hits.DEFAULT_K`, no cap with ``min_score`` alone). Every hit carries its
cosine (``score``), the query words its text matched by source and its recognised text; a
fused hit also its fused score and keyword coverage, so the order can be explained.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from .errors import InvalidArgumentError
from .filters import Filter
from .hits import Cut, Hit, HitSource, hits_of, newest_first
from .keywords import SOURCES, CosineScale, KeywordIndex, Matches, Terms, check_mode, fuse, matched_words, query_terms


class Searchable(Protocol):
    """What text search by mode asks of the vector side (:class:`~retrieval.vector_search.VectorSearch`
    answers it): its keyword side, its vector searches, its stored vectors and rows. The
    :class:`~retrieval.hits.Cut` it is given was checked where the search entered."""

    @property
    def keywords(self) -> KeywordIndex | None: ...

    @property
    def hit_source(self) -> HitSource: ...

    def mask(self, where: Filter) -> np.ndarray: ...

    def hits(self, vectors: np.ndarray, cut: Cut, where: Filter | None = None) -> list[list[Hit]]: ...

    def search_range(self, vectors: np.ndarray, min_score: float, where: Filter | None = None) -> list[tuple[np.ndarray, np.ndarray]]: ...

    def search_ids(self, vectors: np.ndarray, k: int = 10, where: Filter | None = None) -> tuple[np.ndarray, np.ndarray]: ...

    def vectors_of(self, ids: Sequence[int] | np.ndarray) -> np.ndarray: ...

    def cosine_scale(self, vector: np.ndarray) -> CosineScale: ...


# Candidates the vector side brings to the fusion (at least k).
DEPTH = 100
# Keyword matches hybrid brings beside the vector side's candidates, best coverage first (a vector
# candidate gets its coverage whatever its place among the matches).
KEYWORD_DEPTH = 1_000
# Keyword mode reads this many matches' cosines, so that among equal matches the vector side
# decides over many more than it returns.
KEYWORD_MODE_DEPTH = 10_000


def resolve_mode(mode: str | None, keywords: KeywordIndex | None) -> str:
    """The mode a text search runs in: ``mode`` when given, else ``hybrid`` where the index
    has a keyword side and ``vector`` where it has none.

    Raises:
        InvalidArgumentError: an unknown mode; ``keyword`` on an index without a keyword side.
    """
    if mode is None:
        return "hybrid" if keywords is not None else "vector"
    checked = check_mode(mode)
    if checked == "keyword" and keywords is None:
        raise InvalidArgumentError(
            "this index has no keyword side (it was built before clipsearch had one): run the same "
            "`clipsearch index PHOTOS_DIR INDEX_DIR` once to add it (nothing is embedded again)"
        )
    return checked


def text_search(
    index: Searchable, queries: Sequence[str], vectors: np.ndarray, cut: Cut, where: Filter | None, mode: str
) -> list[list[Hit]]:
    """The hits of each text query in ``mode`` (``vectors`` are the queries' embeddings)."""
    keywords = index.keywords
    if mode == "vector" or keywords is None:
        return index.hits(vectors, cut, where)
    allowed = index.mask(where) if where is not None and where.active else None
    out = []
    for query, vector in zip(queries, vectors, strict=True):
        terms = query_terms(query)
        matches = keywords.match(terms, allowed)
        if mode == "keyword":
            hits = _keyword_hits(index, matches, vector, cut)
        elif not len(matches):
            hits = index.hits(vector[None], cut, where)[0]
        else:
            hits = _fused_hits(index, matches, vector, cut, where)
        out.append(_with_text(keywords, terms, hits))
    return out


def _scores(index: Searchable, ids: np.ndarray, vector: np.ndarray, known: dict[int, float]) -> np.ndarray:
    """Cosines of ``ids`` with the query: from the vector side where it ranked them, else from
    the stored vectors."""
    missing = [int(i) for i in ids if int(i) not in known]
    if missing:
        # einsum, not BLAS: a product this small is no faster threaded, and OpenBLAS's threads
        # would spin on after it beside FAISS's, slowing the next search.
        stored = np.einsum("ij,j->i", index.vectors_of(missing), np.asarray(vector, np.float32))
        known = {**known, **dict(zip(missing, stored.tolist(), strict=True))}
    return np.array([known[int(i)] for i in ids], np.float32)


def _keyword_hits(index: Searchable, matches: Matches, vector: np.ndarray, cut: Cut) -> list[Hit]:
    ids, coverage = matches.ids[:KEYWORD_MODE_DEPTH], matches.scores[:KEYWORD_MODE_DEPTH]
    cosines = _scores(index, ids, vector, {})
    if cut.min_score is not None:
        keep = cosines >= cut.min_score
        ids, cosines, coverage = ids[keep], cosines[keep], coverage[keep]
    # Best coverage first; among equal matches, the vector side decides.
    order = np.lexsort((ids, -cosines, -coverage))[: cut.cap]
    return _explained(index, ids[order], cosines[order], cut, None, coverage[order])


def _fused_hits(index: Searchable, matches: Matches, vector: np.ndarray, cut: Cut, where: Filter | None) -> list[Hit]:
    if cut.min_score is not None:
        vids, vscores = index.search_range(vector[None], cut.min_score, where=where)[0]
    else:
        vscores, vids = index.search_ids(vector[None], max(cut.top_k, DEPTH), where=where)
        keep = vids[0] >= 0
        vids, vscores = vids[0][keep], vscores[0][keep]
    ids = np.union1d(vids, matches.ids[:KEYWORD_DEPTH])
    coverage = _coverage_of(matches, ids)
    cosines = _scores(index, ids, vector, dict(zip(vids.tolist(), vscores.tolist(), strict=True)))
    order, fused = fuse(ids, cosines, coverage, index.cosine_scale(vector))
    order = order[: cut.cap]
    return _explained(index, ids[order], cosines[order], cut, fused[order], coverage[order])


def _coverage_of(matches: Matches, ids: np.ndarray) -> np.ndarray:
    """The keyword score of each of ``ids`` (0 where its words do not match)."""
    coverage = np.zeros(len(ids))
    _, at, found = np.intersect1d(ids, matches.ids, assume_unique=True, return_indices=True)
    coverage[at] = matches.scores[found]
    return coverage


def _explained(index: Searchable, ids: np.ndarray, cosines: np.ndarray, cut: Cut, fused: np.ndarray | None,
               coverage: np.ndarray) -> list[Hit]:
    """The hits of ``ids`` in the order given (by date for ``sort="taken"``, equal dates in the
    order given), each with its keyword coverage and, where given, its fused score."""
    if cut.sort == "taken" and len(ids):
        by_date = newest_first(index.hit_source.taken_us()[ids], np.arange(len(ids)))
        ids, cosines, coverage = ids[by_date], cosines[by_date], coverage[by_date]
        fused = fused[by_date] if fused is not None else None
    return [
        dataclasses.replace(h, keyword=float(coverage[n]), fused=float(fused[n]) if fused is not None else None)
        for n, h in enumerate(hits_of(index.hit_source, ids, cosines))
    ]


def _with_text(keywords: KeywordIndex, terms: Terms, hits: list[Hit]) -> list[Hit]:
    texts = keywords.texts([h.id for h in hits])
    out = []
    for hit, text in zip(hits, texts, strict=True):
        matched = {s: tuple(w) for s in SOURCES if (w := matched_words(terms, text[s]))}
        # replace, not a new Hit: the hit keeps every other field (a shard's caption and url).
        out.append(dataclasses.replace(hit, matched=matched, ocr_text=text["ocr"]))
    return out


__all__ = ["DEPTH", "KEYWORD_DEPTH", "KEYWORD_MODE_DEPTH", "Searchable", "resolve_mode", "text_search"]
