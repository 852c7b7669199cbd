"""WebDataset shards on the query side: names, object-store access, one member read (the build's side: :mod:`indexer.shards`).

An image that came from a shard is stored as ``SHARD#MEMBER``: ``SHARD`` is the shard's path
relative to the folder (or bucket prefix) that holds the shards, which the manifest records as
``source_root`` (a local path or a URL such as ``s3://bucket/prefix``); ``MEMBER`` is the image's
name inside the tar. Its row also records ``member_offset``, where the image's bytes start in
the tar, so a reader (the server's ``/api/images/{id}``) fetches exactly those bytes, locally or
by one ranged read from the store, without scanning the tar.

Stores are reached through fsspec (the ``shards`` extra: ``fsspec`` and ``s3fs``; ``gcsfs`` for
``gs://``, ``adlfs`` for ``az://``). Credentials and endpoints come the store's standard way
(for S3 the ``AWS_*`` variables, ``AWS_ENDPOINT_URL`` included, and profiles), plus
``storage_options`` passed to fsspec as they are. fsspec is imported inside functions: the
query side stays importable without it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import InvalidArgumentError, ShardSourceError

# Between the shard's name and the member's name in a stored path.
MEMBER_SEP = "#"
_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")


@dataclass(frozen=True)
class SampleMeta:
    """What came with an image in its shard: where it is, its caption and img2dataset's ``.json``
    fields (None where the sample has none). ``offset``: where the image's bytes start in the tar."""

    shard: str
    key: str
    offset: int
    caption: str | None = None
    url: str | None = None
    original_width: int | None = None
    original_height: int | None = None
    sha256: str | None = None


def scheme_of(url: str) -> str | None:
    """The URL scheme of ``url`` (``s3``), None for a local path (``file://`` is local too)."""
    m = _SCHEME.match(url)
    if m is None or m.group(1).lower() == "file":
        return None
    return m.group(1).lower()


def split_member(rel: str) -> tuple[str, str]:
    """``(shard, member)`` of a stored ``SHARD#MEMBER`` path.

    Raises:
        InvalidArgumentError: the path names no member.
    """
    shard, sep, member = rel.partition(MEMBER_SEP)
    if not sep or not shard or not member:
        raise InvalidArgumentError(f"{rel!r} is not a SHARD{MEMBER_SEP}MEMBER path")
    return shard, member


def parse_storage_options(text: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """``--storage-options``: a JSON object (or a mapping) of fsspec keyword arguments.

    Raises:
        InvalidArgumentError: not JSON, or not an object.
    """
    if text is None or text == "":
        return {}
    if isinstance(text, Mapping):
        return dict(text)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgumentError(f"storage options must be a JSON object: {exc.msg} at column {exc.colno}") from None
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"storage options must be a JSON object, got {type(value).__name__}")
    return value


def filesystem(url: str, storage_options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """The fsspec filesystem of ``url`` and the path within it.

    Raises:
        ShardSourceError: fsspec, or the package of the URL's scheme, is not installed (naming
            it), or the scheme is unknown.
    """
    scheme = scheme_of(url)
    try:
        from fsspec.core import url_to_fs
    except ImportError:
        raise ShardSourceError("reading shards needs fsspec: pip install 'clipsearch[shards]'") from None
    options = dict(storage_options or {})
    if scheme is not None:
        _check_scheme(scheme)
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if scheme in ("s3", "s3a") and endpoint and "endpoint_url" not in options:
            # Given explicitly: fsspec keeps one filesystem per set of options, so a changed
            # endpoint must change them (and older botocore does not read the variable itself).
            options["endpoint_url"] = endpoint
    try:
        fs, path = url_to_fs(url, **options)
    except ImportError as exc:
        raise ShardSourceError(f"reading {scheme}:// URLs needs {_package_of(scheme or '')}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ShardSourceError(f"cannot open {url}: {exc}") from None
    return fs, path


def _check_scheme(scheme: str) -> None:
    from fsspec.registry import known_implementations, registry

    if scheme not in registry and scheme not in known_implementations:
        raise ShardSourceError(f"no fsspec filesystem knows the URL scheme {scheme}://")
    if scheme in registry:
        return
    package = _package_of(scheme)
    import importlib.util

    if importlib.util.find_spec(package) is None:
        raise ShardSourceError(f"reading {scheme}:// URLs needs the fsspec package {package}: pip install {package}")


def _package_of(scheme: str) -> str:
    from fsspec.registry import known_implementations

    spec = known_implementations.get(scheme, {})
    return str(spec.get("class", "fsspec")).split(".")[0]


def describe_error(url: str, exc: BaseException) -> str:
    """One line for a failed store access: what was asked and what the store said."""
    if isinstance(exc, FileNotFoundError):
        return f"{url}: no such file, key or bucket"
    if isinstance(exc, PermissionError):
        return f"{url}: access denied (HTTP 403): check the credentials (AWS_* variables, profile, --storage-options)"
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if "connect" in text.lower() or "timeout" in text.lower() or "timed out" in text.lower():
        return f"{url}: the store does not answer ({text})"
    return f"{url}: {type(exc).__name__}: {text}"


def store_errors() -> tuple[type[BaseException], ...]:
    """The exceptions a store access may raise: OSError, botocore's own when installed, and the
    TypeError or ValueError of a storage option the store's client does not take (its client is
    made on first use, so a bad option surfaces there)."""
    errors: list[type[BaseException]] = [OSError, TypeError, ValueError]
    try:
        from botocore.exceptions import BotoCoreError, ClientError

        errors += [BotoCoreError, ClientError]
    except ImportError:
        pass
    return tuple(errors)


def join(root: str, name: str) -> str:
    """``name`` (a shard's path relative to ``root``) under ``root``, a local folder or a URL."""
    return root.rstrip("/") + "/" + name


def read_member(root: str, shard: str, offset: int, size: int, storage_options: Mapping[str, Any] | None = None,
                *, content_hash: str | None = None) -> bytes:
    """``size`` bytes at ``offset`` of the shard ``shard`` under ``root``: one member's content;
    with ``content_hash`` (the row's) they must be the bytes that were indexed.

    Raises:
        ShardSourceError: the shard cannot be read (gone, refused, shorter than recorded), or
            holds other bytes there now.
    """
    url = join(root, shard)
    fs, path = filesystem(url, storage_options)
    try:
        data = fs.cat_file(path, start=offset, end=offset + size)
    except store_errors() as exc:
        raise ShardSourceError(describe_error(url, exc)) from None
    # The indexer's content hash (indexer.dataset.content_hash): BLAKE2b-128 of the bytes.
    if len(data) != size or (content_hash and hashlib.blake2b(data, digest_size=16).hexdigest() != content_hash):
        raise ShardSourceError(f"{url}: changed since it was indexed (re-run clipsearch index)")
    return bytes(data)


__all__ = [
    "MEMBER_SEP",
    "SampleMeta",
    "ShardSourceError",
    "describe_error",
    "filesystem",
    "join",
    "parse_storage_options",
    "read_member",
    "scheme_of",
    "split_member",
    "store_errors",
]
