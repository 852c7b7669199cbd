"""One error model for every response, :mod:`retrieval.errors` as ``{"error": "<one line>"}`` with a 4xx/5xx status.

Typed library exceptions map to statuses here (the HTTP side of what ``clipsearch.cli.main``
does for the shell); nothing else in the server builds an error body.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from retrieval.errors import ClipSearchError, ImageDecodeError, InvalidArgumentError, ShardUnavailableError

from .responses import JSONResponse


class NotFoundError(ClipSearchError):
    """An index name or image id the server does not have (404)."""


class UploadTooLargeError(HTTPException):
    """The request body is over the upload limit (413); raised while the body streams in."""

    def __init__(self, limit_bytes: int) -> None:
        super().__init__(413, f"the upload is larger than the limit of {limit_bytes / 1048576:g} MiB")


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """The one error body: ``{"error": message}``, message cut to its first line."""
    line = message.strip().splitlines()[0] if message.strip() else "error"
    return JSONResponse({"error": line}, status_code=status, headers=headers)


def status_of(exc: ClipSearchError) -> int:
    """The HTTP status of a library exception: the caller's mistake (4xx) or ours (500)."""
    if isinstance(exc, NotFoundError):
        return 404
    if isinstance(exc, (InvalidArgumentError, ImageDecodeError)):
        return 400
    if isinstance(exc, ShardUnavailableError):
        return 503  # a shard set's shard did not answer in time: worth trying again
    return 500


def validation_message(errors: Sequence[Any]) -> str:
    """One line naming the first bad field: ``k: Input should be less than or equal to 1000``."""
    if not errors:
        return "invalid request"
    first = errors[0]
    # loc starts with where the value came from (query, body, path): not part of the field's name.
    loc = [str(p) for p in first.get("loc", ()) if p not in ("query", "body", "path", "form")]
    msg = str(first.get("msg", "invalid value"))
    if first.get("type") == "extra_forbidden":
        msg = "unknown field"
    elif first.get("type") == "json_invalid":
        return "malformed JSON: " + str(first.get("ctx", {}).get("error", msg))
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{'.'.join(loc) or 'request'}: {msg}{more}"


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    detail = str(exc.detail)
    if exc.status_code == 404 and detail == "Not Found":
        detail = f"not found: {request.url.path[:200]}"  # Starlette's own 404: no route matched
    return error_response(exc.status_code, detail, headers=dict(exc.headers or {}))


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    return error_response(422, validation_message(exc.errors()))


async def _library_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ClipSearchError)
    status = status_of(exc)
    if status >= 500:
        print(f"clipsearch: error: {request.method} {request.url.path}: {exc}", file=sys.stderr)
    return error_response(status, str(exc))


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers of HTTP, validation and library errors (500s: see middleware)."""
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(ClipSearchError, _library_error)
