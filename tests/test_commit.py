"""Streaming builds through ``indexer.commit.GenerationWriter``: chunk commits merged into one part
with its path file, and an update that extends an approximate index and keeps its options."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from vector_indexes import DIM, ROWS, clustered, records, write_vectors_index

from indexer.commit import GenerationWriter, IndexMeta
from indexer.lock import IndexLock
from indexer.parts import MERGE_MIN_PARTS
from indexer.sides.registry import side_writers
from retrieval import ImageIndex
from retrieval.layout import PATHS_DIR, read_manifest


def test_finish_merges_chunk_parts_and_writes_path_files(vec_index: Path, vectors: np.ndarray) -> None:
    manifest = read_manifest(vec_index)
    # 12 commits of 250 rows: the finishing commit merged the small parts into one.
    assert 12 >= MERGE_MIN_PARTS and len(manifest.parts) == 1 and manifest.parts[0].rows == ROWS
    assert manifest.format_version == 2 and manifest.index_type == "Flat"
    assert all(p.paths is not None and f"/{PATHS_DIR}/" in p.paths for p in manifest.parts)
    index = ImageIndex.open(vec_index)
    assert np.array_equal(index.vectors.embeddings(), vectors)
    assert index.metadata.paths_of([0, 2999, 7]) == ["dir0/img00000.jpg", "dir4/img02999.jpg", "dir2/img00007.jpg"]
    assert index.metadata.paths_of([5]) == [r["path"] for r in index.rows([5])]


def test_update_extends_an_approximate_index_and_keeps_its_options(tmp_path: Path) -> None:
    vecs = clustered(4000, DIM, seed=3)
    out = tmp_path / "grow.idx"
    write_vectors_index(out, vecs[:3000], commit_every=1000, options={"index_type": "hnsw", "target_recall": 0.9})
    first = read_manifest(out)
    assert first.index_type == "HNSW32" and first.index_tuning["tuned_rows"] == 3000
    with IndexLock(out):
        meta = IndexMeta(first.model, first.model_fingerprint, first.backend, DIM, first.preprocess, "synthetic", {}, first.index_options)
        writer = GenerationWriter(out, meta, first, side_writers)
        writer.append(records(3000, 1000), vecs[3000:])
        writer.finish()
    grown = read_manifest(out)
    assert grown.count == 4000 and grown.index_type == "HNSW32" and grown.index_options == first.index_options
    # Grown by a third: re-tuned on the new rows.
    assert grown.index_tuning["tuned_rows"] == 4000
    index = ImageIndex.open(out)
    assert index.vectors.search_ids(vecs[3500:3501], 1)[1][0, 0] == 3500
