"""Fetching the image a ``/knn-service`` request names by ``image_url`` (off unless the server
was started with ``--allow-image-urls``): http and https only, within a size cap and a time limit.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from retrieval.errors import InvalidArgumentError

_CHUNK = 64 * 1024
_SCHEMES = ("http", "https")


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    # urllib follows redirects to ftp:// too; a fetch that starts on http stays on http(s).
    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        if urlsplit(newurl).scheme.lower() not in _SCHEMES:
            raise InvalidArgumentError(f"image_url redirects to a non-http URL: {newurl[:200]}")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def check_url(url: str) -> str:
    """``url`` when it is an absolute http(s) URL.

    Raises:
        InvalidArgumentError: another scheme, no host, or not a string.
    """
    if not isinstance(url, str) or not url.strip():
        raise InvalidArgumentError("image_url must be a non-empty string")
    parts = urlsplit(url.strip())
    if parts.scheme.lower() not in _SCHEMES or not parts.hostname:
        raise InvalidArgumentError(f"image_url must be an http or https URL, got {url[:200]!r}")
    return url.strip()


def fetch_image(url: str, max_bytes: int, timeout_s: float) -> bytes:
    """The body of ``url``: at most ``max_bytes``, read within ``timeout_s`` seconds in all
    (blocking: call it from a worker thread).

    Raises:
        InvalidArgumentError: a bad URL, a failed fetch (with its reason), a body over the cap,
            or a fetch over the time limit.
    """
    url = check_url(url)
    deadline = time.monotonic() + timeout_s
    opener = urllib.request.build_opener(_HttpOnlyRedirects)
    request = urllib.request.Request(url, headers={"User-Agent": "clipsearch", "Accept": "image/*"})
    try:
        with opener.open(request, timeout=timeout_s) as resp:
            declared = resp.headers.get("Content-Length")
            if declared and declared.isdigit() and int(declared) > max_bytes:
                raise InvalidArgumentError(f"image_url is larger than the limit of {max_bytes / 1048576:g} MiB")
            chunks: list[bytes] = []
            size = 0
            while chunk := resp.read(_CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    raise InvalidArgumentError(f"image_url is larger than the limit of {max_bytes / 1048576:g} MiB")
                if time.monotonic() > deadline:
                    raise InvalidArgumentError(f"image_url took longer than {timeout_s:g} s to fetch")
                chunks.append(chunk)
    except InvalidArgumentError:
        raise
    except urllib.error.HTTPError as exc:
        raise InvalidArgumentError(f"image_url answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise InvalidArgumentError(f"could not fetch image_url: {reason}") from None
    return b"".join(chunks)


__all__ = ["check_url", "fetch_image"]
