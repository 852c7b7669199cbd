"""HTTP request fields derived from a settings dataclass's fields (``Filter``, ``SearchParams``):
the pydantic fields of a JSON body or a multipart form, and a FastAPI dependency whose
parameters are the GET query's.

Each field whose :class:`~retrieval.options.Option` says ``http`` is a request field of the same
name, described by its help. A text the field reads itself (a date) travels as a string; a
repeatable field is a list. With ``bounds``, the declared minimum and ``http_max`` are checked
here (a request out of range is 422); without, the dataclass checks its values itself (400).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine, Mapping
from typing import Annotated, Any, Literal

from fastapi import Query
from pydantic import Field

from retrieval.options import options_of, value_types

# json: a JSON body; form: multipart fields (a repeated field is always a list); query: GET
# parameters (repeat one for a list).
Shape = Literal["json", "form", "query"]
# name -> (annotation, default, the constraints and description of Field / Query)
Spec = tuple[Any, Any, dict[str, Any]]


def http_names(cls: type) -> list[str]:
    """The names of ``cls``'s request fields, in declaration order."""
    return [f.name for f, opt in options_of(cls) if opt.http]


def field_specs(cls: type, shape: Shape, *, bounds: bool = True, items: Mapping[str, Any] | None = None) -> dict[str, Spec]:
    """The request fields of ``cls`` in ``shape``: name -> (annotation, default, constraints).

    Args:
        cls: a dataclass whose fields carry :func:`~retrieval.options.option` metadata.
        shape: the request part the fields are read from.
        bounds: check the declared bounds in the request's shape.
        items: the type of a list's items where it is not text, by field name.
    """
    types = value_types(cls)
    out: dict[str, Spec] = {}
    for f, opt in options_of(cls):
        if not opt.http:
            continue
        constraints: dict[str, Any] = {"description": opt.help}
        kind = str if opt.parse is not None else types[f.name]
        if kind is tuple:
            item = (items or {}).get(f.name, str)
            if shape == "query":
                # A repeated GET parameter is not bounded here: the code reading the list counts
                # it (make_terms counts the add and subtract terms together).
                out[f.name] = (list[item] | None, None, constraints)  # type: ignore[valid-type]  # a runtime type
                continue
            if bounds and opt.http_max is not None:
                constraints["max_length"] = opt.http_max
            out[f.name] = (list[item], [], constraints)  # type: ignore[valid-type]  # a runtime type
            continue
        if bounds and opt.minimum is not None:
            constraints["ge"] = opt.minimum
        if bounds and opt.http_max is not None:
            constraints["le"] = opt.http_max
        out[f.name] = (kind if f.default is not None else kind | None, f.default, constraints)
    return out


def model_fields(specs: Mapping[str, Spec]) -> dict[str, Any]:
    """``create_model`` field definitions of ``specs``: name -> (annotation, FieldInfo)."""
    return {name: (annotation, Field(default, **constraints)) for name, (annotation, default, constraints) in specs.items()}


def query_dependency(specs: Mapping[str, Spec]) -> Callable[..., Coroutine[Any, Any, dict[str, Any]]]:
    """A FastAPI dependency whose parameters are ``specs`` as query parameters; it returns the
    values by name (for the route to check and use)."""

    async def read(**values: Any) -> dict[str, Any]:
        return values

    parameters = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[annotation, Query(**constraints)])
        for name, (annotation, default, constraints) in specs.items()
    ]
    # FastAPI reads a dependency's parameters from its signature.
    setattr(read, "__signature__", inspect.Signature(parameters))  # noqa: B010  # mypy refuses the attribute on a function
    return read


__all__ = ["Shape", "Spec", "field_specs", "http_names", "model_fields", "query_dependency"]
