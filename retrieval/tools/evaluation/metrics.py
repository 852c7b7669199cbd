"""Retrieval metrics as pure numpy functions, ranks in, numbers out (documented as :mod:`retrieval.metrics`).

Conventions shared by every function here:

- A *rank* is 1-based: the best-scored image has rank 1.
- ``first_ranks`` holds, per query, the rank of its best-ranked relevant image. ``np.inf``
  means "no relevant image among the results" (possible when only the top K were ranked);
  it counts as a reciprocal rank of 0 and a miss at every K.
- Recall@K is the fraction of queries with *at least one* relevant image in the top K, the
  convention of CLIP_benchmark and open_clip's published retrieval results (not the fraction
  of relevant images retrieved).
- nDCG uses binary relevance and ``log2(rank + 1)`` discounts; the ideal DCG puts
  ``min(#relevant, k)`` relevant images on top.
- ``expected_random_*`` give the exact value of a metric for a uniformly random ranking of
  ``n_items`` images of which ``n_relevant`` are relevant: the chance level to compare with.

Bad input (no queries, ranks < 1, k < 1, ...) raises
:class:`~retrieval.errors.InvalidArgumentError`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from ...checks import is_int, is_positive_int
from ...errors import InvalidArgumentError

# Above this many terms a harmonic-number difference is taken from its asymptotic expansion
# (error < 1e-20) instead of being summed term by term.
_HARMONIC_DIRECT_TERMS = 1_000_000


def _ranks(first_ranks: ArrayLike, what: str = "first_ranks") -> np.ndarray:
    ranks = np.asarray(first_ranks, dtype=np.float64)
    if ranks.ndim != 1:
        raise InvalidArgumentError(f"{what} must be a 1-d sequence of ranks, got shape {ranks.shape}")
    if ranks.size == 0:
        raise InvalidArgumentError(f"{what} is empty: there is no query to average over")
    if np.isnan(ranks).any() or (ranks < 1).any():
        raise InvalidArgumentError(f"{what} must hold 1-based ranks (>= 1, or inf for 'not found')")
    return ranks


def _check_k(k: int) -> int:
    if not is_positive_int(k):
        raise InvalidArgumentError(f"k must be an integer >= 1, got {k!r}")
    return int(k)


def reciprocal_ranks(first_ranks: ArrayLike) -> np.ndarray:
    """Per-query reciprocal rank ``1 / first_rank`` (0 for ``inf``, i.e. not found).

    Raises:
        InvalidArgumentError: empty input or a rank < 1.
    """
    return 1.0 / _ranks(first_ranks)


def mrr(first_ranks: ArrayLike) -> float:
    """Mean reciprocal rank of the first relevant image.

    Args:
        first_ranks: per query, the 1-based rank of its best-ranked relevant image (``inf``
            when none was retrieved, which counts 0: this is then MRR@K).

    Returns:
        The mean of ``1 / first_rank`` over the queries, in [0, 1].

    Raises:
        InvalidArgumentError: empty input or a rank < 1.
    """
    return float(reciprocal_ranks(first_ranks).mean())


def recall_at_k(first_ranks: ArrayLike, k: int) -> float:
    """Fraction of queries with at least one relevant image in the top ``k``.

    Raises:
        InvalidArgumentError: empty input, a rank < 1 or ``k < 1``.
    """
    k = _check_k(k)
    return float((_ranks(first_ranks) <= k).mean())


def mean_rank(first_ranks: ArrayLike) -> float:
    """Mean 1-based rank of the first relevant image (``inf`` if any query was not ranked).

    Raises:
        InvalidArgumentError: empty input or a rank < 1.
    """
    return float(_ranks(first_ranks).mean())


def median_rank(first_ranks: ArrayLike) -> float:
    """Median 1-based rank of the first relevant image (the mean of the two middle ones for an
    even number of queries).

    Raises:
        InvalidArgumentError: empty input or a rank < 1.
    """
    return float(np.median(_ranks(first_ranks)))


def ndcg_scores(relevant_ranks: Sequence[ArrayLike], k: int = 10) -> np.ndarray:
    """Per-query nDCG@k with binary relevance.

    Args:
        relevant_ranks: per query, the ranks of *all* its relevant images (distinct; ``inf``
            for those not retrieved). Their number is the query's number of relevant images.
        k: the cut-off.

    Returns:
        ``DCG@k / IDCG@k`` per query, where ``DCG@k = sum(1 / log2(rank + 1))`` over relevant
        ranks <= k and ``IDCG@k`` is the same sum over ranks ``1..min(#relevant, k)``.

    Raises:
        InvalidArgumentError: no query, a query without relevant images, a rank < 1, repeated
            finite ranks within a query, or ``k < 1``.
    """
    k = _check_k(k)
    if isinstance(relevant_ranks, np.ndarray) and relevant_ranks.ndim == 1 and relevant_ranks.dtype != object:
        raise InvalidArgumentError("relevant_ranks must hold one sequence of ranks per query")
    if len(relevant_ranks) == 0:
        raise InvalidArgumentError("relevant_ranks is empty: there is no query to average over")
    # Discount of positions 1..k; ideal[j] is the IDCG of a query with j relevant images.
    discounts = 1.0 / np.log2(np.arange(2, k + 2, dtype=np.float64))
    ideal = np.concatenate([[0.0], np.cumsum(discounts)])
    out = np.empty(len(relevant_ranks), dtype=np.float64)
    for i, ranks_i in enumerate(relevant_ranks):
        ranks = _ranks(ranks_i, what=f"relevant_ranks[{i}]")
        finite = ranks[np.isfinite(ranks)]
        if len(np.unique(finite)) != len(finite):
            raise InvalidArgumentError(f"relevant_ranks[{i}] repeats a rank: two images cannot share one")
        hits = finite[finite <= k].astype(np.int64)
        out[i] = discounts[hits - 1].sum() / ideal[min(len(ranks), k)]
    return out


def ndcg_at_k(relevant_ranks: Sequence[ArrayLike], k: int = 10) -> float:
    """Mean nDCG@k over queries (see :func:`ndcg_scores`).

    Raises:
        InvalidArgumentError: see :func:`ndcg_scores`.
    """
    return float(ndcg_scores(relevant_ranks, k).mean())


# -- chance levels ------------------------------------------------------------------------------


def _check_counts(n_items: int, n_relevant: int) -> tuple[int, int]:
    for name, value in (("n_items", n_items), ("n_relevant", n_relevant)):
        if not is_int(value):
            raise InvalidArgumentError(f"{name} must be an integer, got {value!r}")
    if not 1 <= n_relevant <= n_items:
        raise InvalidArgumentError(f"need 1 <= n_relevant <= n_items, got n_relevant={n_relevant}, n_items={n_items}")
    return int(n_items), int(n_relevant)


def _harmonic_difference(n: int, m: int) -> float:
    """``H_n - H_m = sum(1/j for j in m+1..n)`` for ``0 <= m <= n``."""
    if n - m <= _HARMONIC_DIRECT_TERMS:
        # Summed from the smallest terms up for accuracy.
        return math.fsum(1.0 / np.arange(n, m, -1, dtype=np.float64))

    def h(x: int) -> float:  # H_x - gamma, asymptotic expansion (x > 10^6 here)
        return math.log(x) + 1 / (2 * x) - 1 / (12 * x**2) + 1 / (120 * x**4)

    if m < _HARMONIC_DIRECT_TERMS:  # H_m itself summed exactly, H_n expanded
        return h(n) + np.euler_gamma - math.fsum(1.0 / np.arange(m, 0, -1, dtype=np.float64))
    return h(n) - h(m)


def expected_random_mrr(n_items: int, n_relevant: int, cutoff: int | None = None) -> float:
    """Expected reciprocal rank of the first relevant image under a uniformly random ranking.

    Let ``N = n_items``, ``R = n_relevant`` and ``X`` the rank of the first relevant image.
    ``P(X = k) = C(N-k, R-1) / C(N, R)`` (the other R-1 relevant images all lie below rank k),
    so ``E[1/X] = sum_{k=1}^{N-R+1} C(N-k, R-1) / (k C(N, R))``. With the identity
    ``sum_{k=1}^{n-m} C(n-k, m) / k = C(n, m) (H_n - H_m)`` (induction on n and m; H is the
    harmonic number) this is ``E[1/X] = R / (N-R+1) * (H_N - H_{R-1})``.
    For example N=4, R=2: ranks 1, 2, 3 have probabilities 3/6, 2/6, 1/6, so
    ``E = 1/2 + 1/6 + 1/18 = 13/18``, and ``2/3 * (H_4 - H_1) = 2/3 * 13/12 = 13/18``.

    Args:
        n_items: images ranked (N >= 1).
        n_relevant: relevant images among them (1 <= R <= N).
        cutoff: if given, the expected reciprocal rank *at* this cut-off (0 beyond it), the
            chance level of MRR@cutoff; summed term by term, ``O(cutoff)``.

    Returns:
        The expectation, in (0, 1].

    Raises:
        InvalidArgumentError: counts out of range or ``cutoff < 1``.
    """
    n, r = _check_counts(n_items, n_relevant)
    if cutoff is not None:
        last = min(_check_k(cutoff), n - r + 1)
        # p_1 = R/N and p_{k+1} / p_k = C(N-k-1, R-1) / C(N-k, R-1) = (N-k-R+1) / (N-k).
        k = np.arange(1, last + 1, dtype=np.float64)
        ratios = (n - k[:-1] - r + 1) / (n - k[:-1])
        p = (r / n) * np.concatenate([[1.0], np.cumprod(ratios)])
        return float(math.fsum(p / k))
    return r / (n - r + 1) * _harmonic_difference(n, r - 1)


def expected_random_recall(n_items: int, n_relevant: int, k: int) -> float:
    """Probability that a uniformly random ranking puts a relevant image in the top ``k``:
    ``1 - C(N-R, k) / C(N, k) = 1 - prod_{i=0}^{k-1} (N-R-i) / (N-i)``.

    Raises:
        InvalidArgumentError: counts out of range or ``k < 1``.
    """
    n, r = _check_counts(n_items, n_relevant)
    k = _check_k(k)
    if k > n - r:
        return 1.0
    i = np.arange(k, dtype=np.float64)
    return float(1.0 - np.prod((n - r - i) / (n - i)))


def expected_random_rank(n_items: int, n_relevant: int) -> float:
    """Expected rank of the first relevant image under a random ranking: ``(N+1) / (R+1)``.

    Raises:
        InvalidArgumentError: counts out of range.
    """
    n, r = _check_counts(n_items, n_relevant)
    return (n + 1) / (r + 1)


__all__ = [
    "expected_random_mrr",
    "expected_random_rank",
    "expected_random_recall",
    "mean_rank",
    "median_rank",
    "mrr",
    "ndcg_at_k",
    "ndcg_scores",
    "recall_at_k",
    "reciprocal_ranks",
]
