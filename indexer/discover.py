"""Find the image files of a collection: recursive, deterministic, loop-free.

Directory symlinks are not followed (they cause loops and count the same image twice); file
symlinks that point at a regular file are taken, as the user placed them in the collection.
Names are handled as bytes, so file names that are not valid UTF-8 are found too. With
:class:`~indexer.exclusions.Exclusions` the walk leaves out what they exclude and never enters an
excluded folder.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from retrieval.errors import PhotosDirError
from retrieval.images import IMAGE_EXTENSIONS
from retrieval.shards import SampleMeta

from .exclusions import Exclusions


@dataclass(frozen=True)
class ImageFile:
    """One candidate image: its path relative to the collection root, as file-system bytes.

    An image in a WebDataset shard (:mod:`indexer.shards`) is ``SHARD#MEMBER``, its ``mtime_ns``
    the shard's version, and ``sample`` what came with it (caption, url, where it starts)."""

    rel: bytes
    size: int
    mtime_ns: int
    sample: SampleMeta | None = None


@dataclass(frozen=True)
class Discovery:
    """What a walk found: the images, and directories that could not be listed (with why)."""

    files: list[ImageFile]
    unreadable_dirs: list[tuple[bytes, str]]
    missing: list[tuple[bytes, str]] = field(default_factory=list)


def check_photos_dir(photos_dir: Path) -> None:
    """Raises:
    PhotosDirError: ``photos_dir`` is missing or not a directory."""
    if not photos_dir.exists():
        raise PhotosDirError(f"photos directory {photos_dir} does not exist")
    if not photos_dir.is_dir():
        raise PhotosDirError(f"{photos_dir} is not a directory")


def find_images(photos: Path, files: Sequence[str | bytes] | None = None, exclude: Exclusions | None = None,
                extensions: Iterable[str] = IMAGE_EXTENSIONS) -> Discovery:
    """The images of a build: a walk of ``photos`` for files with ``extensions`` (videos' too with
    ``--videos``) without what ``exclude`` leaves out, or the listed ``files`` (:func:`from_list`).

    Raises:
        PhotosDirError: ``photos`` is not a directory or holds no images (an emptied folder, e.g.
            an unmounted share, is never taken to mean "remove every row"), or none of ``files``
            exists.
    """
    check_photos_dir(photos)
    if files is not None:
        found = from_list(photos, files)
        if not found.files:
            raise PhotosDirError(f"none of the {len(found.missing)} listed files exist in {photos}")
        return found
    extensions = frozenset(extensions)
    found = discover(photos, extensions, exclude=exclude)
    if not found.files:
        exts = ", ".join(sorted(extensions))
        hint = "" if exclude is None or exclude.options.include_hidden else "; hidden files and caches are left out"
        raise PhotosDirError(f"no images found in {photos} (looked for {exts}{hint})")
    return found


def _has_image_extension(name: bytes, extensions: frozenset[bytes]) -> bool:
    dot = name.rfind(b".")
    return dot > 0 and name[dot:].lower() in extensions


def discover(
    root: str | os.PathLike[str], extensions: Iterable[str] = IMAGE_EXTENSIONS, exclude: Exclusions | None = None
) -> Discovery:
    """Walk ``root`` and return its image files sorted by relative path (byte order).

    Only regular files (or symlinks to regular files) whose extension is in ``extensions``
    (case-insensitive) are returned; FIFOs, sockets, dangling links and directory symlinks are
    ignored. Directories that cannot be listed are reported, not fatal. ``exclude`` (default:
    nothing) leaves out files and whole folders, which are not entered.
    """
    exts = frozenset(e.lower().encode() for e in extensions)
    root_b = os.fsencode(Path(root))
    files: list[ImageFile] = []
    unreadable: list[tuple[bytes, str]] = []
    stack: list[bytes] = [b""]
    while stack:
        rel_dir = stack.pop()
        abs_dir = os.path.join(root_b, rel_dir) if rel_dir else root_b
        try:
            with os.scandir(abs_dir) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            unreadable.append((rel_dir, exc.strerror or type(exc).__name__))
            continue
        subdirs: list[bytes] = []
        for entry in entries:
            rel = os.path.join(rel_dir, entry.name) if rel_dir else entry.name
            try:
                if entry.is_dir(follow_symlinks=False):
                    if exclude is None or not exclude.skips_dir(rel, entry.name):
                        subdirs.append(rel)
                    continue
                if not _has_image_extension(entry.name, exts) or (exclude is not None and exclude.skips_file(rel, entry.name)):
                    continue
                st = entry.stat(follow_symlinks=True)
            except OSError:
                continue  # dangling symlink or vanished file: nothing to index
            if stat.S_ISREG(st.st_mode):
                files.append(ImageFile(rel=rel, size=st.st_size, mtime_ns=st.st_mtime_ns))
        # Reverse so that popping yields subdirectories in sorted order.
        stack.extend(reversed(subdirs))
    files.sort(key=lambda f: f.rel)
    return Discovery(files=files, unreadable_dirs=unreadable)


def from_list(root: str | os.PathLike[str], paths: Iterable[str | bytes]) -> Discovery:
    """Take an explicit list of image paths relative to ``root`` instead of walking it.

    Paths are normalised, de-duplicated and sorted like :func:`discover`. Entries that are
    absolute, leave ``root``, or are not regular files are reported in ``missing`` with why.
    """
    root_b = os.fsencode(Path(root))
    seen: set[bytes] = set()
    files: list[ImageFile] = []
    missing: list[tuple[bytes, str]] = []
    for raw in paths:
        rel = os.path.normpath(os.fsencode(raw))
        if rel in seen:
            continue
        seen.add(rel)
        if os.path.isabs(rel) or rel == b".." or rel.startswith(b"../"):
            missing.append((rel, "outside the photos directory"))
            continue
        try:
            st = os.stat(os.path.join(root_b, rel))
        except OSError as exc:
            missing.append((rel, "file not found" if isinstance(exc, FileNotFoundError) else exc.strerror or "unreadable"))
            continue
        if not stat.S_ISREG(st.st_mode):
            missing.append((rel, "not a regular file"))
            continue
        files.append(ImageFile(rel=rel, size=st.st_size, mtime_ns=st.st_mtime_ns))
    files.sort(key=lambda f: f.rel)
    missing.sort()
    return Discovery(files=files, unreadable_dirs=[], missing=missing)
