"""One ranking from two: the vector side's cosines and the keyword side's coverage, on one scale.

A hybrid hit's fused score is ``max(z, Z_FLOOR) + KEYWORD_WEIGHT * coverage``:

- ``z`` is the image's cosine in standard deviations above the query's mean cosine over the
  collection (:class:`CosineScale`), so that one scale serves a model whose cosines crowd near
  0.3 and one whose cosines spread from -1 to 1;
- below :data:`Z_FLOOR` a cosine is not evidence the keyword side should be weighed against:
  every image scoring that low counts the same, and the words decide among them;
- ``coverage`` is the keyword side's score (:class:`~retrieval.keywords.fts.Matches`): the
  share of the query's words, weighted by rarity and match credit, that the image's text holds
  (1 when it holds them all, whole).

So a full match on the query's words counts as much as eight standard deviations of cosine, a
match on half of them four: an image whose name says what the query says rises above the
vector side's best guesses, and among images matching equally well, the vector side decides.
Reciprocal rank fusion (the previous rule) threw the strength of each side away; the weight
and the floor were chosen by measurement on the demo's two query sets, where the model is weak
and the names strong and the other way round (``benchmarks/bench_relevance.py``,
``docs/keywords.md``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InvalidArgumentError

# A full match on the query's words against standard deviations of cosine.
KEYWORD_WEIGHT = 8.0
# Cosines below mean + Z_FLOOR standard deviations all count the same.
Z_FLOOR = 1.5
MODES: tuple[str, ...] = ("hybrid", "vector", "keyword")


def check_mode(mode: object) -> str:
    """``mode`` if it is one of :data:`MODES`.

    Raises:
        InvalidArgumentError: another value.
    """
    if mode not in MODES:
        raise InvalidArgumentError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    return str(mode)


@dataclass(frozen=True)
class CosineScale:
    """The mean and standard deviation of one query's cosine over the collection."""

    mean: float
    std: float

    def z(self, cosines: np.ndarray) -> np.ndarray:
        """``cosines`` in standard deviations above the mean."""
        return (np.asarray(cosines, np.float64) - self.mean) / max(self.std, 1e-6)


def fused_scores(cosines: np.ndarray, coverage: np.ndarray, scale: CosineScale) -> np.ndarray:
    """Each candidate's fused score from its cosine and its keyword coverage (0 for none)."""
    return np.maximum(scale.z(cosines), Z_FLOOR) + KEYWORD_WEIGHT * np.asarray(coverage, np.float64)


def fuse(ids: np.ndarray, cosines: np.ndarray, coverage: np.ndarray, scale: CosineScale) -> tuple[np.ndarray, np.ndarray]:
    """The fused order of the candidates ``ids`` (positions into them, best first; ties: the
    higher cosine, then the lower id) and each candidate's fused score, in the given order.

    Args:
        ids: the candidates (the vector side's and the keyword side's, each once).
        cosines: their cosines with the query.
        coverage: their keyword scores, 0 where the words do not match.
        scale: the query's :class:`CosineScale`.
    """
    cosines = np.asarray(cosines, np.float64)
    score = fused_scores(cosines, coverage, scale)
    return np.lexsort((np.asarray(ids, np.int64), -cosines, -score)), score


__all__ = ["KEYWORD_WEIGHT", "MODES", "Z_FLOOR", "CosineScale", "check_mode", "fuse", "fused_scores"]
