"""Retrieval evaluation: labelled queries in, MRR, Recall@K, nDCG@10 and ranks out.

The driver: :func:`evaluate` encodes the queries with the index's own encoder, ranks the
index for each (exactly by default, :mod:`.ranking`; with ``ann=True`` the index's own FAISS
search ranks the top K instead), and measures where the relevant images land
(:mod:`.metrics`). Queries come from :mod:`.queries`; the report types are in :mod:`.results`.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...checks import is_positive_int
from ...encoders.languages import language_embedder
from ...errors import (
    EvaluationError,
    ImageDecodeError,
    InvalidArgumentError,
    QueriesFileError,
)
from ...images import DEFAULT_MAX_PIXELS, load_pixels
from ...index import Hit
from ...keywords import check_mode
from . import metrics
from .queries import Query
from .ranking import DEFAULT_BATCH_SIZE, DEFAULT_CHUNK_ROWS, TOP_N, exact_ranks
from .results import NDCG_K, EvalReport, QueryResult, SkippedQuery

if TYPE_CHECKING:
    from ...index import ImageIndex

DEFAULT_KS: tuple[int, ...] = (1, 5, 10)


# -- options -------------------------------------------------------------------------------------


def parse_ks(text: str) -> tuple[int, ...]:
    """``"1,5,10"`` -> ``(1, 5, 10)``: sorted, without repeats.

    Raises:
        InvalidArgumentError: empty, or an item that is not an integer >= 1.
    """
    message = f"--k must be a comma-separated list of integers >= 1 (e.g. 1,5,10), got {text!r}"
    try:
        ks = [int(item.strip()) for item in text.split(",")]
    except ValueError:
        raise InvalidArgumentError(message) from None
    if any(k < 1 for k in ks):
        raise InvalidArgumentError(message)
    return _check_ks(ks)


def _check_ks(ks: Iterable[int]) -> tuple[int, ...]:
    if isinstance(ks, (str, bytes)):
        raise InvalidArgumentError(f"ks must be a list of integers, got {ks!r}; use parse_ks for text")
    ks = list(ks)
    bad = [k for k in ks if not is_positive_int(k)]
    if not ks or bad:
        raise InvalidArgumentError(f"k values must be integers >= 1 (e.g. 1,5,10), got {ks!r}")
    return tuple(sorted({int(k) for k in ks}))


@dataclass(frozen=True)
class EvalOptions:
    """How :func:`evaluate` ranks.

    Attributes:
        ks: cut-offs of Recall@K (sorted, unique).
        ann: rank with the index's FAISS search (top ``cutoff`` only) instead of exactly.
        batch_size: queries encoded and ranked together; the exact ranking reads the
            embeddings once per batch.
        chunk_rows: stored embeddings scored per step of the exact ranking; with
            ``batch_size`` it bounds memory (``chunk_rows * batch_size`` float32 scores).
        mode: how text queries rank: ``vector`` (the default: the papers' ranking), or
            ``hybrid`` / ``keyword`` (:mod:`retrieval.hybrid`, the top ``cutoff`` like ``ann``);
            image queries rank by vector in every mode.

    Raises:
        InvalidArgumentError: empty or bad ``ks``, ``batch_size`` or ``chunk_rows`` < 1.
    """

    ks: tuple[int, ...] = DEFAULT_KS
    ann: bool = False
    batch_size: int = DEFAULT_BATCH_SIZE
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    mode: str = "vector"

    def __post_init__(self) -> None:
        check_mode(self.mode)
        object.__setattr__(self, "ks", _check_ks(self.ks))
        for name in ("batch_size", "chunk_rows"):
            value = getattr(self, name)
            if not is_positive_int(value):
                raise InvalidArgumentError(f"{name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.ann, bool):
            raise InvalidArgumentError(f"ann must be True or False, got {self.ann!r}")

    @property
    def top_only(self) -> bool:
        """Whether only the top :attr:`cutoff` is ranked (ANN, or a mode other than vector)."""
        return self.ann or self.mode != "vector"

    @property
    def cutoff(self) -> int:
        """How many results the ANN search retrieves: enough for every K and for nDCG@10."""
        return max(max(self.ks), NDCG_K)


# -- the driver ----------------------------------------------------------------------------------


def evaluate(
    index: ImageIndex,
    queries: Sequence[Query],
    ks: Sequence[int] = DEFAULT_KS,
    ann: bool = False,
    batch_size: int = DEFAULT_BATCH_SIZE,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    per_query_path: str | os.PathLike[str] | None = None,
    query_lang: str | None = None,
    mode: str = "vector",
) -> EvalReport:
    """Rank the index for every query and measure where its relevant images land.

    Images are ranked by descending cosine score, equal scores by ascending id (the order of
    ``ImageIndex.search``); see :mod:`.ranking` for how exact ranks are computed.
    Relevant paths that are not in the index are reported, never silently dropped: a query
    with none of them present is skipped (``report.skipped``), one with some present is
    evaluated on those (``report.partially_missing``).

    Args:
        index: an open index; its query encoder embeds the texts and images.
        queries: from :func:`load_queries` or built in code.
        ks: cut-offs of Recall@K.
        ann: rank with the index's FAISS search (top ``max(ks + [10])``) instead of exactly;
            MRR is then MRR@K and mean/median rank are None.
        batch_size: queries per encoder call and per pass over the embeddings.
        chunk_rows: stored embeddings scored at a time by the exact ranking.
        per_query_path: also write one JSON line per evaluated query there (written whole
            at the end, replacing the file).
        query_lang: the texts' FLORES-200 code, for a model whose tokenizer needs one
            (NLLB-CLIP, see :meth:`ImageIndex.query_languages`); ignored by the others.
        mode: ``vector`` (default), ``hybrid`` or ``keyword``: how text queries rank (see
            :class:`EvalOptions`); the metrics are then @``cutoff``, as with ``ann``.

    Returns:
        The report; ``report.to_dict()`` is the JSON summary.

    Raises:
        InvalidArgumentError: bad ``ks``, ``batch_size``, ``chunk_rows``, no queries, or a
            ``per_query_path`` whose directory does not exist or cannot be written.
        QueriesFileError: a query image cannot be decoded.
        EvaluationError: no query has any relevant image in the index.
        ModelMismatchError, ModelLoadError: from loading the index's query encoder.
    """
    options = EvalOptions(ks=_check_ks(ks), ann=ann, batch_size=batch_size, chunk_rows=chunk_rows, mode=mode)
    queries = list(queries)
    if not queries:
        raise InvalidArgumentError("no queries to evaluate")
    for q in queries:
        if not isinstance(q, Query):
            raise InvalidArgumentError(f"queries must be Query objects, got {type(q).__name__}")
    out_path = _check_output_path(per_query_path) if per_query_path is not None else None
    started = time.perf_counter()

    paths = index.paths()
    lookup: dict[str, int] = {}
    for i, p in enumerate(paths):
        lookup.setdefault(p, i)
    evaluated: list[tuple[Query, np.ndarray, tuple[str, ...]]] = []
    skipped: list[SkippedQuery] = []
    partial: list[SkippedQuery] = []
    for q in queries:
        present = [lookup[p] for p in q.relevant if p in lookup]
        missing = tuple(p for p in q.relevant if p not in lookup)
        if not present:
            skipped.append(SkippedQuery(q, missing))
            continue
        if missing:
            partial.append(SkippedQuery(q, missing))
        evaluated.append((q, np.asarray(present, dtype=np.int64), missing))
    if not evaluated:
        first = skipped[0]
        where = f"line {first.query.line}" if first.query.line is not None else "the first query"
        raise EvaluationError(
            f"none of the {len(queries)} queries has a relevant image in the index (e.g. {where}: "
            f"{first.missing[0]!r}); 'relevant' paths must be as the index stores them, relative to "
            "the indexed folder (see `clipsearch search --json`)"
        )

    vectors = _embed_queries(index, [q for q, _, _ in evaluated], options.batch_size, query_lang)
    encoded = time.perf_counter()
    relevant = [ids for _, ids, _ in evaluated]
    if options.top_only:
        texts = [q.text if q.image is None else None for q, _, _ in evaluated]
        ranks, top_ids, top_scores = _rank_ann(index, vectors, relevant, options, texts)
    else:
        ranks, top_ids, top_scores = exact_ranks(
            index.iter_embeddings,
            index.count,
            vectors,
            relevant,
            batch_size=options.batch_size,
            chunk_rows=options.chunk_rows,
            top_n=TOP_N,
        )
    ranked = time.perf_counter()

    report = _report(index, options, evaluated, ranks, top_ids, top_scores, skipped, partial, paths)
    if out_path is not None:
        _write_per_query(out_path, report)
    return replace(
        report, seconds=time.perf_counter() - started, encode_seconds=encoded - started, rank_seconds=ranked - encoded
    )


def _check_output_path(path: str | os.PathLike[str]) -> Path:
    out = Path(path)
    parent = out.parent
    if not parent.is_dir():
        raise InvalidArgumentError(f"cannot write the per-query file {out}: directory {parent} does not exist")
    if out.is_dir():
        raise InvalidArgumentError(f"cannot write the per-query file {out}: it is a directory")
    if not os.access(parent, os.W_OK):
        raise InvalidArgumentError(f"cannot write the per-query file {out}: directory {parent} is not writable")
    return out


def _embed_queries(index: ImageIndex, queries: Sequence[Query], batch_size: int, query_lang: str | None) -> np.ndarray:
    """``(len(queries), dim)`` normalised query vectors, texts and images in batches."""
    out = np.empty((len(queries), index.dim), dtype=np.float32)
    texts = [i for i, q in enumerate(queries) if q.text is not None]
    images = [i for i, q in enumerate(queries) if q.image is not None]
    if texts:
        # On the index's text encoder, as searches embed them: the numpy tower where it applies,
        # so the one-shot rule (few texts: fp32, no torch) and the gate hold for eval too.
        embed_texts = language_embedder(index.text_encoder, query_lang)[1]
        for start in range(0, len(texts), batch_size):
            rows = texts[start : start + batch_size]
            out[rows] = embed_texts([str(queries[i].text) for i in rows])
    cfg = index.preprocess
    for start in range(0, len(images), batch_size):
        rows = images[start : start + batch_size]
        pixels = []
        for i in rows:
            q = queries[i]
            try:
                pixels.append(load_pixels(q.image, cfg, max_pixels=DEFAULT_MAX_PIXELS)[0])  # type: ignore[arg-type]  # rows have an image
            except ImageDecodeError as exc:
                raise QueriesFileError(f"cannot decode query image {q.image}: {exc.reason}", line=q.line) from exc
        # Stacked with tensor methods: torch itself is imported only by the encoders module.
        batch = pixels[0].new_empty((len(pixels), *pixels[0].shape))
        for j, p in enumerate(pixels):
            batch[j] = p
        out[rows] = index.encoder.embed_pixels(batch)
    return out


def _rank_ann(
    index: ImageIndex, vectors: np.ndarray, relevant: Sequence[np.ndarray], options: EvalOptions,
    texts: Sequence[str | None] = (),
) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """Ranks within the top ``cutoff`` (``inf`` beyond) of the FAISS search, or of
    ``options.mode`` for the text queries (``texts``, None for an image query), and the top ``TOP_N``."""
    n = len(vectors)
    top_ids = np.full((n, TOP_N), -1, dtype=np.int64)
    top_scores = np.full((n, TOP_N), -np.inf, dtype=np.float32)
    ranks: list[np.ndarray] = []
    for start in range(0, n, options.batch_size):
        hits = index.search_vectors(vectors[start : start + options.batch_size], options.cutoff)
        if options.mode != "vector":
            for j in range(len(hits)):
                text = texts[start + j]
                if text is not None:
                    hits[j] = index.search_embedded([text], vectors[start + j][None], options.cutoff, mode=options.mode)[0]
        for j, row in enumerate(hits):
            position = {h.id: r for r, h in enumerate(row, 1)}
            ranks.append(np.array([position.get(int(i), np.inf) for i in relevant[start + j]], dtype=np.float64))
            shown = row[:TOP_N]
            top_ids[start + j, : len(shown)] = [h.id for h in shown]
            top_scores[start + j, : len(shown)] = [h.score for h in shown]
    return ranks, top_ids, top_scores


def _report(
    index: ImageIndex,
    options: EvalOptions,
    evaluated: Sequence[tuple[Query, np.ndarray, tuple[str, ...]]],
    ranks: Sequence[np.ndarray],
    top_ids: np.ndarray,
    top_scores: np.ndarray,
    skipped: Sequence[SkippedQuery],
    partial: Sequence[SkippedQuery],
    paths: Sequence[str],
) -> EvalReport:
    first = np.array([r.min() for r in ranks], dtype=np.float64)
    ndcg = metrics.ndcg_scores(ranks, NDCG_K)
    n_items = index.count
    cutoff = options.cutoff if options.top_only else None
    # Chance levels depend only on each query's number of relevant images: one value per count.
    counts = np.array([len(r) for r in ranks], dtype=np.int64)
    distinct = np.unique(counts)

    def chance(fn: Callable[[int], float]) -> float:
        table = {int(c): fn(int(c)) for c in distinct}
        return float(np.mean([table[int(c)] for c in counts]))

    results = tuple(
        QueryResult(
            query=q,
            relevant=tuple(paths[int(i)] for i in ids),
            relevant_ids=tuple(int(i) for i in ids),
            missing=missing,
            ranks=tuple(float(r) for r in rk),
            ndcg=float(nd),
            top=tuple(Hit(int(i), paths[int(i)], float(s)) for i, s in zip(tids, tsc, strict=True) if i >= 0),
        )
        for (q, ids, missing), rk, nd, tids, tsc in zip(evaluated, ranks, ndcg, top_ids, top_scores, strict=True)
    )
    return EvalReport(
        ranking=options.mode if options.mode != "vector" else "ann" if options.ann else "exact",
        ks=options.ks,
        cutoff=cutoff,
        index_size=n_items,
        index_type=str(index.manifest.index_type),
        results=results,
        skipped=tuple(skipped),
        partially_missing=tuple(partial),
        mrr=metrics.mrr(first),
        recall={k: metrics.recall_at_k(first, k) for k in options.ks},
        ndcg=float(ndcg.mean()),
        mean_rank=None if options.top_only else metrics.mean_rank(first),
        median_rank=None if options.top_only else metrics.median_rank(first),
        chance_mrr=chance(lambda r: metrics.expected_random_mrr(n_items, r, cutoff)),
        chance_recall={k: chance(functools.partial(metrics.expected_random_recall, n_items, k=k)) for k in options.ks},
        chance_mean_rank=None if options.top_only else chance(lambda r: metrics.expected_random_rank(n_items, r)),
        seconds=0.0,  # timed by the caller
        encode_seconds=0.0,
        rank_seconds=0.0,
    )


def _write_per_query(path: Path, report: EvalReport) -> None:
    """Write the per-query JSON lines next to ``path`` first, then rename: never half a file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8", errors="backslashreplace") as fh:
            for result in report.results:
                fh.write(json.dumps(result.to_dict(report.ks), ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise InvalidArgumentError(f"cannot write the per-query file {path}: {exc.strerror}") from exc


__all__ = ["DEFAULT_KS", "EvalOptions", "evaluate", "parse_ks"]
