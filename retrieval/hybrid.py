"""Text search by mode: ``vector`` (the embedding alone), ``keyword`` (the images whose words
match), ``hybrid`` (both rankings fused, :func:`retrieval.keywords.fuse`).

Hybrid takes the vector ranking's first :data:`DEPTH` images (or every image at or above
``min_score``) and the keyword matches' first :data:`DEPTH`, and ranks their union by reciprocal
rank fusion. Where no word of the query matches, the result is the vector search's, exactly.
Filters apply to both sides. Every hit carries its cosine (``score``), the query words its
text matched by source, and its recognised text.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from .errors import InvalidArgumentError
from .filters import Filter
from .hits import Cut, Hit, make_hits
from .keywords import SOURCES, KeywordIndex, Matches, Terms, check_mode, fuse, matched_words, query_terms

if TYPE_CHECKING:
    from .index import ImageIndex

# Candidates each side brings to the fusion (at least k).
DEPTH = 100


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
    index: ImageIndex, queries: Sequence[str], vectors: np.ndarray, cut: Cut, where: Filter | None, mode: str
) -> list[list[Hit]]:
    """The hits of each text query in ``mode`` (``vectors`` are the queries' embeddings)."""
    keywords = index.keywords
    if mode == "vector" or keywords is None:
        return index.search_vectors(vectors, cut.k, where=where, min_score=cut.min_score, sort=cut.sort)
    allowed = index.mask(where) if where is not None and where.active else None
    out = []
    for query, vector in zip(queries, vectors, strict=True):
        terms = query_terms(query)
        matches = keywords.match(terms, allowed)
        if mode == "keyword":
            hits = _keyword_hits(index, matches, vector, cut)
        elif not len(matches):
            hits = index.search_vectors(vector[None], cut.k, where=where, min_score=cut.min_score, sort=cut.sort)[0]
        else:
            hits = _fused_hits(index, matches, vector, cut, where)
        out.append(_with_text(keywords, terms, hits))
    return out


def _scores(index: ImageIndex, ids: np.ndarray, vector: np.ndarray, known: dict[int, float]) -> np.ndarray:
    """Cosines of ``ids`` with the query: from the vector side where it ranked them, else from
    the stored vectors."""
    missing = [int(i) for i in ids if int(i) not in known]
    if missing:
        stored = index.vectors_of(missing) @ np.asarray(vector, np.float32)
        known = {**known, **dict(zip(missing, stored.tolist(), strict=True))}
    return np.array([known[int(i)] for i in ids], np.float32)


def _keyword_hits(index: ImageIndex, matches: Matches, vector: np.ndarray, cut: Cut) -> list[Hit]:
    ids = matches.ids if cut.k is None else matches.ids[: cut.k]
    scores = _scores(index, ids, vector, {})
    if cut.min_score is not None:
        keep = scores >= cut.min_score
        ids, scores = ids[keep], scores[keep]
    return make_hits(index.hit_source, ids, scores, cut)


def _fused_hits(index: ImageIndex, matches: Matches, vector: np.ndarray, cut: Cut, where: Filter | None) -> list[Hit]:
    depth = max(cut.top_k, DEPTH)
    if cut.min_score is not None:
        vids, vscores = index.search_range(vector[None], cut.min_score, where=where)[0]
    else:
        vscores, vids = index.search_ids(vector[None], depth, where=where)
        keep = vids[0] >= 0
        vids, vscores = vids[0][keep], vscores[0][keep]
    fused = fuse(vids, matches.ids[:depth], matches.ranks[:depth])
    if cut.k is not None:
        fused = fused[: cut.k]
    if cut.sort == "taken" and len(fused):
        # Newest first, undated last; equal dates keep the fused order.
        taken = index.hit_source.taken_us()[fused]
        undated = taken == np.iinfo(np.int64).min
        fused = fused[np.lexsort((np.arange(len(fused)), -np.where(undated, 0, taken), undated))]
    scores = _scores(index, fused, vector, dict(zip(vids.tolist(), vscores.tolist(), strict=True)))
    # The fused order as it stands (make_hits reorders only for sort="taken").
    return make_hits(index.hit_source, fused, scores, Cut(cut.k, None, "score"))


def _with_text(keywords: KeywordIndex, terms: Terms, hits: list[Hit]) -> list[Hit]:
    texts = keywords.texts([h.id for h in hits])
    out = []
    for hit, text in zip(hits, texts, strict=True):
        matched = {s: tuple(w) for s in SOURCES if (w := matched_words(terms, text[s]))}
        # replace, not a new Hit: the hit keeps every other field (a shard's caption and url).
        out.append(dataclasses.replace(hit, matched=matched, ocr_text=text["ocr"]))
    return out


__all__ = ["DEPTH", "resolve_mode", "text_search"]
