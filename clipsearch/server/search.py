"""Search requests: their shapes (GET parameters, a JSON body, a multipart form), their checks,
and the one function that answers them with ``ImageIndex``'s own search calls.

Errors follow one rule: a request of the wrong shape (an unknown field, a wrong type, k or
offset out of range) is 422; a well-formed value the search refuses (an empty text, a vector of
the wrong dimension, a filter that cannot match, an image that does not decode) is 400.
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, create_model

from retrieval.errors import InvalidArgumentError
from retrieval.filters import Filter
from retrieval.hits import check_cut
from retrieval.index import Hit, ImageIndex
from retrieval.keywords import check_mode
from retrieval.query_terms import QueryTerm, parse_term

from ..search_params import MAX_DEPTH, MAX_TERMS, SearchParams
from .config import DEFAULT_THUMBNAIL_SIZE
from .errors import NotFoundError
from .fields import field_specs, http_names, model_fields, query_dependency
from .filters import filter_fields, filters_model, make_filter
from .indexes import ServedIndex

QueryKind = Literal["text", "image_id", "vector", "image"]
# A JSON vector is checked against the index's dim after parsing; this only bounds the parse.
_MAX_VECTOR_LEN = 16384


if TYPE_CHECKING:
    Filters = BaseModel
else:
    Filters = filters_model()


class TermBody(BaseModel):
    """A weighted term of query arithmetic: exactly one of ``text`` and ``image_id``."""

    model_config = ConfigDict(extra="forbid")

    text: str | None = None
    image_id: int | None = Field(None, ge=0)
    weight: float = Field(1.0, description="how much of it (the default 1); subtracted terms count negative")


class _Query(BaseModel):
    # The query of a JSON body; the search parameters are added from SearchParams' fields.
    model_config = ConfigDict(extra="forbid")

    text: str | None = Field(None, description="text query")
    image_id: int | None = Field(None, ge=0, description="more like this: the id of an indexed image")
    vector: list[float] | None = Field(None, max_length=_MAX_VECTOR_LEN, description="a query embedding (normalised by the server)")
    filters: Filters | None = None


class _Fields(BaseModel):
    model_config = ConfigDict(extra="forbid")


# The search parameters, by SearchParams' field names.
PARAMS = http_names(SearchParams)
# A JSON term may also be an image id with a weight.
_JSON_TERMS = {"add": str | TermBody, "subtract": str | TermBody}

if TYPE_CHECKING:
    SearchBody = _Query
    SearchForm = _Fields
else:
    SearchBody = create_model(
        "SearchBody",
        __base__=_Query,
        __doc__="``POST /api/search`` as JSON: exactly one of ``text``, ``image_id``, ``vector``; query arithmetic "
        "adds and subtracts more terms (not with ``vector``).",
        **model_fields(field_specs(SearchParams, "json", items=_JSON_TERMS)),
    )
    SearchForm = create_model(
        "SearchForm",
        __base__=_Fields,
        __doc__="The form fields beside a multipart ``image`` file (filters by their flat names).",
        **model_fields(field_specs(SearchParams, "form")),
        **filter_fields("form"),
    )


def query_params() -> Callable[..., Coroutine[Any, Any, dict[str, Any]]]:
    """A FastAPI dependency whose parameters are the search parameters as GET query parameters;
    it returns them by name (for :func:`make_request`)."""
    return query_dependency(field_specs(SearchParams, "query"))


class SearchResult(BaseModel):
    id: int
    path: str
    score: float
    taken: str | None = Field(None, description="when the photo was taken (EXIF, ISO 8601), null when it does not say")
    camera: str | None = Field(None, description="camera make and model (EXIF)")
    gps: list[float] | None = Field(None, description="[latitude, longitude] in degrees (EXIF)")
    caption: str | None = Field(None, description="the caption that came with the image in its WebDataset shard (.txt)")
    url: str | None = Field(None, description="where the image was downloaded from (img2dataset's .json), for images from shards")
    matched: dict[str, list[str]] | None = Field(
        None, description="hybrid and keyword modes: the query words found in the image's text, by source (path, embedded, "
        "caption, ocr); null in vector mode"
    )
    ocr_text: str | None = Field(None, description="text recognised in the image (index --ocr), null when none")
    keyword: float | None = Field(
        None, description="hybrid and keyword modes: the share of the query's words the image's text matches (0 to 1, "
        "rarer words weigh more, whole words more than parts); null in vector mode and where no word matched any image"
    )
    fused: float | None = Field(
        None, description="hybrid mode, where words matched: the score the results are ordered by, "
        "max(z, 1.5) + 8 * keyword, z being the cosine in standard deviations above the query's mean cosine; null elsewhere"
    )
    width: int
    height: int
    image_url: str
    thumbnail_url: str


class SearchResponse(BaseModel):
    results: list[SearchResult]
    offset: int
    k: int
    took_ms: float


@dataclass(frozen=True)
class SearchRequest:
    """One validated query, whatever shape it came in."""

    kind: QueryKind
    k: int
    offset: int
    index: str | None
    where: Filter
    min_score: float | None = None
    sort: str = "score"
    query_lang: str | None = None
    mode: str | None = None
    text: str | None = None
    image_id: int | None = None
    vector: tuple[float, ...] | None = None
    image: bytes | None = None
    # Query arithmetic: more terms added to / subtracted from the query (weights signed).
    terms: tuple[QueryTerm, ...] = ()


def make_terms(add: list[str | TermBody] | list[str], subtract: list[str | TermBody] | list[str]) -> tuple[QueryTerm, ...]:
    """The arithmetic terms of a request, as the CLI's ``--add`` / ``--subtract`` read them
    (``N:`` weights), except that no term names a file: images are ids or the uploaded file.

    Raises:
        InvalidArgumentError: more than :data:`MAX_TERMS` terms, an empty term, a zero weight, a
            term with both or neither of text and image_id.
    """
    if len(add) + len(subtract) > MAX_TERMS:
        raise InvalidArgumentError(f"at most {MAX_TERMS} add and subtract terms")

    def term(item: str | TermBody) -> QueryTerm:
        if isinstance(item, str):
            return parse_term(item, files=False)
        if (item.text is None) == (item.image_id is None):
            raise InvalidArgumentError("a term has exactly one of text and image_id")
        if item.text is not None:
            return QueryTerm(item.text, "text", item.weight)
        return QueryTerm(int(item.image_id or 0), "id", item.weight)

    return tuple(term(t) for t in add) + tuple(term(t).negated() for t in subtract)


def check_window(k: int, offset: int) -> None:
    if offset + k > MAX_DEPTH:
        raise InvalidArgumentError(f"offset + k must be <= {MAX_DEPTH}, got {offset + k}")


def make_request(kind: QueryKind, params: Mapping[str, Any], filters: Mapping[str, Any], **query: Any) -> SearchRequest:
    """A :class:`SearchRequest` of ``kind`` from the search parameters' and the filters' values
    by name (``query``: the query itself, ``text=...``).

    Raises:
        InvalidArgumentError: ``offset + k`` too deep, a filter or a term the search refuses.
    """
    check_window(params["k"], params["offset"])
    where = make_filter(**filters)
    terms = make_terms(params["add"] or [], params["subtract"] or [])
    # An empty form field is no cut-off and the default order, as an empty filter is no filter.
    min_score, sort = params["min_score"], params["sort"] or "score"
    check_cut(params["k"], min_score, sort)
    mode = check_mode(params["mode"]) if params.get("mode") else None
    if mode == "keyword" and (kind != "text" or terms):
        raise InvalidArgumentError("mode keyword takes a text query alone: image queries and query arithmetic are vector-only")
    # An empty form field is no language, as for the cut-off.
    query_lang = params["query_lang"] or None
    return SearchRequest(kind=kind, k=params["k"], offset=params["offset"], index=params["index"], where=where,
                         min_score=min_score, sort=sort, mode=mode, query_lang=query_lang, terms=terms, **query)


def from_body(body: SearchBody) -> SearchRequest:
    """A JSON body as a :class:`SearchRequest` (exactly one query kind)."""
    given = [name for name in ("text", "image_id", "vector") if getattr(body, name) is not None]
    if len(given) != 1:
        got = f"; got {', '.join(given)}" if given else ""
        raise InvalidArgumentError(f"give exactly one of text, image_id, vector (or a multipart image file){got}")
    kind: QueryKind = given[0]  # type: ignore[assignment]  # one of the three names above
    params = {name: getattr(body, name) for name in PARAMS}
    filters = body.filters.model_dump() if body.filters is not None else {}
    vector = tuple(body.vector) if body.vector is not None else None
    req = make_request(kind, params, filters, text=body.text, image_id=body.image_id, vector=vector)
    if req.terms and kind == "vector":
        raise InvalidArgumentError("add and subtract combine with text, image_id or an image file, not with a vector")
    return req


def from_form(form: SearchForm, image: bytes) -> SearchRequest:
    """A multipart form (its fields and the uploaded image) as a :class:`SearchRequest`."""
    params = {name: getattr(form, name) for name in PARAMS}
    return make_request("image", params, form.model_dump(exclude=set(PARAMS)), image=image)


def _hits(index: ImageIndex, served: ServedIndex, req: SearchRequest, depth: int) -> list[Hit]:
    # Each kind is the ImageIndex call the CLI (or the Python API) makes for it: same ranking.
    cut: dict[str, Any] = {"k": depth, "where": req.where, "min_score": req.min_score, "sort": req.sort}
    if req.terms:
        return _combined(index, served, req, cut)
    if req.kind == "text":
        assert req.text is not None
        if not req.text.strip():
            index.search(req.text, **cut)  # refuses it, in the library's words
        # Only the encoding runs under the model lock and its timer (the query-encoding metric);
        # the FAISS search is what ImageIndex.search runs after it.
        with served.model_call("text"):
            vector = index.embed_texts([req.text], query_lang=req.query_lang)
        return index.search_embedded([req.text], vector, mode=req.mode, **cut)[0]
    if req.kind == "image":
        assert req.image is not None
        with served.model_call("image"):
            upload = io.BytesIO(req.image)
            upload.name = "upload"  # how decoding errors name it (instead of '<stream>')
            return index.search_image(upload, **cut)
    if req.kind == "image_id":
        return index.search_similar(_known_id(index, served, req.image_id), **cut)
    return index.search_vectors(_unit_vector(req.vector, index.dim)[None], **cut)[0]


def _combined(index: ImageIndex, served: ServedIndex, req: SearchRequest, cut: dict[str, Any]) -> list[Hit]:
    # The query is the first term, as `clipsearch search QUERY --add ...` makes it (a text takes an N: weight too).
    if req.kind == "text":
        first = parse_term(req.text or "", files=False)
    elif req.kind == "image_id":
        first = QueryTerm(_known_id(index, served, req.image_id), "id")
    else:
        first = QueryTerm(req.image or b"", "image")
    for term in req.terms:
        if term.kind == "id" and isinstance(term.value, int):
            _known_id(index, served, term.value)
    kinds = {t.kind for t in (first, *req.terms)}
    with served.model_call("text" if "text" in kinds else "image"):
        return index.search_combined([first, *req.terms], **cut, query_lang=req.query_lang)


def _known_id(index: ImageIndex, served: ServedIndex, image_id: int | None) -> int:
    """``image_id`` when the generation answering the request has it (a 404 otherwise)."""
    if image_id is None or image_id >= index.count:
        raise NotFoundError(f"no image {image_id} in index {served.name!r} ({index.count} images)")
    return image_id


def _unit_vector(values: tuple[float, ...] | None, dim: int) -> np.ndarray:
    if values is None or len(values) != dim:
        raise InvalidArgumentError(f"vector must have {dim} numbers (the index's dim), got {0 if values is None else len(values)}")
    vec = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(vec)):
        raise InvalidArgumentError("vector must hold finite numbers (no NaN or Infinity)")
    norm = float(np.linalg.norm(vec))
    if norm == 0.0 or not math.isfinite(norm):
        raise InvalidArgumentError("vector must not be all zeros")
    return (vec / norm).astype(np.float32)


def run_search(served: ServedIndex, req: SearchRequest) -> dict[str, Any]:
    """Answer one search (blocking: call it from a worker thread).

    The index generation is read once, so the whole answer (ranking, sizes) comes from it even
    if a writer publishes a new one meanwhile. Ranking is the index's own for ``offset + k``
    results, sliced (with ``min_score``: the first ``offset + k`` of every hit at or above it,
    in the asked order, so pages follow each other); ``took_ms`` covers the search and the
    metadata reads.
    """
    started = time.perf_counter()
    index = served.current()
    hits = _hits(index, served, req, req.offset + req.k)[req.offset : req.offset + req.k]
    sizes = index.sizes_of([h.id for h in hits]).tolist()
    name = quote(served.name, safe="")
    results = [
        {
            "id": h.id,
            "path": h.path,
            "score": h.score,
            "taken": h.taken,
            "camera": h.camera,
            "gps": list(h.gps) if h.gps is not None else None,
            "caption": h.caption,
            "url": h.url,
            "matched": {k: list(v) for k, v in h.matched.items()} if h.matched is not None else None,
            "ocr_text": h.ocr_text,
            "keyword": h.keyword,
            "fused": h.fused,
            "width": int(s[0]),
            "height": int(s[1]),
            "image_url": f"/api/images/{h.id}?index={name}",
            "thumbnail_url": f"/api/thumbnails/{h.id}?size={DEFAULT_THUMBNAIL_SIZE}&index={name}",
        }
        for h, s in zip(hits, sizes, strict=True)
    ]
    took_ms = (time.perf_counter() - started) * 1000
    return {"results": results, "offset": req.offset, "k": req.k, "took_ms": round(took_ms, 3)}


def find_hits(served: ServedIndex, req: SearchRequest) -> tuple[ImageIndex, list[Hit]]:
    """The hits of ``req`` (its ``offset:offset+k`` window) and the generation that answered:
    the search :func:`run_search` makes, for answers of another shape (clip-back's
    ``/knn-service``). Blocking: call it from a worker thread."""
    index = served.current()
    return index, _hits(index, served, req, req.offset + req.k)[req.offset : req.offset + req.k]
