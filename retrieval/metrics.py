"""The documented import path of the retrieval metrics (README: ``retrieval.metrics``).

The functions live in :mod:`retrieval.evaluation.metrics`; this module only re-exports them so
that scripts written against the README keep working.
"""

from __future__ import annotations

from .evaluation.metrics import (
    expected_random_mrr,
    expected_random_rank,
    expected_random_recall,
    mean_rank,
    median_rank,
    mrr,
    ndcg_at_k,
    ndcg_scores,
    recall_at_k,
    reciprocal_ranks,
)

__all__ = [
    "expected_random_mrr",
    "expected_random_rank",
    "expected_random_recall",
    "mean_rank",
    "median_rank",
    "mrr",
    "ndcg_at_k",
    "ndcg_scores",
    "recall_at_k",
    "reciprocal_ranks",
]
