"""Queries from an index's own captions: each stored caption is a text query whose one relevant
image is the image it came with (the retrieval setting of the Karpathy splits), so an index
built from WebDataset shards is evaluated in place, with no queries file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...checks import is_positive_int
from ...errors import EvaluationError, InvalidArgumentError
from .queries import Query

if TYPE_CHECKING:
    from ...index import ImageIndex

# The seed of ``limit``'s draw: the same index and limit give the same queries on every run.
DEFAULT_SEED = 0


def caption_queries(index: ImageIndex, limit: int | None = None, seed: int = DEFAULT_SEED) -> list[Query]:
    """A text query per image with a stored caption, relevant to that image alone, in id order;
    with ``limit``, ``limit`` of them drawn without replacement with ``seed`` (fixed by default).

    Raises:
        InvalidArgumentError: ``limit`` is not an integer >= 1.
        EvaluationError: no image of the index has a caption.
    """
    if limit is not None and not is_positive_int(limit):
        raise InvalidArgumentError(f"limit must be an integer >= 1, got {limit!r}")
    ids = np.arange(index.count)
    captions = [s["caption"] for s in index.sample_meta(ids)] if index.count else []
    have = np.asarray([i for i, c in enumerate(captions) if c is not None and c.strip()], np.int64)
    if not len(have):
        raise EvaluationError(
            f"{index.directory} holds no captions to use as queries: index WebDataset shards with .txt captions, "
            "or give a QUERIES.jsonl"
        )
    if limit is not None and limit < len(have):
        have = np.sort(np.random.default_rng(seed).choice(have, size=limit, replace=False))
    paths = index.paths_of(have)
    return [Query(relevant=(path,), text=captions[int(i)]) for i, path in zip(have.tolist(), paths, strict=True)]


__all__ = ["DEFAULT_SEED", "caption_queries"]
