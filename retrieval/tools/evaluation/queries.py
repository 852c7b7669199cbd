"""Labelled queries: the :class:`Query` type and the queries file that holds them.

Queries file (JSON Lines, UTF-8): one object per line,
``{"query": "a red bus", "relevant": ["town/bus.png", ...]}`` for a text query or
``{"image": "queries/bus.jpg", "relevant": [...]}`` for an image query. ``relevant`` lists
paths exactly as the index's ``path`` column stores them (relative to the indexed folder). A
relative ``image`` path is relative to the directory of the queries file. Other keys ("id",
"category", ...) are ignored; blank lines are skipped; line numbers in messages count every
line of the file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import InvalidArgumentError, QueriesFileError
from ...jsonl import read_lines


@dataclass(frozen=True)
class Query:
    """One labelled query: a text or an image, and the index paths that are relevant to it.

    ``relevant`` is stored as a tuple without repeats (first occurrence kept). ``line`` is the
    1-based line of the queries file it came from (None for queries built in code).

    Raises:
        InvalidArgumentError: neither or both of ``text`` and ``image``, an empty text or image
            path, or ``relevant`` not a non-empty list of non-empty path strings.
    """

    relevant: tuple[str, ...]
    text: str | None = None
    image: Path | None = None
    line: int | None = None

    def __post_init__(self) -> None:
        if (self.text is None) == (self.image is None):
            both = "not both" if self.text is not None else "found neither"
            raise InvalidArgumentError(f'a query needs either "query" (a text) or "image" (a path), {both}')
        if self.text is not None and (not isinstance(self.text, str) or not self.text.strip()):
            raise InvalidArgumentError(f'"query" must be a non-empty text, got {self.text!r}')
        if self.image is not None:
            if not isinstance(self.image, (str, os.PathLike)) or not os.fspath(self.image):
                raise InvalidArgumentError(f'"image" must be a non-empty path, got {self.image!r}')
            object.__setattr__(self, "image", Path(self.image))
        relevant = self.relevant
        if isinstance(relevant, (str, bytes)) or not isinstance(relevant, (list, tuple)):
            raise InvalidArgumentError(f'"relevant" must be a list of image paths, got {type(relevant).__name__}')
        if not relevant:
            raise InvalidArgumentError('"relevant" is empty: list at least one image path')
        for i, path in enumerate(relevant):
            if not isinstance(path, str) or not path:
                raise InvalidArgumentError(f'"relevant"[{i}] must be a non-empty path string, got {path!r}')
        object.__setattr__(self, "relevant", tuple(dict.fromkeys(relevant)))

    def describe(self) -> dict[str, Any]:
        """``{"query": text}`` or ``{"image": path}``, as reports show the query."""
        return (
            {"query": self.text}
            if self.text is not None
            else {"image": os.fspath(self.image)}  # type: ignore[arg-type]  # __post_init__: image is set when text is None
        )


def load_queries(path: str | os.PathLike[str]) -> list[Query]:
    """Read a queries file (JSON Lines; see the module docstring for the format).

    Args:
        path: the queries file. Relative ``image`` paths in it are resolved against its
            directory; those images must exist.

    Returns:
        The queries in file order, each with its line number.

    Raises:
        QueriesFileError: the file is missing or unreadable, holds no query, or a line is not
            UTF-8, not JSON, not an object, has neither or both of "query" and "image", an
            empty query, a missing image, or a missing, empty or non-string "relevant" list.
            The message names the file and line.
    """
    file = os.fspath(path)
    lines = read_lines(file, "queries file", QueriesFileError)
    base = Path(os.path.abspath(os.path.dirname(file) or "."))
    queries: list[Query] = []
    for number, raw in lines:
        try:
            obj = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise QueriesFileError("not valid UTF-8", file, number) from None
        except json.JSONDecodeError as exc:
            raise QueriesFileError(f"not valid JSON ({exc.msg} at column {exc.colno})", file, number) from None
        queries.append(_parse_query(obj, base, file, number))
    if not queries:
        raise QueriesFileError("holds no queries (one JSON object per line expected)", file)
    return queries


def _parse_query(obj: Any, base: Path, file: str, line: int) -> Query:
    if not isinstance(obj, dict):
        raise QueriesFileError(f"expected a JSON object, got {type(obj).__name__}", file, line)
    if "relevant" not in obj:
        raise QueriesFileError('"relevant" is missing: list the index paths relevant to this query', file, line)
    image = obj.get("image")
    try:
        query = Query(relevant=obj["relevant"], text=obj.get("query"), image=image, line=line)
    except InvalidArgumentError as exc:
        raise QueriesFileError(str(exc), file, line) from None
    if query.image is not None:
        resolved = Path(os.path.abspath(base / query.image))
        if not resolved.is_file():
            raise QueriesFileError(f"query image not found: {resolved}", file, line)
        query = Query(relevant=query.relevant, image=resolved, line=line)
    return query


__all__ = ["Query", "load_queries"]
