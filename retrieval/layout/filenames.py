"""File and directory names inside an index directory (see :mod:`retrieval.layout` for the tree)."""

from __future__ import annotations

import os
from pathlib import Path

MANIFEST_FILE = "manifest.json"
EMBEDDINGS_DIR = "embeddings"
PATHS_DIR = "paths"
FAISS_FILE = "index.faiss"
KEYWORDS_FILE = "keywords.sqlite"
# The faces side (index --faces): one row per face, and one per image the detector has read.
FACES_FILE = "faces.parquet"
FACES_READ_FILE = "faces_read.parquet"
SKIPPED_FILE = "skipped.parquet"
LOCK_FILE = "lock"
PATHS_SUFFIX = ".paths"

GENERATION_PREFIX = "gen-"
STAGING_PREFIX = ".staging-"


def generation_dir(generation: str) -> str:
    """Name of the directory (inside INDEX_DIR) that holds one generation's data files."""
    return GENERATION_PREFIX + generation


def part_name(number: int) -> str:
    """File name of the ``number``-th part of a generation (zero-padded: name order is id order)."""
    return f"part-{number:05d}.parquet"


def is_index_dir(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` holds a manifest (of any version)."""
    return (Path(path) / MANIFEST_FILE).is_file()


def holds_only_writer_leftovers(path: str | os.PathLike[str]) -> bool:
    """Whether a directory holds nothing but what a writer killed before its first manifest
    leaves behind (its lock file, staging and generation folders): ours to reuse."""
    return all(p.name == LOCK_FILE or p.name.startswith((STAGING_PREFIX, GENERATION_PREFIX)) for p in Path(path).iterdir())
