"""Reading an image's bytes out of its WebDataset shard, in a decode worker or a Ray actor.

:class:`ShardReader` is what the build's readers are handed in place of a folder (which shards a
SOURCE names and what each holds: :mod:`indexer.shards`). It keeps one fsspec file open per shard
and thread and reads it forward, at the offsets the listing recorded; the query side's one-off
read of a member is :func:`retrieval.shards.read_member`.
"""

from __future__ import annotations

import threading
from typing import Any

from retrieval.shards import describe_error, filesystem, join, parse_storage_options, store_errors

from .discover import ImageFile


class ShardReader:
    """Reads an image's bytes out of its shard: one open fsspec file per shard and thread, read
    forward (a store's file reads ahead in blocks, so a shard read in order streams)."""

    def __init__(self, root: str, storage_options: str = "") -> None:
        self.root = root
        self.storage_options = storage_options
        self._local = threading.local()

    def __getstate__(self) -> dict[str, Any]:
        # Workers open their own files.
        return {"root": self.root, "storage_options": self.storage_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["root"], state["storage_options"])  # type: ignore[misc]

    def read(self, file: ImageFile) -> bytes:
        """The bytes of ``file`` (an image listed by :func:`list_shard`).

        Raises:
            OSError: the shard cannot be read or is shorter than listed.
        """
        sample = file.sample
        if sample is None:
            raise OSError(f"{file.rel!r} is not a shard member")
        handle = self._handle(sample.shard)
        try:
            handle.seek(sample.offset)
            data = handle.read(file.size)
        except store_errors() as exc:
            raise OSError(describe_error(join(self.root, sample.shard), exc)) from exc
        if len(data) != file.size:
            raise OSError("shard shorter than listed (truncated or replaced)")
        return bytes(data)

    def _handle(self, shard: str) -> Any:
        cache: dict[str, Any] = getattr(self._local, "files", None) or {}
        self._local.files = cache
        handle = cache.get(shard)
        if handle is None:
            for old in list(cache.values()):
                old.close()  # the previous shard is done: files are read in shard order
            cache.clear()
            url = join(self.root, shard)
            fs, path = filesystem(url, parse_storage_options(self.storage_options))
            try:
                handle = cache[shard] = fs.open(path, "rb")
            except store_errors() as exc:
                raise OSError(describe_error(url, exc)) from exc
        return handle

    def close(self) -> None:
        for handle in (getattr(self._local, "files", None) or {}).values():
            handle.close()
        self._local.files = {}


__all__ = ["ShardReader"]
