"""Retrieval evaluation: labelled queries in, MRR, Recall@K, nDCG@10 and ranks out.

The room for everything ``clipsearch eval`` and the quality benchmarks need:

* :mod:`.queries`: the :class:`Query` type and the queries file (``load_queries``).
* :mod:`.run`: :func:`evaluate`, the driver, and its :class:`EvalOptions` (``parse_ks``).
* :mod:`.ranking`: exact ranking over the stored embeddings (``exact_ranks``), pure numpy.
* :mod:`.results`: the report types (:class:`EvalReport`, :class:`QueryResult`, ...).
* :mod:`.metrics`: the metrics as plain numpy functions of ranks, with chance levels.
* :mod:`.caption_datasets`: Karpathy / caption CSV / caption JSONL loaders that turn a
  captioned dataset into the images to index and a queries file (benchmarks, tests).

``retrieval.evaluate`` and ``retrieval.metrics``, the import paths the README documents,
re-export these names.
"""

from __future__ import annotations

from . import metrics
from .caption_datasets import (
    CaptionedSet,
    apply_split_file,
    load_captions_csv,
    load_captions_jsonl,
    load_dataset,
    load_karpathy,
    queries_of,
    write_image_list,
    write_queries,
)
from .queries import Query, load_queries
from .ranking import canonical_scores, exact_ranks
from .results import EvalReport, QueryResult, SkippedQuery
from .run import DEFAULT_KS, EvalOptions, evaluate, parse_ks

__all__ = [
    "DEFAULT_KS",
    "CaptionedSet",
    "EvalOptions",
    "EvalReport",
    "Query",
    "QueryResult",
    "SkippedQuery",
    "apply_split_file",
    "canonical_scores",
    "evaluate",
    "exact_ranks",
    "load_captions_csv",
    "load_captions_jsonl",
    "load_dataset",
    "load_karpathy",
    "load_queries",
    "metrics",
    "parse_ks",
    "queries_of",
    "write_image_list",
    "write_queries",
]
