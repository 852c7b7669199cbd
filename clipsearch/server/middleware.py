"""Pure-ASGI middleware: security headers, the last-resort 500, and the upload limit.

Pure ASGI rather than ``BaseHTTPMiddleware`` because both need what that class hides: the
body limit wraps ``receive`` (to count bytes as they stream in) and the header middleware wraps
``send`` (so that every response, errors and files included, gets the headers).
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import UploadTooLargeError, error_response

# The web UI's policy (common brief): only our own scripts and styles, images from us or from
# blob:/data: URLs the UI makes from fetched thumbnails (fetch() can send the token, <img> cannot),
# and videos from us or blob: (a video hit played in the viewer).
UI_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; media-src 'self' blob:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)


class SecurityHeaders:
    """Adds ``X-Content-Type-Options: nosniff``, a CSP and ``Referrer-Policy`` to every response,
    and turns an exception that escaped every handler into ``500 {"error": "internal server error"}``
    (its traceback goes to stderr, never into the body).

    Args:
        app: the wrapped application.
        csp_for: the Content-Security-Policy for a request path.
    """

    def __init__(self, app: ASGIApp, csp_for: Callable[[str], str]) -> None:
        self.app = app
        self.csp_for = csp_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extra = [
            (b"x-content-type-options", b"nosniff"),
            (b"content-security-policy", self.csp_for(scope.get("path", "")).encode("latin-1")),
            (b"referrer-policy", b"no-referrer"),
        ]
        started = False

        async def send_with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                names = {name.lower() for name, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []), *(h for h in extra if h[0] not in names)]
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        except ClientDisconnect:
            return  # the client went away mid-body: nobody to answer, nothing to log
        except Exception:  # noqa: BLE001 - the last resort: log it, answer 500, keep serving
            print(f"clipsearch: internal error on {scope.get('method')} {scope.get('path')}:", file=sys.stderr)
            traceback.print_exc(file=sys.stderr)
            if not started:
                await error_response(500, "internal server error")(scope, receive, send_with_headers)


class BodyLimit:
    """413 for request bodies over ``max_bytes``: at once from ``Content-Length`` (the body is
    never read), or as soon as the running count of a body without one passes the limit.

    Args:
        app: the wrapped application.
        max_bytes: the largest body accepted.
        shown_limit: the limit named in the message (the upload limit, without form overhead).
    """

    def __init__(self, app: ASGIApp, max_bytes: int, shown_limit: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.shown_limit = shown_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await error_response(400, "malformed Content-Length header")(scope, receive, send)
                    return
                if declared > self.max_bytes:
                    await error_response(413, str(UploadTooLargeError(self.shown_limit).detail))(scope, receive, send)
                    return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # An HTTPException, so that FastAPI's body parsing re-raises it as it is and
                    # the error handler answers 413 (any other exception would become a 400).
                    raise UploadTooLargeError(self.shown_limit)
            return message

        await self.app(scope, counting_receive, send)
