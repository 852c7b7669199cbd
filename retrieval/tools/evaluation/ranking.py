"""Exact ranking: where each relevant image lands in the full ranking of a query.

Images are ordered by descending cosine score, equal scores by ascending id: the order
:meth:`retrieval.index.ImageIndex.search` returns. The rank of every relevant image in the
*full* ranking is computed exactly, by brute force over the stored embeddings, streamed
``chunk_rows`` at a time, so memory does not grow with the index.

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

Pure numpy: no index, encoder or file is touched here (fine-tuning validation ranks in-memory
embeddings with it too).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np

from ...errors import EvaluationError, InvalidArgumentError

DEFAULT_BATCH_SIZE = 256
DEFAULT_CHUNK_ROWS = 65_536
TOP_N = 10  # results listed per query in the per-query file

# Bound on the elements of the float64 temporaries of canonical scoring (32 MiB each).
_BLOCK_ELEMENTS = 1 << 22

ChunkSource = Callable[[int], Iterable[tuple[int, np.ndarray]]]
"""``source(rows)`` yields ``(first_id, (n, dim) float32)`` blocks of consecutive ids, from 0."""


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
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_CHUNK_ROWS",
    "TOP_N",
    "ChunkSource",
    "canonical_scores",
    "exact_ranks",
]
