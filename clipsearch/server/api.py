"""The ``/api`` routes of ``clipsearch serve`` (:func:`clipsearch.server.app.create_app` mounts them)
and the token check that they, clip-back's routes and ``/metrics`` stand behind.

``/api/health``, ``/api/indexes``, ``/api/search`` (a GET query, a JSON body or a multipart image
upload, each checked once into an :class:`~clipsearch.server.search.ApiSearch`), an original by
id (``Range`` and ``HEAD`` too) and its thumbnail; ``/api/people`` is
:mod:`clipsearch.server.people`'s. Each handler parses, runs the library call in a worker thread
(never on the event loop) and serialises.
"""

from __future__ import annotations

import hmac
import inspect
import json
import typing
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.responses import FileResponse, Response

from retrieval.errors import InvalidArgumentError, ModelLoadError, ModelMismatchError
from retrieval.shard_ranges import VerifiedMembers

from . import files, ranges
from .config import DEFAULT_THUMBNAIL_SIZE
from .filters import query_filters
from .indexes import IndexSet, ServedIndex
from .people import people_router
from .responses import JSONResponse
from .search import ApiSearch, SearchBody, SearchForm, SearchResponse, from_body, from_form, make_request, query_params, run_search

# At module level: the route's annotations are strings, resolved in this module's namespace.
_query_params = query_params()
_query_filters = query_filters()
# Every name GET /api/search reads: the two dependencies' parameters and the query itself.
_GET_SEARCH_NAMES = frozenset([*inspect.signature(_query_params).parameters, *inspect.signature(_query_filters).parameters, "q"])
# The multipart fields that may repeat: every other one keeps its last value.
_FORM_LISTS = frozenset(name for name, f in SearchForm.model_fields.items() if typing.get_origin(f.annotation) is list)


class Health(BaseModel):
    status: str
    indexes: list[str]


class IndexSummary(BaseModel):
    name: str
    count: int
    model: str
    dim: int
    index_type: str
    generation: str | int
    # The FLORES-200 codes a text query names in query_lang (NLLB-CLIP); empty for models that
    # read any language as it is.
    query_languages: list[str]


_bearer = HTTPBearer(auto_error=False, description="the server's --token (CLIPSEARCH_TOKEN)")


def require_token(request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    """401 unless the request carries the server's token (when it has one)."""
    token: str | None = request.app.state.config.token
    if token is None:
        return
    given = credentials.credentials.encode("utf-8", "surrogateescape") if credentials is not None else b""
    # compare_digest: the time taken does not tell how much of a guess was right.
    if credentials is None or not hmac.compare_digest(given, token.encode("utf-8")):
        raise HTTPException(401, "missing or wrong token: send Authorization: Bearer TOKEN", headers={"WWW-Authenticate": "Bearer"})



def _query_languages(served: ServedIndex) -> list[str]:
    # The list loads an open_clip model's tokenizer; a model that cannot load lists none here
    # and its searches say why.
    try:
        return list(served.current().encoders.query_languages())
    except (ModelLoadError, ModelMismatchError):
        return []



def _indexes(request: Request) -> IndexSet:
    indexes: IndexSet = request.app.state.indexes
    return indexes


def api_router() -> APIRouter:
    """The ``/api`` routes, each behind :func:`require_token`."""
    api = APIRouter(prefix="/api", dependencies=[Depends(require_token)])

    @api.get("/health", response_model=Health, summary="The server is up; the names of its indexes")
    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "indexes": _indexes(request).names})

    @api.get("/indexes", response_model=list[IndexSummary], summary="The served indexes (first: the default)")
    async def list_indexes(request: Request) -> Response:
        def describe() -> list[dict[str, Any]]:
            out = []
            for served in _indexes(request):
                m = served.current().manifest
                facts = {"count": m.count, "model": m.model, "dim": m.dim, "index_type": m.index_type, "generation": m.generation,
                         "query_languages": _query_languages(served)}
                out.append({"name": served.name, **facts})
            return out

        return JSONResponse(await run_in_threadpool(describe))

    @api.get("/search", response_model=SearchResponse, summary="Search by text, with the CLI's filters")
    async def search_get(
        request: Request,
        params: Annotated[dict[str, Any], Depends(_query_params)],
        filters: Annotated[dict[str, Any], Depends(_query_filters)],
        q: Annotated[str | None, Query(description="the text query")] = None,
    ) -> Response:
        # A misspelt filter must not return unfiltered results: unknown names are refused, as POST's are.
        unknown = [name for name in request.query_params if name not in _GET_SEARCH_NAMES]
        if unknown:
            raise RequestValidationError([{"type": "extra_forbidden", "loc": ("query", name), "msg": "unknown field"} for name in unknown])
        if q is None or not q.strip():
            if not any(v not in (None, "", [], False) for v in filters.values()):
                raise InvalidArgumentError("give a text query: q=... (or filters alone, e.g. person=NAME, to list what they keep)")
            # No query: the images the filters keep, newest first ("photos of Alice").
            return await _answer(request, make_request("browse", params, filters))
        return await _answer(request, make_request("text", params, filters, text=q))

    @api.post("/search", response_model=SearchResponse, summary="Search by text, image id, vector (JSON) or image file (multipart)")
    async def search_post(request: Request) -> Response:
        return await _answer(request, await _read_search_body(request))

    @api.get("/images/{image_id}", summary="The original image (or video) file of an id", response_class=FileResponse)
    async def image(request: Request, image_id: str, index: Annotated[str | None, Query()] = None) -> Response:
        served = _indexes(request).get(index)
        members: VerifiedMembers = request.app.state.members

        def locate() -> files.ImageFile:
            current = served.current()
            return files.original(current, files.parse_id(image_id, current, served.name), served.name, members)

        found = await run_in_threadpool(locate)
        headers = {"ETag": found.etag, "Cache-Control": files.ORIGINAL_CACHE_CONTROL}
        if files.etag_matches(request.headers.get("if-none-match"), found.etag):
            return Response(status_code=304, headers=headers)
        if found.member is not None:  # a video of a shard: only the range asked is read (once its member was checked)
            return await run_in_threadpool(
                ranges.ranged_read, found.member.size, files.member_reader(members, found.member, image_id),
                request.headers.get("range"), found.media_type, headers, head=request.method == "HEAD", limit=ranges.RANGE_LIMIT)
        if found.data is not None or found.path is None:  # an image read out of its shard
            return ranges.ranged(found.data or b"", request.headers.get("range"), found.media_type, headers)
        return FileResponse(found.path, media_type=found.media_type, headers=headers)

    # HEAD too, and Range on GET (FileResponse answers both; ranges.ranged for a shard's bytes): a browser's <video> asks the size
    # and seeks in a video's file. Kept out of the schema: one operation per path and method.
    api.add_api_route("/images/{image_id}", image, methods=["HEAD"], include_in_schema=False)

    @api.get("/thumbnails/{image_id}", summary="A JPEG thumbnail, no larger than size on its long side", response_class=FileResponse)
    async def thumbnail(
        request: Request,
        image_id: str,
        size: Annotated[int, Query(description="long side in pixels: 64, 128, 256, 384, 512, 768 or 1024")] = DEFAULT_THUMBNAIL_SIZE,
        index: Annotated[str | None, Query()] = None,
    ) -> Response:
        served = _indexes(request).get(index)
        files.check_size(size)
        cache_dir: Path = request.app.state.config.thumbnail_dir
        conditional = request.headers.get("if-none-match")

        def make() -> tuple[Path | None, str]:
            current = served.current()
            number = files.parse_id(image_id, current, served.name)
            key, etag = files.thumbnail_key(current, number, size)
            if files.etag_matches(conditional, etag):
                return None, etag
            return files.thumbnail_file(current, number, served.name, size, key, cache_dir), etag

        path, etag = await run_in_threadpool(make)
        headers = {"ETag": etag, "Cache-Control": files.THUMBNAIL_CACHE_CONTROL}
        if path is None:
            return Response(status_code=304, headers=headers)
        return FileResponse(path, media_type="image/jpeg", headers=headers)

    api.include_router(people_router())
    return api


async def _answer(request: Request, req: ApiSearch) -> Response:
    request.state.query_kind = req.kind  # the metrics' kind label
    served = _indexes(request).get(req.index)
    return JSONResponse(await run_in_threadpool(run_search, served, req))


async def _read_search_body(request: Request) -> ApiSearch:
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "multipart/form-data":
        return await _read_form(request)
    if kind not in ("application/json", ""):
        raise HTTPException(415, f"send application/json or multipart/form-data, not {kind}")
    raw = await request.body()
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError(f"malformed JSON: {exc}") from None
    try:
        body = SearchBody.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from None
    return from_body(body)


async def _read_form(request: Request) -> ApiSearch:
    form = await request.form(max_files=1, max_fields=64)
    try:
        upload = form.get("image")
        if not isinstance(upload, UploadFile):
            raise InvalidArgumentError('a multipart search needs an "image" file field')
        fields: dict[str, Any] = {}
        for key in form.keys():
            if key == "image":
                continue
            values = form.getlist(key)
            if any(isinstance(v, UploadFile) for v in values):
                raise InvalidArgumentError(f"only the image field may be a file, not {key!r}")
            fields[key] = values if key in _FORM_LISTS else values[-1]
        try:
            parsed = SearchForm.model_validate(fields)
        except ValidationError as exc:
            raise RequestValidationError(exc.errors()) from None
        data = await upload.read()
    finally:
        await form.close()
    return from_form(parsed, data)


__all__ = ["Health", "IndexSummary", "api_router", "require_token"]
