"""A build's videos: each planned video sampled (:mod:`.frames`) from its file or shard member
(:mod:`.source`), its frames embedded with the index's image tower (:func:`sample_one`, which
runs where the engine embeds: this process, or a Ray actor), and appended as one row per frame
(``VIDEO_COLUMNS``) by the build's writer (:func:`write_videos`); :func:`embed_videos` does both
in this process.

A video's rows are appended together, after all of them are embedded, so a commit never holds
part of a video; a video that cannot be sampled (not a video by its content, no video stream, a
codec without a decoder, damaged, over its time limit) becomes one skip record with the reason.
Its rows carry the file's size, mtime and content hash as read before it was sampled, so an
update keeps, refreshes or re-samples it whole (:func:`indexer.plan.plan_update`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from retrieval.errors import EngineError, VideoDecodeError
from retrieval.faults import crash_point
from retrieval.layout import SkipRecord

from ..discover import ImageFile
from ..plan import UpdatePlan
from ..shard_reader import ShardReader
from ..stats import RunStats
from ..writer import FileRecord, FrameFacts
from .frames import VideoSampler
from .probe import VIDEO_EXTENSIONS, VideoSource
from .source import file_facts, name_of, opened
from .video_config import VideoOptions

if TYPE_CHECKING:
    from retrieval.encoders import Encoder

# Frames embedded in one model call.
BATCH = 32


def check_engine() -> None:
    """Refuse, in one line, a build with ``--videos`` where PyAV (the video extra) is not
    installed here (EngineError). Every engine and source takes videos (a Ray build's actors
    import PyAV on their nodes too)."""
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


@dataclass
class VideoResult:
    """One video as :func:`sample_one` leaves it: its ``records`` and ``vectors`` (one per
    sampled frame, in time order), or the ``reason`` it is skipped with and the ``facts`` read
    (None: the file could not even be read); and what sampling and embedding it cost."""

    file: ImageFile
    records: list[FileRecord]
    vectors: np.ndarray | None
    reason: str | None = None
    facts: tuple[int, int, str] | None = None
    sample_seconds: float = 0.0
    embed_seconds: float = 0.0
    decoded: int = 0


def sample_one(file: ImageFile, images: Path | ShardReader, enc: Encoder, options: VideoOptions) -> VideoResult:
    """Sample and embed one video of the folder or shards ``images``; a video that fails is a
    result with its skip reason, never an exception."""
    try:
        facts = file_facts(file, images)
    except OSError as exc:
        return VideoResult(file, [], None, f"unreadable ({exc.strerror or exc})")
    try:
        with opened(file, images) as source:
            return video_rows(file, source, facts, enc, options)
    except VideoDecodeError as exc:
        return VideoResult(file, [], None, exc.reason, facts)
    except OSError as exc:
        return VideoResult(file, [], None, f"unreadable ({exc.strerror or exc})", facts)


def write_videos(results: Iterable[VideoResult], sink: VideoSink, updated: frozenset[bytes] = frozenset()) -> VideoStats:
    """Append each result's rows through ``sink`` (a video whole, then a commit when one is due),
    or its skip record, in the order given. ``updated``: paths whose old rows this replaces
    (counted as updated, or lost when the new file no longer samples)."""
    stats = VideoStats()
    for got in results:
        rel = got.file.rel
        stats.sample_seconds += got.sample_seconds
        stats.embed_seconds += got.embed_seconds
        stats.decoded += got.decoded
        if got.reason is not None or got.vectors is None:
            reason = got.reason or "no frame could be decoded"
            sink.skip(SkipRecord(rel, reason, *(got.facts or ())))
            stats.skipped += 1
            stats.lost += rel in updated
            if got.facts is not None:
                stats.reasons.append(reason)
            continue
        crash_point("video")
        sink.append(got.records, got.vectors)
        stats.videos += 1
        stats.frames += len(got.records)
        stats.updated += rel in updated
        sink.commit(len(got.records))
    return stats


def until(stop: Callable[[], bool] | None, files: Sequence[ImageFile]) -> Iterator[ImageFile]:
    """``files`` in order, asking ``stop`` before each (True ends them there)."""
    for file in files:
        if stop is not None and stop():
            return
        yield file


def embed_videos(files: Sequence[ImageFile], root: Path | ShardReader, enc: Encoder, options: VideoOptions, sink: VideoSink, *,
                 updated: frozenset[bytes] = frozenset(), stop: Callable[[], bool] | None = None) -> VideoStats:
    """Sample, embed and append every video of ``files`` (paths relative to the folder ``root``,
    or members of the shards it reads) in this process; a video that fails becomes a skip
    record. ``updated``: see :func:`write_videos`. ``stop`` is asked before each video."""
    return write_videos((sample_one(f, root, enc, options) for f in until(stop, files)), sink, updated)


def video_rows(file: ImageFile, source: VideoSource, facts: tuple[int, int, str], enc: Encoder,
               options: VideoOptions) -> VideoResult:
    """The rows of one video (a :class:`~indexer.writer.FileRecord` per sampled frame) and their
    vectors, in time order; ``source``: its path, or an open binary file of its bytes.

    Raises:
        VideoDecodeError: the file cannot be sampled (see :func:`indexer.video.frames.sample_video`).
    """
    from retrieval.images import preprocess_images

    t0 = time.perf_counter()
    sampler = VideoSampler(source, options, max_side=max(448, _input_side(enc)), name=name_of(file))
    frames = sorted(sampler, key=lambda f: f.time)
    info = sampler.info
    assert info is not None  # set once the sampler is iterated through
    t1 = time.perf_counter()
    chunks = [enc.embed_pixels(preprocess_images([f.image for f in frames[i:i + BATCH]], enc.preprocess))
              for i in range(0, len(frames), BATCH)]
    vectors = np.concatenate(chunks).astype(np.float32)
    size, mtime_ns, digest = facts
    meta = info.photo_meta()
    records = [
        FileRecord(file.rel, info.width, info.height, size, mtime_ns, digest, meta, file.sample,
                   FrameFacts(f.time, f.keyframe, info.duration, info.codec, info.rotation))
        for f in frames
    ]
    return VideoResult(file, records, vectors, None, facts, t1 - t0, time.perf_counter() - t1, sampler.decoded)


def _input_side(enc: Encoder) -> int:
    # The model's input side: frames are kept no larger than needed (the crop, or the shortest edge).
    pre = enc.preprocess
    return int(max(pre.crop_size) if pre.crop_size else pre.shortest_edge or 224)


__all__ = [
    "BATCH", "VideoResult", "VideoSink", "VideoStats", "check_engine", "count", "embed_videos", "is_video_path", "sample_one",
    "split_videos", "until", "video_rows", "write_videos",
]
