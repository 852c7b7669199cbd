"""The documented import path of the evaluation API (docs/evaluation.md: ``from retrieval.evaluate import ...``).

The code lives in :mod:`retrieval.evaluation`; this module only re-exports its names so that
scripts written against those docs keep working.
"""

from __future__ import annotations

from .evaluation.queries import Query, load_queries
from .evaluation.ranking import canonical_scores, exact_ranks
from .evaluation.results import EvalReport, QueryResult, SkippedQuery
from .evaluation.run import DEFAULT_KS, EvalOptions, evaluate, parse_ks
from .evaluation.stored_captions import caption_queries

__all__ = [
    "DEFAULT_KS",
    "canonical_scores",
    "caption_queries",
    "EvalOptions",
    "EvalReport",
    "Query",
    "QueryResult",
    "SkippedQuery",
    "evaluate",
    "exact_ranks",
    "load_queries",
    "parse_ks",
]
