"""Captioned datasets -> the images to index and a text-to-image queries file.

Three input formats are read into one :class:`CaptionedSet`:

* Karpathy split files (``dataset_coco.json``, ``dataset_flickr30k.json``, ``dataset_flickr8k.json``):
  ``{"images": [{"filepath"?, "filename", "split", "sentences": [{"raw": ...}, ...]}, ...],
  "dataset": "coco"}``. Image path = ``filepath/filename`` when ``filepath`` is present (COCO:
  ``val2014/COCO_val2014_....jpg``), else ``filename`` (Flickr keeps all images in one folder).
* Caption CSV/TSV: a header with a path column (``path``, ``filepath``, ``image`` or
  ``image_path``) and a caption column (``caption`` or ``text``); one caption per row.
* Caption JSONL: one ``{"path": ..., "caption": ...}`` object per line (same alternative keys
  as the CSV; other keys are ignored). Several rows may name the same image: several captions.

Paths are made relative to the images root the indexer is given (``image_prefix`` is put in
front of every path, e.g. ``flickr30k-images``) and normalised like ``build_index(files=...)``
does, so that they are exactly the paths the index stores and ``search`` returns.

:func:`write_queries` writes one query per caption, ``{"query": caption, "relevant": [path]}``:
text-to-image Recall@K over these queries is the "image retrieval" recall that CLIP papers,
open_clip and CLIP_benchmark publish (for each caption, is its image among the top K of all
test images).

Captions per image (Karpathy): the published protocol is "5,000 images / 25,000 captions" for
COCO and "1,000 / 5,000" for Flickr30k, so :func:`load_karpathy` keeps the first
``max_captions=5`` sentences of each image. A few COCO test images carry a 6th or 7th
sentence (about 25,010 sentences instead of 25,000, by the usual count; no copy of the file was
at hand to check). CLIP_benchmark, which produced open_clip's published retrieval table, does
not cut them in code (torchvision ``CocoCaptions`` returns every annotation of an image and
``zeroshot_retrieval`` ranks every text), so its figures count whatever its annotation file
holds; pass ``max_captions=None`` to keep them all. A handful of ~25,000 queries differ either
way, which moves recall by a few hundredths of a point at most.
"""

from __future__ import annotations

import csv
import json
import os
import posixpath
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from retrieval.errors import ClipSearchError
from retrieval.layout import atomic_write

#: Sentences kept per image from Karpathy split files (the 5k/25k COCO and 1k/5k Flickr protocol).
KARPATHY_CAPTIONS_PER_IMAGE = 5

#: Column names / JSON keys accepted for the image path and the caption, in order of preference.
PATH_KEYS: tuple[str, ...] = ("path", "filepath", "image", "image_path")
CAPTION_KEYS: tuple[str, ...] = ("caption", "text")


class DatasetError(ClipSearchError):
    """A dataset file is missing, unreadable or malformed.

    Attributes:
        source: the file (or a description of the input) the problem is in.
        line: 1-based line number, for line-oriented files (CSV, JSONL, split lists, JSON syntax).
        record: 0-based index of the offending entry of a Karpathy file's ``images`` list.
        problem: what is wrong, without the location.
    """

    def __init__(self, source: str | os.PathLike[str], problem: str, *, line: int | None = None, record: int | None = None) -> None:
        self.source = os.fspath(source)
        self.problem = problem
        self.line = line
        self.record = record
        where = self.source
        if line is not None:
            where += f":{line}"
        if record is not None:
            where += f": images[{record}]"
        super().__init__(f"{where}: {problem}")


@dataclass(frozen=True)
class CaptionedSet:
    """Images and their captions, with paths relative to the images root.

    Attributes:
        name: dataset name (``coco``, ``flickr30k``, or the caption file's stem).
        split: the split the images were taken from, or None for a whole caption file.
        images: every image of the set (the gallery to index), unique, in order of first
            appearance in the source file; images without captions are distractors.
        captions: ``(image path, caption)`` pairs in file order; every path is in ``images``.
        source: the file the set was read from (for messages).

    Raises:
        DatasetError: duplicate or empty image paths, an empty caption, or a caption whose
            image is not in ``images``.
    """

    name: str
    split: str | None
    images: tuple[str, ...]
    captions: tuple[tuple[str, str], ...]
    source: str = field(default="<captioned set>", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "images", tuple(self.images))
        object.__setattr__(self, "captions", tuple(tuple(pair) for pair in self.captions))
        seen: set[str] = set()
        for path in self.images:
            if not isinstance(path, str) or not path:
                raise DatasetError(self.source, f"image paths must be non-empty strings, got {path!r}")
            if path in seen:
                raise DatasetError(self.source, f"image {path!r} is listed twice")
            seen.add(path)
        for pair in self.captions:
            if len(pair) != 2:
                raise DatasetError(self.source, f"captions must be (image path, caption) pairs, got {pair!r}")
            path, caption = pair
            if path not in seen:
                raise DatasetError(self.source, f"caption {caption!r} names image {path!r}, which is not in images")
            if not isinstance(caption, str) or not caption.strip():
                raise DatasetError(self.source, f"empty caption for image {path!r}")

    @property
    def n_images(self) -> int:
        return len(self.images)

    @property
    def n_captions(self) -> int:
        return len(self.captions)

    def subset(self, paths: Iterable[str], split: str | None = None) -> CaptionedSet:
        """Keep only the images in ``paths`` (and their captions), in this set's order.

        Args:
            paths: image paths as stored in this set; unknown ones are ignored (use
                :func:`apply_split_file` to have them reported).
            split: the split name of the result (default: unchanged).
        """
        keep = set(paths)
        return CaptionedSet(
            name=self.name,
            split=self.split if split is None else split,
            images=tuple(p for p in self.images if p in keep),
            captions=tuple(c for c in self.captions if c[0] in keep),
            source=self.source,
        )


# -- paths -------------------------------------------------------------------------------------


def normalize_image_path(raw: str, prefix: str = "") -> str:
    """``prefix/raw`` as a normalised relative POSIX path, as ``build_index(files=...)`` stores it.

    Raises:
        ValueError: empty, absolute, or leaving the images root (``..``).
    """
    if not isinstance(raw, str) or not raw.strip():
        raise ValueError(f"image path must be a non-empty string, got {raw!r}")
    if posixpath.isabs(raw) or os.path.isabs(raw):
        raise ValueError(f"image path {raw!r} is absolute; paths must be relative to the images root")
    path = posixpath.normpath(posixpath.join(prefix, raw) if prefix else raw)
    if path in (".", "..") or path.startswith("../") or posixpath.isabs(path):
        raise ValueError(f"image path {raw!r} (prefix {prefix!r}) is not inside the images root")
    return path


def _check_prefix(prefix: str) -> str:
    if prefix in ("", "."):
        return ""
    # Reuse the path checks: a prefix must itself be a relative path inside the images root.
    try:
        return normalize_image_path(prefix)
    except ValueError as exc:
        raise DatasetError("image_prefix", str(exc)) from None


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
    if max_captions is not None and (isinstance(max_captions, bool) or not isinstance(max_captions, int) or max_captions < 1):
        raise DatasetError(source, f"max_captions must be None or an integer >= 1, got {max_captions!r}")
    prefix = _check_prefix(image_prefix)
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
    name = data.get("dataset") if isinstance(data.get("dataset"), str) and data.get("dataset") else Path(source).stem
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
    except ValueError as exc:
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
    prefix = _check_prefix(image_prefix)
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
            rows = _csv_rows(source, reader, path_col, caption_col)
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


def _csv_rows(source: str, reader: Any, path_col: int, caption_col: int) -> Iterator[tuple[int, Any, Any]]:
    width = max(path_col, caption_col) + 1
    for row in reader:
        line = reader.line_num
        if not any(cell.strip() for cell in row):
            continue  # blank line
        if len(row) < width:
            raise DatasetError(source, f"row has {len(row)} fields, the header needs at least {width}", line=line)
        yield line, row[path_col], row[caption_col]


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
    prefix = _check_prefix(image_prefix)
    try:
        fh = open(source, "rb")
    except OSError as exc:
        raise DatasetError(source, f"cannot read: {exc.strerror or exc}") from exc
    with fh:
        return _collect(source, _jsonl_rows(source, fh), prefix, max_captions, name)


def _jsonl_rows(source: str, fh: IO[bytes]) -> Iterator[tuple[int, Any, Any]]:
    for line_no, raw in enumerate(fh, start=1):
        try:
            text = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
        except UnicodeDecodeError:
            raise DatasetError(source, "not UTF-8 text", line=line_no) from None
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DatasetError(source, f"invalid JSON at column {exc.colno}: {exc.msg}", line=line_no) from None
        if not isinstance(obj, dict):
            raise DatasetError(source, f"expected a JSON object, got {type(obj).__name__}", line=line_no)
        path_key = next((k for k in PATH_KEYS if k in obj), None)
        caption_key = next((k for k in CAPTION_KEYS if k in obj), None)
        if path_key is None:
            raise DatasetError(source, f"no image path key (one of: {', '.join(PATH_KEYS)})", line=line_no)
        if caption_key is None:
            raise DatasetError(source, f"no caption key (one of: {', '.join(CAPTION_KEYS)})", line=line_no)
        yield line_no, obj[path_key], obj[caption_key]


def _collect(
    source: str,
    rows: Iterable[tuple[int, Any, Any]],
    prefix: str,
    max_captions: int | None,
    name: str | None,
) -> CaptionedSet:
    """Build a set from ``(line, path, caption)`` rows, validating each with its line number."""
    if max_captions is not None and (isinstance(max_captions, bool) or not isinstance(max_captions, int) or max_captions < 1):
        raise DatasetError(source, f"max_captions must be None or an integer >= 1, got {max_captions!r}")
    per_image: dict[str, int] = {}
    captions: list[tuple[str, str]] = []
    for line, raw_path, caption in rows:
        if not isinstance(raw_path, str):
            raise DatasetError(source, f"image path must be a string, got {raw_path!r}", line=line)
        try:
            image = normalize_image_path(raw_path, prefix)
        except ValueError as exc:
            raise DatasetError(source, str(exc), line=line) from None
        if not isinstance(caption, str) or not caption.strip():
            raise DatasetError(source, f"empty caption for image {image!r}", line=line)
        count = per_image.get(image, 0)
        per_image[image] = count + 1
        if max_captions is None or count < max_captions:
            captions.append((image, caption.strip()))
    if not per_image:
        raise DatasetError(source, "no captions in the file")
    return CaptionedSet(
        name=name or Path(source).stem,
        split=None,
        images=tuple(per_image),
        captions=tuple(captions),
        source=source,
    )


# -- dispatch, splits, output ------------------------------------------------------------------


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
        return load_karpathy(source, split or "test", image_prefix=image_prefix, max_captions=cap)  # type: ignore[arg-type]
    if suffix not in (".csv", ".tsv", ".jsonl", ".ndjson"):
        raise DatasetError(source, f"unknown dataset format {suffix or '(no extension)'!r}; expected .json (Karpathy), .csv, .tsv or .jsonl")
    if split is not None:
        raise DatasetError(source, "caption files have no splits; select images with a split file instead")
    cap = None if max_captions == "default" else max_captions
    if suffix in (".csv", ".tsv"):
        return load_captions_csv(source, image_prefix=image_prefix, max_captions=cap)  # type: ignore[arg-type]
    return load_captions_jsonl(source, image_prefix=image_prefix, max_captions=cap)  # type: ignore[arg-type]


def read_image_list(path: str | os.PathLike[str], *, image_prefix: str = "") -> tuple[tuple[int, str], ...]:
    """Read a list of image paths (one per line, ``#`` comments and blank lines ignored).

    Returns:
        ``(line number, normalised path)`` pairs in file order.

    Raises:
        DatasetError: unreadable file, or an invalid path (with its line number).
    """
    source = os.fspath(path)
    prefix = _check_prefix(image_prefix)
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
        except ValueError as exc:
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
    text = "".join(json.dumps(q, ensure_ascii=False) + "\n" for q in queries)
    atomic_write(path, lambda fh: fh.write(text.encode("utf-8")))
    return len(queries)


def write_image_list(dataset: CaptionedSet, path: str | os.PathLike[str]) -> int:
    """Write the set's images one per line (for ``clipsearch index --files-from``).

    Returns:
        The number of paths written.
    """
    text = "".join(p + "\n" for p in dataset.images)
    atomic_write(path, lambda fh: fh.write(text.encode("utf-8")))
    return len(dataset.images)


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
