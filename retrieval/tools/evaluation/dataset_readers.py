"""Readers of the three caption dataset formats, each into a :class:`CaptionedSet`.

:func:`load_dataset` picks the reader by the file's extension.

* Karpathy split files (``dataset_coco.json``, ``dataset_flickr30k.json``, ``dataset_flickr8k.json``):
  ``{"images": [{"filepath"?, "filename", "split", "sentences": [{"raw": ...}, ...]}, ...],
  "dataset": "coco"}``. Image path = ``filepath/filename`` when ``filepath`` is present (COCO:
  ``val2014/COCO_val2014_....jpg``), else ``filename`` (Flickr keeps all images in one folder).
* Caption CSV/TSV: a header with a path column (``path``, ``filepath``, ``image`` or
  ``image_path``) and a caption column (``caption`` or ``text``); one caption per row.
* Caption JSONL: one ``{"path": ..., "caption": ...}`` object per line (same alternative keys
  as the CSV; other keys are ignored), read by :func:`retrieval.jsonl.parse_caption_line`, the
  parser fine-tuning pairs files use too. Several rows may name the same image: several captions.

Captions per image (Karpathy): the published protocol is "5,000 images / 25,000 captions" for
COCO and "1,000 / 5,000" for Flickr30k, so :func:`load_karpathy` keeps the first
``max_captions=5`` sentences of each image. A few COCO test images carry a 6th or 7th
sentence (about 25,010 sentences instead of 25,000, by the usual count). CLIP_benchmark,
which produced open_clip's published retrieval table, does not cut them in code (torchvision
``CocoCaptions`` returns every annotation of an image and ``zeroshot_retrieval`` ranks every
text), so its figures count whatever its annotation file holds; pass ``max_captions=None`` to
keep them all. A handful of ~25,000 queries differ either way, which moves recall by a few
hundredths of a point at most.
"""

from __future__ import annotations

import csv
import json
import os
import posixpath
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...checks import is_positive_int
from ...errors import DatasetError, InvalidArgumentError
from ...jsonl import CAPTION_KEYS, PATH_KEYS, caption_pair, parse_caption_line, read_lines
from .captioned_set import CaptionedSet, check_prefix, normalize_image_path

#: Sentences kept per image from Karpathy split files (the 5k/25k COCO and 1k/5k Flickr protocol).
KARPATHY_CAPTIONS_PER_IMAGE = 5


# -- any supported file ------------------------------------------------------------------------


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


# -- Karpathy split files ----------------------------------------------------------------------


def load_karpathy(
    path: str | os.PathLike[str],
    split: str | Sequence[str] = "test",
    *,
    image_prefix: str = "",
    max_captions: int | None = KARPATHY_CAPTIONS_PER_IMAGE,
) -> CaptionedSet:
    """Read a Karpathy split file (``dataset_coco.json``, ``dataset_flickr30k.json``, ...).

    Args:
        path: the JSON file.
        split: split name(s) to keep: ``test`` (COCO 5,000 images, Flickr30k 1,000), ``val``,
            ``train``, ``restval``; several as a sequence or a comma-separated string.
        image_prefix: put in front of every image path, e.g. ``flickr30k-images`` when the
            images root given to the indexer is that folder's parent.
        max_captions: keep the first N sentences of each image (None: all of them).

    Returns:
        The images of the split in file order and their captions (``sentences[i].raw``,
        stripped of surrounding white space).

    Raises:
        DatasetError: unreadable file, invalid JSON (with line and column), a malformed image
            record (with its index in ``images``), duplicate images, or no image in the split.
    """
    source = os.fspath(path)
    splits = _split_names(split)
    if max_captions is not None and not is_positive_int(max_captions):
        raise DatasetError(source, f"max_captions must be None or an integer >= 1, got {max_captions!r}")
    prefix = check_prefix(image_prefix)
    data = _read_json(source)
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise DatasetError(source, 'not a Karpathy split file: expected an object with an "images" list')
    images: list[str] = []
    captions: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    found_splits: set[str] = set()
    for i, record in enumerate(data["images"]):
        if not isinstance(record, dict):
            raise DatasetError(source, f"expected an object, got {type(record).__name__}", record=i)
        rec_split = record.get("split")
        if not isinstance(rec_split, str):
            raise DatasetError(source, f'"split" must be a string, got {rec_split!r}', record=i)
        found_splits.add(rec_split)
        if rec_split not in splits:
            continue
        image = _karpathy_path(source, i, record, prefix)
        if image in seen:
            raise DatasetError(source, f"image {image!r} is listed twice (also images[{seen[image]}])", record=i)
        seen[image] = i
        sentences = record.get("sentences")
        if not isinstance(sentences, list) or not sentences:
            raise DatasetError(source, f'{image}: "sentences" must be a non-empty list', record=i)
        kept = sentences if max_captions is None else sentences[:max_captions]
        for j, sentence in enumerate(kept):
            raw = sentence.get("raw") if isinstance(sentence, dict) else None
            if not isinstance(raw, str) or not raw.strip():
                raise DatasetError(source, f'{image}: sentences[{j}] has no non-empty "raw" text', record=i)
            captions.append((image, raw.strip()))
        images.append(image)
    if not images:
        known = ", ".join(sorted(found_splits)) or "none"
        raise DatasetError(source, f"no image in split {'/'.join(splits)} (splits in the file: {known})")
    dataset = data.get("dataset")
    name = dataset if isinstance(dataset, str) and dataset else Path(source).stem
    return CaptionedSet(name=name, split="+".join(splits), images=tuple(images), captions=tuple(captions), source=source)


def _split_names(split: str | Sequence[str]) -> tuple[str, ...]:
    names = split.split(",") if isinstance(split, str) else list(split)
    cleaned = tuple(dict.fromkeys(n.strip() for n in names if isinstance(n, str) and n.strip()))
    if not cleaned:
        raise DatasetError("split", f"no split name given ({split!r})")
    return cleaned


def _karpathy_path(source: str, i: int, record: Mapping[str, Any], prefix: str) -> str:
    filename = record.get("filename")
    filepath = record.get("filepath")
    if not isinstance(filename, str) or not filename.strip():
        raise DatasetError(source, f'"filename" must be a non-empty string, got {filename!r}', record=i)
    if filepath is not None and not isinstance(filepath, str):
        raise DatasetError(source, f'"filepath" must be a string, got {filepath!r}', record=i)
    raw = posixpath.join(filepath, filename) if filepath else filename
    try:
        return normalize_image_path(raw, prefix)
    except InvalidArgumentError as exc:
        raise DatasetError(source, str(exc), record=i) from None


def _read_json(source: str) -> Any:
    try:
        with open(source, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise DatasetError(source, f"cannot read: {exc.strerror or exc}") from exc
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DatasetError(source, f"not UTF-8 text (byte {exc.start})", line=line) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetError(source, f"invalid JSON at column {exc.colno}: {exc.msg}", line=exc.lineno) from None


# -- caption CSV / JSONL -----------------------------------------------------------------------


def load_captions_csv(
    path: str | os.PathLike[str],
    *,
    image_prefix: str = "",
    max_captions: int | None = None,
    name: str | None = None,
    delimiter: str | None = None,
) -> CaptionedSet:
    """Read a caption CSV (``.tsv``: tab-separated) with a header row.

    Args:
        path: the file (UTF-8, a byte-order mark is allowed).
        image_prefix: put in front of every image path.
        max_captions: keep the first N captions of each image (None: all).
        name: dataset name (default: the file name without extension).
        delimiter: field separator (default: tab for ``.tsv``, else comma).

    Returns:
        The images in order of first appearance and every caption in row order.

    Raises:
        DatasetError: unreadable file, no path/caption column in the header, or a row with an
            empty or invalid path or caption (with its line number).
    """
    source = os.fspath(path)
    prefix = check_prefix(image_prefix)
    sep = delimiter or ("\t" if source.lower().endswith(".tsv") else ",")
    try:
        fh = open(source, encoding="utf-8-sig", newline="")
    except OSError as exc:
        raise DatasetError(source, f"cannot read: {exc.strerror or exc}") from exc
    with fh:
        reader = csv.reader(fh, delimiter=sep)
        try:
            header = next(reader, None)
            if header is None:
                raise DatasetError(source, "empty file: expected a header row", line=1)
            columns = [h.strip().lower() for h in header]
            path_col = _pick_column(source, columns, PATH_KEYS, "image path")
            caption_col = _pick_column(source, columns, CAPTION_KEYS, "caption")
            rows = _csv_rows(source, reader, path_col, caption_col, columns[caption_col])
            return _collect(source, rows, prefix, max_captions, name)
        except UnicodeDecodeError as exc:
            raise DatasetError(source, f"not UTF-8 text ({exc.reason})", line=reader.line_num + 1) from None
        except csv.Error as exc:
            raise DatasetError(source, f"malformed CSV: {exc}", line=reader.line_num) from None


def _pick_column(source: str, columns: list[str], keys: tuple[str, ...], what: str) -> int:
    for key in keys:
        if key in columns:
            return columns.index(key)
    raise DatasetError(source, f"header has no {what} column (one of: {', '.join(keys)}); found {columns}", line=1)


def _csv_rows(source: str, reader: Any, path_col: int, caption_col: int, caption_key: str) -> Iterator[tuple[int, str, str]]:
    width = max(path_col, caption_col) + 1
    for row in reader:
        line = reader.line_num
        if not any(cell.strip() for cell in row):
            continue  # blank line
        if len(row) < width:
            raise DatasetError(source, f"row has {len(row)} fields, the header needs at least {width}", line=line)
        try:
            path, caption = caption_pair(row[path_col], row[caption_col], caption_key)
        except InvalidArgumentError as exc:
            raise DatasetError(source, str(exc), line=line) from None
        yield line, path, caption


def load_captions_jsonl(
    path: str | os.PathLike[str],
    *,
    image_prefix: str = "",
    max_captions: int | None = None,
    name: str | None = None,
) -> CaptionedSet:
    """Read a caption JSONL file: one ``{"path": ..., "caption": ...}`` object per line.

    ``filepath``/``image``/``image_path`` are accepted for ``path`` and ``text`` for
    ``caption``; other keys (e.g. ``category``) are ignored; blank lines are skipped.

    Args:
        path: the file (UTF-8).
        image_prefix: put in front of every image path.
        max_captions: keep the first N captions of each image (None: all).
        name: dataset name (default: the file name without extension).

    Returns:
        The images in order of first appearance and every caption in line order.

    Raises:
        DatasetError: unreadable file, or a line that is not a JSON object with a valid path
            and a non-empty caption (with its line number).
    """
    source = os.fspath(path)
    prefix = check_prefix(image_prefix)
    lines = read_lines(source, "caption file", lambda message, file: DatasetError(file, message))
    return _collect(source, _jsonl_rows(source, lines), prefix, max_captions, name)


def _jsonl_rows(source: str, lines: Iterable[tuple[int, bytes]]) -> Iterator[tuple[int, str, str]]:
    for line_no, raw in lines:
        try:
            obj = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise DatasetError(source, "not UTF-8 text", line=line_no) from None
        except json.JSONDecodeError as exc:
            raise DatasetError(source, f"invalid JSON at column {exc.colno}: {exc.msg}", line=line_no) from None
        try:
            path, caption = parse_caption_line(obj)
        except InvalidArgumentError as exc:
            raise DatasetError(source, str(exc), line=line_no) from None
        yield line_no, path, caption


def _collect(
    source: str,
    rows: Iterable[tuple[int, str, str]],
    prefix: str,
    max_captions: int | None,
    name: str | None,
) -> CaptionedSet:
    """Build a set from checked ``(line, path, caption)`` rows, normalising each path."""
    if max_captions is not None and not is_positive_int(max_captions):
        raise DatasetError(source, f"max_captions must be None or an integer >= 1, got {max_captions!r}")
    per_image: dict[str, int] = {}
    captions: list[tuple[str, str]] = []
    for line, raw_path, caption in rows:
        try:
            image = normalize_image_path(raw_path, prefix)
        except InvalidArgumentError as exc:
            raise DatasetError(source, str(exc), line=line) from None
        count = per_image.get(image, 0)
        per_image[image] = count + 1
        if max_captions is None or count < max_captions:
            captions.append((image, caption))
    if not per_image:
        raise DatasetError(source, "no captions in the file")
    return CaptionedSet(
        name=name or Path(source).stem,
        split=None,
        images=tuple(per_image),
        captions=tuple(captions),
        source=source,
    )


__all__ = ["KARPATHY_CAPTIONS_PER_IMAGE", "load_captions_csv", "load_captions_jsonl", "load_dataset", "load_karpathy"]
