"""FAISS: build, write, read and search. The only module that imports faiss.

Vectors are L2-normalised float32 and searched by inner product, so scores are cosines.
FAISS row i holds the image with id i; :mod:`retrieval.index` checks this on open.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from .errors import IndexFormatError

DEFAULT_INDEX_TYPE = "Flat"


def build(vectors: np.ndarray, index_type: str = DEFAULT_INDEX_TYPE) -> Any:
    """Build an inner-product index of ``vectors`` (row i gets label i).

    Args:
        vectors: ``(n, dim)`` float32, L2-normalised.
        index_type: a FAISS factory string; ``"Flat"`` is exact search.

    Raises:
        ValueError: bad shape or an index type that needs training data we cannot give.
    """
    import faiss

    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[1] < 1:
        raise ValueError(f"expected (n, dim) vectors, got shape {vectors.shape}")
    index = faiss.index_factory(vectors.shape[1], index_type, faiss.METRIC_INNER_PRODUCT)
    if not index.is_trained:
        index.train(vectors)
    if len(vectors):
        index.add(vectors)
    return index


def add(index: Any, vectors: np.ndarray) -> None:
    """Append vectors (labels continue from ``index.ntotal``)."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if len(vectors):
        index.add(vectors)


def write(index: Any, path: str | os.PathLike[str]) -> None:
    """Serialise ``index`` to ``path`` (callers handle the atomic rename)."""
    import faiss

    faiss.write_index(index, os.fspath(path))


def read(path: str | os.PathLike[str], mmap: bool = False) -> Any:
    """Load an index; ``mmap`` maps it read-only instead of reading it into memory.

    Raises:
        IndexFormatError: missing or unreadable file.
    """
    import faiss

    path = Path(path)
    if not path.is_file():
        raise IndexFormatError(f"{path} is missing; rebuild the index with `clipsearch index`")
    flags = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY if mmap else 0
    try:
        return faiss.read_index(os.fspath(path), flags)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "unknown error"
        raise IndexFormatError(f"{path} is damaged ({first}); rebuild the index with `clipsearch index`") from exc


def search(index: Any, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` search: returns ``(scores, ids)``, each ``(n_queries, min(k, ntotal))``.

    Results are ordered by descending score; ties are ordered by ascending id so that the
    ranking is deterministic.
    """
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    if queries.ndim == 1:
        queries = queries[None, :]
    k = min(int(k), int(index.ntotal))
    if k <= 0:
        return np.empty((len(queries), 0), np.float32), np.empty((len(queries), 0), np.int64)
    # FAISS keeps an arbitrary member of a group of equal scores that straddles position k.
    # Fetch past the cut until no row ties across it, so that sorting (score desc, id asc)
    # and cutting gives the documented order and search(k) is a prefix of search(k + 1).
    fetch = k
    while True:
        fetch = min(int(index.ntotal), max(fetch * 2, k + 1))
        scores, ids = index.search(queries, fetch)
        if fetch == index.ntotal or not np.any(scores[:, k - 1] == scores[:, fetch - 1]):
            break
    order = np.lexsort((ids, -scores), axis=1)[:, :k]
    return np.take_along_axis(scores, order, 1), np.take_along_axis(ids, order, 1)
