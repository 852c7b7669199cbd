"""Retrieval evaluation: labelled queries in, MRR, Recall@K, nDCG@10 and ranks out.

Queries file (JSON Lines, UTF-8): one object per line,
``{"query": "a red bus", "relevant": ["town/bus.png", ...]}`` for a text query or
``{"image": "queries/bus.jpg", "relevant": [...]}`` for an image query. ``relevant`` lists
paths exactly as the index's ``path`` column stores them (relative to the indexed folder). A
relative ``image`` path is relative to the directory of the queries file. Other keys ("id",
"category", ...) are ignored; blank lines are skipped; line numbers in messages count every
line of the file.

Ranking. Images are ordered by descending cosine score, equal scores by ascending id: the
order :meth:`retrieval.index.ImageIndex.search` returns. By default the rank of every relevant
image in the *full* ranking is computed exactly, by brute force over the stored embeddings,
streamed from the Parquet files ``chunk_rows`` at a time, so memory does not grow with the
index. With ``ann=True`` the index's own FAISS search ranks the top K instead.

How exact ranks stay exact: a float32 dot product computed by BLAS depends on the shape of
the matrix product it is part of and even on the row's position in it (on OpenBLAS two equal
embeddings in one block can score a few ulps apart). Ranks must not depend on that, so the
score that decides the order is :func:`canonical_scores`: the float32 products, exact in
float64, summed in a fixed pairwise tree, a function of the two vectors only. Equal embeddings
thus score equally and tie by id, and an image never outranks itself. Computing it for every
image would be slow, so the stream is scored with float32 BLAS products and only images whose
float32 score lies within the rounding-error bound of a relevant image's canonical score
(``(gamma32(dim) + gamma64(log2 dim)) * max|x| * |q|``) get a canonical score; the others are
certainly above or below it. The result equals sorting all canonical scores, whatever
``chunk_rows`` and ``batch_size`` are. Scores in ``search`` results come from FAISS and can
differ from canonical ones in the last float32 bits, so two images whose scores differ by
less than that may be listed in the other order there.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from . import metrics
from .errors import (
    EvaluationError,
    ImageDecodeError,
    InvalidArgumentError,
    QueriesFileError,
)
from .images import DEFAULT_MAX_PIXELS, load_pixels
from .jsonl import read_lines
from .index import Hit

if TYPE_CHECKING:
    from .index import ImageIndex

DEFAULT_KS: tuple[int, ...] = (1, 5, 10)
DEFAULT_BATCH_SIZE = 256
DEFAULT_CHUNK_ROWS = 65_536
NDCG_K = 10
TOP_N = 10  # results listed per query in the per-query file

# Bound on the elements of the float64 temporaries of canonical scoring (32 MiB each).
_BLOCK_ELEMENTS = 1 << 22

ChunkSource = Callable[[int], Iterable[tuple[int, np.ndarray]]]
"""``source(rows)`` yields ``(first_id, (n, dim) float32)`` blocks of consecutive ids, from 0."""


# -- queries --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Query:
    """One labelled query: a text or an image, and the index paths that are relevant to it.

    ``relevant`` is stored as a tuple without repeats (first occurrence kept). ``line`` is the
    1-based line of the queries file it came from (None for queries built in code).

    Raises:
        InvalidArgumentError: neither or both of ``text`` and ``image``, an empty text or image
            path, or ``relevant`` not a non-empty list of non-empty path strings.
    """

    relevant: tuple[str, ...]
    text: str | None = None
    image: Path | None = None
    line: int | None = None

    def __post_init__(self) -> None:
        if (self.text is None) == (self.image is None):
            both = "not both" if self.text is not None else "found neither"
            raise InvalidArgumentError(f'a query needs either "query" (a text) or "image" (a path), {both}')
        if self.text is not None and (not isinstance(self.text, str) or not self.text.strip()):
            raise InvalidArgumentError(f'"query" must be a non-empty text, got {self.text!r}')
        if self.image is not None:
            if not isinstance(self.image, (str, os.PathLike)) or not os.fspath(self.image):
                raise InvalidArgumentError(f'"image" must be a non-empty path, got {self.image!r}')
            object.__setattr__(self, "image", Path(self.image))
        relevant = self.relevant
        if isinstance(relevant, (str, bytes)) or not isinstance(relevant, (list, tuple)):
            raise InvalidArgumentError(f'"relevant" must be a list of image paths, got {type(relevant).__name__}')
        if not relevant:
            raise InvalidArgumentError('"relevant" is empty: list at least one image path')
        for i, path in enumerate(relevant):
            if not isinstance(path, str) or not path:
                raise InvalidArgumentError(f'"relevant"[{i}] must be a non-empty path string, got {path!r}')
        object.__setattr__(self, "relevant", tuple(dict.fromkeys(relevant)))

    def describe(self) -> dict[str, Any]:
        """``{"query": text}`` or ``{"image": path}``, as reports show the query."""
        return {"query": self.text} if self.text is not None else {"image": os.fspath(self.image)}  # type: ignore[arg-type]


def load_queries(path: str | os.PathLike[str]) -> list[Query]:
    """Read a queries file (JSON Lines; see the module docstring for the format).

    Args:
        path: the queries file. Relative ``image`` paths in it are resolved against its
            directory; those images must exist.

    Returns:
        The queries in file order, each with its line number.

    Raises:
        QueriesFileError: the file is missing or unreadable, holds no query, or a line is not
            UTF-8, not JSON, not an object, has neither or both of "query" and "image", an
            empty query, a missing image, or a missing, empty or non-string "relevant" list.
            The message names the file and line.
    """
    file = os.fspath(path)
    lines = read_lines(file, "queries file", QueriesFileError)
    base = Path(os.path.abspath(os.path.dirname(file) or "."))
    queries: list[Query] = []
    for number, raw in lines:
        try:
            obj = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise QueriesFileError("not valid UTF-8", file, number) from None
        except json.JSONDecodeError as exc:
            raise QueriesFileError(f"not valid JSON ({exc.msg} at column {exc.colno})", file, number) from None
        queries.append(_parse_query(obj, base, file, number))
    if not queries:
        raise QueriesFileError("holds no queries (one JSON object per line expected)", file)
    return queries


def _parse_query(obj: Any, base: Path, file: str, line: int) -> Query:
    if not isinstance(obj, dict):
        raise QueriesFileError(f"expected a JSON object, got {type(obj).__name__}", file, line)
    if "relevant" not in obj:
        raise QueriesFileError('"relevant" is missing: list the index paths relevant to this query', file, line)
    image = obj.get("image")
    try:
        query = Query(relevant=obj["relevant"], text=obj.get("query"), image=image, line=line)
    except InvalidArgumentError as exc:
        raise QueriesFileError(str(exc), file, line) from None
    if query.image is not None:
        resolved = Path(os.path.abspath(base / query.image))
        if not resolved.is_file():
            raise QueriesFileError(f"query image not found: {resolved}", file, line)
        query = Query(relevant=query.relevant, image=resolved, line=line)
    return query


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
    bad = [k for k in ks if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1]
    if not ks or bad:
        raise InvalidArgumentError(f"k values must be integers >= 1 (e.g. 1,5,10), got {ks!r}")
    return tuple(sorted({int(k) for k in ks}))


# -- options and results ---------------------------------------------------------------------


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

    Raises:
        InvalidArgumentError: empty or bad ``ks``, ``batch_size`` or ``chunk_rows`` < 1.
    """

    ks: tuple[int, ...] = DEFAULT_KS
    ann: bool = False
    batch_size: int = DEFAULT_BATCH_SIZE
    chunk_rows: int = DEFAULT_CHUNK_ROWS

    def __post_init__(self) -> None:
        object.__setattr__(self, "ks", _check_ks(self.ks))
        for name in ("batch_size", "chunk_rows"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise InvalidArgumentError(f"{name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.ann, bool):
            raise InvalidArgumentError(f"ann must be True or False, got {self.ann!r}")

    @property
    def cutoff(self) -> int:
        """How many results the ANN search retrieves: enough for every K and for nDCG@10."""
        return max(max(self.ks), NDCG_K)


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


# -- evaluate ------------------------------------------------------------------------------------


def evaluate(
    index: ImageIndex,
    queries: Sequence[Query],
    ks: Sequence[int] = DEFAULT_KS,
    ann: bool = False,
    batch_size: int = DEFAULT_BATCH_SIZE,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    per_query_path: str | os.PathLike[str] | None = None,
) -> EvalReport:
    """Rank the index for every query and measure where its relevant images land.

    Images are ranked by descending cosine score, equal scores by ascending id (the order of
    ``ImageIndex.search``); see the module docstring for how exact ranks are computed.
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

    Returns:
        The report; ``report.to_dict()`` is the JSON summary.

    Raises:
        InvalidArgumentError: bad ``ks``, ``batch_size``, ``chunk_rows``, no queries, or a
            ``per_query_path`` whose directory does not exist or cannot be written.
        QueriesFileError: a query image cannot be decoded.
        EvaluationError: no query has any relevant image in the index.
        ModelMismatchError, ModelLoadError: from loading the index's query encoder.
    """
    options = EvalOptions(ks=ks, ann=ann, batch_size=batch_size, chunk_rows=chunk_rows)
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

    vectors = _embed_queries(index, [q for q, _, _ in evaluated], options.batch_size)
    encoded = time.perf_counter()
    relevant = [ids for _, ids, _ in evaluated]
    if options.ann:
        ranks, top_ids, top_scores = _rank_ann(index, vectors, relevant, options)
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


def _embed_queries(index: ImageIndex, queries: Sequence[Query], batch_size: int) -> np.ndarray:
    """``(len(queries), dim)`` normalised query vectors, texts and images in batches."""
    encoder = index.encoder
    out = np.empty((len(queries), index.dim), dtype=np.float32)
    texts = [i for i, q in enumerate(queries) if q.text is not None]
    images = [i for i, q in enumerate(queries) if q.image is not None]
    for start in range(0, len(texts), batch_size):
        rows = texts[start : start + batch_size]
        out[rows] = encoder.embed_texts([queries[i].text for i in rows])  # type: ignore[misc]
    cfg = index.preprocess
    for start in range(0, len(images), batch_size):
        rows = images[start : start + batch_size]
        pixels = []
        for i in rows:
            q = queries[i]
            try:
                pixels.append(load_pixels(q.image, cfg, max_pixels=DEFAULT_MAX_PIXELS)[0])  # type: ignore[arg-type]
            except ImageDecodeError as exc:
                raise QueriesFileError(f"cannot decode query image {q.image}: {exc.reason}", line=q.line) from exc
        # Stacked with tensor methods: torch itself is imported only by the encoders module.
        batch = pixels[0].new_empty((len(pixels), *pixels[0].shape))
        for j, p in enumerate(pixels):
            batch[j] = p
        out[rows] = encoder.embed_pixels(batch)
    return out


def _rank_ann(
    index: ImageIndex, vectors: np.ndarray, relevant: Sequence[np.ndarray], options: EvalOptions
) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """Ranks within the FAISS top ``cutoff`` (``inf`` beyond), and the top ``TOP_N``."""
    n = len(vectors)
    top_ids = np.full((n, TOP_N), -1, dtype=np.int64)
    top_scores = np.full((n, TOP_N), -np.inf, dtype=np.float32)
    ranks: list[np.ndarray] = []
    for start in range(0, n, options.batch_size):
        hits = index.search_vectors(vectors[start : start + options.batch_size], options.cutoff)
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
    cutoff = options.cutoff if options.ann else None
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
        ranking="ann" if options.ann else "exact",
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
        mean_rank=None if options.ann else metrics.mean_rank(first),
        median_rank=None if options.ann else metrics.median_rank(first),
        chance_mrr=chance(lambda r: metrics.expected_random_mrr(n_items, r, cutoff)),
        chance_recall={k: chance(lambda r, k=k: metrics.expected_random_recall(n_items, r, k)) for k in options.ks},
        chance_mean_rank=None if options.ann else chance(lambda r: metrics.expected_random_rank(n_items, r)),
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


# -- exact ranking ---------------------------------------------------------------------------


def canonical_scores(items: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """Row-wise dot products ``items[i] . queries[i]`` as a deterministic function of the two rows.

    The float32 products are exact in float64; they are summed in a fixed pairwise tree of
    elementwise additions, each correctly rounded, so the result depends only on the values,
    never on where a row sits in a matrix or on the BLAS library. Error bound:
    ``gamma64(ceil(log2 dim)) * sum(|x_k q_k|)``.

    Args:
        items: ``(m, dim)`` float32.
        queries: ``(m, dim)`` float32, one query row per item row.

    Returns:
        ``(m,)`` float64 scores.
    """
    p = np.asarray(items, dtype=np.float32).astype(np.float64) * np.asarray(queries, dtype=np.float32).astype(np.float64)
    while p.shape[1] > 1:
        half = p.shape[1] // 2
        paired = p[:, :half] + p[:, half : 2 * half]
        p = np.concatenate([paired, p[:, 2 * half :]], axis=1) if p.shape[1] % 2 else paired
    return p[:, 0] if p.shape[1] else np.zeros(len(p))


def _score_error_bound(dim: int) -> float:
    """Bound on ``|float32 BLAS dot - canonical dot| / (|x| |q|)`` for vectors of length dim.

    Any float32 summation order (FMA or not) is within ``gamma32(dim) * sum|x_k q_k|`` of the
    exact value, the canonical score within ``gamma64(log2 dim)`` of it, and
    ``sum|x_k q_k| <= |x| |q|``.
    """
    depth = max(1, math.ceil(math.log2(max(dim, 1))))
    gamma32 = dim * 2.0**-24 / (1 - dim * 2.0**-24)
    gamma64 = depth * 2.0**-53 / (1 - depth * 2.0**-53)
    return (gamma32 + gamma64) * (1 + 1e-6)


def _round_out(values: np.ndarray, direction: float) -> np.ndarray:
    """float64 -> float32 thresholds rounded away from the band (down for lows, up for highs)."""
    return np.nextafter(values.astype(np.float32), np.float32(direction))


def exact_ranks(
    source: ChunkSource,
    count: int,
    queries: np.ndarray,
    relevant: Sequence[np.ndarray],
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    top_n: int = TOP_N,
) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """Exact 1-based ranks of relevant items in the full ranking of each query.

    Items are ranked by descending :func:`canonical_scores` (the dot product, computed the
    same way for every item, so equal embeddings score equally), equal scores by ascending
    id. The bulk of the work is float32 BLAS products over ``chunk_rows`` items at a time;
    only items whose float32 score is within the rounding-error bound of a relevant item's
    score get a canonical score. The result does not depend on ``batch_size`` or
    ``chunk_rows``. Memory is ``O(chunk_rows * batch_size + relevant rows * dim)``: the
    embeddings are read once to gather the relevant rows, then once per batch of queries.

    Args:
        source: ``source(rows)`` yields ``(first_id, (n <= rows, dim) float32)`` blocks
            covering ids ``0..count-1`` in order (e.g. ``ImageIndex.iter_embeddings``).
        count: number of items.
        queries: ``(n_queries, dim)`` float32 query vectors.
        relevant: per query, the ids of its relevant items (at least one, in ``0..count-1``).
        batch_size: queries scored per pass over the items.
        chunk_rows: items scored per matrix product.
        top_n: also return the first ``top_n`` items of each ranking.

    Returns:
        ``(ranks, top_ids, top_scores)``: per query a float array of ranks aligned with
        ``relevant[i]``; ``(n_queries, top_n)`` ids (-1 past the end of a short index) and
        their canonical scores rounded to float32.

    Raises:
        InvalidArgumentError: bad shapes, ids out of range, sizes < 1.
        EvaluationError: ``source`` does not yield ``count`` consecutive rows of width dim.
    """
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    if queries.ndim != 2 or len(queries) != len(relevant):
        raise InvalidArgumentError(f"need one query vector per relevant list, got {queries.shape} and {len(relevant)}")
    for name, value in (("batch_size", batch_size), ("chunk_rows", chunk_rows), ("count", count)):
        if value < 1:
            raise InvalidArgumentError(f"{name} must be >= 1, got {value}")
    if top_n < 0:
        raise InvalidArgumentError(f"top_n must be >= 0, got {top_n}")
    rel = [np.asarray(r, dtype=np.int64).reshape(-1) for r in relevant]
    for r in rel:
        if r.size == 0 or r.min() < 0 or r.max() >= count:
            raise InvalidArgumentError(f"every query needs relevant ids in 0..{count - 1}, got {r.tolist()}")
    dim = queries.shape[1]
    rows = min(chunk_rows, count)
    unique_ids = np.unique(np.concatenate(rel))
    gathered, max_norm = _gather(source, count, dim, rows, unique_ids)
    # Per query: how far a float32 BLAS score may be from the canonical score, for any item.
    deltas = _score_error_bound(dim) * max_norm * np.linalg.norm(queries.astype(np.float64), axis=1) + 1e-30

    ranks: list[np.ndarray] = []
    top_ids = np.full((len(queries), top_n), -1, dtype=np.int64)
    top_scores = np.full((len(queries), top_n), -np.inf, dtype=np.float32)
    for start in range(0, len(queries), batch_size):
        stop = min(start + batch_size, len(queries))
        batch_rel = rel[start:stop]
        rel_vectors = gathered[np.searchsorted(unique_ids, np.concatenate(batch_rel))]
        batch = _Batch(queries[start:stop], deltas[start:stop], batch_rel, rel_vectors, top_n)
        for first, block in _chunks(source, count, dim, rows):
            batch.add_chunk(first, block)
        batch_ranks = batch.ranks()
        offsets = np.cumsum([0, *(len(r) for r in batch_rel)])
        ranks.extend(batch_ranks[offsets[j] : offsets[j + 1]] for j in range(len(batch_rel)))
        top_ids[start:stop], top_scores[start:stop] = batch.top()
    return ranks, top_ids, top_scores


def _chunks(source: ChunkSource, count: int, dim: int, rows: int) -> Iterator[tuple[int, np.ndarray]]:
    """The source's blocks, checked to be consecutive, of width ``dim`` and ``count`` rows in all."""
    expected = 0
    for first, block in source(rows):
        block = np.asarray(block, dtype=np.float32)
        if first != expected or block.ndim != 2 or block.shape[1] != dim or len(block) > rows:
            raise EvaluationError(
                f"the stored embeddings do not stream as expected (block at id {first}, shape {block.shape}; "
                f"expected id {expected}, width {dim}, at most {rows} rows); is the index being rebuilt?"
            )
        expected += len(block)
        if len(block):
            yield first, block
    if expected != count:
        raise EvaluationError(f"the index holds {expected} stored embeddings, expected {count}; is the index being rebuilt?")


def _gather(source: ChunkSource, count: int, dim: int, rows: int, ids: np.ndarray) -> tuple[np.ndarray, float]:
    """The rows of the sorted unique ``ids`` and the largest row norm, in one pass."""
    out = np.empty((len(ids), dim), dtype=np.float32)
    max_sq = 0.0
    for first, block in _chunks(source, count, dim, rows):
        lo, hi = np.searchsorted(ids, [first, first + len(block)])
        out[lo:hi] = block[ids[lo:hi] - first]
        max_sq = max(max_sq, float(np.einsum("ij,ij->i", block, block).max()))
    # The float32 sum of squares is itself rounded; a 0.1 % margin only widens the bands.
    return out, math.sqrt(max_sq) * 1.001


class _Batch:
    """The ranking state of one batch of queries while the embeddings stream by.

    For each (query, relevant item) pair with canonical score ``c`` and error bound ``d``, an
    item whose float32 score is above ``c + d`` certainly outranks the relevant item and one
    below ``c - d`` certainly does not; the few in between are compared by canonical score,
    then id. The top lists keep every item whose float32 score is within ``2 d`` of the
    running ``top_n``-th best (a superset of the true top ``top_n``) with its canonical score.
    """

    def __init__(
        self, queries: np.ndarray, deltas: np.ndarray, relevant: Sequence[np.ndarray], rel_vectors: np.ndarray, top_n: int
    ) -> None:
        self.queries = queries
        self.deltas = deltas
        self.top_n = top_n
        self.pair_query = np.concatenate([np.full(len(r), j, dtype=np.int64) for j, r in enumerate(relevant)])
        self.pair_item = np.concatenate(relevant)
        self.pair_score = canonical_scores(rel_vectors, queries[self.pair_query])
        pair_delta = deltas[self.pair_query]
        self.low = _round_out(self.pair_score - pair_delta, -np.inf)
        self.high = _round_out(self.pair_score + pair_delta, np.inf)
        self.outranked_by = np.zeros(len(self.pair_item), dtype=np.int64)
        self.seen_self = np.zeros(len(self.pair_item), dtype=bool)
        # Top-list candidates per query: float32 score, canonical score, id.
        empty = (np.empty(0, np.float32), np.empty(0, np.float64), np.empty(0, np.int64))
        self.candidates: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = [empty] * len(queries)
        self.floor = np.full(len(queries), -np.inf, dtype=np.float32)  # float32 score to enter

    def add_chunk(self, first: int, block: np.ndarray) -> None:
        # (queries, n): each query's scores are one contiguous row, scanned once per pair.
        scores = self.queries @ block.T
        band_rows: list[np.ndarray] = []
        band_pairs: list[np.ndarray] = []
        for p, q in enumerate(self.pair_query):
            row = scores[q]
            self.outranked_by[p] += np.count_nonzero(row > self.high[p])
            band = np.flatnonzero((row >= self.low[p]) & (row <= self.high[p]))
            if len(band):
                band_rows.append(band)
                band_pairs.append(np.full(len(band), p, dtype=np.int64))
        if band_rows:
            self._resolve_band(first, block, np.concatenate(band_rows), np.concatenate(band_pairs))
        if self.top_n:
            self._update_top(first, block, scores)

    def _resolve_band(self, first: int, block: np.ndarray, rows: np.ndarray, pair: np.ndarray) -> None:
        """Compare the band's items with their pair's relevant item by canonical score, then id."""
        ids = first + rows
        exact = self._canonical(block, rows, self.pair_query[pair])
        mine = self.pair_score[pair]
        item = self.pair_item[pair]
        wins = (exact > mine) | ((exact == mine) & (ids < item))
        self.outranked_by += np.bincount(pair[wins], minlength=len(self.outranked_by))
        self.seen_self[pair[ids == item]] = True

    def _canonical(self, block: np.ndarray, rows: np.ndarray, query_cols: np.ndarray) -> np.ndarray:
        out = np.empty(len(rows), dtype=np.float64)
        step = max(1, _BLOCK_ELEMENTS // block.shape[1])
        for s in range(0, len(rows), step):
            out[s : s + step] = canonical_scores(block[rows[s : s + step]], self.queries[query_cols[s : s + step]])
        return out

    def _update_top(self, first: int, block: np.ndarray, scores: np.ndarray) -> None:
        n_queries, n = scores.shape
        margin = 2 * self.deltas
        keep = scores >= self.floor[:, None]
        if n > self.top_n and np.count_nonzero(keep) > 4 * self.top_n * n_queries:
            # No running list yet (first chunk): the chunk's own top_n-th best bounds the final one.
            kth = np.partition(scores, n - self.top_n, axis=1)[:, n - self.top_n]
            keep &= scores >= _round_out(kth.astype(np.float64) - margin, -np.inf)[:, None]
        q_idx, r_idx = np.nonzero(keep)  # query-major
        if not len(q_idx):
            return
        exact = self._canonical(block, r_idx, q_idx)
        bounds = np.searchsorted(q_idx, np.arange(n_queries + 1))
        for q in range(n_queries):
            sel = slice(bounds[q], bounds[q + 1])
            if sel.start == sel.stop:
                continue
            f32, c64, ids = self.candidates[q]
            f32 = np.concatenate([f32, scores[q, r_idx[sel]]])
            c64 = np.concatenate([c64, exact[sel]])
            ids = np.concatenate([ids, first + r_idx[sel]])
            if len(f32) >= self.top_n:
                nth = np.partition(f32, len(f32) - self.top_n)[len(f32) - self.top_n]
                self.floor[q] = _round_out(np.array([nth - margin[q]], dtype=np.float64), -np.inf)[0]
                kept = f32 >= self.floor[q]
                f32, c64, ids = f32[kept], c64[kept], ids[kept]
            self.candidates[q] = (f32, c64, ids)

    def ranks(self) -> np.ndarray:
        if not self.seen_self.all():
            raise EvaluationError(
                "internal error: a relevant image's float32 score fell outside its rounding-error band; "
                "please report this with your numpy/BLAS configuration"
            )
        return (1 + self.outranked_by).astype(np.float64)

    def top(self) -> tuple[np.ndarray, np.ndarray]:
        ids_out = np.full((len(self.queries), self.top_n), -1, dtype=np.int64)
        scores_out = np.full((len(self.queries), self.top_n), -np.inf, dtype=np.float32)
        for q, (_, c64, ids) in enumerate(self.candidates):
            order = np.lexsort((ids, -c64))[: self.top_n]
            ids_out[q, : len(order)] = ids[order]
            scores_out[q, : len(order)] = c64[order]
        return ids_out, scores_out


__all__ = [
    "DEFAULT_KS",
    "canonical_scores",
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
