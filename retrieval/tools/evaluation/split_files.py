"""Split files: a list of image paths that selects the images of a split from a captioned set.

A caption CSV/JSONL file has no splits of its own; a split file (e.g. ``data/demo/splits/test.txt``)
lists the images of one, one path per line, as in the caption file.
"""

from __future__ import annotations

import os
from pathlib import Path

from ...errors import DatasetError, InvalidArgumentError
from .captioned_set import CaptionedSet, check_prefix, normalize_image_path


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


__all__ = ["apply_split_file", "read_image_list"]
