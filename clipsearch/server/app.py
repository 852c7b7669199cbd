"""``create_app``: the FastAPI application of ``clipsearch serve``, put together.

Its settings checked, its indexes opened (and warmed: the query models loaded before the first
request), then the routes mounted (``/api`` from :mod:`clipsearch.server.api`, clip-back's,
``/metrics``, the web UI, the docs) and the middleware wrapped around them in order. State lives
on ``app.state`` (``indexes``, ``config``, ``members``: the shard videos this process checked),
so several apps can live in one process.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path

from fastapi import Depends, FastAPI
from PIL import Image
from starlette.concurrency import run_in_threadpool
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import FileResponse, Response
from starlette.staticfiles import StaticFiles

from retrieval.partition_live import Connect
from retrieval.partitions import DEFAULT_DEADLINE_S
from retrieval.query_cache import DEFAULT_CAPACITY
from retrieval.shard_ranges import VerifiedMembers
from retrieval.version import __version__

from .api import api_router, require_token
from .clip_back import clip_back_router
from .clip_back_query import IGNORED_HEADER
from .config import DEFAULT_IMAGE_URL_TIMEOUT_S, ServerConfig
from .docs import document_search_body, mount_docs
from .errors import install_error_handlers
from .indexes import IndexSet, ServedIndex
from .middleware import UI_CSP, BodyLimit, SecurityHeaders
from .prometheus import CONTENT_TYPE, MetricsMiddleware, ServerMetrics
from .responses import JSONResponse
from .shard_sets import open_served

STATIC_DIR = Path(__file__).parent / "static"
# A text query run once per index at start-up, so that no request pays the model load.
_WARM_TEXT = "a photo"


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
    app.include_router(api_router())
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


def _warm_image() -> io.BytesIO:
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (128, 96, 64)).save(buf, "PNG")
    buf.seek(0)
    return buf


# -- the UI ----------------------------------------------------------------------------------


def _mount_ui(app: FastAPI) -> None:
    # HEAD too: link checkers and `curl -I` ask for the page that way.
    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def index_page() -> Response:
        # no-cache: a new version of the UI is picked up at the next load (it is revalidated).
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html", headers={"Cache-Control": "no-cache"})

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
