"""Videos in search results: a video's frame rows become one hit, its best moment.

An index that holds videos stores a row per sampled frame (``VIDEO_COLUMNS``), so the nearest
rows to a query are often several frames of one video. :func:`video_search` asks the search for
more rows than the caller wants (doubling until enough distinct files are found or the index is
exhausted), keeps each video's best-placed frame, scores every frame of that video against the
query exactly, and turns them into moments (:func:`retrieval.moments.find_moments`); the hit
then carries its best moment (``start``, ``end``, ``frame_time``) and all of them. Images pass
through unchanged, and an index without videos never comes here.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .hits import Cut, Hit, newest_first
from .moments import MomentOptions, find_moments

# The first request asks for this many rows per wanted hit (and at least FETCH_MIN more).
FETCH_FACTOR = 4
FETCH_MIN = 64


class FrameRows(Protocol):
    """What :class:`VideoFrames` reads: :class:`~retrieval.rows.Rows`."""

    @property
    def count(self) -> int: ...

    def column(self, name: str) -> pa.ChunkedArray: ...

    def paths(self) -> list[str]: ...

    def taken_us(self) -> np.ndarray: ...


class VideoFrames:
    """Which rows are video frames, and each video's frame rows with their times (read once, on
    first use, from the ``media``, ``frame_time``, ``duration`` and ``path`` columns)."""

    def __init__(self, rows: FrameRows) -> None:
        self.rows = rows
        self._lock = threading.Lock()
        self._by_path: dict[str, np.ndarray] | None = None
        self._is_video: np.ndarray | None = None
        self._times: np.ndarray | None = None
        self._durations: np.ndarray | None = None

    def _load(self) -> None:
        with self._lock:
            if self._by_path is not None:
                return
            media = self.rows.column("media")
            is_video = np.asarray(pc.fill_null(pc.equal(media, "video"), False).to_numpy(zero_copy_only=False), bool)
            self._times = np.asarray(pc.fill_null(self.rows.column("frame_time"), 0.0).to_numpy(zero_copy_only=False), np.float64)
            self._durations = np.asarray(pc.fill_null(self.rows.column("duration"), np.nan).to_numpy(zero_copy_only=False), np.float64)
            paths = self.rows.paths()
            by_path: dict[str, list[int]] = {}
            for i in np.flatnonzero(is_video).tolist():
                by_path.setdefault(paths[i], []).append(i)
            self._is_video = is_video
            self._by_path = {p: np.asarray(ids, np.int64) for p, ids in by_path.items()}

    def is_video(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Per id, whether its row is a video's frame."""
        self._load()
        assert self._is_video is not None
        return self._is_video[np.asarray(ids, np.int64)]

    def frames(self, path: str) -> tuple[np.ndarray, np.ndarray, float | None]:
        """The frame rows of the video at ``path``: ids, times (seconds) and its duration."""
        self._load()
        assert self._by_path is not None and self._times is not None and self._durations is not None
        ids = self._by_path.get(path, np.empty(0, np.int64))
        duration = float(np.nanmax(self._durations[ids])) if len(ids) and not np.isnan(self._durations[ids]).all() else None
        return ids, self._times[ids], duration

    def first_frames(self, allowed: np.ndarray) -> np.ndarray:
        """``allowed`` (a mask over ids) with each video's allowed frames after its first left out:
        a listing without a query (the rows a filter keeps) shows a video once."""
        self._load()
        assert self._by_path is not None
        keep = np.array(allowed, dtype=bool, copy=True)
        for ids in self._by_path.values():
            kept = ids[keep[ids]]
            keep[kept[1:]] = False
        return keep

    def time_of(self, row: int) -> float:
        """The time in seconds of a video frame's row."""
        self._load()
        assert self._times is not None
        return float(self._times[row])


def as_video_hits(hits: list[Hit], frames: VideoFrames) -> list[Hit]:
    """``hits`` with each video frame's hit marked as a video's (``media``, ``frame_time``), for
    a listing without a query (no moments: nothing to match)."""
    if not hits:
        return hits
    video = frames.is_video([h.id for h in hits]).tolist()
    return [dataclasses.replace(h, media="video", frame_time=frames.time_of(h.id)) if v else h for h, v in zip(hits, video, strict=True)]


def video_search(run: Callable[[int | None], list[Hit]], cut: Cut, count: int, frames: VideoFrames, vector: np.ndarray | None,
                 vectors_of: Callable[[np.ndarray], np.ndarray], options: MomentOptions | None = None) -> list[Hit]:
    """The hits of a search over an index with videos, a video once, with its moments.

    ``run(k)`` runs the search by score for ``k`` rows (None: as ``cut`` has it, which is every
    row at or above ``cut.min_score``); ``vector`` is the query's vector (None: moments from the
    scores of the rows returned alone), ``vectors_of`` the stored vectors of ids.
    """
    cap = cut.cap
    want = None if cap is None else min(count, cap * FETCH_FACTOR + FETCH_MIN)
    while True:
        hits = _one_per_file(run(want), frames)
        if cap is None or want is None or len(hits) >= cap or want >= count:
            break
        want = min(count, want * 2)
    hits = hits[:cap] if cap is not None else hits
    if cut.sort == "taken" and hits:
        ids = np.asarray([h.id for h in hits], np.int64)
        scores = np.asarray([np.nan if h.score is None else h.score for h in hits], np.float32)
        order = newest_first(frames.rows.taken_us()[ids], ids, -scores)
        hits = [hits[i] for i in order.tolist()]
    return [_with_moments(h, frames, vector, vectors_of, cut, options) if frames.is_video([h.id])[0] else h for h in hits]


def _one_per_file(hits: list[Hit], frames: VideoFrames) -> list[Hit]:
    """``hits`` with each video's frames after its first one left out."""
    if not hits:
        return hits
    video = frames.is_video([h.id for h in hits])
    seen: set[str] = set()
    out = []
    for hit, is_video in zip(hits, video.tolist(), strict=True):
        if is_video:
            if hit.path in seen:
                continue
            seen.add(hit.path)
        out.append(hit)
    return out


def _with_moments(hit: Hit, frames: VideoFrames, vector: np.ndarray | None, vectors_of: Callable[[np.ndarray], np.ndarray],
                  cut: Cut, options: MomentOptions | None) -> Hit:
    ids, times, duration = frames.frames(hit.path)
    own = np.nan if hit.score is None else hit.score  # every hit of a query has its score
    if vector is not None and len(ids):
        scores = vectors_of(ids).astype(np.float64) @ np.asarray(vector, np.float64).ravel()
    else:
        scores = np.where(ids == hit.id, own, np.nan)
    moments = find_moments(times, scores, ids, duration, cut.min_score, options)
    if not moments:
        # An approximate index scored the hit's frame above min_score and the exact score is
        # below it: the moment is that frame's.
        moments = find_moments(times, np.where(ids == hit.id, own, np.nan), ids, duration, None, options)
    best = moments[0]
    hit = dataclasses.replace(hit, id=best.id, score=best.score) if hit.score is None or best.score > hit.score else hit
    return dataclasses.replace(hit, media="video", start=best.start, end=best.end, frame_time=best.time, moments=tuple(moments))


__all__ = ["FETCH_FACTOR", "FETCH_MIN", "FrameRows", "VideoFrames", "as_video_hits", "video_search"]
