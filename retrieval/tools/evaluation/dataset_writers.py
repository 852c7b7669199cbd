"""What a captioned set yields for an evaluation run: the queries file and the image list.

:func:`write_queries` writes one query per caption, ``{"query": caption, "relevant": [path]}``:
text-to-image Recall@K over these queries is the "image retrieval" recall that CLIP papers,
open_clip and CLIP_benchmark publish (for each caption, is its image among the top K of all
test images). :func:`write_image_list` writes the gallery for ``clipsearch index --files-from``.
"""

from __future__ import annotations

import json
import os
from typing import IO, Any

from ...layout import atomic_write
from .captioned_set import CaptionedSet


def queries_of(dataset: CaptionedSet, *, merge_duplicates: bool = False) -> list[dict[str, Any]]:
    """The evaluation queries of a set: one per caption, ``{"query", "relevant": [path]}``.

    Args:
        dataset: the set.
        merge_duplicates: captions that are exactly equal become one query whose relevant
            images are all the images they caption (in first-appearance order). Off for the
            published protocol, where every caption is its own query with only its own image.
    """
    if not merge_duplicates:
        return [{"query": caption, "relevant": [image]} for image, caption in dataset.captions]
    merged: dict[str, list[str]] = {}
    for image, caption in dataset.captions:
        relevant = merged.setdefault(caption, [])
        if image not in relevant:
            relevant.append(image)
    return [{"query": caption, "relevant": relevant} for caption, relevant in merged.items()]


def write_queries(dataset: CaptionedSet, path: str | os.PathLike[str], *, merge_duplicates: bool = False) -> int:
    """Write the set's queries as JSONL (UTF-8), atomically.

    Each line is ``{"query": caption, "relevant": [image path, ...]}`` with paths as the index
    stores them; see :func:`queries_of`.

    Returns:
        The number of queries written.

    Raises:
        OSError: the file cannot be written.
    """
    queries = queries_of(dataset, merge_duplicates=merge_duplicates)
    _write_text(path, "".join(json.dumps(q, ensure_ascii=False) + "\n" for q in queries))
    return len(queries)


def write_image_list(dataset: CaptionedSet, path: str | os.PathLike[str]) -> int:
    """Write the set's images one per line (for ``clipsearch index --files-from``).

    Returns:
        The number of paths written.
    """
    _write_text(path, "".join(p + "\n" for p in dataset.images))
    return len(dataset.images)


def _write_text(path: str | os.PathLike[str], text: str) -> None:
    def write(fh: IO[bytes]) -> None:
        fh.write(text.encode("utf-8"))

    atomic_write(path, write)


__all__ = ["queries_of", "write_image_list", "write_queries"]
