"""What an evaluation produces: per-query results, skipped queries and the report.

Plain frozen dataclasses with ``to_dict`` methods; ``to_dict`` output is the JSON that
``clipsearch eval --json`` prints and the per-query file holds, so its keys are a contract.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...index import Hit
from .queries import Query

NDCG_K = 10


@dataclass(frozen=True)
class SkippedQuery:
    """A query with relevant paths that are not in the index (``missing``)."""

    query: Query
    missing: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"line": self.query.line, **self.query.describe(), "missing": list(self.missing)}


@dataclass(frozen=True)
class QueryResult:
    """Where one evaluated query's relevant images ranked.

    Attributes:
        query: the query.
        relevant: its relevant paths that are in the index (evaluated).
        relevant_ids: their ids.
        missing: its relevant paths that are not in the index.
        ranks: 1-based rank of each of ``relevant`` (``inf``: not in the ANN top K).
        ndcg: this query's nDCG@10.
        top: the first ``TOP_N`` results of the ranking.
    """

    query: Query
    relevant: tuple[str, ...]
    relevant_ids: tuple[int, ...]
    missing: tuple[str, ...]
    ranks: tuple[float, ...]
    ndcg: float
    top: tuple[Hit, ...]

    @property
    def first_rank(self) -> float:
        """Rank of the best-ranked relevant image (``inf`` when none is in the ANN top K)."""
        return min(self.ranks)

    @property
    def reciprocal_rank(self) -> float:
        return 1.0 / self.first_rank

    def to_dict(self, ks: Sequence[int]) -> dict[str, Any]:
        """One line of the per-query file (``hit@k`` for each of ``ks``)."""
        first = self.first_rank
        out: dict[str, Any] = {"line": self.query.line, **self.query.describe()}
        out["relevant"] = list(self.relevant)
        out["missing"] = list(self.missing)
        out["first_rank"] = _int_or_none(first)
        out["reciprocal_rank"] = self.reciprocal_rank
        out["ranks"] = [_int_or_none(r) for r in self.ranks]
        out.update({f"hit@{k}": bool(first <= k) for k in ks})
        out[f"ndcg@{NDCG_K}"] = self.ndcg
        out["top"] = [{"rank": n, **hit.to_dict()} for n, hit in enumerate(self.top, 1)]
        return out


@dataclass(frozen=True)
class EvalReport:
    """The outcome of :func:`evaluate`; :meth:`to_dict` is what ``clipsearch eval --json`` prints.

    ``mrr`` is MRR@``cutoff`` and ``mean_rank``/``median_rank`` are None with ANN ranking
    (ranks beyond the top ``cutoff`` are unknown). ``chance_*`` are the exact expected values
    of the same metrics for a uniformly random ranking of the index, averaged over the
    evaluated queries (each with its own number of relevant images).
    """

    ranking: str
    ks: tuple[int, ...]
    cutoff: int | None
    index_size: int
    index_type: str
    results: tuple[QueryResult, ...]
    skipped: tuple[SkippedQuery, ...]
    partially_missing: tuple[SkippedQuery, ...]
    mrr: float
    recall: Mapping[int, float]
    ndcg: float
    mean_rank: float | None
    median_rank: float | None
    chance_mrr: float
    chance_recall: Mapping[int, float]
    chance_mean_rank: float | None
    seconds: float
    encode_seconds: float
    rank_seconds: float

    @property
    def queries(self) -> int:
        """Number of evaluated queries (skipped ones excluded)."""
        return len(self.results)

    @property
    def missing_relevant(self) -> int:
        """Relevant paths, over all queries, that are not in the index."""
        return sum(len(s.missing) for s in (*self.skipped, *self.partially_missing))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"queries": self.queries, "ranking": self.ranking, "mrr": self.mrr}
        if self.cutoff is not None:
            out[f"mrr@{self.cutoff}"] = self.mrr
        out.update({f"recall@{k}": v for k, v in self.recall.items()})
        out[f"ndcg@{NDCG_K}"] = self.ndcg
        out["mean_rank"] = self.mean_rank
        out["median_rank"] = self.median_rank
        out["chance_mrr"] = self.chance_mrr
        out.update({f"chance_recall@{k}": v for k, v in self.chance_recall.items()})
        out["chance_mean_rank"] = self.chance_mean_rank
        out["index_size"] = self.index_size
        out["index_type"] = self.index_type
        out["skipped_queries"] = len(self.skipped)
        out["missing_relevant"] = self.missing_relevant
        out["skipped"] = [s.to_dict() for s in self.skipped]
        out["partially_missing"] = [s.to_dict() for s in self.partially_missing]
        out["seconds"] = self.seconds
        out["encode_seconds"] = self.encode_seconds
        out["rank_seconds"] = self.rank_seconds
        return out


def _int_or_none(rank: float) -> int | None:
    return int(rank) if math.isfinite(rank) else None


__all__ = ["NDCG_K", "EvalReport", "QueryResult", "SkippedQuery"]
