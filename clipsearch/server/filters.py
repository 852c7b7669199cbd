"""The metadata filters over HTTP, derived from :class:`~retrieval.filters.Filter`'s fields: the
fields of the JSON ``filters`` object, of the multipart form and of ``GET /api/search``'s query,
and the :class:`Filter` a request's values make.

Every shape takes the CLI's names (``min_width``, ``modified_after``) and the CLI's values as
text: dates are ISO 8601 strings and a repeatable filter is a list. Only the types are checked
here (a wrong type is 422); a value the :class:`Filter` refuses is 400, as for the CLI.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, Literal

from fastapi import Query
from pydantic import ConfigDict, Field, create_model

from retrieval.filters import Filter
from retrieval.options import Option, options_of, value_types

# json: the JSON body's ``filters`` object (a lone prefix may be a string); form: the multipart
# fields (a repeated field is always a list); query: GET parameters (repeat one for a list).
Shape = Literal["json", "form", "query"]


def _http_options() -> list[tuple[str, Option, type]]:
    types = value_types(Filter)
    # Text read by the field's parser (a date) travels as a string.
    return [(f.name, opt, str if opt.parse is not None else types[f.name]) for f, opt in options_of(Filter) if opt.http]


def filter_fields(shape: Shape) -> dict[str, Any]:
    """``create_model`` field definitions of the filters in ``shape``: name -> (type, FieldInfo)."""
    out: dict[str, Any] = {}
    for name, opt, kind in _http_options():
        default: Any = None
        annotation: Any = kind | None
        if kind is tuple:
            annotation = {"json": list[str] | str | None, "form": list[str], "query": list[str] | None}[shape]
            default = [] if shape == "form" else None
        out[name] = (annotation, Field(default, description=opt.help))
    return out


def filters_model() -> type:
    """The JSON body's ``filters`` object: every filter by its CLI name, nothing else."""
    return create_model(
        "Filters",
        __config__=ConfigDict(extra="forbid"),
        __doc__="Metadata filters, by the names of ``clipsearch search``'s flags (all must hold).",
        **filter_fields("json"),
    )


def query_filters() -> Callable[..., Coroutine[Any, Any, dict[str, Any]]]:
    """A FastAPI dependency whose parameters are the filters as query parameters; it returns
    the given ones by name (for :func:`make_filter`, once the route has checked its own)."""

    async def read(**values: Any) -> dict[str, Any]:
        return values

    parameters = [
        inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY,
            default=info.default,
            annotation=Annotated[annotation, Query(description=info.description)],
        )
        for name, (annotation, info) in filter_fields("query").items()
    ]
    # FastAPI reads a dependency's parameters from its signature.
    setattr(read, "__signature__", inspect.Signature(parameters))  # noqa: B010  # mypy refuses the attribute on a function
    return read


def make_filter(**values: Any) -> Filter:
    """The :class:`Filter` of the CLI's filter names (empty strings count as absent, as in a form).

    Raises:
        InvalidArgumentError: a value the filter refuses (negative size, bad date, min > max).
        TypeError: a name that is not a filter.
    """
    known = {name: (opt, kind) for name, opt, kind in _http_options()}
    unknown = set(values) - set(known)
    if unknown:
        raise TypeError(f"not filters: {', '.join(sorted(unknown))}")
    kwargs: dict[str, Any] = {}
    for name, value in values.items():
        opt, kind = known[name]
        if kind is tuple:
            items = [value] if isinstance(value, str) else list(value or [])
            kwargs[name] = tuple(v for v in items if v)
        elif value == "" or value is None:
            kwargs[name] = None
        else:
            kwargs[name] = opt.parse(value) if opt.parse is not None else value
    return Filter(**kwargs)


__all__ = ["Shape", "filter_fields", "filters_model", "make_filter", "query_filters"]
