"""``VectorSearch``: a generation's stored vectors and the FAISS searches over them
(``index.vectors``), what :mod:`retrieval.hybrid` ranks a text with beside the keyword side.

It trusts its callers: a :class:`~retrieval.hits.Cut` it is given was checked where the
search entered (:class:`~retrieval.request.SearchRequest`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from .checks import is_positive_int
from .errors import InvalidArgumentError
from .filters import Filter
from .generation import Generation
from .hits import Cut, Hit, make_hits
from .keywords import CosineScale, KeywordIndex
from .rows import Rows


class VectorSearch:
    """The vector side of one opened generation.

    Args:
        generation: the generation whose FAISS index and stored vectors it searches.
    """

    def __init__(self, generation: Generation) -> None:
        self._generation = generation
        self._rows = generation.rows

    @property
    def keywords(self) -> KeywordIndex | None:
        """The generation's keyword side (:class:`~retrieval.keywords.KeywordIndex`), None in an
        index built before it."""
        return self._generation.keywords

    @property
    def hit_source(self) -> Rows:
        """The rows hits are made from (:func:`retrieval.hits.make_hits`)."""
        return self._rows

    @property
    def exact_scores(self) -> bool:
        """True when FAISS scores are exact inner products of the stored vectors (flat storage,
        searched exhaustively): range searches then miss nothing."""
        return self._generation.exact_scores

    def mask(self, where: Filter) -> np.ndarray:
        """Boolean mask over ids of the images passing ``where`` (recent masks are cached)."""
        return self._rows.mask(where)

    def hits(self, vectors: np.ndarray, cut: Cut, where: Filter | None = None) -> list[list[Hit]]:
        """The hits of each query vector ``(n, dim)`` (normalised by the caller) that ``cut`` selects."""
        return [make_hits(self._rows, ids, scores, cut) for ids, scores in self._select(vectors, where, cut)]

    def _select(self, vectors: np.ndarray, where: Filter | None, cut: Cut) -> list[tuple[np.ndarray, np.ndarray]]:
        # Per query (ids, scores), best first: the top k, or every image at or above min_score.
        vectors = np.asarray(vectors, dtype=np.float32)
        vectors = vectors[None] if vectors.ndim == 1 else vectors
        if cut.min_score is not None:
            return self.search_range(vectors, cut.min_score, where=where)
        scores, ids = self.search_ids(vectors, cut.top_k, where=where)
        return [(row_i[row_i >= 0], row_s[row_i >= 0]) for row_s, row_i in zip(scores, ids, strict=True)]

    def search_ids(self, vectors: np.ndarray, k: int = 10, where: Filter | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The FAISS stage alone: ``(scores, ids)`` of shape ``(n, min(k, matches))``.

        Raises:
            InvalidArgumentError: k below 1, vectors not ``(n, dim)``.
        """
        if not is_positive_int(k):
            raise InvalidArgumentError(f"k must be an integer >= 1, got {k!r}")
        vectors = np.asarray(vectors, dtype=np.float32)
        vectors = self._generation.query_vectors(vectors[None] if vectors.ndim == 1 else vectors)
        return self._generation.search(vectors, k, self._rows.allowed(where))

    def search_range(
        self, vectors: np.ndarray, min_score: float, where: Filter | None = None
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Every image scoring at least ``min_score`` with each query vector ``(n, dim)``: per
        query ``(ids, scores)`` by descending score (ties by id). Exact for flat indexes; an
        approximate index may miss images (see :func:`retrieval.faiss_index.range_search`).
        """
        vectors = self._generation.query_vectors(vectors)
        return self._generation.range_search(vectors, min_score, self._rows.allowed(where))

    def vectors_of(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """The stored embeddings of ``ids`` as an ``(n, dim)`` float32 array, in the given order."""
        return self._generation.vectors_of(ids)

    def cosine_scale(self, vector: np.ndarray) -> CosineScale:
        """The mean and standard deviation of ``vector``'s cosine over the collection, estimated
        on a fixed sample of its stored vectors (the scale hybrid ranking fuses on)."""
        moments = self._generation.cosine_moments
        if moments is None:
            return CosineScale(0.0, 1.0)
        mean, cov = moments
        q = np.asarray(vector, np.float64)
        # einsum, not BLAS: OpenBLAS's threads would spin on after the product, beside FAISS's.
        return CosineScale(float(np.einsum("i,i->", q, mean)), float(np.sqrt(max(np.einsum("i,ij,j->", q, cov, q), 0.0))))

    def embeddings(self) -> np.ndarray:
        """All stored embeddings as an ``(count, dim)`` float32 array, in id order."""
        return self._rows.embeddings()

    def iter_embeddings(self, batch_rows: int = 65536) -> Iterator[tuple[int, np.ndarray]]:
        """Stream the stored embeddings as ``(first_id, (n, dim) float32)`` chunks, in id order."""
        return self._rows.iter_embeddings(batch_rows)

    def iter_vectors(self, where: Filter | None = None, batch_rows: int = 65536) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Stream ``(ids, vectors)`` of the images passing ``where`` (all without it), in id
        order, at most ``batch_rows`` stored rows read at a time; batches with no image passing
        are skipped."""
        return self._rows.iter_vectors(where, batch_rows)

    def warm(self, vectors: bool | None = None) -> int:
        """Ask the kernel to read a memory-mapped FAISS file in the background, so that a
        long-running reader's first queries do not each wait for the disk: what every query
        scans (the IVF lists and codes) and, with ``vectors``, a re-ranked index's float16
        vectors too (default: when the file takes at most half the available memory). Returns
        the bytes asked for: 0 when the FAISS index is in RAM. ``serve`` calls it on every
        generation it opens; a one-shot ``search`` does not (it would read more than it uses)."""
        return self._generation.warm(vectors)


__all__ = ["VectorSearch"]
