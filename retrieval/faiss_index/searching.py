"""Searching an index: its search parameters, filtered top-k with a deterministic order, range search.

Vectors are L2-normalised float32 and searched by inner product, so scores are cosines.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from .structure import FaissIndex, SearchParams, Selector, _hnsw_of, _is_pretransform, _ivf_of, refine_of


def set_search_params(index: FaissIndex, params: Mapping[str, int]) -> None:
    """Apply tuned search parameters (``{"nprobe": 32}``, ``{"efSearch": 64}``, and
    ``{"k_factor": 16}`` for a refine stage) to ``index``."""
    refine = refine_of(index)
    if "k_factor" in params and refine is not None:
        refine.k_factor = float(params["k_factor"])
    ivf = _ivf_of(index)
    if "nprobe" in params and ivf is not None:
        ivf.nprobe = int(params["nprobe"])
        quantizer = _hnsw_of(ivf.quantizer)
        if quantizer is not None:
            # An HNSW coarse quantizer must return at least nprobe good lists.
            quantizer.hnsw.efSearch = max(64, 2 * int(params["nprobe"]))
    hnsw = _hnsw_of(index)
    if "efSearch" in params and hnsw is not None:
        hnsw.hnsw.efSearch = int(params["efSearch"])


def search(
    index: FaissIndex, queries: npt.NDArray[np.float32], k: int, allowed: npt.NDArray[np.bool_] | None = None
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """Top-``k`` search: returns ``(scores, ids)``, each ``(n_queries, min(k, ntotal))``.

    Results are ordered by descending score; ties are ordered by ascending id so that the
    ranking is deterministic. Missing results (an approximate index found fewer) have id -1.

    Args:
        allowed: optional boolean mask over ids; only those ids are returned. An
            approximate index is searched with growing ``nprobe``/``efSearch`` until every
            query has ``min(k, allowed.sum())`` results (an IVF index at ``nprobe = nlist``
            and HNSW's flat storage are exhaustive), so a filter never yields fewer results.
    """
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    if queries.ndim == 1:
        queries = queries[None, :]
    if allowed is None:
        return _search(index, queries, min(int(k), int(index.ntotal)), int(index.ntotal), None)
    allowed = np.asarray(allowed, dtype=bool)
    if len(allowed) != index.ntotal:
        raise ValueError(f"allowed mask has {len(allowed)} entries for {index.ntotal} vectors")
    matches = int(allowed.sum())
    k = min(int(k), matches)
    sel = _selector(allowed)
    boost = 1
    while True:
        params = _filtered_params(index, sel, boost)
        scores, ids = _search(index, queries, k, matches, params)
        if k == 0 or bool(np.all(ids[:, k - 1] >= 0)):
            return scores, ids
        if not _can_boost(index, boost):
            break
        boost *= 4
    # HNSW's graph can strand a selective filter: scan its flat storage with the same filter.
    hnsw = _hnsw_of(index)
    if hnsw is not None and not _is_pretransform(index):
        import faiss

        storage = faiss.downcast_index(hnsw.storage)
        return _search(storage, queries, k, matches, faiss.SearchParameters(sel=sel))
    return scores, ids


def _selector(allowed: npt.NDArray[np.bool_]) -> Selector:
    import faiss

    bits = np.packbits(np.asarray(allowed, dtype=bool), bitorder="little")
    sel = faiss.IDSelectorBitmap(bits)
    sel.bits_ref = bits  # keep the buffer alive as long as the selector
    return sel


def _filtered_params(index: FaissIndex, sel: Selector, boost: int) -> SearchParams:
    """Search parameters restricting results to ``sel``; ``boost`` multiplies nprobe/efSearch."""
    import faiss

    refine = refine_of(index)
    if refine is not None:
        # IndexRefine ignores a selector of its own: the base search must apply it (the refine
        # stage only re-scores what the base returned).
        base = _filtered_params(refine.base_index, sel, boost)
        outer = faiss.IndexRefineSearchParameters(k_factor=float(refine.k_factor), base_index_params=base)
        outer.inner_ref = base
        return outer
    ivf = _ivf_of(index)
    if ivf is not None:
        inner = faiss.SearchParametersIVF(sel=sel, nprobe=min(int(ivf.nlist), max(1, int(ivf.nprobe)) * boost))
    elif (hnsw := _hnsw_of(index)) is not None:
        inner = faiss.SearchParametersHNSW(sel=sel, efSearch=int(hnsw.hnsw.efSearch) * boost)
    else:
        inner = faiss.SearchParameters(sel=sel)
    if isinstance(faiss.downcast_index(index), faiss.IndexPreTransform):
        outer = faiss.SearchParametersPreTransform(index_params=inner)
        outer.inner_ref = inner
        return outer
    return inner


def _can_boost(index: FaissIndex, boost: int) -> bool:
    ivf = _ivf_of(index)
    if ivf is not None:
        return max(1, int(ivf.nprobe)) * boost < int(ivf.nlist)
    hnsw = _hnsw_of(index)
    if hnsw is not None:
        return int(hnsw.hnsw.efSearch) * boost < max(4096, int(index.ntotal) // 16)
    return False


def _search(
    index: FaissIndex, queries: npt.NDArray[np.float32], k: int, limit: int, params: SearchParams | None
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    if k <= 0:
        return np.empty((len(queries), 0), np.float32), np.empty((len(queries), 0), np.int64)
    # FAISS keeps an arbitrary member of a group of equal scores that straddles position k.
    # Fetch past the cut until no row ties across it, so that sorting (score desc, id asc)
    # and cutting gives the documented order and search(k) is a prefix of search(k + 1).
    # ``limit`` caps the fetch (the number of vectors that can be returned at all).
    # One past the cut first: a re-ranked index scores ``fetch * k_factor`` candidates, so a
    # first fetch of 2k would double its work (and re-rank deeper than it was tuned for).
    fetch = k
    while True:
        fetch = min(limit, k + 1 if fetch == k else fetch * 2)
        scores, ids = index.search(queries, fetch) if params is None else index.search(queries, fetch, params=params)
        tied = (scores[:, k - 1] == scores[:, fetch - 1]) & (ids[:, fetch - 1] >= 0)
        if fetch >= limit or not np.any(tied):
            break
    # Missing results (-1) sort last whatever their placeholder score.
    order = np.lexsort((ids, -scores, ids < 0), axis=1)[:, :k]
    return np.take_along_axis(scores, order, 1), np.take_along_axis(ids, order, 1)


def range_search(
    index: FaissIndex, queries: npt.NDArray[np.float32], min_score: float
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """Every stored vector scoring at least ``min_score`` with each query: ``(lims, scores,
    ids)`` in FAISS's layout (query ``i``'s results are ``[lims[i]:lims[i+1]]``, unordered).

    Exact for flat indexes; approximate ones (IVF at the tuned nprobe, HNSW, compressed codes)
    may miss vectors and return approximate scores.
    """
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    if refine_of(index) is not None:
        return _refine_range_search(index, queries, min_score)
    # FAISS keeps inner products strictly above the radius: step just below min_score.
    radius = float(np.nextafter(np.float32(min_score), np.float32(-np.inf)))
    step = _hnsw_range_chunk(index)
    if step is None or len(queries) <= step:
        lims, scores, ids = index.range_search(queries, radius)
    else:
        parts = [index.range_search(queries[i : i + step], radius) for i in range(0, len(queries), step)]
        counts = np.concatenate([np.diff(p[0]) for p in parts])
        lims = np.concatenate([[0], np.cumsum(counts)]).astype(parts[0][0].dtype)
        scores = np.concatenate([p[1] for p in parts])
        ids = np.concatenate([p[2] for p in parts])
    keep = scores >= min_score
    if keep.all():
        return lims, scores, ids
    owner = np.repeat(np.arange(len(queries)), np.diff(lims))[keep]
    return np.searchsorted(owner, np.arange(len(queries) + 1)).astype(lims.dtype), scores[keep], ids[keep]


def _refine_range_search(
    index: FaissIndex, queries: npt.NDArray[np.float32], min_score: float
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """:func:`range_search` for an index with a refine stage, which FAISS answers with no results
    at all (IndexRefine has no range search): top-k searches, k growing for the queries whose
    k-th re-scored hit still reaches ``min_score``, so the scores are the refine stage's."""
    n = len(queries)
    found: list[tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]] = [(np.empty(0, np.float32), np.empty(0, np.int64))] * n
    todo = np.arange(n)
    k = 32
    while len(todo):
        k = min(k, int(index.ntotal))
        scores, ids = index.search(queries[todo], k)
        more = []
        for row, q in enumerate(todo.tolist()):
            keep = (ids[row] >= 0) & (scores[row] >= min_score)
            found[q] = (scores[row][keep], ids[row][keep])
            if keep.all() and k < index.ntotal:
                more.append(q)
        todo = np.asarray(more, dtype=np.int64)
        k *= 4
    counts = np.array([len(s) for s, _ in found], dtype=np.int64)
    lims = np.concatenate([[0], np.cumsum(counts)]).astype(np.uint64)
    if not n:
        return lims, np.empty(0, np.float32), np.empty(0, np.int64)
    return lims, np.concatenate([s for s, _ in found]).astype(np.float32), np.concatenate([i for _, i in found]).astype(np.int64)


def _hnsw_range_chunk(index: FaissIndex) -> int | None:
    """Queries per ``range_search`` call that an HNSW index answers in one block, else None.

    FAISS's HNSW search walks the queries in blocks of ``InterruptCallback.get_period_hint(
    max_level * d * efSearch)`` (1e8 / flops while Python's interrupt callback is installed),
    and its range-search result handler allocates the result once per block: a second block
    aborts the process ("labels == nullptr && distances == nullptr failed", faiss 1.15). One
    block per call avoids it.
    """
    hnsw = _hnsw_of(index)
    if hnsw is None:
        return None
    flops = max(1, int(hnsw.hnsw.max_level)) * int(index.d) * max(1, int(hnsw.hnsw.efSearch))
    return max(1, 10**8 // (flops + 1) // 2)
