"""Tuning an approximate index: the cheapest search parameters whose recall reaches a target."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from .exact import recall_at
from .searching import search, set_search_params
from .structure import FaissIndex, _hnsw_of, _ivf_of, refine_of

# Re-ranking depths tried when tuning an index with a refine stage (``...,Refine(SQfp16)``): the
# approximate codes return ``k * k_factor`` candidates, re-scored against the refine vectors.
K_FACTORS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def tunable(index: FaissIndex) -> tuple[str, list[int]] | None:
    """The search parameter that trades speed for recall, and the values worth trying."""
    ivf = _ivf_of(index)
    if ivf is not None:
        return "nprobe", _nprobes(ivf)
    if _hnsw_of(index) is not None:
        return "efSearch", [16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048]
    return None


def _nprobes(ivf: FaissIndex) -> list[int]:
    """Powers of two below the IVF's list count, then the count itself (a full scan)."""
    values, v = [], 1
    while v < ivf.nlist:
        values.append(v)
        v *= 2
    return values + [int(ivf.nlist)]


def tune(
    index: FaissIndex,
    queries: npt.NDArray[np.float32],
    truth: npt.NDArray[np.int64],
    target: float,
    exclude: npt.NDArray[np.int64] | None = None,
    k: int = 10,
) -> tuple[dict[str, int], float, bool]:
    """The cheapest ``nprobe``/``efSearch`` whose recall@``k`` reaches ``target``, left set on ``index``.

    Args:
        index: the index to tune.
        queries: query vectors, float32, L2-normalised.
        truth: each query's exact top ids (:class:`~.exact.ExactTopK`).
        target: the recall@``k`` to reach.
        exclude: one id per query dropped from both lists (see :func:`~.exact.recall_at`).
        k: the recall depth.

    Returns:
        ``(params, recall, reached)``; when no value reaches the target, the best one tried.
    """
    ivf = _ivf_of(index)
    if refine_of(index) is not None and ivf is not None:
        return _tune_refine(index, ivf, queries, truth, target, exclude, k)
    knob = tunable(index)
    if knob is None:
        _, found = index.search(np.ascontiguousarray(queries, dtype=np.float32), k + 1)
        return {}, recall_at(found, truth, exclude, k), True
    name, values = knob
    best: tuple[dict[str, int], float] = ({}, -1.0)
    fetch = k + (1 if exclude is not None else 0)
    gains: list[float] = []
    for value in values:
        set_search_params(index, {name: value})
        _, found = index.search(np.ascontiguousarray(queries, dtype=np.float32), fetch)
        recall = recall_at(found, truth, exclude, k)
        gains.append(recall - max(best[1], 0.0))
        if recall > best[1] + 1e-9:
            best = ({name: value}, recall)
        if recall >= target:
            return {name: value}, recall, True
        # Compressed codes cap recall below the target: once two doublings each gained under
        # 1% of the remaining gap, larger values only cost time (up to a full scan).
        if len(gains) >= 3 and all(g < 0.01 * (target - best[1]) for g in gains[-2:]):
            break
    set_search_params(index, best[0])
    return best[0], best[1], False


def refine_cost(index: FaissIndex, nprobe: int, k_factor: int, k: int = 10) -> float:
    """A machine-independent estimate of one query's work in an IVF index with a refine stage
    (bytes touched): scanning ``nprobe`` lists of codes (plus their lookup tables), then
    re-scoring ``k * k_factor`` candidates against the refine vectors, each a random read of a
    full vector that is decoded and multiplied. Used to choose between (nprobe, k_factor) pairs
    reaching the same recall without timing anything (a build must not depend on the load of
    the machine it ran on).

    Raises:
        ValueError: ``index`` is not an IVF index with a refine stage.
    """
    ivf = _ivf_of(index)
    refine = refine_of(index)
    if ivf is None or refine is None:
        raise ValueError("the refine cost is that of an IVF index with a refine stage")
    per_list = int(index.ntotal) / max(1, int(ivf.nlist))
    scan = nprobe * (per_list * (int(ivf.code_size) + 8) + 256 * int(index.d))
    # A refine vector costs its bytes twice over a scanned code: a cache miss, then a decode.
    rescore = k * k_factor * 2 * int(refine.refine_index.sa_code_size()) * 2
    return float(scan + rescore)


def _tune_refine(
    index: FaissIndex,
    ivf: FaissIndex,
    queries: npt.NDArray[np.float32],
    truth: npt.NDArray[np.int64],
    target: float,
    exclude: npt.NDArray[np.int64] | None,
    k: int,
) -> tuple[dict[str, int], float, bool]:
    """Two knobs: the lists probed (``nprobe``) and the re-ranking depth (``k_factor``).

    For each ``nprobe`` (doubling), the smallest ``k_factor`` reaching ``target``; more lists
    need no deeper re-ranking, so each step only searches below the last depth found. Of the
    pairs reaching the target, the one with the lowest :func:`refine_cost`; the walk stops once
    the scan alone of the next ``nprobe`` costs more than that. When none reaches it, the pair
    with the best recall (the deepest re-ranking, at the ``nprobe`` where recall stopped rising).
    """
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    fetch = k + (1 if exclude is not None else 0)
    nprobes = _nprobes(ivf)
    factors = [f for f in K_FACTORS if f * fetch <= max(fetch, int(index.ntotal))] or [1]

    def recall_of(nprobe: int, k_factor: int) -> float:
        set_search_params(index, {"nprobe": nprobe, "k_factor": k_factor})
        # Through :func:`search`, as readers search: the candidates re-ranked depend on how
        # many results are fetched.
        _, found = search(index, queries, fetch)
        return recall_at(found, truth, exclude, k)

    best: tuple[dict[str, int], float] = ({}, -1.0)
    chosen: tuple[dict[str, int], float, float] | None = None  # params, recall, cost
    deepest: list[float] = []
    top = len(factors) - 1
    for nprobe in nprobes:
        if chosen is not None and refine_cost(index, nprobe, 0, k) >= chosen[2]:
            break
        recall = recall_of(nprobe, factors[top])
        if recall > best[1] + 1e-9:
            best = ({"nprobe": nprobe, "k_factor": factors[top]}, recall)
        if recall < target:
            deepest.append(recall)
            # Recall stopped rising with more lists at the deepest re-ranking: the codes, not the
            # lists probed, are the limit.
            if len(deepest) >= 3 and deepest[-1] - deepest[-3] < 0.01 * (target - best[1]) + 1e-9:
                break
            continue
        reach = (top, recall)
        while reach[0] > 0:
            below = recall_of(nprobe, factors[reach[0] - 1])
            if below < target:
                break
            reach = (reach[0] - 1, below)
        top = reach[0]
        cost = refine_cost(index, nprobe, factors[top], k)
        if chosen is None or cost < chosen[2]:
            chosen = ({"nprobe": nprobe, "k_factor": factors[top]}, reach[1], cost)
        if top == 0:
            break
    if chosen is not None:
        set_search_params(index, chosen[0])
        return chosen[0], chosen[1], True
    set_search_params(index, best[0])
    return best[0], best[1], False
