"""Retrieval metrics against hand-worked examples; chance levels against enumeration and
Monte-Carlo estimates."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from retrieval.errors import InvalidArgumentError
from retrieval.tools.evaluation.metrics import (
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

INF = math.inf
LOG2_3 = math.log2(3)


def test_mrr_by_hand() -> None:
    # 1/1 + 1/2 + 1/4 + 0 (not retrieved) = 1.75, over 4 queries = 0.4375
    assert mrr([1, 2, 4, INF]) == pytest.approx(0.4375)
    assert reciprocal_ranks([1, 2, 4, INF]).tolist() == [1.0, 0.5, 0.25, 0.0]
    assert mrr([3]) == pytest.approx(1 / 3)


def test_recall_at_k_by_hand() -> None:
    ranks = [1, 2, 4, INF]
    assert recall_at_k(ranks, 1) == 0.25  # only rank 1
    assert recall_at_k(ranks, 2) == 0.5  # ranks 1, 2
    assert recall_at_k(ranks, 4) == 0.75  # ranks 1, 2, 4; inf never counts
    assert recall_at_k(ranks, 1000) == 0.75


def test_mean_and_median_rank_by_hand() -> None:
    assert mean_rank([1, 3, 8]) == 4.0  # 12 / 3
    assert median_rank([1, 3, 8]) == 3.0
    assert median_rank([1, 2, 4, 10]) == 3.0  # (2 + 4) / 2
    assert mean_rank([2, INF]) == INF


def test_ndcg_by_hand() -> None:
    # Relevant at ranks 1 and 3: DCG = 1/log2(2) + 1/log2(4) = 1 + 0.5 = 1.5;
    # ideal puts them at 1 and 2: IDCG = 1 + 1/log2(3) = 1.6309...; nDCG = 0.9197...
    a = 1.5 / (1 + 1 / LOG2_3)
    # One relevant at rank 2: DCG = 1/log2(3) = 0.6309...; IDCG = 1.
    b = 1 / LOG2_3
    # One relevant at rank 11: outside the top 10, nDCG@10 = 0.
    c = 0.0
    scores = ndcg_scores([[1, 3], [2], [11]], k=10)
    assert scores == pytest.approx([a, b, c])
    assert ndcg_at_k([[1, 3], [2], [11]], k=10) == pytest.approx((a + b + c) / 3)


def test_ndcg_ideal_uses_min_of_relevant_and_k() -> None:
    # 12 relevant images at ranks 1..12: DCG@10 covers ranks 1..10, and so does the ideal
    # (min(12, 10) = 10 positions), so nDCG@10 = 1 exactly.
    assert ndcg_scores([list(range(1, 13))], k=10)[0] == pytest.approx(1.0)
    # Two relevant, one not retrieved (inf) and one at rank 1: DCG = 1, IDCG = 1 + 1/log2(3).
    assert ndcg_scores([[INF, 1]], k=10)[0] == pytest.approx(1 / (1 + 1 / LOG2_3))
    # k = 1: only rank 1 counts, IDCG = 1.
    assert ndcg_scores([[1, 2], [2]], k=1).tolist() == [1.0, 0.0]


@pytest.mark.parametrize(
    "call",
    [
        lambda: mrr([]),
        lambda: mrr([0]),
        lambda: mrr([1, float("nan")]),
        lambda: mrr([[1, 2]]),
        lambda: recall_at_k([1], 0),
        lambda: recall_at_k([1], True),
        lambda: ndcg_at_k([], 10),
        lambda: ndcg_at_k([[]], 10),
        lambda: ndcg_at_k([[1, 1]], 10),
        lambda: ndcg_at_k([1, 2], 10),
        lambda: median_rank([]),
        lambda: expected_random_mrr(3, 0),
        lambda: expected_random_mrr(3, 4),
        lambda: expected_random_mrr(3, 1, cutoff=0),
        lambda: expected_random_recall(3, 1, 0),
        lambda: expected_random_rank(0, 0),
    ],
)
def test_bad_input_raises_typed_error(call) -> None:
    with pytest.raises(InvalidArgumentError):
        call()


def _enumerated_mrr(n: int, r: int, cutoff: int | None = None) -> Fraction:
    """E[1/first rank] by enumerating every placement of the r relevant items."""
    total = Fraction(0)
    subsets = list(itertools.combinations(range(1, n + 1), r))
    for positions in subsets:
        first = min(positions)
        total += Fraction(1, first) if cutoff is None or first <= cutoff else 0
    return total / len(subsets)


def test_expected_random_mrr_by_hand() -> None:
    # N=4, R=2: the first relevant is at rank 1, 2, 3 with probability 3/6, 2/6, 1/6
    # (C(3,1), C(2,1), C(1,1) of the C(4,2) = 6 placements): E = 1/2 + 1/6 + 1/18 = 13/18;
    # the formula gives R/(N-R+1) * (H_4 - H_1) = 2/3 * (1/2 + 1/3 + 1/4) = 2/3 * 13/12 = 13/18.
    assert expected_random_mrr(4, 2) == pytest.approx(13 / 18, rel=1e-14)
    # N=4, R=1: uniform rank 1..4, E = H_4 / 4 = (25/12) / 4 = 25/48.
    assert expected_random_mrr(4, 1) == pytest.approx(25 / 48, rel=1e-14)
    # Every item relevant: the first one is always at rank 1.
    assert expected_random_mrr(5, 5) == pytest.approx(1.0, rel=1e-14)
    # MRR@2 for N=4, R=2: 3/6 * 1 + 2/6 * 1/2 = 2/3 (rank 3 counts 0).
    assert expected_random_mrr(4, 2, cutoff=2) == pytest.approx(2 / 3, rel=1e-14)
    assert expected_random_mrr(10, 3, cutoff=1) == pytest.approx(3 / 10, rel=1e-14)


def test_expected_random_mrr_equals_enumeration() -> None:
    for n in range(1, 9):
        for r in range(1, n + 1):
            assert expected_random_mrr(n, r) == pytest.approx(float(_enumerated_mrr(n, r)), rel=1e-12), (n, r)
            for cutoff in (1, 2, 5, n + 3):
                got = expected_random_mrr(n, r, cutoff=cutoff)
                assert got == pytest.approx(float(_enumerated_mrr(n, r, cutoff)), rel=1e-12), (n, r, cutoff)


def _first_ranks_by_simulation(n: int, r: int, trials: int, seed: int) -> np.ndarray:
    # The r relevant items take the positions of the r smallest of n uniform keys: a uniformly
    # random r-subset of the ranks 1..n.
    keys = np.random.default_rng(seed).random((trials, n))
    return keys.argpartition(r - 1, axis=1)[:, :r].min(axis=1) + 1


@pytest.mark.parametrize(("n", "r"), [(50, 1), (50, 3), (200, 17), (7, 7)])
def test_expected_random_mrr_against_monte_carlo(n: int, r: int) -> None:
    trials = 100_000
    reciprocal = 1.0 / _first_ranks_by_simulation(n, r, trials, seed=n * 1000 + r)
    stderr = reciprocal.std() / math.sqrt(trials)
    assert abs(reciprocal.mean() - expected_random_mrr(n, r)) <= 5 * stderr + 1e-12


def test_expected_random_recall_and_rank() -> None:
    # N=4, R=2, k=2: a miss needs both top places non-relevant, C(2,2)/C(4,2) = 1/6 -> 5/6.
    assert expected_random_recall(4, 2, 2) == pytest.approx(5 / 6)
    assert expected_random_recall(4, 1, 1) == pytest.approx(1 / 4)
    assert expected_random_recall(4, 2, 3) == 1.0  # only 2 non-relevant items
    # E[first rank] = (N+1)/(R+1): N=4, R=2 -> 1*3/6 + 2*2/6 + 3*1/6 = 10/6 = 5/3.
    assert expected_random_rank(4, 2) == pytest.approx(5 / 3)
    ranks = _first_ranks_by_simulation(100, 4, 100_000, seed=7)
    for k in (1, 5, 10):
        hits = ranks <= k
        assert abs(hits.mean() - expected_random_recall(100, 4, k)) <= 5 * hits.std() / math.sqrt(len(hits)) + 1e-12
    assert abs(ranks.mean() - expected_random_rank(100, 4)) <= 5 * ranks.std() / math.sqrt(len(ranks))


def test_expected_random_mrr_large_index_uses_accurate_harmonic_numbers() -> None:
    # Past a million terms the harmonic difference comes from its asymptotic expansion.
    n = 3_000_000
    direct = math.fsum(1.0 / np.arange(1, n + 1, dtype=np.float64)) / n  # R=1: H_N / N
    assert expected_random_mrr(n, 1) == pytest.approx(direct, rel=1e-12)
    r = 1_500_000  # both ends large: H_N - H_{R-1} expanded at both
    direct = r / (n - r + 1) * math.fsum(1.0 / np.arange(r, n + 1, dtype=np.float64))
    assert expected_random_mrr(n, r) == pytest.approx(direct, rel=1e-12)
