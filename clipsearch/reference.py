"""The options reference of the docs, generated from the declarations the code runs on.

Each table lists one settings dataclass's fields (``BuildConfig``'s build options, ``Filter``'s
filters, ``SearchParams``' search parameters) with the CLI flag, the Python keyword and the HTTP
field derived from them, so the docs cannot drift from the flags. ``docs/hooks.py`` puts them into the pages at build time.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from retrieval.options import Option, flag_of, options_of, value_types

_KEYWORD = "Python keyword"
_HEADER = ("Flag", _KEYWORD, "HTTP field", "Type", "Default", "Meaning")
_NONE = "—"


def tables() -> dict[str, str]:
    """The Markdown tables of the options reference, by name.

    Returns:
        ``build`` (``clipsearch index`` / :func:`indexer.build_index` / ``BuildConfig``),
        ``filters`` (``clipsearch search`` / ``where=Filter(...)`` / the search API) and
        ``search`` (``clipsearch search`` / the search API, no Python keyword column) and
        ``watch`` (``clipsearch index --watch`` / ``WatchConfig``), each a Markdown table with
        one row per field.
    """
    from indexer.build_config import BuildConfig
    from indexer.watch_config import WatchConfig
    from retrieval.filters import Filter

    from .search_params import SearchParams

    return {
        "build": table(BuildConfig), "filters": table(Filter), "search": table(SearchParams, python=False),
        "watch": table(WatchConfig),
    }


def table(cls: type, *, python: bool = True) -> str:
    """One Markdown table row per field of the dataclass ``cls`` (see :func:`tables`); without
    ``python``, no Python keyword column (the fields are not keywords of one Python call)."""
    types = value_types(cls)
    header = _HEADER if python else tuple(h for h in _HEADER if h != _KEYWORD)
    lines = [_row(header), _row(("---",) * len(header))]
    for f, opt in options_of(cls):
        flag = f"`{opt.short}`, `{flag_of(f)}`" if opt.short else f"`{flag_of(f)}`"
        cells = (
            flag if opt.cli else _NONE,
            f"`{f.name}`",
            f"`{f.name}`" if opt.http else _NONE,
            _type(opt, types[f.name]),
            _default(opt, f),
            _escape(opt.help),
        )
        lines.append(_row(cells if python else cells[:1] + cells[2:]))
    return "\n".join(lines) + "\n"


def _type(opt: Option, kind: type) -> str:
    if opt.http_max is not None:
        # The server's bound on one request; the CLI takes any.
        return f"{_type(dataclasses.replace(opt, http_max=None), kind)} (HTTP: at most {opt.http_max})"
    if opt.choices is not None:
        return " or ".join(f"`{c}`" for c in opt.choices)
    if kind is tuple:
        return "text, repeatable"
    name = {str: "text", int: "integer", float: "number", bool: "flag"}.get(kind, kind.__name__)
    if opt.text_type is not None:
        # The CLI and HTTP take text that the field reads; Python takes the value too.
        return f"{opt.text_type} ({name} in Python)"
    return name


def _default(opt: Option, f: dataclasses.Field[Any]) -> str:
    if opt.default_text is not None:
        return _escape(opt.default_text) or _NONE
    if f.default is None or f.default == ():
        return _NONE
    return f"`{f.default}`"


def _escape(text: str) -> str:
    # Table cells: a pipe would end the cell, a star would start emphasis.
    return text.replace("|", "\\|").replace("*", "\\*").replace("<", "&lt;")


def _row(cells: tuple[str, ...]) -> str:
    return "| " + " | ".join(cells) + " |"


__all__ = ["table", "tables"]
