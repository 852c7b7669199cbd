"""Search requests over HTTP, as :mod:`clipsearch.cli.search` on the command line.

Their shapes (GET parameters, a JSON body, a multipart form), checked once
into an :class:`ApiSearch` (the library's :class:`~retrieval.request.SearchRequest` and the
page), and the one function that answers them with ``ImageIndex.search``.

Errors follow one rule: a request of the wrong shape (an unknown field, a wrong type, k or
offset out of range) is 422; a well-formed value the search refuses (an empty text, a vector of
the wrong dimension, a filter that cannot match, an image that does not decode) is 400.
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, create_model

from retrieval.errors import InvalidArgumentError
from retrieval.index import Hit, ImageIndex
from retrieval.partitions import coverage
from retrieval.query_terms import QueryTerm, parse_term
from retrieval.request import SearchRequest

from ..search_params import MAX_DEPTH, MAX_TERMS, SearchParams
from .config import DEFAULT_THUMBNAIL_SIZE
from .errors import NotFoundError
from .fields import field_specs, http_names, model_fields, query_dependency
from .filters import filter_fields, filters_model, make_filter
from .indexes import ServedIndex

QueryKind = Literal["text", "image_id", "vector", "image", "browse"]
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


class MomentResult(BaseModel):
    start: float = Field(description="seconds from the video's start")
    end: float = Field(description="seconds from the video's start")
    time: float = Field(description="the moment's best frame, in seconds")
    score: float
    id: int = Field(description="the best frame's row (its thumbnail is that frame)")
class FaceResult(BaseModel):
    box: list[float] = Field(description="left, top, right, bottom in the original's pixels")
    person: int | None = Field(None, description="whose face: the person's number; null for nobody or a hidden person")
    name: str | None = Field(None, description="the person's name, null until named")


class SearchResult(BaseModel):
    id: int
    path: str
    score: float | None = Field(description="the cosine with the query; null without a query (filters alone, newest first)")
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
    media: Literal["video"] | None = Field(None, description="video for a video's hit (its best moment), null for an image")
    start: float | None = Field(None, description="a video's hit: where its best moment starts, in seconds (null in a "
                                "listing without a query: frame_time is the frame the filters kept)")
    end: float | None = Field(None, description="a video's hit: where its best moment ends, in seconds (null as start)")
    frame_time: float | None = Field(None, description="a video's hit: the time of its best frame (the id's row and score)")
    moments: list[MomentResult] | None = Field(None, description="a video's hit: every matching moment, the best first")
    video_url: str | None = Field(None, description="a video's hit: its file, playing from the moment (#t=start,end; "
                                  "#t=frame_time without a moment)")
    faces: list[FaceResult] | None = Field(
        None, description="the faces in the image, largest first (an index built with --faces; null otherwise)"
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
    partial: bool | None = Field(
        None, description="a shard set (serve --ray): true when a shard did not answer within its deadline and its images are "
        "missing from the results; absent for an index"
    )
    missing_shards: list[str] | None = Field(None, description="a shard set: the shards missing from the results (empty when none)")


@dataclass(frozen=True)
class ApiSearch:
    """One HTTP search, checked where it came in, whatever its shape: the library's
    :class:`~retrieval.request.SearchRequest` (``offset + k`` deep: a page is a slice of the
    ranking), the page, the served index's name and the query's kind (the metrics' label).
    Below the edge nothing checks it again; only what the answering generation decides (an
    id it has, a vector of its dim) is checked there."""

    kind: QueryKind
    search: SearchRequest
    k: int
    offset: int
    index: str | None


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


def make_request(kind: QueryKind, params: Mapping[str, Any], filters: Mapping[str, Any], *, text: str | None = None,
                 image_id: int | None = None, vector: Sequence[float] | None = None, image: bytes | None = None) -> ApiSearch:
    """An :class:`ApiSearch` of ``kind`` from the search parameters' and the filters' values by
    name, and the query itself (``text``, ``image_id``, ``vector`` or ``image``).

    Raises:
        InvalidArgumentError: ``offset + k`` too deep, a filter, a term or a query the search
            refuses (:class:`~retrieval.request.SearchRequest`).
    """
    k, offset = params["k"], params["offset"]
    check_window(k, offset)
    terms = make_terms(params["add"] or [], params["subtract"] or [])
    upload = None
    if image is not None:
        upload = io.BytesIO(image)
        upload.name = "upload"  # how decoding errors name it (instead of '<stream>')
    query: dict[str, Any] = {"text": text, "similar_to": image_id, "image": upload}
    if vector is not None:
        query = {"vector": unit_vector(vector)}
    if terms:
        if kind == "vector":
            raise InvalidArgumentError("add and subtract combine with text, image_id or an image file, not with a vector")
        # The query is the first term, as `clipsearch search QUERY --add ...` makes it (a text takes an N: weight too).
        if kind == "text":
            first = parse_term(text or "", files=False)
        elif kind == "image_id":
            first = QueryTerm(image_id if image_id is not None else -1, "id")
        else:
            first = QueryTerm(image or b"", "image")
        query = {"add": (first, *terms)}
    # An empty form field is no cut-off, the default order, no mode and no language, as an empty filter is no filter.
    search = SearchRequest(**query, k=offset + k, where=make_filter(**filters), min_score=params["min_score"],
                           sort=params["sort"] or "score", mode=params.get("mode") or None,
                           query_lang=params["query_lang"] or None)
    return ApiSearch(kind=kind, search=search, k=k, offset=offset, index=params["index"])


def from_body(body: SearchBody) -> ApiSearch:
    """A JSON body as an :class:`ApiSearch` (exactly one query kind, or none with filters: the
    images they keep, newest first)."""
    given = [name for name in ("text", "image_id", "vector") if getattr(body, name) is not None]
    params = {name: getattr(body, name) for name in PARAMS}
    filters = body.filters.model_dump() if body.filters is not None else {}
    if not given and not params.get("add") and any(v not in (None, "", [], False) for v in filters.values()):
        return make_request("browse", params, filters)
    if len(given) != 1:
        got = f"; got {', '.join(given)}" if given else ""
        raise InvalidArgumentError(f"give exactly one of text, image_id, vector (or a multipart image file){got}")
    kind: QueryKind = given[0]  # type: ignore[assignment]  # one of the three names above
    return make_request(kind, params, filters, text=body.text, image_id=body.image_id, vector=body.vector)


def from_form(form: SearchForm, image: bytes) -> ApiSearch:
    """A multipart form (its fields and the uploaded image) as an :class:`ApiSearch`."""
    params = {name: getattr(form, name) for name in PARAMS}
    return make_request("image", params, form.model_dump(exclude=set(PARAMS)), image=image)


def _hits(index: ImageIndex, served: ServedIndex, api: ApiSearch) -> list[Hit]:
    # The request is checked; what this generation decides is checked here: its ids (404), its dim.
    req = api.search
    for image_id in (req.similar_to, *(t.value for t in req.terms if t.kind == "id")):
        if image_id is not None:
            _known_id(index, served, int(image_id))
    if req.kind == "text":
        assert req.text is not None
        # Only the encoding runs under the model lock and its timer (the query-encoding metric);
        # the FAISS search is what index.search runs after it.
        with served.model_call("text"):
            vector = index.encoders.embed_texts([req.text], query_lang=req.query_lang)
        return index.search(req.with_vector(vector[0]))
    if req.kind == "vector":
        assert req.vector is not None
        if len(req.vector) != index.dim:
            raise InvalidArgumentError(f"vector must have {index.dim} numbers (the index's dim), got {len(req.vector)}")
        return index.search(req)
    if req.kind in ("similar", "browse"):
        return index.search(req)
    with served.model_call("text" if any(t.kind == "text" for t in req.terms) else "image"):
        return index.search(req)


def _known_id(index: ImageIndex, served: ServedIndex, image_id: int) -> None:
    """A 404 when the generation answering the request has no image ``image_id``."""
    if image_id >= index.count:
        raise NotFoundError(f"no image {image_id} in index {served.name!r} ({index.count} images)")


def unit_vector(values: Sequence[float]) -> np.ndarray:
    """A request's vector, normalised (the server normalises what it is given).

    Raises:
        InvalidArgumentError: not finite numbers, or all zeros.
    """
    vec = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(vec)):
        raise InvalidArgumentError("vector must hold finite numbers (no NaN or Infinity)")
    norm = float(np.linalg.norm(vec))
    if norm == 0.0 or not math.isfinite(norm):
        raise InvalidArgumentError("vector must not be all zeros")
    return (vec / norm).astype(np.float32)


def run_search(served: ServedIndex, req: ApiSearch) -> dict[str, Any]:
    """Answer one search (blocking: call it from a worker thread).

    The index generation is read once, so the whole answer (ranking, sizes) comes from it even
    if a writer publishes a new one meanwhile. Ranking is the index's own for ``offset + k``
    results, sliced (with ``min_score``: the first ``offset + k`` of every hit at or above it,
    in the asked order, so pages follow each other); ``took_ms`` covers the search and the
    metadata reads.
    """
    started = time.perf_counter()
    index = served.current()
    found = _hits(index, served, req)
    hits = found[req.offset : req.offset + req.k]
    sizes = index.metadata.sizes_of([h.id for h in hits]).tolist()
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
            "faces": [f.to_dict() for f in h.faces] if h.faces is not None else None,
            "width": int(s[0]),
            "height": int(s[1]),
            "image_url": f"/api/images/{h.id}?index={name}",
            "thumbnail_url": f"/api/thumbnails/{h.id}?size={DEFAULT_THUMBNAIL_SIZE}&index={name}",
            **_video_fields(h, name),
        }
        for h, s in zip(hits, sizes, strict=True)
    ]
    took_ms = (time.perf_counter() - started) * 1000
    out: dict[str, Any] = {"results": results, "offset": req.offset, "k": req.k, "took_ms": round(took_ms, 3)}
    out.update(coverage(found) or {})
    return out


def _video_fields(hit: Hit, name: str) -> dict[str, Any]:
    # A video's moments, and its file's URL with a media fragment a <video> plays from. A listing
    # without a query (filters alone: a person's photos) has no moment, only the frame it kept.
    if hit.media != "video" or hit.frame_time is None and (hit.start is None or hit.end is None):
        return {"media": None, "start": None, "end": None, "frame_time": None, "moments": None, "video_url": None}
    fragment = f"#t={hit.start:g},{hit.end:g}" if hit.start is not None and hit.end is not None else f"#t={hit.frame_time:g}"
    return {"media": hit.media, "start": hit.start, "end": hit.end, "frame_time": hit.frame_time,
            "moments": [m.to_dict() for m in hit.moments or ()], "video_url": f"/api/images/{hit.id}?index={name}{fragment}"}


def find_hits(served: ServedIndex, req: ApiSearch) -> tuple[ImageIndex, list[Hit]]:
    """The hits of ``req`` (its ``offset:offset+k`` window) and the generation that answered:
    the search :func:`run_search` makes, for answers of another shape (clip-back's
    ``/knn-service``). Blocking: call it from a worker thread."""
    index = served.current()
    return index, _hits(index, served, req)[req.offset : req.offset + req.k]
