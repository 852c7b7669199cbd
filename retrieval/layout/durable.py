"""Durable writes: a file replaced atomically, a directory flushed, a generation published.

A crash at any moment leaves either the old or the new content, never a mix: each file is
written to a temporary name, flushed, and renamed over its target; a rename is made durable by
flushing the directory that holds it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

from .filenames import generation_dir


def _fsync_dir(directory: Path) -> None:
    # The rename itself is only durable once the directory entry is flushed.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], object]) -> None:
    """Write a file atomically: ``write`` fills a temp file in the same directory, then rename.

    If ``write`` raises, the temp file is removed and ``path`` is left as it was.

    Args:
        path: the file to create or replace.
        write: called once with the temp file, opened for binary writing.

    Raises:
        OSError: the temp file cannot be created, written or renamed; whatever ``write`` raises.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)


def fsync_tree(directory: str | os.PathLike[str]) -> None:
    """Flush every file of a (flat) directory and the directory itself to disk."""
    directory = Path(directory)
    for path in directory.iterdir():
        if path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(directory)


def publish_generation(index_dir: str | os.PathLike[str], staging: str | os.PathLike[str], generation: str) -> Path:
    """Rename a complete staging directory to its generation name (atomic, same file system).

    Args:
        index_dir: the index directory that holds ``staging``.
        staging: the staging directory, every data file of the generation in place.
        generation: the generation id; the directory becomes ``gen-<generation>``.

    Returns:
        The path of the published generation directory.

    Raises:
        OSError: a file cannot be flushed, or the rename fails (the target exists, ...).
    """
    index_dir = Path(index_dir)
    fsync_tree(staging)
    target = index_dir / generation_dir(generation)
    os.rename(staging, target)
    _fsync_dir(index_dir)
    return target
