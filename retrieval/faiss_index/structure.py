"""What an index is made of: its IVF, HNSW and refine stages, and the vectors it holds."""

from __future__ import annotations

from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

# FAISS ships SWIG wrappers without usable type information (pyproject.toml reads it as untyped), so
# its objects are named by role: an index of any kind, and the search parameters and id selectors
# passed to its searches.
FaissIndex: TypeAlias = Any
SearchParams: TypeAlias = Any
Selector: TypeAlias = Any


def kind_of(index: FaissIndex) -> str:
    """``ivf``, ``hnsw`` or ``flat`` (anything else searched as it is)."""
    if _ivf_of(index) is not None:
        return "ivf"
    if _hnsw_of(index) is not None:
        return "hnsw"
    return "flat"


def _ivf_of(index: FaissIndex) -> FaissIndex | None:
    import faiss

    try:
        return faiss.extract_index_ivf(index)
    except (RuntimeError, AttributeError):
        return None


def _hnsw_of(index: FaissIndex) -> FaissIndex | None:
    import faiss

    inner = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexPreTransform) else index
    inner = faiss.downcast_index(inner)
    return inner if hasattr(inner, "hnsw") else None


def _is_pretransform(index: FaissIndex) -> bool:
    import faiss

    return isinstance(faiss.downcast_index(index), faiss.IndexPreTransform)


def refine_of(index: FaissIndex) -> FaissIndex:
    """The ``IndexRefine`` wrapping ``index``'s approximate search (codes re-ranked against a
    second copy of the vectors, e.g. ``IVF4096,PQ64,Refine(SQfp16)``), or None.

    Typed without ``| None``: callers that have just checked :func:`streams_refine` reach into the
    result directly.
    """
    import faiss

    inner = faiss.downcast_index(index)
    return inner if isinstance(inner, faiss.IndexRefine) else None


def stored_vectors(index: FaissIndex, ids: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.float32], bool] | None:
    """The vectors ``index`` holds for ``ids``, and whether they are exact copies.

    Flat storage (flat, HNSW over flat, IVF-flat) holds the vectors as given: they must equal
    the stored embeddings. Compressed codes (SQ, PQ, OPQ rotations) decode to approximations.
    None when the index type cannot return its vectors.
    """
    import faiss

    ids = np.asarray(ids, dtype=np.int64)
    # A refine stage reconstructs from its own copy of the vectors, by id.
    ivf = _ivf_of(index) if refine_of(index) is None else None
    inner = faiss.downcast_index(index)
    exact = not isinstance(inner, faiss.IndexPreTransform) and (
        isinstance(inner, faiss.IndexFlat)
        or isinstance(inner, faiss.IndexIVFFlat)
        or ((hnsw := _hnsw_of(index)) is not None and isinstance(faiss.downcast_index(hnsw.storage), faiss.IndexFlat))
    )
    try:
        if ivf is not None:
            # id -> (list, offset), built in memory: IVF lists are not addressable by id otherwise.
            ivf.make_direct_map()
        out = np.empty((len(ids), int(index.d)), np.float32)
        for row, i in enumerate(ids.tolist()):
            out[row] = index.reconstruct(int(i))
    except RuntimeError:
        return None
    return out, exact
