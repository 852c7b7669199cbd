"""Synthetic vector indexes, written through the indexer's own write path (no images, no model).

Shared by the tests of approximate indexes (reindexing and tuning, filters, commits, re-ranked
indexes); their fixtures (``vectors``, ``vec_index``, ...) are in ``conftest.py``.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np

from indexer.commit import GenerationWriter, IndexMeta
from indexer.lock import IndexLock
from indexer.sides.registry import side_writers
from indexer.writer import FileRecord

DIM = 32
ROWS = 3000


def clustered(n: int, dim: int, seed: int = 0, clusters: int = 30, noise: float = 0.8) -> np.ndarray:
    """L2-normalised vectors around random centres: clustered like real embeddings."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim)).astype(np.float32)
    x = centres[rng.integers(0, clusters, n)] / np.sqrt(dim) * 3 + rng.standard_normal((n, dim)).astype(np.float32) * noise / np.sqrt(dim)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def records(start: int, n: int) -> list[FileRecord]:
    # Paths in 5 folders; widths 100..149; mtimes = id (ns).
    return [
        FileRecord(f"dir{i % 5}/img{i:05d}.jpg".encode(), 100 + i % 50, 60 + i % 7, 1000 + i, i, f"{i:032x}")
        for i in range(start, start + n)
    ]


def write_vectors_index(out: Path, vectors: np.ndarray, commit_every: int, options: dict | None = None, first: int = 0,
                        model: str = "synthetic", source_root: str = "synthetic") -> None:
    """An index of ``vectors`` through the indexer's own write path (no images, no model); its
    rows' paths and facts are those of ids ``first ..`` (a part of a collection built alone)."""
    meta = IndexMeta(
        model=model,
        model_fingerprint="sha256:" + ("0" * 64 if model == "synthetic" else hashlib.sha256(model.encode()).hexdigest()),
        backend="hf",
        dim=vectors.shape[1],
        preprocess={"shortest_edge": 8, "crop_size": [8, 8], "resample": 3, "mean": [0.5] * 3, "std": [0.5] * 3, "rescale_factor": 1 / 255},
        source_root=source_root,
        index_options=options or {"index_type": "auto"},
    )
    out.mkdir(parents=True)
    with IndexLock(out):
        writer = GenerationWriter(out, meta, None, side_writers)
        for start in range(0, len(vectors), commit_every):
            chunk = vectors[start : start + commit_every]
            writer.append(records(first + start, len(chunk)), chunk)
            writer.commit()
        writer.finish()


def copy_of(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy.idx"
    shutil.copytree(src, dst)
    return dst


def exact_top(vectors: np.ndarray, queries: np.ndarray, k: int, allowed: np.ndarray | None = None) -> np.ndarray:
    scores = queries @ vectors.T
    if allowed is not None:
        scores[:, ~allowed] = -np.inf
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]
