"""Query arithmetic: a query made of several weighted texts and images.

``"a dog" + "in the snow" - "grass"``: each term is embedded and L2-normalised, the terms are
summed with their weights (subtracted terms count negative) and the sum is L2-normalised
again, so the result is a unit query vector like any other. This module parses terms and
combines vectors; the encoders that embed the terms are passed in by the caller.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlparse

import numpy as np

from .errors import InvalidArgumentError

# text: embedded by the text tower; image: an image file, embedded by the image tower;
# id: an image of the index, by its stored vector (nothing is decoded).
TermKind = Literal["text", "image", "id"]

# "2:a dog", "0.5:./beach.jpg", "-1:grass": a number, a colon, then the term.
_WEIGHTED = re.compile(r"^\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*:(.*)$", re.DOTALL)
# A term written as one of these is meant as a file: it is an image, and must exist.
_FILE_PREFIXES = ("./", "../", "/", "~/", "file://")
# Below this norm the weighted sum has no direction left (the terms cancel out).
_MIN_NORM = 1e-6


@dataclass(frozen=True)
class QueryTerm:
    """One term of a combined query: a text, an image (a file path, or the file's bytes) or an
    indexed image's id, with a weight (negative subtracts)."""

    value: str | int | bytes
    kind: TermKind = "text"
    weight: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in ("text", "image", "id"):
            raise InvalidArgumentError(f"a query term is a text, an image or an image id, not {self.kind!r}")
        if self.kind == "id":
            if isinstance(self.value, bool) or not isinstance(self.value, int) or self.value < 0:
                raise InvalidArgumentError(f"an image id term must be an integer >= 0, got {self.value!r}")
        elif self.kind == "image" and isinstance(self.value, bytes):
            if not self.value:
                raise InvalidArgumentError("an image term's file is empty")
        elif not isinstance(self.value, str) or not self.value.strip():
            raise InvalidArgumentError("a query term is empty")
        if isinstance(self.weight, bool) or not isinstance(self.weight, (int, float)) or not math.isfinite(self.weight):
            raise InvalidArgumentError(f"a query term's weight must be a finite number, got {self.weight!r}")
        if self.weight == 0:
            raise InvalidArgumentError(f"the term {self.value!r} has weight 0; leave it out instead")

    def negated(self) -> QueryTerm:
        return replace(self, weight=-self.weight)


def parse_term(spec: str, *, weights: bool = True, files: bool = True) -> QueryTerm:
    """A term as the command line writes it.

    ``N:`` before the term is its weight (when ``weights``). With ``files``, a term starting
    with ``./``, ``../``, ``/``, ``~/`` or ``file://`` names an image file, which must exist;
    anything else is text (a server parses with ``files=False``: no request names a file).

    Raises:
        InvalidArgumentError: an empty term, a zero weight, or a named file that does not exist.
    """
    weight = 1.0
    body = spec
    match = _WEIGHTED.match(spec) if weights else None
    if match:
        weight, body = float(match.group(1)), match.group(2).strip()
    if not body.strip():
        raise InvalidArgumentError(f"the query term {spec!r} is empty")
    if files and body.startswith(_FILE_PREFIXES):
        path = unquote(urlparse(body).path) if body.startswith("file://") else os.path.expanduser(body)
        if not Path(path).is_file():
            raise InvalidArgumentError(f"the query image {body!r} is not a file")
        return QueryTerm(path, "image", weight)
    return QueryTerm(body, "text", weight)


def as_term(term: str | os.PathLike[str] | QueryTerm) -> QueryTerm:
    """The Python API's terms: a ``str`` is text, a path object an image, a :class:`QueryTerm` itself."""
    if isinstance(term, QueryTerm):
        return term
    if isinstance(term, str):
        return QueryTerm(term, "text")
    if isinstance(term, os.PathLike):
        return QueryTerm(os.fspath(term), "image")
    raise InvalidArgumentError(f"a query term is a str (text), a path (image) or a QueryTerm, got {type(term).__name__}")


def combine(vectors: np.ndarray, weights: Sequence[float]) -> np.ndarray:
    """The unit vector of ``sum(w * v / |v|)`` over the rows of ``vectors``, shape ``(dim,)``.

    Raises:
        InvalidArgumentError: the weighted sum is (close to) zero: the terms cancel out.
    """
    vectors = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit = vectors / np.maximum(norms, np.finfo(np.float64).tiny)
    total = (np.asarray(weights, dtype=np.float64)[:, None] * unit).sum(axis=0)
    norm = float(np.linalg.norm(total))
    if not math.isfinite(norm) or norm < _MIN_NORM:
        raise InvalidArgumentError("the query terms cancel out: their weighted sum has no direction")
    return (total / norm).astype(np.float32)


def embed_terms(
    terms: Sequence[QueryTerm],
    embed_texts: Callable[[list[str]], np.ndarray],
    embed_image: Callable[[str | bytes], np.ndarray],
    stored_vectors: Callable[[list[int]], np.ndarray] | None = None,
) -> np.ndarray:
    """The combined query vector ``(dim,)`` of ``terms``: texts embedded in one batch, image
    files one by one, image ids by their stored vectors (``stored_vectors``).

    Raises:
        InvalidArgumentError: no terms, or terms that cancel out.
        ImageDecodeError: an image term cannot be decoded.
    """
    if not terms:
        raise InvalidArgumentError("a combined query needs at least one term")
    texts = [str(t.value) for t in terms if t.kind == "text"]
    text_vectors = iter(embed_texts(texts)) if texts else iter(())
    ids = [int(t.value) for t in terms if t.kind == "id"]
    if ids and stored_vectors is None:
        raise InvalidArgumentError("image id terms need an index")
    id_vectors = iter(stored_vectors(ids)) if ids and stored_vectors is not None else iter(())
    rows = []
    for t in terms:
        if t.kind == "text":
            rows.append(next(text_vectors))
        elif t.kind == "id":
            rows.append(next(id_vectors))
        else:
            rows.append(embed_image(t.value if isinstance(t.value, bytes) else str(t.value)).reshape(-1))
    return combine(np.stack(rows), [t.weight for t in terms])


__all__ = ["QueryTerm", "TermKind", "as_term", "combine", "embed_terms", "parse_term"]
