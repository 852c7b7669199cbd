"""``SearchRequest``: one search, checked once where it enters (the Python API, the CLI, the
HTTP server), then trusted by every layer below it.

A request names its query (a text, an image, a vector, an indexed image's id, or the terms of
query arithmetic) and which hits to return (``k``, ``min_score``, ``sort``, ``where``, the text
ranking ``mode`` and the text's language). Everything that can be checked without an index is
checked when the value is made; what depends on the index (the vector's dimension, an id's
range, whether the index has a keyword side) is checked by the index that answers it, once.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import BinaryIO, Literal

import numpy as np

from .errors import InvalidArgumentError
from .filters import Filter
from .hits import Cut, check_cut
from .keywords import check_mode
from .query_terms import QueryTerm, as_term

# What a request searches with.
RequestKind = Literal["text", "image", "vector", "similar", "terms", "browse"]
# An image query: a path, the file's bytes, or a binary file object.
ImageInput = str | bytes | os.PathLike[str] | BinaryIO
# A term of query arithmetic: text (str), an image file (a path object) or a QueryTerm.
TermInput = str | os.PathLike[str] | QueryTerm


@dataclass(frozen=True, eq=False)
class SearchRequest:
    """One checked search: its query and which hits it returns.

    Give one query: ``text``, ``image``, ``vector`` or ``similar_to`` (an indexed image's id,
    "more like this"); or the terms of query arithmetic in ``add`` and ``subtract`` (a ``text``,
    ``image`` or ``similar_to`` given with them is their first term, weight 1); or no query and
    an active ``where`` ("photos of Alice": the images it keeps, newest first, without scores;
    ``min_score`` and ``mode`` take a query). A ``text`` given
    with its ``vector`` is searched with that vector (embedded already, e.g. under a server's
    model lock); its words still rank in hybrid and keyword mode.

    Args:
        text: a text query (never syntax: quotes, ``AND``, ``*`` are words or nothing).
        image: an image query: a file path, the file's bytes or a binary file object.
        vector: a query embedding, ``(dim,)`` or ``(1, dim)``, normalised by the caller.
        similar_to: the id of an indexed image, searched with its stored embedding.
        add: terms added to the query (``str``: text, path object: image, or
            :class:`~retrieval.query_terms.QueryTerm` with its weight or an image id).
        subtract: terms subtracted from it.
        k: number of results (default 10); with ``min_score`` at most this many (default: no cap).
        where: only images passing this :class:`~retrieval.filters.Filter`.
        min_score: only images scoring at least this cosine (in [-1, 1]).
        sort: ``score`` (best first) or ``taken`` (newest photo first, undated last).
        mode: how a text ranks: ``hybrid``, ``vector`` or ``keyword`` (None: the index's
            default, :func:`retrieval.hybrid.resolve_mode`); ``keyword`` takes a text alone.
        query_lang: the text's FLORES-200 code, for a model whose tokenizer must be told it.

    Raises:
        InvalidArgumentError: no query or more than one, an empty text, an empty or malformed
            term, terms with a vector, a vector that is not one row of finite numbers, a
            negative id, k < 1, min_score outside [-1, 1], an unknown sort or mode,
            ``keyword`` mode without a text alone, a ``where`` that is not a ``Filter``.
    """

    text: str | None = None
    image: ImageInput | None = None
    vector: np.ndarray | Sequence[float] | None = None
    similar_to: int | None = None
    add: Sequence[TermInput] = ()
    subtract: Sequence[TermInput] = ()
    k: int | None = None
    where: Filter | None = None
    min_score: float | None = None
    sort: str = "score"
    mode: str | None = None
    query_lang: str | None = None
    # Derived when made: the checked cut-off and the terms of query arithmetic (empty without).
    cut: Cut = field(init=False, repr=False)
    terms: tuple[QueryTerm, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: the derived fields are set once, here
        set_(self, "cut", check_cut(self.k, self.min_score, self.sort))
        if self.text is not None and (not isinstance(self.text, str) or not self.text.strip()):
            raise InvalidArgumentError("query must be a non-empty text")
        if self.similar_to is not None:
            if isinstance(self.similar_to, bool) or not isinstance(self.similar_to, (int, np.integer)) or self.similar_to < 0:
                raise InvalidArgumentError(f"no image with id {self.similar_to!r} (ids are integers >= 0)")
            set_(self, "similar_to", int(self.similar_to))
        if self.where is not None and not isinstance(self.where, Filter):
            raise InvalidArgumentError(f"where must be a Filter, got {type(self.where).__name__}")
        if self.query_lang is not None and not isinstance(self.query_lang, str):
            raise InvalidArgumentError(f"query_lang must be a FLORES-200 code, got {self.query_lang!r}")
        if self.vector is not None:
            set_(self, "vector", _one_vector(self.vector))
        set_(self, "terms", self._terms())
        given = [name for name in ("text", "image", "similar_to") if getattr(self, name) is not None]
        if self.vector is not None and given not in ([], ["text"]):
            raise InvalidArgumentError("a vector query takes no image or image id")
        if len(given) > 1:
            raise InvalidArgumentError(f"give one query, not {' and '.join(given)}")
        if not given and self.vector is None and not self.terms:
            if self.where is None or not self.where.active:
                raise InvalidArgumentError(
                    "give a query (a text, an image, a vector, an image id or terms to add) or a filter to list what it keeps"
                )
            if self.min_score is not None or self.mode is not None:
                raise InvalidArgumentError("min_score and mode rank a query: without one, the images a filter keeps come newest first")
        if self.mode is not None:
            set_(self, "mode", check_mode(self.mode))
            if self.mode == "keyword" and self.kind != "text":
                raise InvalidArgumentError(
                    "mode keyword takes a text query alone: image queries and query arithmetic are vector-only"
                )

    def _terms(self) -> tuple[QueryTerm, ...]:
        if isinstance(self.add, (str, os.PathLike)) or isinstance(self.subtract, (str, os.PathLike)):
            raise InvalidArgumentError("add and subtract take lists of terms, not a single term")
        if not self.add and not self.subtract:
            return ()
        if self.vector is not None:
            raise InvalidArgumentError("add and subtract combine with a text, an image or an image id, not with a vector")
        first: list[QueryTerm] = []
        if self.text is not None:
            first = [QueryTerm(self.text, "text")]
        elif self.similar_to is not None:
            first = [QueryTerm(self.similar_to, "id")]
        elif isinstance(self.image, (str, os.PathLike, bytes)):
            first = [QueryTerm(self.image if isinstance(self.image, bytes) else os.fspath(self.image), "image")]
        elif self.image is not None:
            raise InvalidArgumentError("query arithmetic takes an image as a path or bytes, not a file object")
        return (*first, *(as_term(t) for t in self.add), *(as_term(t).negated() for t in self.subtract))

    def with_vector(self, vector: np.ndarray | Sequence[float]) -> SearchRequest:
        """This text request with its query's embedding made already (e.g. under a server's
        model lock), so that searching it runs no model; nothing else is checked again.

        Raises:
            InvalidArgumentError: not a text request, or not one row of finite numbers.
        """
        if self.kind != "text":
            raise InvalidArgumentError(f"with_vector takes a text request, not a {self.kind} request")
        out = copy.copy(self)
        object.__setattr__(out, "vector", _one_vector(vector))
        return out

    @property
    def kind(self) -> RequestKind:
        """What it searches with: ``terms`` (query arithmetic), else its one query; ``browse``
        without one (the filter's images, newest first)."""
        if self.terms:
            return "terms"
        if self.text is not None:
            return "text"
        if self.image is not None:
            return "image"
        if self.similar_to is not None:
            return "similar"
        if self.vector is not None:
            return "vector"
        return "browse"


def _one_vector(value: np.ndarray | Sequence[float]) -> np.ndarray:
    try:
        vector = np.array(value, dtype=np.float32)
    except (TypeError, ValueError):
        raise InvalidArgumentError("vector must be a sequence of numbers") from None
    if vector.ndim == 2 and vector.shape[0] == 1:
        vector = vector[0]
    if vector.ndim != 1 or not len(vector):
        raise InvalidArgumentError(f"vector must be one row of numbers, got shape {vector.shape}")
    if not np.isfinite(vector).all():
        raise InvalidArgumentError("vector must hold finite numbers (no NaN or Infinity)")
    vector.flags.writeable = False
    return vector


__all__ = ["ImageInput", "RequestKind", "SearchRequest", "TermInput"]
