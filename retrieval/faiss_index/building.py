"""Making an index: create from a factory string, train, reserve room, add vectors."""

from __future__ import annotations

import re

import numpy as np
import numpy.typing as npt

from ..errors import InvalidArgumentError
from .structure import FaissIndex, _hnsw_of, _ivf_of, refine_of

DEFAULT_INDEX_TYPE = "Flat"
# k-means iterations when training IVF/PQ: past ~10 the centroids barely move for retrieval.
TRAIN_ITERATIONS = 10
# efSearch of an HNSW coarse quantizer while vectors are added: FAISS's default (16) assigns
# some vectors to a list that is not their nearest centroid's, where searches probing the
# nearest lists never find them, which caps recall below a flat quantizer's.
QUANTIZER_ADD_EF = 128


def build(vectors: npt.NDArray[np.float32], index_type: str = DEFAULT_INDEX_TYPE) -> FaissIndex:
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
    add(index, vectors)
    return index


def _reason(exc: RuntimeError) -> str:
    last = str(exc).strip().splitlines()[-1] if str(exc).strip() else "unknown error"
    # "Error in faiss::Index* faiss::index_factory(...) at /project/faiss/index_factory.cpp:1228: could not ...",
    # or "... Clustering.cpp:66: Error: 'nx >= k' failed: Number of training points ...".
    return re.sub(r"^Error: '.*' failed: ", "", re.sub(r"^Error in .* at \S+:\d+: ", "", last))


def create(factory: str, dim: int) -> FaissIndex:
    """An empty inner-product index from a FAISS factory string.

    Raises:
        InvalidArgumentError: FAISS does not understand ``factory`` for this dimension.
    """
    import faiss

    try:
        index = faiss.index_factory(int(dim), factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as exc:
        raise InvalidArgumentError(f"FAISS cannot build index type {factory!r} for {dim}-d vectors: {_reason(exc)}") from exc
    ivf = _ivf_of(index)
    if ivf is not None:
        ivf.cp.niter = TRAIN_ITERATIONS
        pq = faiss.downcast_index(ivf)
        if isinstance(pq, faiss.IndexIVFPQ):
            # On by default in factory-made IVF-PQ, for polysemous (Hamming) filtering, which we
            # never search with, and it takes most of the training time.
            pq.do_polysemous_training = False
    return index


def training_rows_needed(index: FaissIndex) -> int:
    """The fewest training vectors FAISS accepts for ``index`` (0: it needs none).

    Each k-means of its training needs at least one point per centroid: ``nlist`` for an IVF
    coarse quantizer, ``2**nbits`` for a product, OPQ or additive (RQ, LSQ) codebook; a PCA one
    per output dimension. FAISS checks this only once training starts, after the sample has
    been read.
    """
    import faiss

    need = 0
    todo = [index]
    while todo:
        part = faiss.downcast_index(todo.pop())
        if isinstance(part, faiss.IndexPreTransform):
            for i in range(part.chain.size()):
                step = faiss.downcast_VectorTransform(part.chain.at(i))
                if isinstance(step, faiss.OPQMatrix):
                    need = max(need, 256)  # OPQ trains its rotation with an 8-bit PQ of its own
                elif isinstance(step, faiss.PCAMatrix):
                    need = max(need, int(step.d_out))
        if isinstance(part, faiss.IndexIVF):
            need = max(need, int(part.nlist))
        if (pq := getattr(part, "pq", None)) is not None:
            need = max(need, int(pq.ksub))
        if (aq := getattr(part, "aq", None)) is not None:
            need = max([need, *(1 << int(b) for b in faiss.vector_to_array(aq.nbits))])
        # The stages inside: a transform's index, a refine stage's two, HNSW's storage.
        inner = (getattr(part, name, None) for name in ("index", "base_index", "refine_index", "storage"))
        todo += [stage for stage in inner if stage is not None]
    return need


def train(index: FaissIndex, sample: npt.NDArray[np.float32], seed: int = 0) -> None:
    """Train ``index`` (IVF centroids, PQ/SQ codebooks, OPQ rotation) on ``sample`` if it needs it.

    Raises:
        InvalidArgumentError: FAISS cannot train it on ``sample`` (its reason, without the C++ trace).
    """
    if index.is_trained:
        return
    ivf = _ivf_of(index)
    if ivf is not None:
        ivf.cp.seed = seed
    try:
        index.train(np.ascontiguousarray(sample, dtype=np.float32))
    except RuntimeError as exc:
        # What training_rows_needed does not foresee (an exotic factory) still ends in one line.
        raise InvalidArgumentError(f"FAISS cannot train this index on {len(sample)} vectors: {_reason(exc)}") from exc


def reserve(index: FaissIndex, rows: int) -> None:
    """Make room for ``rows`` vectors in a refine stage's code array before adding them.

    FAISS grows that array (the largest part of a re-ranked index) by reallocation, doubling
    its capacity, so a build would peak at the old and the new array together. Sizing it once
    to the final size (then back to the rows it holds: the capacity stays) leaves the adds no
    reallocation to make.
    """
    import faiss

    refine = refine_of(index)
    if refine is None:
        return
    inner = faiss.downcast_index(refine.refine_index)
    if not isinstance(inner, faiss.IndexFlatCodes):
        return
    held = int(inner.ntotal) * int(inner.code_size)
    want = int(rows) * int(inner.code_size)
    if want > held:
        inner.codes.resize(want)
        inner.codes.resize(held)


def add(index: FaissIndex, vectors: npt.NDArray[np.float32]) -> None:
    """Append vectors (labels continue from ``index.ntotal``)."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if not len(vectors):
        return
    ivf = _ivf_of(index)
    quantizer = _hnsw_of(ivf.quantizer) if ivf is not None else None
    if quantizer is None:
        index.add(vectors)
        return
    searching = int(quantizer.hnsw.efSearch)
    quantizer.hnsw.efSearch = max(searching, QUANTIZER_ADD_EF)
    try:
        index.add(vectors)
    finally:
        quantizer.hnsw.efSearch = searching
