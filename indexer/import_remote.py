"""``clipsearch import`` from an object store: clip-retrieval output (or Parquet) at a URL is
copied with fsspec into a staging folder beside INDEX_DIR, imported from there as a local
source is (:mod:`indexer.import_sources`), and the copy removed.

Only what an import reads is copied: ``img_emb/*.npy`` and ``metadata/*.parquet`` of a
clip-retrieval output, or the ``*.parquet`` files of a Parquet source (the npy files are memory-
mapped and read twice by the checks, so a local copy costs less than ranged reads would).
"""

from __future__ import annotations

import posixpath
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from retrieval.errors import ImportSourceError
from retrieval.shards import describe_error, filesystem, scheme_of, store_errors


def is_remote(source: str) -> bool:
    """Whether an import SOURCE is a URL of an object store (``s3://...``)."""
    return scheme_of(source) is not None


@contextmanager
def staged(source: str, near: Path, storage_options: Mapping[str, Any] | None = None) -> Iterator[Path]:
    """The source at the URL ``source`` copied into a folder beside ``near`` (removed afterwards).

    Raises:
        ImportSourceError: the store cannot be reached, refuses, or holds nothing importable there.
    """
    try:
        fs, path = filesystem(source, storage_options)
    except ImportSourceError:
        raise
    except Exception as exc:  # noqa: BLE001 - ShardSourceError and the scheme's own errors, one message
        raise ImportSourceError(source, str(exc)) from None
    near.parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=".import-", dir=near.parent))
    try:
        local = _copy(fs, source, path.rstrip("/"), folder)
        yield local
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _copy(fs: Any, url: str, path: str, folder: Path) -> Path:
    try:
        if fs.isfile(path):
            target = folder / posixpath.basename(path)
            fs.get_file(path, str(target))
            return target
        wanted = [p for p in fs.find(path) if _wanted(posixpath.relpath(p, path))]
        if not wanted:
            if not fs.exists(path):
                raise ImportSourceError(url, "no such file, key or bucket")
            raise ImportSourceError(url, "holds neither img_emb/*.npy with metadata/*.parquet nor *.parquet files")
        for remote in wanted:
            target = folder / posixpath.relpath(remote, path)
            target.parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(remote, str(target))
    except ImportSourceError:
        raise
    except store_errors() as exc:
        raise ImportSourceError(url, describe_error(url, exc)) from None
    return folder


def _wanted(rel: str) -> bool:
    parts = rel.split("/")
    if len(parts) == 1:
        return rel.lower().endswith(".parquet")
    return len(parts) == 2 and (
        (parts[0] == "img_emb" and rel.endswith(".npy")) or (parts[0] == "metadata" and rel.endswith(".parquet"))
    )


__all__ = ["is_remote", "staged"]
