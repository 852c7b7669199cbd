"""Training pairs files: one ``{"path": ..., "caption": ...}`` JSON object per line.

``path`` is relative to an images root (by default the pairs file's own directory) or
absolute; ``caption`` is the text that describes the image. Other keys (``category``, ...)
are ignored and blank lines skipped, so a captions file such as ``data/demo/captions.jsonl`` is
a pairs file as it is. The same image may appear on several lines with different captions.

A line that cannot be used (not UTF-8, not JSON, not an object, no path, an empty caption, an
image that does not exist) does not stop a training run: it is recorded in
:attr:`PairsFile.skipped` with its line number and reason, and the caller reports it. Only a
file that is missing, unreadable or left with no usable pair is an error.

This module reads text only; images are decoded later (:mod:`indexer.training.augment`), where a file
that exists but cannot be decoded is skipped the same way.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retrieval.errors import InvalidArgumentError, PairsFileError
from retrieval.jsonl import parse_caption_line, read_lines

# How many skipped lines a summary lists before "... and N more".
DEFAULT_LISTED = 5


@dataclass(frozen=True)
class Pair:
    """One usable line: an existing image file and its caption.

    Attributes:
        path: the path as the file wrote it.
        file: the image file (absolute).
        caption: the caption, stripped of surrounding whitespace (never empty).
        line: 1-based line number in the pairs file.
    """

    path: str
    file: Path
    caption: str
    line: int


@dataclass(frozen=True)
class SkippedLine:
    """A line that was not used, and why (``reason`` is one short phrase)."""

    line: int
    reason: str

    def describe(self, source: str) -> str:
        return f"{source}:{self.line}: {self.reason}"


@dataclass(frozen=True)
class PairsFile:
    """The usable pairs of a file and the lines that were skipped.

    Attributes:
        source: the pairs file as given.
        root: the directory relative image paths were resolved against.
        pairs: usable pairs in file order.
        skipped: skipped lines in file order.
    """

    source: str
    root: Path
    pairs: tuple[Pair, ...]
    skipped: tuple[SkippedLine, ...]

    def skipped_summary(self, limit: int = DEFAULT_LISTED) -> list[str]:
        """Lines for a person: a headline with the count, then the first ``limit`` skipped lines.

        Returns:
            An empty list when nothing was skipped.
        """
        if not self.skipped:
            return []
        total = len(self.pairs) + len(self.skipped)
        out = [f"{self.source}: skipped {len(self.skipped)} of {total} lines"]
        out += ["  " + s.describe(self.source) for s in self.skipped[:limit]]
        if len(self.skipped) > limit:
            out.append(f"  ... and {len(self.skipped) - limit} more")
        return out


def load_pairs(path: str | os.PathLike[str], images_root: str | os.PathLike[str] | None = None) -> PairsFile:
    """Read a pairs file, keeping the usable lines and recording the others.

    Args:
        path: the JSON Lines file.
        images_root: directory that relative image paths are relative to; default: the
            directory of ``path``.

    Returns:
        The usable pairs (at least one) and the skipped lines.

    Raises:
        PairsFileError: the file is missing, a directory or unreadable, ``images_root`` is not
            a directory, or no line is usable (the message gives the first reasons).
    """
    source = os.fspath(path)
    lines = read_lines(source, "pairs file", PairsFileError)
    if images_root is None:
        root = Path(os.path.abspath(os.path.dirname(source) or "."))
    else:
        root = Path(os.path.abspath(os.fspath(images_root)))
        if not root.is_dir():
            raise PairsFileError(f"images root {root} is not a directory", source)

    pairs: list[Pair] = []
    skipped: list[SkippedLine] = []
    for number, raw in lines:
        result = _parse_line(raw, root, number)
        (pairs if isinstance(result, Pair) else skipped).append(result)  # type: ignore[arg-type]  # isinstance picks the matching list
    if not pairs:
        if not skipped:
            raise PairsFileError('holds no pairs (one {"path": ..., "caption": ...} object per line expected)', source)
        first = "; ".join(s.describe(source) for s in skipped[:3])
        raise PairsFileError(f"none of its {len(skipped)} lines is a usable pair, e.g. {first}", source)
    return PairsFile(source=source, root=root, pairs=tuple(pairs), skipped=tuple(skipped))


def _parse_line(raw: bytes, root: Path, line: int) -> Pair | SkippedLine:
    try:
        obj: Any = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return SkippedLine(line, "not valid UTF-8")
    except json.JSONDecodeError as exc:
        return SkippedLine(line, f"not valid JSON ({exc.msg} at column {exc.colno})")
    try:
        rel, caption = parse_caption_line(obj)
    except InvalidArgumentError as exc:
        return SkippedLine(line, str(exc))
    file = Path(os.path.abspath(root / rel))
    if not file.is_file():
        return SkippedLine(line, f"image not found: {rel}")
    return Pair(path=rel, file=file, caption=caption, line=line)


def caption_groups(captions: Sequence[str]) -> list[int]:
    """Group id per caption: equal ids for captions a CLIP tokenizer cannot tell apart.

    CLIP tokenizers lower-case and collapse whitespace, so "The letter A." and "the letter a."
    are the same text to the model.
    """
    ids: dict[str, int] = {}
    return [ids.setdefault(" ".join(c.lower().split()), len(ids)) for c in captions]
