"""Exact answers to measure approximate ones against: top-k over chunks, and recall@k."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


class ExactTopK:
    """Exact top-``k`` by inner product for fixed queries, over vectors fed in chunks.

    Memory is one chunk plus ``(n_queries, k)`` results, whatever the collection size.
    """

    def __init__(self, queries: npt.NDArray[np.float32], k: int) -> None:
        import faiss

        self.queries = np.ascontiguousarray(queries, dtype=np.float32)
        self.k = k
        self._heap = faiss.ResultHeap(len(self.queries), k, keep_max=True)

    def add(self, first_id: int, vectors: npt.NDArray[np.float32]) -> None:
        """Score the chunk ``vectors``, whose first row has id ``first_id``."""
        import faiss

        if not len(vectors) or not len(self.queries):
            return
        flat = faiss.IndexFlatIP(self.queries.shape[1])
        flat.add(np.ascontiguousarray(vectors, dtype=np.float32))
        scores, ids = flat.search(self.queries, min(self.k, len(vectors)))
        if scores.shape[1] < self.k:
            pad = self.k - scores.shape[1]
            scores = np.pad(scores, ((0, 0), (0, pad)), constant_values=-np.inf)
            ids = np.pad(ids, ((0, 0), (0, pad)), constant_values=-1)
        self._heap.add_result(np.ascontiguousarray(scores), np.ascontiguousarray(np.where(ids >= 0, ids + first_id, -1)))

    def result(self) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        """``(scores, ids)`` sorted by descending score (call once, after the last chunk)."""
        self._heap.finalize()
        return self._heap.D, self._heap.I


def recall_at(
    found: npt.NDArray[np.int64], truth: npt.NDArray[np.int64], exclude: npt.NDArray[np.int64] | None = None, k: int = 10
) -> float:
    """Mean fraction of each query's true top-``k`` found in its approximate top-``k``.

    ``exclude`` (one id per query) drops the query's own vector from both lists: a collection
    vector used as a query would otherwise always find itself.
    """
    total = 0.0
    for i in range(len(truth)):
        drop = int(exclude[i]) if exclude is not None else -1
        want = [int(t) for t in truth[i] if t >= 0 and t != drop][:k]
        got = [int(f) for f in found[i] if f >= 0 and f != drop][:k]
        total += len(set(got).intersection(want)) / max(1, len(want))
    return total / max(1, len(truth))
