"""One ranking from two: reciprocal rank fusion (Cormack, Clarke and Büttcher, SIGIR 2009).

An image's fused score is ``sum(1 / (RRF_K + rank))`` over the rankings that hold it. Ranks,
not scores, are fused: a cosine and a keyword score have no common scale, and RRF needs none.
Images that match the query's words equally well share a keyword rank
(:class:`~retrieval.keywords.fts.Matches`), so among them the vector ranking decides.
"""

from __future__ import annotations

import numpy as np

from ..errors import InvalidArgumentError

# The constant of the paper (and of Elasticsearch's and OpenSearch's RRF).
RRF_K = 60
MODES: tuple[str, ...] = ("hybrid", "vector", "keyword")


def check_mode(mode: object) -> str:
    """``mode`` if it is one of :data:`MODES`.

    Raises:
        InvalidArgumentError: another value.
    """
    if mode not in MODES:
        raise InvalidArgumentError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    return str(mode)


def fuse(vector_ids: np.ndarray, keyword_ids: np.ndarray, keyword_ranks: np.ndarray) -> np.ndarray:
    """The ids of both rankings, best fused score first (ties: the vector ranking's order, then id).

    Args:
        vector_ids: the vector ranking, best first (rank = position + 1).
        keyword_ids: the keyword matches, best first.
        keyword_ranks: their ranks (equal for equal matches), from 1.
    """
    vector_ids = np.asarray(vector_ids, np.int64)
    keyword_ids = np.asarray(keyword_ids, np.int64)
    ids = np.union1d(vector_ids, keyword_ids)
    score = np.zeros(len(ids), np.float64)
    vpos = np.full(len(ids), len(vector_ids), np.int64)
    at = np.searchsorted(ids, vector_ids)
    score[at] += 1.0 / (RRF_K + np.arange(1, len(vector_ids) + 1))
    vpos[at] = np.arange(len(vector_ids))
    at = np.searchsorted(ids, keyword_ids)
    score[at] += 1.0 / (RRF_K + np.asarray(keyword_ranks, np.float64))
    order = np.lexsort((ids, vpos, -score))
    return ids[order]


__all__ = ["MODES", "RRF_K", "check_mode", "fuse"]
