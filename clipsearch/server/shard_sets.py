"""A served directory that holds a shard set (:mod:`retrieval.partitions`) instead of one index.

:func:`open_served` opens either kind: an index as a :class:`~retrieval.live.LiveIndex`, a set
as a :class:`~retrieval.partition_live.LivePartitions` whose shards are searched in this process,
or where ``connect`` reaches them (Ray Serve replicas: :mod:`clipsearch.server.cluster`). The
set answers the members the server reads of an index (``search``, ``rows``, ``metadata``,
``files``, ``encoders``, ``manifest`` facts), so the same app, API and UI serve both.
"""

from __future__ import annotations

import os
from typing import cast

from retrieval.live import LiveIndex
from retrieval.partition_live import Connect, LivePartitions, local_shards, open_partitions
from retrieval.partition_set import is_partition_set
from retrieval.partitions import DEFAULT_DEADLINE_S


def open_served(
    directory: str | os.PathLike[str],
    *,
    model: str | None,
    device: str,
    precision: str,
    mmap: bool | None,
    query_cache: int,
    warm: bool,
    connect: Connect | None = None,
    deadline_s: float = DEFAULT_DEADLINE_S,
) -> LiveIndex:
    """``directory`` opened for serving: an index, or a shard set (``partitions.json``).

    Raises:
        The errors of ``LiveIndex`` and of :func:`~retrieval.partition_live.open_partitions`.
    """
    if not is_partition_set(directory):
        return LiveIndex(directory, model=model, device=device, precision=precision, mmap=mmap, query_cache=query_cache, warm=warm)
    reach = connect or local_shards(mmap)
    live = LivePartitions(
        directory,
        lambda d: open_partitions(d, connect=reach, model=model, device=device, precision=precision, query_cache=query_cache,
                                  deadline_s=deadline_s),
    )
    # A set is not a LiveIndex: it answers the members of one that the server reads (see above).
    return cast(LiveIndex, live)


__all__ = ["open_served"]
