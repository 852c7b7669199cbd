"""``create_app``: the FastAPI application of ``clipsearch serve`` (the API, the UI, the docs).

Handlers parse and validate, call the same ``ImageIndex`` methods the CLI calls (in a worker
thread: model calls and file reads never run on the event loop), and serialise. State lives on
``app.state`` (``indexes``, ``config``, ``members``: the shard videos this process checked), so
several apps can live in one process.
"""

from __future__ import annotations

import hmac
import inspect
import io
import json
import os
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from PIL import Image
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import FileResponse, Response
from starlette.staticfiles import StaticFiles

from retrieval.errors import InvalidArgumentError, ModelLoadError, ModelMismatchError
from retrieval.partition_live import Connect
from retrieval.partitions import DEFAULT_DEADLINE_S
from retrieval.query_cache import DEFAULT_CAPACITY
from retrieval.shard_ranges import VerifiedMembers
from retrieval.version import __version__

from . import files, ranges
from .clip_back import clip_back_router
from .clip_back_query import IGNORED_HEADER
from .config import DEFAULT_IMAGE_URL_TIMEOUT_S, DEFAULT_THUMBNAIL_SIZE, ServerConfig
from .docs import document_search_body, mount_docs
from .errors import install_error_handlers
from .filters import query_filters
from .indexes import IndexSet, ServedIndex
from .middleware import UI_CSP, BodyLimit, SecurityHeaders
from .people import people_router
from .prometheus import CONTENT_TYPE, MetricsMiddleware, ServerMetrics
from .responses import JSONResponse
from .search import (
    ApiSearch,
    SearchBody,
    SearchForm,
    SearchResponse,
    from_body,
    from_form,
    make_request,
    query_params,
    run_search,
)
from .shard_sets import open_served

STATIC_DIR = Path(__file__).parent / "static"
# At module level: the route's annotations are strings, resolved in this module's namespace.
_query_params = query_params()
_query_filters = query_filters()
# Every name GET /api/search reads: the two dependencies' parameters and the query itself.
_GET_SEARCH_NAMES = frozenset([*inspect.signature(_query_params).parameters, *inspect.signature(_query_filters).parameters, "q"])
# The multipart fields that may repeat: every other one keeps its last value.
_FORM_LISTS = frozenset(name for name, f in SearchForm.model_fields.items() if typing.get_origin(f.annotation) is list)
# A text query run once per index at start-up, so that no request pays the model load.
_WARM_TEXT = "a photo"


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


def create_app(
    index_dirs: Sequence[str | os.PathLike[str]],
    *,
    token: str | None = None,
    max_upload_mb: float = 20,
    cache_dir: str | os.PathLike[str] | None = None,
    browser_ui: bool = True,
    model: str | None = None,
    device: str = "auto",
    precision: str = "auto",
    warm: bool = True,
    query_cache: int = DEFAULT_CAPACITY,
    mmap: bool | None = None,
    allow_image_urls: bool = False,
    image_url_timeout_s: float = DEFAULT_IMAGE_URL_TIMEOUT_S,
    cors_origins: Sequence[str] = (),
    metrics: bool = True,
    shard_connect: Connect | None = None,
    shard_deadline_s: float = DEFAULT_DEADLINE_S,
) -> FastAPI:
    """The ``clipsearch serve`` application over ``index_dirs``.

    Every directory is opened now as a :class:`~retrieval.live.LiveIndex` (later generations
    written by ``clipsearch index`` / ``reindex`` are picked up per request), named by its base
    name; the first is the default. With ``warm``, each index's text tower and image tower are
    loaded now, so that no request pays a model load.

    Args:
        index_dirs: the INDEX_DIRs to serve.
        token: require ``Authorization: Bearer <token>`` on every ``/api`` request.
        max_upload_mb: largest query image accepted (413 above).
        cache_dir: thumbnail cache (default ``$XDG_CACHE_HOME/clipsearch/thumbnails``).
        browser_ui: serve the web UI at ``/``.
        model, device, precision: query model settings, as for ``ImageIndex.open`` (``precision``
            defaults to ``auto`` here: a server is long-lived, so int8 text products that pass the
            quality gate are worth their one-time torch import).
        warm: load the query models now and have the kernel read what every query of a
            memory-mapped FAISS file scans (``ImageIndex.vectors.warm``; tests that never query
            may skip it).
        query_cache: distinct query texts per index whose vectors are kept (0: none).
        mmap: memory-map every FAISS file (True: what several worker processes share), read
            it into RAM (False), or follow the plan each index recorded (None).
        allow_image_urls, image_url_timeout_s, cors_origins, metrics: see :class:`ServerConfig`.
        shard_connect, shard_deadline_s: for a directory holding a shard set
            (:mod:`clipsearch.server.shard_sets`): how its shards are reached (default: opened
            in this process) and the seconds each has to answer a call.

    Raises:
        InvalidArgumentError: bad settings, or two directories with the same name.
        NotAnIndexError, IndexFormatError, ModelMismatchError, ...: an index that cannot be served.
    """
    config = ServerConfig(
        token=token,
        max_upload_mb=max_upload_mb,
        cache_dir=Path(cache_dir) if cache_dir else None,
        browser_ui=browser_ui,
        allow_image_urls=allow_image_urls,
        image_url_timeout_s=image_url_timeout_s,
        cors_origins=tuple(cors_origins),
        metrics=metrics,
    )
    indexes = IndexSet(
        index_dirs,
        lambda d: open_served(d, model=model, device=device, precision=precision, mmap=mmap, query_cache=query_cache, warm=warm,
                              connect=shard_connect, deadline_s=shard_deadline_s),
    )
    # Before warming, so that the model calls of the warm-up queries are not counted.
    server_metrics = ServerMetrics(indexes) if metrics else None
    if warm:
        for served in indexes:
            _warm(served)
    if server_metrics is not None:
        # Connected after the warm-up queries, which no client asked for.
        server_metrics.connect()

    app = FastAPI(
        title="clipsearch",
        version=__version__,
        description="Search your images by text, by image or by vector.",
        docs_url=None,
        redoc_url=None,
        default_response_class=JSONResponse,
    )
    app.state.config = config
    app.state.indexes = indexes
    # The shard members whose content hash this process checked: later ranges read only their bytes.
    app.state.members = VerifiedMembers()
    install_error_handlers(app)
    app.include_router(_api_router())
    app.include_router(clip_back_router(require_token))
    if server_metrics is not None:
        _mount_metrics(app, server_metrics)
    docs_csp = mount_docs(app)
    if browser_ui:
        _mount_ui(app)
    document_search_body(app)

    def csp_for(path: str) -> str:
        return docs_csp if path == "/docs" else UI_CSP

    # Outermost last: the headers (and the last-resort 500) wrap everything, the 413 included;
    # CORS headers go on the 413 too (a browser would otherwise hide its reason from the page);
    # the metrics count every answer, the last-resort 500 included.
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes, shown_limit=config.max_upload_bytes)
    if config.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(config.cors_origins),
            allow_methods=["GET", "POST", "HEAD"],
            allow_headers=["Authorization", "Content-Type"],
            expose_headers=[IGNORED_HEADER],
            max_age=600,
        )
    app.add_middleware(SecurityHeaders, csp_for=csp_for)
    if server_metrics is not None:
        app.add_middleware(MetricsMiddleware, metrics=server_metrics)
    return app


def _mount_metrics(app: FastAPI, server_metrics: ServerMetrics) -> None:
    @app.get("/metrics", dependencies=[Depends(require_token)], summary="Prometheus metrics (text format)", response_class=Response)
    async def metrics_page() -> Response:
        return Response(await run_in_threadpool(server_metrics.exposition), media_type=CONTENT_TYPE)


def _warm(served: ServedIndex) -> None:
    index = served.current()
    langs = index.encoders.query_languages()
    with served.model_call("text"):
        index.search(_WARM_TEXT, k=1, query_lang=("eng_Latn" if "eng_Latn" in langs else langs[0]) if langs else None)
    with served.model_call("image"):
        # The image tower, and the first pass through it (lazy kernels, preprocessing), which
        # the first uploaded query would otherwise wait for.
        index.search_image(_warm_image(), k=1)
    if index.count:
        # The first metadata read opens the Parquet row groups.
        index.rows([0], columns=("content_hash",))
        index.metadata.sizes_of([0])  # the width and height columns, read once for every result page


def _query_languages(served: ServedIndex) -> list[str]:
    # The list loads an open_clip model's tokenizer; a model that cannot load lists none here
    # and its searches say why.
    try:
        return list(served.current().encoders.query_languages())
    except (ModelLoadError, ModelMismatchError):
        return []


def _warm_image() -> io.BytesIO:
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (128, 96, 64)).save(buf, "PNG")
    buf.seek(0)
    return buf


# -- auth ---------------------------------------------------------------------------------------

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


# -- the API ------------------------------------------------------------------------------------


def _indexes(request: Request) -> IndexSet:
    indexes: IndexSet = request.app.state.indexes
    return indexes


def _api_router() -> APIRouter:
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


# -- the UI ----------------------------------------------------------------------------------


def _mount_ui(app: FastAPI) -> None:
    # HEAD too: link checkers and `curl -I` ask for the page that way.
    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def index_page() -> Response:
        # no-cache: a new version of the UI is picked up at the next load (it is revalidated).
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html", headers={"Cache-Control": "no-cache"})

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
