"""How a shard set's answers combine: the hits of every shard merged in the unsharded index's
order (:func:`merge`), and the set's cosine scale from its shards' moments (:func:`set_scale`).

Pure functions over :class:`~retrieval.partition_shard.ShardAnswer` values with the set's ids;
the fan-out that gathers them, with its deadline and missing shards, is
:mod:`retrieval.partitions`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from .hits import Cut, Hit, newest_first
from .keywords import CosineScale, fused_scores
from .partition_shard import ShardAnswer


def set_scale(moments: Sequence[tuple[int, np.ndarray, np.ndarray] | None]) -> tuple[np.ndarray, np.ndarray] | None:
    """The set's cosine moments (mean, covariance) from its shards' ``(count, mean, cov)``,
    weighted by count: what one index over every shard's vectors would estimate."""
    known = [m for m in moments if m is not None]
    total = sum(n for n, _, _ in known)
    if not total:
        return None
    mean = sum((n / total) * mu for n, mu, _ in known)
    cov = sum((n / total) * (c + np.outer(mu - mean, mu - mean)) for n, mu, c in known)
    return np.asarray(mean), np.asarray(cov)


def merge(answers: Sequence[ShardAnswer], cut: Cut, mode: str, scale: CosineScale | None) -> list[Hit]:
    """The set's hits from its shards' answers (the set's ids), in the unsharded index's order."""
    hits = [h for a in answers for h in a.hits]
    if not hits:
        return []
    taken = np.concatenate([a.taken_us for a in answers]).astype(np.int64)
    ids = np.array([h.id for h in hits], np.int64)
    scores = np.array([h.score for h in hits], np.float32)
    matched = mode != "vector" and any(a.matched for a in answers)
    if not matched:
        if cut.min_score is None:
            chosen = np.lexsort((ids, -scores))[: cut.top_k]
            if cut.sort == "taken":
                chosen = chosen[newest_first(taken[chosen], ids[chosen], -scores[chosen])]
        else:
            order = newest_first(taken, ids, -scores) if cut.sort == "taken" else np.lexsort((ids, -scores))
            chosen = order[: cut.cap]
        return [hits[i] for i in chosen.tolist()]
    if mode == "hybrid":
        # A shard where no word matched ranked by the cosine alone: its hits get the fused score
        # and zero coverage they would have had beside the matches of the others.
        fill = fused_scores(scores.astype(np.float64), np.zeros(len(hits)), scale) if scale is not None else scores
        hits = [h if h.fused is not None else replace(h, fused=float(f), keyword=0.0) for h, f in zip(hits, fill.tolist(), strict=True)]
        key = np.array([h.fused for h in hits], np.float64)
    else:
        key = np.array([h.keyword or 0.0 for h in hits], np.float64)
    chosen = np.lexsort((ids, -scores.astype(np.float64), -key))[: cut.cap]
    if cut.sort == "taken":
        chosen = chosen[newest_first(taken[chosen], np.arange(len(chosen)))]
    return [hits[i] for i in chosen.tolist()]


def only(answer: ShardAnswer, keep: np.ndarray) -> ShardAnswer:
    """``answer`` with the hits where ``keep`` is True alone."""
    return replace(answer, hits=[h for h, k in zip(answer.hits, keep.tolist(), strict=True) if k], taken_us=answer.taken_us[keep],
                   sizes=answer.sizes[keep])


__all__ = ["merge", "only", "set_scale"]
