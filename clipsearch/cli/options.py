"""CLI flags derived from a settings dataclass's fields and their :mod:`retrieval.options` metadata.

The dataclasses are ``BuildConfig``, ``Filter`` and ``SearchParams``; the field values are read
back from the parsed arguments.

Each field's :class:`~retrieval.options.Option` says its help, metavar, bounds and section; the
field's type and default give the rest. A value below a declared minimum is a usage error
(exit 2, like any malformed flag); a value the library refuses stays the library's error.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Collection, Mapping
from typing import Any

from retrieval.options import Option, flag_of, options_of, value_types


def int_at_least(minimum: int) -> Callable[[str], int]:
    """argparse type: an integer >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse

def add_options(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    names: Collection[str] | None = None,
    *,
    group: str | None = None,
    descriptions: Mapping[str, str] | None = None,
) -> None:
    """Add a flag for each field of ``cls`` (those in ``names``, default every field with a flag).

    Args:
        parser: the command's parser, or an argument group of it.
        cls: a dataclass whose fields carry :func:`~retrieval.options.option` metadata.
        names: the fields to add, in declaration order (default: all but ``cli=False`` ones).
        group: the help section for fields that declare none (default: the command's options).
        descriptions: the text under a help section's title, by title (what is CLI-only about it).
    """
    types = value_types(cls)
    sections: dict[str, argparse._ArgumentGroup] = {}
    for f, opt in options_of(cls):
        if not _wanted(f.name, opt, names):
            continue
        title = opt.group or group
        target = parser
        if title is not None and isinstance(parser, argparse.ArgumentParser):
            if title not in sections:
                sections[title] = parser.add_argument_group(title, (descriptions or {}).get(title))
            target = sections[title]
        flags = (opt.short, flag_of(f)) if opt.short else (flag_of(f),)
        target.add_argument(*flags, **_argument(f.name, f.default, opt, types[f.name]))


def values_from_args(cls: type, args: argparse.Namespace, names: Collection[str] | None = None) -> dict[str, Any]:
    """The field values that :func:`add_options`' flags hold, as ``cls`` takes them.

    A negated flag is turned back (``--no-progress`` -> ``progress=False``), a repeated one
    becomes a tuple (None when not given and the field's default is None: "keep what was
    recorded"), and text that a field declares a reader for is read with it.

    Raises:
        InvalidArgumentError: text the field's reader refuses (a bad size, a bad date).
    """
    types = value_types(cls)
    values: dict[str, Any] = {}
    for f, opt in options_of(cls):
        if not _wanted(f.name, opt, names):
            continue
        value = getattr(args, _dest(f.name, opt))
        if opt.negate:
            value = not value
        elif types[f.name] is tuple:
            value = tuple(value) if value or f.default is not None else None
        elif opt.parse is not None and value is not None:
            value = opt.parse(value)
        values[f.name] = value
    return values


def help_text(opt: Option, default: Any) -> str:
    """The flag's help: its meaning, then its default as people read it."""
    shown = default_text(opt, default)
    text = opt.flag_help or opt.help
    return f"{text} (default: {shown})" if shown and not opt.negate else text


def default_text(opt: Option, default: Any) -> str:
    """The default as the help and the docs show it ("" when there is nothing to say)."""
    if opt.default_text is not None:
        return opt.default_text
    if default is None or default is False or default == ():
        return ""
    return str(default)


def _wanted(name: str, opt: Option, names: Collection[str] | None) -> bool:
    return name in names if names is not None else opt.cli


def _dest(name: str, opt: Option) -> str:
    return opt.flag.lstrip("-").replace("-", "_") if opt.flag else name


def _argument(name: str, default: Any, opt: Option, kind: type) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"help": help_text(opt, default)}
    if opt.flag:
        kwargs["dest"] = _dest(name, opt)
    if kind is bool and default is None:
        # Three states: --x, --no-x, or neither (None: the library keeps what was recorded).
        return {**kwargs, "action": argparse.BooleanOptionalAction, "default": None}
    if kind is bool:
        return {**kwargs, "action": "store_true"}
    if kind is tuple:
        kwargs.update(action="append", default=[])
    else:
        kwargs["default"] = default
    if opt.metavar is not None:
        kwargs["metavar"] = opt.metavar
    if opt.choices is not None:
        kwargs["choices"] = opt.choices
    reader = _reader(kind, opt)
    if reader is not None:
        kwargs["type"] = reader
    return kwargs


def _reader(kind: type, opt: Option) -> Callable[[str], Any] | None:
    # Text a field reads itself (opt.parse) is read when used, so its error is the library's.
    if opt.parse is not None:
        return None
    if kind is int:
        return int_at_least(int(opt.minimum)) if opt.minimum is not None else int
    if kind is float:
        if opt.minimum is None:
            return float
        if opt.minimum != 0:
            raise TypeError(f"a float option's minimum can only be 0, got {opt.minimum}")
        return _positive_number if opt.positive else _non_negative_number
    return None


def _non_negative_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def _positive_number(text: str) -> float:
    value = _non_negative_number(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


__all__ = ["add_options", "default_text", "help_text", "values_from_args"]
