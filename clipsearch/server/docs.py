"""The API's documentation: Swagger UI at ``/docs`` from the swagger-ui-bundle package (offline,
no CDN), and the OpenAPI document, completed by hand where FastAPI cannot derive it."""

from __future__ import annotations

import base64
import hashlib
import re
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from starlette.responses import HTMLResponse, Response
from starlette.staticfiles import StaticFiles

from .responses import JSONResponse
from .search import SearchBody, SearchForm

# The OpenAPI document in the dialect the bundled Swagger UI reads (see openapi_3_0).
DOCS_OPENAPI_URL = "/docs/openapi-3.0.json"


def mount_docs(app: FastAPI) -> str:
    """Swagger UI at /docs from the swagger-ui-bundle package (offline); returns its CSP."""
    from swagger_ui_bundle import swagger_ui_path  # type: ignore[import-untyped]  # the package ships no type information

    app.mount("/docs-assets", StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")
    page = get_swagger_ui_html(
        openapi_url=DOCS_OPENAPI_URL,
        title="clipsearch API",
        swagger_js_url="/docs-assets/swagger-ui-bundle.js",
        swagger_css_url="/docs-assets/swagger-ui.css",
        swagger_favicon_url="/docs-assets/favicon-32x32.png",
    )
    html = bytes(page.body).decode("utf-8")
    # The page's one inline script (the SwaggerUIBundle call) is allowed by its hash, nothing else.
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(s.encode("utf-8")).digest()).decode() + "'"
        for s in re.findall(r"<script>(.*?)</script>", html, flags=re.S)
    )

    @app.get("/docs", include_in_schema=False)
    async def docs() -> Response:
        return HTMLResponse(html)

    @app.get(DOCS_OPENAPI_URL, include_in_schema=False)
    async def docs_openapi() -> Response:
        return JSONResponse(openapi_3_0(app.openapi()))

    return (
        f"default-src 'none'; script-src 'self' {hashes}; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; frame-ancestors 'none'"
    )


def openapi_3_0(schema: dict[str, Any]) -> dict[str, Any]:
    """FastAPI's OpenAPI 3.1 document in the 3.0 dialect that the bundled Swagger UI (4.x) reads.

    swagger-ui-bundle ships Swagger UI 4, which refuses ``openapi: 3.1.0``. The differences that
    matter here are the version field and optional values (3.1: ``anyOf: [X, {"type": "null"}]``;
    3.0: ``X`` with ``nullable: true``). ``/openapi.json`` stays the real 3.1 document.
    """

    def convert(node: Any) -> Any:
        if isinstance(node, list):
            return [convert(n) for n in node]
        if not isinstance(node, dict):
            return node
        out = {k: convert(v) for k, v in node.items()}
        options = out.get("anyOf")
        if isinstance(options, list) and {"type": "null"} in options:
            rest = [o for o in options if o != {"type": "null"}]
            del out["anyOf"]
            if len(rest) == 1:
                # $ref siblings are ignored in 3.0: wrap a reference in allOf to keep nullable.
                out.update(rest[0] if "$ref" not in rest[0] else {"allOf": rest})
            else:
                out["anyOf"] = rest
            out["nullable"] = True
        return out

    converted: dict[str, Any] = convert(schema)
    converted["openapi"] = "3.0.3"
    return converted


def document_search_body(app: FastAPI) -> None:
    # POST /api/search reads its body itself (JSON or multipart, by Content-Type), so FastAPI
    # cannot derive the request schema: write it into the OpenAPI document here.
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        ref = "#/components/schemas/{model}"
        body = SearchBody.model_json_schema(ref_template=ref)
        form = SearchForm.model_json_schema(ref_template=ref)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model_schema in (body, form):
            components.update(model_schema.pop("$defs", {}))
        components["SearchBody"] = body
        form["properties"] = {"image": {"type": "string", "format": "binary"}, **form["properties"]}
        form["required"] = ["image"]
        components["SearchForm"] = form
        operation = schema["paths"]["/api/search"]["post"]
        operation["requestBody"] = {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/SearchBody"}},
                "multipart/form-data": {"schema": {"$ref": "#/components/schemas/SearchForm"}},
            },
        }
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to customise it
