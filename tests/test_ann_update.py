"""``indexer.ann.update``: the one decision between extending the previous FAISS file and building anew."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from indexer import ann
from indexer.index_types import NAMED_TYPES, IndexOptions
from retrieval import InvalidArgumentError, faiss_index

DIM = 16


def vectors(n: int) -> np.ndarray:
    x = np.random.default_rng(0).standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def chunks_of(vecs: np.ndarray, size: int = 40) -> ann.Chunks:
    def chunks(start: int) -> Iterator[tuple[int, np.ndarray]]:
        for first in range(start, len(vecs), size):
            yield first, vecs[first : first + size]

    return chunks


def test_new_index_is_built_then_extended(tmp_path: Path) -> None:
    vecs = vectors(150)
    flat = IndexOptions(index_type="flat")
    first = ann.update(None, chunks_of(vecs[:100]), DIM, 100, flat)
    assert first.action == "rebuilt" and first.index.ntotal == 100
    path = tmp_path / "index.faiss"
    faiss_index.write(first.index, path)

    later = ann.update(ann.PreviousFaiss(path, 100, first.info), chunks_of(vecs), DIM, 150, flat)
    assert later.action == "extended" and later.index.ntotal == 150 and later.info == first.info
    # Extending gives the same vectors as building over every row at once.
    rebuilt = ann.update(None, chunks_of(vecs), DIM, 150, flat)
    assert rebuilt.action == "rebuilt"
    ids = np.arange(150)
    assert np.array_equal(faiss_index.stored_vectors(later.index, ids)[0], faiss_index.stored_vectors(rebuilt.index, ids)[0])


def test_options_that_no_longer_choose_the_file_rebuild(tmp_path: Path) -> None:
    vecs = vectors(120)
    first = ann.update(None, chunks_of(vecs[:80]), DIM, 80, IndexOptions(index_type="flat"))
    path = tmp_path / "index.faiss"
    faiss_index.write(first.index, path)
    said: list[str] = []
    hnsw = IndexOptions(index_type="HNSW8,Flat")
    assert ann.needs_rebuild(first.info.factory, 120, DIM, hnsw)
    moved = ann.update(ann.PreviousFaiss(path, 80, first.info), chunks_of(vecs), DIM, 120, hnsw, progress=said.append)
    assert moved.action == "rebuilt" and moved.info.factory == "HNSW8,Flat" and moved.index.ntotal == 120
    assert said


def test_vectors_are_added_to_their_nearest_lists_under_an_hnsw_quantizer() -> None:
    import faiss
    from vector_indexes import clustered

    x = clustered(20_000, 128, clusters=20)
    index = faiss_index.create("IVF1024_HNSW32,Flat", 128)
    faiss_index.train(index, x)
    ivf = faiss.extract_index_ivf(index)
    quantizer = faiss.downcast_index(ivf.quantizer)
    # A search setting too narrow to find nearest centroids (added at efSearch 1, 13 % of these
    # vectors went to another list, where searches of their nearest lists never look).
    quantizer.hnsw.efSearch = 1
    faiss_index.add(index, x)
    assert quantizer.hnsw.efSearch == 1  # restored for searches
    nearest = np.argmax(x @ quantizer.reconstruct_n(0, ivf.nlist).T, axis=1)
    listed = np.full(len(x), -1, np.int64)
    for lst in range(ivf.nlist):
        size = ivf.invlists.list_size(lst)
        if size:
            listed[np.asarray(faiss.rev_swig_ptr(ivf.invlists.get_ids(lst), size), dtype=np.int64)] = lst
    assert np.mean(listed == nearest) >= 0.999


@pytest.mark.parametrize(
    "factory,need",
    [
        ("Flat", 0),
        ("HNSW32", 0),
        ("IVF64,Flat", 64),
        ("IVF8,SQ8", 8),
        ("IVF8,PQ4", 256),
        ("IVF8,PQ4x4", 16),
        ("OPQ4,IVF8,Flat", 256),
        ("PCA8,IVF4,Flat", 8),
        ("HNSW32,PQ4", 256),
        ("IVF8,PQ4x4,Refine(PQ2)", 256),
        ("RQ2x6", 64),
    ],
)
def test_training_rows_needed_is_what_faiss_accepts(factory: str, need: int) -> None:
    assert faiss_index.training_rows_needed(faiss_index.create(factory, DIM)) == need
    faiss_index.train(faiss_index.create(factory, DIM), vectors(max(need, 1)))
    if need > 1:
        # One fewer fails in FAISS; that failure is a typed one-line error, not a C++ trace.
        with pytest.raises(InvalidArgumentError, match=rf"^FAISS cannot train this index on {need - 1} vectors: [A-Z]"):
            faiss_index.train(faiss_index.create(factory, DIM), vectors(need - 1))


def test_too_few_vectors_for_the_factory_fail_before_reading_them() -> None:
    def unread(start: int) -> Iterator[tuple[int, np.ndarray]]:
        raise AssertionError("the vectors were read before the plan was checked")

    for factory, need in (("IVF256,Flat", 256), ("IVF4,PQ4", 256)):
        options = IndexOptions(index_type=factory)
        wanted = rf"{re.escape(repr(factory))} needs at least {need} training vectors.*has 100.*auto"
        with pytest.raises(InvalidArgumentError, match=wanted):
            ann.check_options(options, DIM, 100)
        # The end of a build (fewer rows than planned: files that did not decode) fails the same way.
        with pytest.raises(InvalidArgumentError, match=f"needs at least {need} training vectors"):
            ann.update(None, unread, DIM, 100, options)
    ann.check_options(IndexOptions(index_type="IVF64,Flat"), DIM, 64)
    # A build trains on at most MAX_TRAIN_ROWS vectors, however many there are.
    with pytest.raises(InvalidArgumentError, match="trains on at most 400000"):
        ann.check_options(IndexOptions(index_type="IVF500000,Flat"), DIM, 1_000_000)


@pytest.mark.parametrize("index_type", NAMED_TYPES)
def test_auto_and_named_types_always_have_enough_to_train(index_type: str) -> None:
    # Their list counts and PQ bits follow the collection's size, so the check never refuses them.
    for n in (0, 1, 255, 256, 300, 1000, 10_000, 50_001, 200_000, 500_001, 2_000_000, 10_000_000):
        ann.check_options(IndexOptions(index_type=index_type, max_memory=64 * 2**30), 512, n)
