"""A build's videos: each planned video file sampled (:mod:`.frames`), its frames embedded with
the index's image tower, and appended as one row per frame (``VIDEO_COLUMNS``): :func:`embed_videos`.

A video's rows are appended together, after all of them are embedded, so a commit never holds
part of a video; a video that cannot be sampled (not a video by its content, no video stream, a
codec without a decoder, damaged, over its time limit) becomes one skip record with the reason.
Its rows carry the file's size, mtime and content hash as read before it was sampled, so an
update keeps, refreshes or re-samples it whole (:func:`indexer.plan.plan_update`).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from retrieval.errors import EngineError, InvalidArgumentError, VideoDecodeError
from retrieval.faults import crash_point
from retrieval.layout import SkipRecord

from ..discover import ImageFile
from ..plan import UpdatePlan
from ..stats import RunStats
from ..writer import FileRecord, FrameFacts
from .frames import VideoSampler
from .probe import VIDEO_EXTENSIONS
from .video_config import VideoOptions

if TYPE_CHECKING:
    from retrieval.encoders import Encoder

# Frames embedded in one model call.
BATCH = 32
# Bytes read at a time while hashing a video (it is never read whole into memory).
_HASH_CHUNK = 1 << 20


def check_engine(engine: str = "local", shards: bool = False) -> None:
    """Refuse, in one line, a build with ``--videos`` that cannot sample them: PyAV (the video
    extra) not installed (EngineError), or an engine or source that does not take videos yet (a
    Ray build, WebDataset shards: InvalidArgumentError)."""
    if engine != "local":
        raise InvalidArgumentError(f"--videos runs on the local engine for now, not {engine!r}; index the videos with --engine local")
    if shards:
        raise InvalidArgumentError("--videos reads a folder's video files; WebDataset shards hold images only")
    try:
        import av  # noqa: F401
    except ImportError as exc:
        raise EngineError(f"--videos needs PyAV: pip install 'clipsearch[video]'; it is not importable here ({exc})") from None


def split_videos(plan: UpdatePlan) -> list[ImageFile]:
    """Take the videos out of ``plan.to_embed`` (left with the images) and return them, in order."""
    videos = [f for f in plan.to_embed if is_video_path(f.rel)]
    if videos:
        plan.to_embed = [f for f in plan.to_embed if not is_video_path(f.rel)]
    return videos


def count(stats: VideoStats, run: RunStats) -> None:
    """Add what :func:`embed_videos` did to the run's counters: a video is a file added or updated."""
    run.added += stats.videos - stats.updated
    run.updated += stats.updated
    run.newly_skipped += stats.skipped
    run.lost += stats.lost
    run.decode_seconds += stats.sample_seconds
    run.encode_seconds += stats.embed_seconds


def is_video_path(rel: bytes | str) -> bool:
    """Whether a file's name says to look at it as a video (its content decides, when sampled)."""
    return os.path.splitext(os.fsdecode(rel))[1].lower() in VIDEO_EXTENSIONS


@dataclass
class VideoStats:
    """What :func:`embed_videos` did: ``videos`` indexed with ``frames`` rows, ``skipped``
    files, ``lost`` (changed videos that no longer sample and lost their rows), ``updated``
    (videos that replaced their rows) and the seconds spent sampling and embedding."""

    videos: int = 0
    frames: int = 0
    skipped: int = 0
    lost: int = 0
    updated: int = 0
    decoded: int = 0
    sample_seconds: float = 0.0
    embed_seconds: float = 0.0
    reasons: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class VideoSink:
    """Where a build's video rows go: ``append(records, vectors)`` (the generation writer's),
    ``skip(record)``, and ``commit()`` after each video when a chunk is due."""

    append: Callable[[list[FileRecord], np.ndarray], None]
    skip: Callable[[SkipRecord], None]
    commit: Callable[[int], object]


def embed_videos(files: Sequence[ImageFile], root: Path, enc: Encoder, options: VideoOptions, sink: VideoSink, *,
                 updated: frozenset[bytes] = frozenset(), stop: Callable[[], bool] | None = None) -> VideoStats:
    """Sample, embed and append every video of ``files`` (paths relative to ``root``); a video that
    fails becomes a skip record. ``updated``: paths whose old rows this replaces (counted as
    updated, or lost when the new file no longer samples). ``stop`` is asked before each video."""
    stats = VideoStats()
    for file in files:
        if stop is not None and stop():
            break
        path = os.path.join(os.fsencode(root), file.rel)
        try:
            facts = _file_facts(path)
        except OSError as exc:
            sink.skip(SkipRecord(file.rel, f"unreadable ({exc.strerror or exc})"))
            stats.skipped += 1
            stats.lost += file.rel in updated
            continue
        try:
            records, vectors = video_rows(file, path, facts, enc, options, stats)
        except VideoDecodeError as exc:
            sink.skip(SkipRecord(file.rel, exc.reason, *facts))
            stats.skipped += 1
            stats.lost += file.rel in updated
            stats.reasons.append(exc.reason)
            continue
        crash_point("video")
        sink.append(records, vectors)
        stats.videos += 1
        stats.frames += len(records)
        stats.updated += file.rel in updated
        sink.commit(len(records))
    return stats


def video_rows(file: ImageFile, path: bytes, facts: tuple[int, int, str], enc: Encoder, options: VideoOptions,
               stats: VideoStats | None = None) -> tuple[list[FileRecord], np.ndarray]:
    """The rows of one video (a :class:`~indexer.writer.FileRecord` per sampled frame) and their
    vectors, in time order.

    Raises:
        VideoDecodeError: the file cannot be sampled (see :func:`indexer.video.frames.sample_video`).
    """
    from retrieval.images import preprocess_images

    t0 = time.perf_counter()
    sampler = VideoSampler(path, options, max_side=max(448, _input_side(enc)))
    frames = sorted(sampler, key=lambda f: f.time)
    info = sampler.info
    assert info is not None  # set once the sampler is iterated through
    t1 = time.perf_counter()
    chunks = [enc.embed_pixels(preprocess_images([f.image for f in frames[i:i + BATCH]], enc.preprocess))
              for i in range(0, len(frames), BATCH)]
    vectors = np.concatenate(chunks).astype(np.float32)
    if stats is not None:
        stats.sample_seconds += t1 - t0
        stats.embed_seconds += time.perf_counter() - t1
        stats.decoded += sampler.decoded
    size, mtime_ns, digest = facts
    meta = info.photo_meta()
    records = [
        FileRecord(file.rel, info.width, info.height, size, mtime_ns, digest, meta, file.sample,
                   FrameFacts(f.time, f.keyframe, info.duration, info.codec, info.rotation))
        for f in frames
    ]
    return records, vectors


def _file_facts(path: bytes) -> tuple[int, int, str]:
    # Size, mtime and the hash an update compares (the same BLAKE2b-128 as an image's), read in
    # chunks; the stat is the one of the bytes hashed.
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as fh:
        st = os.fstat(fh.fileno())
        while chunk := fh.read(_HASH_CHUNK):
            digest.update(chunk)
    return st.st_size, st.st_mtime_ns, digest.hexdigest()


def _input_side(enc: Encoder) -> int:
    # The model's input side: frames are kept no larger than needed (the crop, or the shortest edge).
    pre = enc.preprocess
    return int(max(pre.crop_size) if pre.crop_size else pre.shortest_edge or 224)


__all__ = [
    "BATCH", "VideoSink", "VideoStats", "check_engine", "count", "embed_videos", "is_video_path", "split_videos", "video_rows",
]
