"""Opening a shard set for search (:func:`open_partitions`), and following it
(:class:`LivePartitions`) as ``clipsearch shard add`` writes new generations of the set.

The shards are reached through a ``connect`` function: in process by default
(:class:`~retrieval.partitions.LocalShard`), Ray Serve replicas for ``serve --ray``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .encoders.precision import parse_precision
from .encoders.query import QueryEncoders
from .partition_set import PARTITIONS_FILE, ShardRef, check_shards, read_partition_set
from .partition_shard import ShardSearcher
from .partitions import DEFAULT_DEADLINE_S, LocalShard, PartitionedIndex, ShardClient
from .query_cache import DEFAULT_CAPACITY, QueryVectorCache

# How a router reaches a shard: the set's directory and the shard's reference.
Connect = Callable[[Path, ShardRef], ShardClient]


def local_shards(mmap: bool | None = None, threads: int | None = None) -> Connect:
    """Shards opened in this process, searched on a thread pool (one thread per shard by default)."""
    pool: list[ThreadPoolExecutor] = []

    def connect(root: Path, shard: ShardRef) -> ShardClient:
        if not pool:
            pool.append(ThreadPoolExecutor(max_workers=threads or max(2, os.cpu_count() or 2), thread_name_prefix="shard"))
        return LocalShard(shard.name, ShardSearcher.open(root / shard.path, mmap=mmap), pool[0])

    return connect


def open_partitions(
    directory: str | os.PathLike[str],
    *,
    connect: Connect | None = None,
    model: str | None = None,
    device: str = "auto",
    precision: str = "auto",
    query_cache: int = DEFAULT_CAPACITY,
    deadline_s: float = DEFAULT_DEADLINE_S,
    text_queries: int | None = None,
) -> PartitionedIndex:
    """Open the shard set at ``directory`` for search (its shards checked against the set first).

    Args:
        directory: the set (its ``partitions.json``).
        connect: how each shard is reached (default: opened in this process).
        model, device, precision, query_cache: the query side, as for ``ImageIndex.open``.
        deadline_s: seconds each shard has to answer a call.
        text_queries: how many text queries this process will run, when it knows (as for
            ``ImageIndex.open``: a one-shot search picks its text tower for one query).

    Raises:
        NotAnIndexError: no set there, or a missing shard (named).
        IndexFormatError: a shard of another model or dimension, or of another row count.
        InvalidArgumentError: a bad precision, query cache or deadline.
    """
    root = Path(directory)
    parts = read_partition_set(root)
    manifests = check_shards(root, parts)
    requested = parse_precision(precision)
    queries = QueryEncoders(manifests[0], model=model, device=device, precision=requested, query_cache=QueryVectorCache(query_cache),
                            text_queries=text_queries)
    reach = connect or local_shards()
    shards = [reach(root, s) for s in parts.shards]
    return PartitionedIndex(parts, shards, queries, manifests[0], deadline_s=deadline_s, roots=[m.source_root for m in manifests])


class LivePartitions:
    """A shard set, reopened when a new ``partitions.json`` is written (the router's current
    set; each shard follows its own generations where it is searched).

    Args:
        directory: the set.
        opener: opens the set (``open_partitions`` with the server's settings).
    """

    def __init__(self, directory: str | os.PathLike[str], opener: Callable[[Path], PartitionedIndex]) -> None:
        self.directory = Path(directory)
        self._opener = opener
        self._lock = threading.Lock()
        self._stamp = self._manifest_stamp()
        self._index = opener(self.directory)

    @property
    def name(self) -> str:
        return self.directory.resolve().name

    def current(self) -> PartitionedIndex:
        """The set as ``partitions.json`` describes it now."""
        stamp = self._manifest_stamp()
        if stamp != self._stamp:
            with self._lock:
                if stamp != self._stamp:
                    self._index = self._opener(self.directory)
                    self._stamp = stamp
        return self._index

    def _manifest_stamp(self) -> tuple[int, int]:
        st = (self.directory / PARTITIONS_FILE).stat()
        return st.st_mtime_ns, st.st_ino


__all__ = ["Connect", "LivePartitions", "local_shards", "open_partitions"]
