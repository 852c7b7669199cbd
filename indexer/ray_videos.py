"""The videos of an ``--engine ray`` build: one video per task on a pool of :class:`VideoActor` s.

A video is many frames and most of its cost is decoding them, so a video is the unit of work:
each actor loads the model once (:func:`~indexer.ray_actor.load_actor_encoder`, as the image
actors do, so the vectors are the image actors'), reads the video from the shared folder or
straight from its shard, samples and embeds it with the local engine's own
:func:`~indexer.video.video_rows.sample_one`, and returns its rows. The driver
(:func:`embed_on_actors`) keeps at most a few videos per actor ahead of the one it writes, and
writes them in the plan's order through the build's sink (a video whole, then a commit when
one is due), exactly as the local engine does: same rows, same ids, same crash safety.

The rows travel back to the driver (a video's sampled frames are few next to the frames decoded
for them), rather than as actor-written parts as the images' do. Nothing here imports ray: the
driver's module is passed in.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from .discover import ImageFile
from .heap import retained_heap
from .ray_actor import ActorSpec, load_actor_encoder
from .shard_reader import ShardReader
from .video.video_config import VideoOptions
from .video.video_rows import VideoResult, VideoSink, VideoStats, sample_one, until, write_videos

# Videos sent ahead per actor: one in work and one queued, so an actor never waits on the driver.
AHEAD_PER_ACTOR = 2


class VideoActor:
    """One model on one Ray worker: samples and embeds one video per call."""

    def __init__(self, spec: ActorSpec, options: VideoOptions) -> None:
        # As the image actors do: activations stay in the heap for the actor's life (indexer/heap.py).
        self._heap = retained_heap()
        self._heap.__enter__()
        self.enc = load_actor_encoder(spec)
        self.options = options
        self.images: Path | ShardReader = spec.shards if spec.shards is not None else Path(os.fsdecode(spec.root))

    def sample(self, file: ImageFile) -> VideoResult:
        """The rows of ``file`` (or why it is skipped): :func:`~indexer.video.video_rows.sample_one`."""
        return sample_one(file, self.images, self.enc, self.options)


def embed_on_actors(ray: ModuleType, spec: ActorSpec, options: VideoOptions, files: Sequence[ImageFile], sink: VideoSink, *,
                    actors: int, resources: dict[str, Any], updated: frozenset[bytes] = frozenset(),
                    stop: Callable[[], bool] | None = None) -> VideoStats:
    """Sample and embed ``files`` on ``actors`` :class:`VideoActor` s (each with ``resources``:
    ``num_cpus``, ``num_gpus``, ``runtime_env``), writing them through ``sink`` in order.
    ``stop`` is asked before each video is sent. A killed actor is restarted and its video sent
    again; an error that persists is raised (Ray's wrapper of it)."""
    if not files:
        return VideoStats()
    remote = ray.remote(max_restarts=2, max_task_retries=2, **resources)(VideoActor)
    pool = [remote.remote(spec, options) for _ in range(max(1, min(actors, len(files))))]
    try:
        return write_videos(_in_order(ray, pool, until(stop, files)), sink, updated)
    finally:
        for actor in pool:
            ray.kill(actor)


def _in_order(ray: ModuleType, pool: list[Any], files: Iterator[ImageFile]) -> Iterator[VideoResult]:
    """Each file's result in ``files``' order, while the actors work on the next ones."""
    idle = list(pool)
    pending: dict[Any, tuple[int, Any]] = {}
    done: dict[int, VideoResult] = {}
    sent = due = 0
    ahead = AHEAD_PER_ACTOR * len(pool)
    exhausted = False
    while True:
        while idle and not exhausted and sent - due < ahead:
            file = next(files, None)
            if file is None:
                exhausted = True
                break
            actor = idle.pop()
            pending[actor.sample.remote(file)] = (sent, actor)
            sent += 1
        if due in done:
            yield done.pop(due)
            due += 1
            continue
        if not pending:
            return
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            number, actor = pending.pop(ref)
            done[number] = ray.get(ref)
            idle.append(actor)


__all__ = ["AHEAD_PER_ACTOR", "VideoActor", "embed_on_actors"]
