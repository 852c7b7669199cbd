"""Retrieval evaluation: labelled queries in, MRR, Recall@K, nDCG@10 and ranks out.

The room for everything ``clipsearch eval`` and the quality benchmarks need:

* :mod:`.queries`: the :class:`Query` type and the queries file (``load_queries``).
* :mod:`.run`: :func:`evaluate`, the driver, and its :class:`EvalOptions` (``parse_ks``).
* :mod:`.ranking`: exact ranking over the stored embeddings (``exact_ranks``), pure numpy.
* :mod:`.results`: the report types (:class:`EvalReport`, :class:`QueryResult`, ...).
* :mod:`.metrics`: the metrics as plain numpy functions of ranks, with chance levels.
* :mod:`.captioned_set`: :class:`CaptionedSet`, images and their captions, and the image-path rule.
* :mod:`.dataset_readers`: the Karpathy JSON / caption CSV / caption JSONL readers (``load_dataset``).
* :mod:`.stored_captions`: queries from an index's own captions (``caption_queries``).
* :mod:`.split_files`: selecting a split's images with a split file (``apply_split_file``).
* :mod:`.dataset_writers`: a set's queries file and image list (``write_queries``), for the
  quality benchmarks and tests.

``retrieval.evaluate`` and ``retrieval.metrics``, the import paths docs/evaluation.md documents,
re-export these names.
"""

from __future__ import annotations

from . import metrics
from .captioned_set import CaptionedSet
from .dataset_readers import load_captions_csv, load_captions_jsonl, load_dataset, load_karpathy
from .dataset_writers import queries_of, write_image_list, write_queries
from .driver import DEFAULT_KS, EvalOptions, evaluate, parse_ks
from .queries import Query, load_queries
from .ranking import canonical_scores, exact_ranks
from .results import EvalReport, QueryResult, SkippedQuery
from .split_files import apply_split_file
from .stored_captions import caption_queries

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
    "caption_queries",
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
