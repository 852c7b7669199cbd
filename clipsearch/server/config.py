"""The server's settings: one frozen, validated dataclass that every module reads."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from retrieval.errors import InvalidArgumentError

# Thumbnail sizes served (long side, pixels). A fixed set, not any size clamped to a range:
# every size is a file in the cache, so a client could otherwise fill the disk with ~1,000
# variants of each image.
THUMBNAIL_SIZES: tuple[int, ...] = (64, 128, 256, 384, 512, 768, 1024)
DEFAULT_THUMBNAIL_SIZE = 256
# Multipart framing and the small form fields come on top of the image itself.
_FORM_OVERHEAD_BYTES = 64 * 1024
# A bearer token is sent in a header: printable ASCII without spaces (RFC 6750's b64token, loosely).
_TOKEN = re.compile(r"[\x21-\x7e]+")
# A CORS origin: scheme://host[:port] with nothing after it (what browsers send in Origin), or *.
_ORIGIN = re.compile(r"\*|https?://[A-Za-z0-9.\-\[\]:]+/?")
# An image_url fetch: at most this long, and this large (the upload limit is the default cap).
DEFAULT_IMAGE_URL_TIMEOUT_S = 10.0


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/clipsearch/thumbnails``, else ``~/.cache/clipsearch/thumbnails``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "clipsearch" / "thumbnails"


@dataclass(frozen=True)
class ServerConfig:
    """How the app serves its indexes.

    Attributes:
        token: when set, every ``/api`` request needs ``Authorization: Bearer <token>``.
        max_upload_mb: largest query image accepted (MiB); larger bodies get 413.
        cache_dir: where thumbnails are cached (None: :func:`default_cache_dir`).
        browser_ui: serve the web UI at ``/`` and ``/static``.
        allow_image_urls: let ``/knn-service`` fetch the ``image_url`` a caller names (off: the
            server would fetch any URL a caller gives it, a request forgery risk).
        image_url_timeout_s: how long an ``image_url`` fetch may take, in seconds.
        cors_origins: origins that browsers may call the API from (``*``: any); none: no CORS
            headers, so only pages served by this server may call it.
        metrics: serve Prometheus metrics at ``/metrics``.
    """

    token: str | None = None
    max_upload_mb: float = 20
    cache_dir: Path | None = None
    browser_ui: bool = True
    allow_image_urls: bool = False
    image_url_timeout_s: float = DEFAULT_IMAGE_URL_TIMEOUT_S
    cors_origins: tuple[str, ...] = ()
    metrics: bool = True

    def __post_init__(self) -> None:
        if self.token is not None and (not isinstance(self.token, str) or not _TOKEN.fullmatch(self.token)):
            raise InvalidArgumentError("the token must be non-empty printable ASCII without spaces")
        mb = self.max_upload_mb
        if isinstance(mb, bool) or not isinstance(mb, (int, float)) or not 0 < mb <= 4096:
            raise InvalidArgumentError(f"max upload size must be a number of MiB in (0, 4096], got {mb!r}")
        if self.cache_dir is not None:
            object.__setattr__(self, "cache_dir", Path(self.cache_dir))
        timeout = self.image_url_timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 300:
            raise InvalidArgumentError(f"the image URL timeout must be a number of seconds in (0, 300], got {timeout!r}")
        origins = (self.cors_origins,) if isinstance(self.cors_origins, str) else tuple(self.cors_origins)
        for origin in origins:
            if not isinstance(origin, str) or not _ORIGIN.fullmatch(origin):
                raise InvalidArgumentError(f"a CORS origin is * or scheme://host[:port] with no path, got {origin!r}")
        object.__setattr__(self, "cors_origins", tuple(o.rstrip("/") for o in origins))

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * 1024 * 1024)

    @property
    def max_body_bytes(self) -> int:
        """The largest request body: the image plus the multipart framing and form fields."""
        return self.max_upload_bytes + _FORM_OVERHEAD_BYTES

    @property
    def thumbnail_dir(self) -> Path:
        return self.cache_dir if self.cache_dir is not None else default_cache_dir()
