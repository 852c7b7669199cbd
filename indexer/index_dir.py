"""The INDEX_DIR a job writes to: whether it may write there, and its write errors.

``clipsearch index`` (:mod:`indexer.build`) and ``clipsearch import`` (:mod:`indexer.importer`)
share the rules that protect other people's files: a path that is not a directory, or a
non-empty directory that is neither an index nor a killed writer's leftovers, is refused. They
differ, on purpose, on an existing index: a build updates one (unless it was imported, which it
cannot update), while an import writes only to a new directory, or over an import killed before
it finished.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Literal

from retrieval.errors import IndexDirError, IndexFormatError, UnsupportedFormatError
from retrieval.layout import FORMAT_NAME, MANIFEST_FILE, holds_only_writer_leftovers, is_index_dir, read_manifest

# Errors of the index directory itself (not of an image): reported as one line, not a traceback.
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST})

# Which command is about to write: their rules differ on an existing index (see the module docstring).
Writer = Literal["index", "import"]


def check_index_dir(out: Path, writer: Writer, *, rebuild: bool = False) -> None:
    """Refuse an ``out`` that ``writer`` must not write into.

    Args:
        out: the INDEX_DIR (it need not exist).
        writer: ``"index"`` (a build or update) or ``"import"``.
        rebuild: a build that replaces the index: a damaged or imported index may be overwritten.

    Raises:
        IndexDirError: ``out`` is a file, a non-empty directory that is not an index, or an index
            this ``writer`` may not write over.
        IndexFormatError: (``index``) a damaged clipsearch index and no ``rebuild``.
        UnsupportedFormatError: (``index``) an index of a newer format than this version writes.
    """
    if not out.exists():
        return
    if not out.is_dir():
        raise IndexDirError(f"{out} exists and is not a directory; choose a new INDEX_DIR")
    if is_index_dir(out):
        if writer == "import":
            _check_import_over_index(out)
        else:
            _check_build_over_index(out, rebuild)
        return
    # Leftovers of a first build or an import killed before its first commit are ours to reuse.
    if holds_only_writer_leftovers(out):
        return
    if writer == "import":
        raise IndexDirError(f"{out} exists and is not empty; `clipsearch import` writes only to a new or empty INDEX_DIR")
    raise IndexDirError(
        f"{out} exists, is not empty and is not a clipsearch index; refusing to write into it. Choose a new or empty INDEX_DIR"
    )


def _check_build_over_index(out: Path, rebuild: bool) -> None:
    try:
        manifest = read_manifest(out)  # refuses an index newer than we can write over safely
    except UnsupportedFormatError:
        raise
    except IndexFormatError as exc:
        # A damaged clipsearch manifest may be replaced on request; anything else that merely
        # has a manifest.json is not ours to overwrite.
        if not _is_clipsearch_manifest(out):
            raise IndexDirError(f"{out} holds a manifest.json that is not a clipsearch index; refusing to write into it") from exc
        if not rebuild:
            raise IndexFormatError(f"{exc}; `clipsearch index --rebuild` replaces it") from exc
        return
    imported = manifest.model_info.get("imported_from")
    if imported and not rebuild:
        # Its rows name no files of PHOTOS_DIR (no size, mtime or hash to compare): an update
        # would drop every imported row as deleted. --rebuild replaces it on purpose.
        raise IndexDirError(
            f"{out} was made by `clipsearch import` from {imported} embeddings, not from image files, so "
            "`clipsearch index` cannot update it; pass --rebuild to replace it with an index of PHOTOS_DIR"
        )


def _check_import_over_index(out: Path) -> None:
    # An import cannot be resumed, but one killed after a commit is started over.
    try:
        manifest = read_manifest(out)
    except IndexFormatError:
        manifest = None
    if manifest is None or manifest.complete or not manifest.model_info.get("imported_from"):
        raise IndexDirError(
            f"{out} already holds a clipsearch index; `clipsearch import` writes only to a new or empty "
            "INDEX_DIR (delete it first, or choose another)"
        )


def _is_clipsearch_manifest(out: Path) -> bool:
    try:
        data = json.loads((out / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("format") == FORMAT_NAME


def write_error(exc: BaseException, out: Path, consequence: str = "") -> IndexDirError | None:
    """The one-line error for ``exc`` when it is a failure to write ``out`` itself (full disk,
    permissions), with ``consequence`` appended; None for any other error."""
    if isinstance(exc, OSError) and exc.errno in WRITE_ERRNOS:
        return IndexDirError(f"cannot write the index to {out}: {exc.strerror}{consequence}")
    return None


__all__ = ["WRITE_ERRNOS", "Writer", "check_index_dir", "write_error"]
