"""Captioned datasets -> the images to index and a text-to-image queries file.

Three input formats (Karpathy split files, caption CSV/TSV, caption JSONL; see
:mod:`.caption_loaders`) are read into one :class:`CaptionedSet` whose image paths are exactly
the paths the index stores (:mod:`.captioned_set`). :func:`load_dataset` picks the loader by
extension; :func:`apply_split_file` keeps the images a split file lists.

:func:`write_queries` writes one query per caption, ``{"query": caption, "relevant": [path]}``:
text-to-image Recall@K over these queries is the "image retrieval" recall that CLIP papers,
open_clip and CLIP_benchmark publish (for each caption, is its image among the top K of all
test images).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from ..errors import DatasetError, InvalidArgumentError
from ..jsonl import CAPTION_KEYS, PATH_KEYS
from ..layout import atomic_write
from .caption_loaders import KARPATHY_CAPTIONS_PER_IMAGE, load_captions_csv, load_captions_jsonl, load_karpathy
from .captioned_set import CaptionedSet, check_prefix, normalize_image_path


def load_dataset(
    path: str | os.PathLike[str],
    *,
    split: str | Sequence[str] | None = None,
    image_prefix: str = "",
    max_captions: int | None | str = "default",
) -> CaptionedSet:
    """Read any supported file, chosen by its extension.

    ``.json`` is a Karpathy split file (``split`` default ``test``, first 5 captions per image
    unless ``max_captions`` says otherwise); ``.csv``/``.tsv`` and ``.jsonl``/``.ndjson`` are
    caption files (all captions unless ``max_captions``; ``split`` must be None: use
    :func:`apply_split_file`).

    Raises:
        DatasetError: unknown extension, or any error of the specific loader.
    """
    source = os.fspath(path)
    suffix = Path(source).suffix.lower()
    if suffix == ".json":
        cap = KARPATHY_CAPTIONS_PER_IMAGE if max_captions == "default" else max_captions
        return load_karpathy(
            source,
            split or "test",
            image_prefix=image_prefix,
            max_captions=cap,  # type: ignore[arg-type]  # "default" replaced; loader rejects other str
        )
    if suffix not in (".csv", ".tsv", ".jsonl", ".ndjson"):
        raise DatasetError(
            source, f"unknown dataset format {suffix or '(no extension)'!r}; expected .json (Karpathy), .csv, .tsv or .jsonl"
        )
    if split is not None:
        raise DatasetError(source, "caption files have no splits; select images with a split file instead")
    cap = None if max_captions == "default" else max_captions
    if suffix in (".csv", ".tsv"):
        return load_captions_csv(
            source, image_prefix=image_prefix, max_captions=cap  # type: ignore[arg-type]  # "default" replaced; loader rejects other str
        )
    return load_captions_jsonl(
        source, image_prefix=image_prefix, max_captions=cap  # type: ignore[arg-type]  # "default" replaced; loader rejects other str
    )


def read_image_list(path: str | os.PathLike[str], *, image_prefix: str = "") -> tuple[tuple[int, str], ...]:
    """Read a list of image paths (one per line, ``#`` comments and blank lines ignored).

    Returns:
        ``(line number, normalised path)`` pairs in file order.

    Raises:
        DatasetError: unreadable file, or an invalid path (with its line number).
    """
    source = os.fspath(path)
    prefix = check_prefix(image_prefix)
    try:
        data = Path(source).read_bytes()
    except OSError as exc:
        raise DatasetError(source, f"cannot read: {exc.strerror or exc}") from exc
    out: list[tuple[int, str]] = []
    for line_no, raw in enumerate(data.splitlines(), start=1):
        try:
            text = raw.decode("utf-8-sig" if line_no == 1 else "utf-8").rstrip("\r")
        except UnicodeDecodeError:
            raise DatasetError(source, "not UTF-8 text", line=line_no) from None
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        try:
            out.append((line_no, normalize_image_path(text, prefix)))
        except InvalidArgumentError as exc:
            raise DatasetError(source, str(exc), line=line_no) from None
    return tuple(out)


def apply_split_file(
    dataset: CaptionedSet, path: str | os.PathLike[str], *, image_prefix: str = "", split: str | None = None
) -> CaptionedSet:
    """Keep the images listed in a split file (e.g. ``data/demo/splits/test.txt``).

    Args:
        dataset: the full set.
        path: one image path per line, as in the caption file (before ``image_prefix``).
        image_prefix: the prefix the dataset was loaded with, applied to the listed paths too.
        split: the split name of the result (default: the file name without extension).

    Raises:
        DatasetError: a listed path that is not in ``dataset`` (with its line number), or an
            empty list.
    """
    source = os.fspath(path)
    known = set(dataset.images)
    listed = read_image_list(source, image_prefix=image_prefix)
    for line_no, image in listed:
        if image not in known:
            raise DatasetError(source, f"image {image!r} is not in {dataset.source}", line=line_no)
    if not listed:
        raise DatasetError(source, "the split file lists no images")
    return dataset.subset((p for _, p in listed), split=split or Path(source).stem)


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


__all__ = [
    "CAPTION_KEYS",
    "KARPATHY_CAPTIONS_PER_IMAGE",
    "PATH_KEYS",
    "CaptionedSet",
    "DatasetError",
    "apply_split_file",
    "load_captions_csv",
    "load_captions_jsonl",
    "load_dataset",
    "load_karpathy",
    "normalize_image_path",
    "queries_of",
    "read_image_list",
    "write_image_list",
    "write_queries",
]
