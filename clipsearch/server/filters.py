"""The metadata filters over HTTP, derived from :class:`~retrieval.filters.Filter`'s fields: the
fields of the JSON ``filters`` object, of the multipart form and of ``GET /api/search``'s query,
and the :class:`Filter` a request's values make.

Every shape takes the CLI's names (``min_width``, ``modified_after``) and the CLI's values as
text: dates are ISO 8601 strings and a repeatable filter is a list. Only the types are checked
here (a wrong type is 422); a value the :class:`Filter` refuses is 400, as for the CLI.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from pydantic import ConfigDict, create_model

from retrieval.filters import Filter
from retrieval.options import options_of, value_types

from .fields import Shape, Spec, field_specs, model_fields, query_dependency


def _specs(shape: Shape) -> dict[str, Spec]:
    # The Filter checks its own values (a 400, as on the CLI): only types are checked here.
    specs = field_specs(Filter, shape, bounds=False)
    if shape == "json":
        # The JSON object also takes a lone prefix as a string, and null for "no condition".
        lists = {name for name, kind in value_types(Filter).items() if kind is tuple}
        specs = {name: (list[str] | str | None, None, spec[2]) if name in lists else spec for name, spec in specs.items()}
    return specs


def filter_fields(shape: Shape) -> dict[str, Any]:
    """``create_model`` field definitions of the filters in ``shape``: name -> (type, FieldInfo)."""
    return model_fields(_specs(shape))


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
    return query_dependency(_specs("query"))


def make_filter(**values: Any) -> Filter:
    """The :class:`Filter` of the CLI's filter names (empty strings count as absent, as in a form).

    Raises:
        InvalidArgumentError: a value the filter refuses (negative size, bad date, min > max).
        TypeError: a name that is not a filter.
    """
    types = value_types(Filter)
    known = {f.name: (opt, types[f.name]) for f, opt in options_of(Filter) if opt.http}
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
