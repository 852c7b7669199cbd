"""The names ``ImageIndex`` (:mod:`retrieval.index`) had before it handed out its collaborators.

Each former name (``index.embed_texts``, ``index.search_similar``, ``ImageIndex.search_ids``...)
with what to use instead and how it still answers: on an instance or on the class, with a
``DeprecationWarning`` that names the new spelling (none for this project's own modules still on
them). ``ImageIndex`` answers them through :func:`former_attribute` and its metaclass
:class:`FormerNamesMeta`, so that its own class body holds only the narrow facade.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .errors import InvalidArgumentError
from .filters import Filter
from .hits import Hit
from .images import PreprocessConfig
from .request import SearchRequest, TermInput
from .rows import check_id

if TYPE_CHECKING:
    from .layout import Manifest


class ImageIndex(Protocol):
    """What the former names use of :class:`retrieval.index.ImageIndex`, named here so that this
    module, which the index imports, does not import it back."""

    @property
    def count(self) -> int: ...

    @property
    def manifest(self) -> Manifest: ...

    def _answer(self, request: SearchRequest) -> Any: ...

    def _texts(self, texts: list[str], vectors: np.ndarray | None, request: SearchRequest) -> Any: ...

    # The rest (search, and the former names themselves through ImageIndex.__getattr__).
    def __getattr__(self, name: str) -> Any: ...


class FormerNamesMeta(type):
    # ``ImageIndex.search_ids`` (the class, not an instance: an unbound method handed around)
    # answers as the former method did, with the same warning; dir() still shows the narrow surface.
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("_") or name not in _MOVED:
            raise AttributeError(f"type object {cls.__name__!r} has no attribute {name!r}")
        use = _MOVED[name][0]
        if not _unmigrated(sys._getframe(1).f_code.co_filename):
            warnings.warn(f"ImageIndex.{name} is deprecated: use {use}", DeprecationWarning, stacklevel=2)

        def former(self: ImageIndex, *args: Any, **kwargs: Any) -> Any:
            return _MOVED[name][1](self)(*args, **kwargs)

        former.__name__ = name
        return former


def former_attribute(index: ImageIndex, name: str) -> Any:
    """What ``index.<name>`` answers for a former name (called by ``ImageIndex.__getattr__``),
    with a ``DeprecationWarning`` naming what to use.

    Raises:
        AttributeError: ``name`` is not a former name.
    """
    moved = _MOVED.get(name)
    if moved is None or name.startswith("_"):
        raise AttributeError(f"{type(index).__name__!r} object has no attribute {name!r}")
    use, get = moved
    # Two frames up: the caller of ImageIndex.__getattr__.
    if not _unmigrated(sys._getframe(2).f_code.co_filename):
        warnings.warn(f"ImageIndex.{name} is deprecated: use {use}", DeprecationWarning, stacklevel=3)
    return get(index)


# The former search methods: each one request (or a batch of texts) through the facade's own path.
def _search_many(index: ImageIndex, queries: Sequence[str], k: int | None = None, where: Filter | None = None, *,
                 min_score: float | None = None, sort: str = "score", mode: str | None = None,
                 query_lang: str | None = None) -> list[list[Hit]]:
    if isinstance(queries, str):
        raise InvalidArgumentError("search_many takes a list of queries, not a single string")
    reqs = [SearchRequest(text=q, k=k, where=where, min_score=min_score, sort=sort, mode=mode, query_lang=query_lang)
            for q in queries]
    return index._texts(list(queries), None, reqs[0]) if reqs else []


def _search_embedded(index: ImageIndex, queries: Sequence[str], vectors: np.ndarray, k: int | None = None,
                     where: Filter | None = None, *, min_score: float | None = None, sort: str = "score",
                     mode: str | None = None) -> list[list[Hit]]:
    if not queries:
        return []
    reqs = [SearchRequest(text=q, k=k, where=where, min_score=min_score, sort=sort, mode=mode) for q in queries]
    return index._texts(list(queries), np.asarray(vectors), reqs[0])


def _search_combined(index: ImageIndex, add: Sequence[TermInput], subtract: Sequence[TermInput] = (), k: int | None = None,
                     where: Filter | None = None, *, min_score: float | None = None, sort: str = "score",
                     query_lang: str | None = None) -> list[Hit]:
    if isinstance(add, (str, os.PathLike)) or isinstance(subtract, (str, os.PathLike)):
        raise InvalidArgumentError("add and subtract take lists of terms, not a single term")
    if not add and not subtract:
        raise InvalidArgumentError("a combined query needs at least one term")
    return index._answer(SearchRequest(add=add, subtract=subtract, k=k, where=where, min_score=min_score, sort=sort,
                                       query_lang=query_lang))


def _search_similar(index: ImageIndex, id: int, k: int | None = None, where: Filter | None = None, *,
                    min_score: float | None = None, sort: str = "score") -> list[Hit]:
    return index._answer(SearchRequest(similar_to=check_id(id, index.count), k=k, where=where, min_score=min_score,
                                       sort=sort))


# This project's own modules still on the former names (owned by other changes in flight: the
# evaluation, zero-shot and benchmark code): they do not warn, so that `clipsearch eval` prints
# no warning of ours. Empty this once they use the collaborators.
_UNMIGRATED = tuple(str(Path(__file__).resolve().parent.parent / d) + os.sep
                    for d in ("retrieval/tools/evaluation", "retrieval/tools/zeroshot", "benchmarks"))


def _unmigrated(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_UNMIGRATED)


def _preprocess(index: ImageIndex) -> PreprocessConfig:
    return PreprocessConfig.from_dict(index.manifest.preprocess)


def _of(collaborator: str, member: str) -> tuple[str, Callable[[ImageIndex], Any]]:
    return f"index.{collaborator}.{member}", lambda index: getattr(getattr(index, collaborator), member)


def _request(example: str, method: Callable[..., Any]) -> tuple[str, Callable[[ImageIndex], Any]]:
    return f"index.search(SearchRequest({example}, ...))", lambda index: partial(method, index)


# Each name ImageIndex had before it handed out its collaborators: what to use instead, and how
# the old name still answers (with a DeprecationWarning).
_MOVED: dict[str, tuple[str, Callable[[ImageIndex], Any]]] = {
    **{name: _of("encoders", name) for name in (
        "embed_texts", "embed_image", "text_path", "image_path", "query_languages", "encoder", "text_encoder", "query_model")},
    "query_cache_info": _of("encoders", "cache_info"),
    **{name: _of("vectors", name) for name in (
        "vectors_of", "embeddings", "iter_embeddings", "iter_vectors", "search_ids", "search_range", "exact_scores",
        "cosine_scale", "hit_source", "warm")},
    **{name: _of("metadata", name) for name in ("paths", "paths_of", "sizes_of", "sample_meta", "skipped", "mask")},
    "source_file": _of("files", "path"),
    "source_bytes": _of("files", "shard_bytes"),
    "preprocess": ("PreprocessConfig.from_dict(index.manifest.preprocess)", _preprocess),
    "search_similar": _request("similar_to=ID", _search_similar),
    "search_combined": _request("add=[...], subtract=[...]", _search_combined),
    "search_many": ("index.search(text, ...) for each text", lambda index: partial(_search_many, index)),
    "search_embedded": _request("text=TEXT, vector=VECTOR", _search_embedded),
}


__all__ = ["FormerNamesMeta", "former_attribute"]
