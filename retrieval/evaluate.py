"""The documented import path of the evaluation API that ``clipsearch eval`` (:mod:`clipsearch.cli.evaluate`) runs.

The code lives in :mod:`retrieval.tools.evaluation`; this module only re-exports its names so that
scripts written against those docs keep working.
"""

from __future__ import annotations

from .tools.evaluation.driver import DEFAULT_KS, EvalOptions, evaluate, parse_ks
from .tools.evaluation.queries import Query, load_queries
from .tools.evaluation.ranking import canonical_scores, exact_ranks
from .tools.evaluation.results import EvalReport, QueryResult, SkippedQuery
from .tools.evaluation.stored_captions import caption_queries

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
