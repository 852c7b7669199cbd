"""clip-retrieval's clip-back HTTP API beside our own ``/api``, so that its clients
(``ClipClient``, clip-front) work against ``clipsearch serve``: ``GET /indices-list``,
``POST /knn-service`` and ``POST /metadata``.

The routes answer with the same search as ``/api/search``
(:func:`~clipsearch.server.search.find_hits` over ``ImageIndex``'s own calls); what differs is
the request's and the answer's shape (:mod:`clipsearch.server.clip_back_query`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from retrieval.errors import InvalidArgumentError

from .clip_back_query import IGNORED_HEADER, json_object, knn_answer, metadata_of, parse_ids, parse_knn
from .config import ServerConfig
from .image_urls import fetch_image
from .indexes import IndexSet
from .responses import JSONResponse
from .search import find_hits


def clip_back_router(require_token: Callable[..., Any]) -> APIRouter:
    """The clip-back routes, behind ``require_token`` (the dependency ``/api`` uses).

    Args:
        require_token: the FastAPI dependency that checks the bearer token.
    """
    router = APIRouter(dependencies=[Depends(require_token)], tags=["clip-back"])

    @router.get("/indices-list", summary="clip-back: the served indexes' names")
    async def indices_list(request: Request) -> Response:
        return JSONResponse(_indexes(request).names)

    @router.post("/knn-service", summary="clip-back: search by text, base64 image, image_url or embedding_input")
    async def knn_service(request: Request) -> Response:
        query = parse_knn(json_object(await request.body()))
        request.state.query_kind = "image" if query.kind == "image_url" else query.kind
        served = _indexes(request).get(query.indice_name)
        image = None
        if query.image_url is not None:
            config: ServerConfig = request.app.state.config
            if not config.allow_image_urls:
                raise InvalidArgumentError("image_url fetches are off on this server (start it with --allow-image-urls)")
            image = await run_in_threadpool(fetch_image, query.image_url, config.max_upload_bytes, config.image_url_timeout_s)
        req = query.search_request(image)
        base_url = str(request.base_url)

        def answer() -> list[dict[str, Any]]:
            index, hits = find_hits(served, req)
            return knn_answer(index, hits, query, base_url)

        headers = {IGNORED_HEADER: ", ".join(query.ignored)} if query.ignored else None
        return JSONResponse(await run_in_threadpool(answer), headers=headers)

    @router.post("/metadata", summary="clip-back: the metadata of image ids")
    async def metadata(request: Request) -> Response:
        data = json_object(await request.body())
        name = data.get("indice_name")
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError("indice_name is required: the index the ids belong to")
        served = _indexes(request).get(name)
        base_url = str(request.base_url)

        def answer() -> list[dict[str, Any]]:
            index = served.current()
            ids = parse_ids(data, index.count)
            return [{"id": i, "metadata": m} for i, m in zip(ids, metadata_of(index, ids, name, base_url), strict=True)]

        return JSONResponse(await run_in_threadpool(answer))

    return router


def _indexes(request: Request) -> IndexSet:
    indexes: IndexSet = request.app.state.indexes
    return indexes


__all__ = ["clip_back_router"]
