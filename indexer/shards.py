"""WebDataset shards as the images of a build (the query side: :mod:`retrieval.shards`).

Which shards a SOURCE names and what each holds; a decode worker reads one image's bytes out of
its shard with :class:`~indexer.shard_reader.ShardReader` (:meth:`ShardSource.reader`).

A SOURCE is a shard spec when it is a URL (``s3://bucket/prefix/``), a ``.tar`` file, a brace
pattern (``shards/{00000..00099}.tar``, expanded by ``braceexpand``, webdataset's own), or a
local folder whose top level holds ``.tar`` files and no images. A folder or prefix stands for
its ``.tar`` files.

Each shard is listed with :mod:`tarfile` over an fsspec file (ranged reads on a store): members
are grouped into samples by webdataset's own key rule (``base_plus_ext``), as img2dataset writes
them: ``KEY.jpg`` (or another image type), ``KEY.txt`` (the caption) and ``KEY.json`` (url,
sizes, sha256). Every image becomes an :class:`~indexer.discover.ImageFile` named
``SHARD#MEMBER`` whose ``mtime_ns`` is the shard's *version* (from its size and ETag, or mtime
for a local file): a shard that changed gives every one of its images a new version, so the
update plan re-embeds them; a shard no longer listed leaves its rows unmatched, so they are
removed; an unchanged shard's committed rows are kept, which is also how a killed run resumes.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
import tarfile
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retrieval.errors import ShardSourceError
from retrieval.images import IMAGE_EXTENSIONS
from retrieval.shards import (
    MEMBER_SEP,
    SampleMeta,
    describe_error,
    filesystem,
    join,
    parse_storage_options,
    scheme_of,
    store_errors,
)

from .discover import Discovery, ImageFile
from .shard_reader import ShardReader
from .video.probe import VIDEO_EXTENSIONS

SHARD_SUFFIX = ".tar"
_IMAGE_EXTS = frozenset(e.lstrip(".").lower() for e in IMAGE_EXTENSIONS)
# Video members (video2dataset's and img2dataset's ``mp4``, ``webm``...): what a folder's walk takes.
_VIDEO_EXTS = frozenset(e.lstrip(".") for e in VIDEO_EXTENSIONS)
# One brace group: a numeric range {000..099} or a list {a,b,c}.
_BRACE = re.compile(r"\{(?:\d+\.\.\d+|[^{}.,]+(?:,[^{},]+)+)\}")
# Shards listed at once (each mostly waits on the store).
LIST_THREADS = 8
# The skip reason of a sample without an image (kept as it is while its shard does not change).
NO_IMAGE = "has no image"


@dataclass(frozen=True)
class Shard:
    """One shard: ``name`` relative to the source's root, its ``url``, ``size`` and ``version``."""

    name: str
    url: str
    size: int
    version: int


@dataclass(frozen=True)
class ShardSource:
    """The shards a SOURCE names: ``root`` (recorded as the index's ``source_root``) holds them."""

    spec: str
    root: str
    shards: tuple[Shard, ...]
    storage_options: str = ""

    @property
    def options(self) -> dict[str, Any]:
        return parse_storage_options(self.storage_options)

    def reader(self) -> ShardReader:
        """What decode workers read images with."""
        return ShardReader(self.root, self.storage_options)


def is_shard_spec(source: str) -> bool:
    """Whether SOURCE names shards (see the module docs) rather than a folder of images."""
    import os

    if scheme_of(source) is not None:
        return True
    if not os.path.isdir(source):
        # A folder of photos may have braces in its name; a pattern or a .tar is not a folder.
        return "{" in source or source.lower().endswith(SHARD_SUFFIX)
    try:
        names = [e.name.lower() for e in os.scandir(source) if e.is_file()]
    except OSError:
        return False
    has_tar = any(n.endswith(SHARD_SUFFIX) for n in names)
    has_image = any(posixpath.splitext(n)[1] in IMAGE_EXTENSIONS for n in names)
    return has_tar and not has_image


def expand(spec: str) -> list[str]:
    """The URLs of a brace pattern, in order (a spec without braces is itself).

    Raises:
        ShardSourceError: a brace group that is neither ``{A..B}`` (digits) nor ``{a,b}``.
    """
    if "{" not in spec and "}" not in spec:
        return [spec]
    import braceexpand

    leftover = _BRACE.sub("", spec)
    if "{" in leftover or "}" in leftover:
        raise ShardSourceError(f"malformed brace range in {spec!r}: use {{00000..00099}} (digits) or {{a,b,c}}")
    try:
        urls = list(braceexpand.braceexpand(spec))
    except braceexpand.UnbalancedBracesError:  # type: ignore[attr-defined]  # exported, not in __all__
        raise ShardSourceError(f"malformed brace range in {spec!r}: unbalanced braces") from None
    return urls


def resolve(spec: str, storage_options: str | Mapping[str, Any] | None = None) -> ShardSource:
    """The shards SOURCE names, each with its size and version (one listing or ``info`` call each).

    Raises:
        ShardSourceError: the store cannot be reached or refuses, a named shard or prefix does not
            exist, a folder or prefix holds no ``.tar``, a malformed brace range, a scheme
            without its fsspec package.
    """
    options = parse_storage_options(storage_options)
    text = json.dumps(options, sort_keys=True) if options else ""
    urls = expand(spec)
    fs, first = filesystem(urls[0], options)
    local = scheme_of(urls[0]) is None
    try:
        if len(urls) == 1 and not urls[0].lower().endswith(SHARD_SUFFIX):
            root, found = _folder(fs, urls[0], first, local)
        else:
            paths = [filesystem(u, options)[1] for u in urls]
            infos = [_info(fs, p, u) for p, u in zip(paths, urls, strict=True)]
            root_path = posixpath.commonpath([posixpath.dirname(p) for p in paths]) if len(paths) > 1 else posixpath.dirname(paths[0])
            root = _url_of(fs, root_path, local)
            found = [(posixpath.relpath(p, root_path), u, info) for p, u, info in zip(paths, urls, infos, strict=True)]
    except ShardSourceError:
        raise
    except store_errors() as exc:
        raise ShardSourceError(describe_error(getattr(exc, "filename", None) or spec, exc)) from None
    shards = tuple(Shard(name, url, int(info.get("size") or 0), _version(info)) for name, url, info in found)
    return ShardSource(spec, root, shards, text)


def _info(fs: Any, path: str, url: str) -> Mapping[str, Any]:
    try:
        info: Mapping[str, Any] = fs.info(path)
    except store_errors() as exc:
        raise ShardSourceError(describe_error(url, exc)) from None
    return info


def _folder(fs: Any, url: str, path: str, local: bool) -> tuple[str, list[tuple[str, str, Mapping[str, Any]]]]:
    path = path.rstrip("/")
    if not fs.exists(path):
        raise ShardSourceError(f"{url}: no such file, folder, key or bucket")
    entries = sorted((e for e in fs.ls(path, detail=True) if str(e["name"]).lower().endswith(SHARD_SUFFIX)), key=lambda e: e["name"])
    if not entries:
        raise ShardSourceError(f"{url} holds no {SHARD_SUFFIX} shards")
    root = _url_of(fs, path, local)
    return root, [(posixpath.relpath(e["name"], path), join(root, posixpath.relpath(e["name"], path)), e) for e in entries]


def _url_of(fs: Any, path: str, local: bool) -> str:
    # The root as a URL of the same store (a bucket path gets its scheme back), or a local path.
    return path if local else fs.unstrip_protocol(path)


def _version(info: Mapping[str, Any]) -> int:
    # Size and ETag (stores) or modification time (local files): changes when the shard does.
    tag = info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("LastModified") or ""
    digest = hashlib.blake2b(f"{info.get('size')}:{tag}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1  # a non-negative int64


@dataclass
class Known:
    """What a complete index holds of one shard: its rows and skips as found files (to be kept),
    its samples without an image, and whether all of them carry one version."""

    files: list[ImageFile]
    missing: list[tuple[bytes, str]]
    versions: set[int]
    retry: bool = False  # a skip without file facts that is not a missing image: read again


def known_shards(index_dir: Path, videos: bool = False) -> dict[str, Known]:
    """Per shard, what the index at ``index_dir`` holds of it, when its last run completed (so
    every shard it listed was embedded whole) with ``videos`` as this run; empty for a new,
    incomplete or damaged index. An unchanged shard is then not read again (:func:`list_source`)."""
    from retrieval import store
    from retrieval.errors import ClipSearchError
    from retrieval.layout import is_index_dir, read_manifest

    try:
        if not is_index_dir(index_dir):
            return {}
        manifest = read_manifest(index_dir)
        if not manifest.complete or bool(manifest.discovery.get("videos")) != videos:
            return {}
        parts = store.open_parts(index_dir, manifest)
        if any("member_offset" not in pf.schema_arrow.names for pf in parts):
            return {}
        columns = {name: store.read_column(parts, name).to_pylist() if parts else []
                   for name in ("path_bytes", "size", "mtime_ns", "member_offset")}
        skipped = store.read_skipped(index_dir / manifest.skipped_file)
    except (ClipSearchError, OSError):
        return {}
    known: dict[str, Known] = {}

    def of(rel: bytes) -> Known | None:
        shard, sep, _ = rel.partition(MEMBER_SEP.encode())
        return known.setdefault(shard.decode("utf-8", "surrogateescape"), Known([], [], set())) if sep else None

    for rel, size, mtime, offset in zip(*columns.values(), strict=True):
        entry = of(rel)
        if entry is not None and offset is not None:
            name = rel.partition(MEMBER_SEP.encode())[0].decode("utf-8", "surrogateescape")
            entry.files.append(ImageFile(rel, size, mtime, SampleMeta(name, "", offset)))
            entry.versions.add(mtime)
    for skip in skipped:
        entry = of(skip.path)
        if entry is None:
            continue
        if skip.size is not None and skip.mtime_ns is not None:
            entry.files.append(ImageFile(skip.path, skip.size, skip.mtime_ns))
            entry.versions.add(skip.mtime_ns)
        elif NO_IMAGE in skip.reason:
            entry.missing.append((skip.path, skip.reason))
        else:
            entry.retry = True
    return known


def list_source(source: ShardSource, threads: int = LIST_THREADS, known: Mapping[str, Known] | None = None,
                videos: bool = False) -> Discovery:
    """Every image (and with ``videos`` every video) of every shard, as files named
    ``SHARD#MEMBER``; samples without one go to ``missing`` with why. A shard that ``known`` (:func:`known_shards`) holds at its current
    version is not read: its rows and skips are taken from there.

    Raises:
        ShardSourceError: a shard that cannot be read, is not a tar, or is truncated.
    """
    options = source.options
    known = known or {}

    def listing(shard: Shard) -> tuple[list[ImageFile], list[tuple[bytes, str]]]:
        held = known.get(shard.name)
        if held is not None and not held.retry and held.versions == {shard.version} and held.files:
            return held.files, held.missing
        return list_shard(shard, options, videos)

    with ThreadPoolExecutor(max(1, min(threads, len(source.shards)))) as pool:
        listed = list(pool.map(listing, source.shards))
    files = [f for found, _ in listed for f in found]
    missing = [m for _, gone in listed for m in gone]
    if not files:
        raise ShardSourceError(f"no images found in the {len(source.shards)} shard(s) of {source.spec}")
    return Discovery(files=files, unreadable_dirs=[], missing=missing)


def list_shard(shard: Shard, options: Mapping[str, Any], videos: bool = False) -> tuple[list[ImageFile], list[tuple[bytes, str]]]:
    """The images of one shard (in tar order), with ``videos`` its videos too (``mp4``, ``webm``...
    members), and its samples without either."""
    from webdataset.tariterators import base_plus_ext

    fs, path = filesystem(shard.url, options)
    samples: dict[str, dict[str, tarfile.TarInfo]] = {}
    texts: dict[tuple[str, str], bytes] = {}
    try:
        with fs.open(path, "rb") as fh, tarfile.open(fileobj=fh, mode="r:") as tar:
            for info in tar:
                if not info.isfile():
                    continue
                key, ext = base_plus_ext(info.name)
                if key is None:
                    continue
                ext = ext.lower()
                samples.setdefault(key, {})[ext] = info
                if ext in ("txt", "json"):
                    member = tar.extractfile(info)
                    texts[(key, ext)] = member.read() if member is not None else b""
    except tarfile.TarError as exc:
        raise ShardSourceError(f"{shard.url}: not a readable tar ({exc})") from None
    except store_errors() as exc:
        raise ShardSourceError(describe_error(shard.url, exc)) from None
    files: list[ImageFile] = []
    missing: list[tuple[bytes, str]] = []
    for key, members in samples.items():
        # A sample's image, and with videos its video (a video's own sample, or beside a preview image).
        image = next((info for ext, info in members.items() if ext in _IMAGE_EXTS), None)
        video = next((info for ext, info in members.items() if ext in _VIDEO_EXTS), None) if videos else None
        found = [m for m in (image, video) if m is not None]
        if not found:
            first = next(iter(members.values()))
            why = f"sample {key!r} {NO_IMAGE} ({', '.join(sorted(members))})"
            missing.append((f"{shard.name}{MEMBER_SEP}{first.name}".encode(), why))
            continue
        for entry in found:
            if entry.offset_data + entry.size > shard.size:
                raise ShardSourceError(f"{shard.url}: truncated tar ({entry.name} ends past the end of the file)")
            meta = _sample(shard.name, key, entry.offset_data, texts.get((key, "txt")), texts.get((key, "json")))
            rel = f"{shard.name}{MEMBER_SEP}{entry.name}".encode()
            files.append(ImageFile(rel=rel, size=entry.size, mtime_ns=shard.version, sample=meta))
    return files, missing


def _sample(shard: str, key: str, offset: int, caption: bytes | None, meta_json: bytes | None) -> SampleMeta:
    fields: dict[str, Any] = {}
    if meta_json:
        try:
            parsed = json.loads(meta_json)
            fields = parsed if isinstance(parsed, dict) else {}
        except (json.JSONDecodeError, UnicodeDecodeError):
            fields = {}  # a damaged .json loses its fields, never the image
    text = caption.decode("utf-8", errors="replace").strip() if caption is not None else None
    if text is None and isinstance(fields.get("caption"), str):
        text = fields["caption"]
    return SampleMeta(
        shard=shard,
        key=key,
        offset=offset,
        caption=text,
        url=_str(fields.get("url")),
        original_width=_int(fields.get("original_width")),
        original_height=_int(fields.get("original_height")),
        sha256=_str(fields.get("sha256")),
    )


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 2**31 else None


__all__ = ["SHARD_SUFFIX", "Shard", "ShardSource", "expand", "is_shard_spec", "list_shard", "list_source", "resolve"]
