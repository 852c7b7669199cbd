"""What an option means to people, declared once beside its dataclass field (its CLI flag: :mod:`clipsearch.cli.options`).

A settings dataclass (``indexer.build_config.BuildConfig``, :class:`retrieval.filters.Filter`,
``clipsearch.search_params.SearchParams``) is the one declaration of its options: each field
carries an :class:`Option` in its metadata (``field(default=..., metadata=option("..."))``),
and the CLI flags, the server's request fields and the reference tables in the docs are derived
from the fields and these records. The derivations live with their front ends
(``clipsearch.cli.options``, ``clipsearch.server``, ``clipsearch.reference``); this module only
holds the record, so the library stays free of them.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

_KEY = "option"


@dataclass(frozen=True)
class Option:
    """How one field is shown and read outside Python.

    Attributes:
        help: what the option does, one phrase (the CLI help and the docs' meaning column).
        default_text: the default as people read it, when the field's own default does not say
            it (a None that means "64 on CPU, 512 on GPU"); "" shows no default.
        flag: the CLI flag when it is not the field name with dashes (``--no-progress``).
        short: a one-letter CLI alias beside the flag (``-k``).
        cli: False when the CLI has no flag for the field (a Python-only setting).
        negate: the flag turns the (boolean) field off: ``--no-progress`` sets ``progress=False``.
        flag_help: the CLI help when it differs from ``help`` (a negated flag says the opposite).
        metavar: the CLI's name for the value (``N``, ``PX``).
        minimum: numbers: the smallest accepted value; the CLI refuses less while parsing.
        positive: numbers: only values > 0 (with ``minimum=0``).
        http_max: the largest value (numbers) or the most items (lists) a request to the server
            may give; the CLI, run by whoever owns the index, takes any.
        choices: the only accepted values.
        group: the CLI help section the flag is listed under (None: the command's own options).
        parse: the field is given as text and read by this (``"4GB"`` -> bytes, an ISO date ->
            ns); its errors are the library's (exit 1 on the CLI, 400 over HTTP).
        text_type: how the docs name the value's type when given as text (``size``, ``ISO date``).
        http: the field is an HTTP request field of the same name.
    """

    help: str
    default_text: str | None = None
    flag: str | None = None
    short: str | None = None
    cli: bool = True
    negate: bool = False
    flag_help: str | None = None
    metavar: str | None = None
    minimum: float | None = None
    positive: bool = False
    http_max: int | None = None
    choices: tuple[str, ...] | None = None
    group: str | None = None
    parse: Callable[[str], Any] | None = None
    text_type: str | None = None
    http: bool = False


def option(help: str, **details: Any) -> Mapping[str, Option]:  # noqa: A002  # the word every CLI library uses
    """Field metadata holding an :class:`Option`: ``field(default=..., metadata=option("..."))``."""
    return {_KEY: Option(help, **details)}


def option_of(f: dataclasses.Field[Any]) -> Option:
    """The :class:`Option` declared on ``f``.

    Raises:
        TypeError: ``f`` was declared without one (every option field must say what it means).
    """
    found = f.metadata.get(_KEY)
    if not isinstance(found, Option):
        raise TypeError(f"field {f.name!r} declares no option(...) metadata")
    return found


def flag_of(f: dataclasses.Field[Any]) -> str:
    """The CLI flag of ``f``: its declared one, else ``--`` and the name with dashes."""
    return option_of(f).flag or "--" + f.name.replace("_", "-")


def value_types(cls: type) -> dict[str, type]:
    """Each field's value type without ``None``: ``int | None`` -> int, a ``Literal`` of strings
    -> str, ``tuple[str, ...]`` -> tuple."""
    out: dict[str, type] = {}
    for name, hint in typing.get_type_hints(cls).items():
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        if typing.get_origin(hint) is Literal:
            hint = type(typing.get_args(hint)[0])
        out[name] = typing.get_origin(hint) or hint
    return out


def options_of(cls: type) -> list[tuple[dataclasses.Field[Any], Option]]:
    """The fields of the dataclass ``cls`` with their :class:`Option`, in declaration order."""
    return [(f, option_of(f)) for f in dataclasses.fields(cls)]


__all__ = ["Option", "flag_of", "option", "option_of", "options_of", "value_types"]
