"""``indexer.ann.update``: the one decision between extending the previous FAISS file and building anew."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from indexer import ann
from retrieval import faiss_index
from retrieval.index_types import IndexOptions

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
