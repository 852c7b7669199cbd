"""MkDocs hooks: the options reference tables, generated from the code at build time.

A page holds a marker ``<!-- options:NAME -->`` where a table of
:func:`clipsearch.reference.tables` belongs; the build replaces it, so the docs show the flags
the code has. A marker naming no table fails the build.
"""

from __future__ import annotations

import re
from typing import Any

from clipsearch.reference import tables

_MARKER = re.compile(r"<!--\s*options:([A-Za-z0-9_-]+)\s*-->")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace each ``<!-- options:NAME -->`` in ``markdown`` with the table ``NAME``.

    Raises:
        KeyError: a marker names a table that :func:`~clipsearch.reference.tables` does not make.
    """
    if not _MARKER.search(markdown):
        return markdown
    known = tables()

    def table(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in known:
            where = getattr(getattr(page, "file", None), "src_uri", page)
            raise KeyError(f"{where}: no options table {name!r}; known: {', '.join(sorted(known))}")
        return known[name]

    return _MARKER.sub(table, markdown)
