"""Moments of videos: the sampled frames of a video that match a query, merged where they are
neighbours into stretches of time, and videos ranked by their best moment.

A video is stored as rows of sampled frames (the indexer's ``indexer.video``), each with its
time. Frames match when they score at least a video's threshold: ``min_score`` where a search
gives one, else within ``margin`` of the video's best frame (a top-k search has no absolute
cut-off, and a frame nearly as good as the best is part of the same answer). Matching frames
with no non-matching sampled frame between them form one :class:`Moment`, which runs from the
first one's time to where the last one's stretch ends (the next sampled frame, or the end of
the video). A video may hold several moments; it ranks by its best.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .errors import InvalidArgumentError


@dataclass(frozen=True)
class Moment:
    """A stretch of a video that matches: ``start`` and ``end`` in seconds, and its best frame's
    row ``id``, ``time`` and ``score``."""

    start: float
    end: float
    time: float
    score: float
    id: int

    def to_dict(self) -> dict[str, float | int]:
        """The moment as JSON holds it."""
        return {"start": self.start, "end": self.end, "time": self.time, "score": self.score, "id": self.id}


@dataclass(frozen=True)
class MomentOptions:
    """How frames become moments.

    Attributes:
        margin: without ``min_score``, a frame matches when it scores at least the video's best
            frame less this (cosines; 0 keeps only frames as good as the best).
        most: the most moments one video reports (the best first).

    Raises:
        InvalidArgumentError: a margin that is not a number in [0, 2], ``most`` below 1.
    """

    margin: float = 0.02
    most: int = 5

    def __post_init__(self) -> None:
        if isinstance(self.margin, bool) or not isinstance(self.margin, (int, float)) or not (
                math.isfinite(self.margin) and 0 <= self.margin <= 2):
            raise InvalidArgumentError(f"moment margin must be a number in [0, 2], got {self.margin!r}")
        if isinstance(self.most, bool) or not isinstance(self.most, int) or self.most < 1:
            raise InvalidArgumentError(f"moments per video must be an integer >= 1, got {self.most!r}")


def find_moments(times: np.ndarray, scores: np.ndarray, ids: np.ndarray, duration: float | None = None,
                 min_score: float | None = None, options: MomentOptions | None = None) -> list[Moment]:
    """The moments of one video, best first.

    ``times``, ``scores`` and ``ids`` describe every sampled frame of the video (any order; a
    NaN score is a frame the search did not score, which never matches); ``duration`` ends the
    last frame's stretch (its own time where unknown). Frames at equal times count as one.
    """
    options = options or MomentOptions()
    times = np.asarray(times, np.float64)
    scores = np.asarray(scores, np.float64)
    ids = np.asarray(ids, np.int64)
    if not (len(times) == len(scores) == len(ids)):
        raise InvalidArgumentError("times, scores and ids of a video's frames must have the same length")
    known = ~np.isnan(scores)
    if not known.any():
        return []
    order = np.lexsort((-np.where(known, scores, -np.inf), times))
    times, scores, ids, known = times[order], scores[order], ids[order], known[order]
    threshold = min_score if min_score is not None else float(np.max(scores[known])) - options.margin
    matching = known & (np.where(known, scores, -np.inf) >= threshold)
    last = float(duration) if duration is not None and math.isfinite(duration) else float(times[-1])
    found: list[Moment] = []
    i = 0
    while i < len(times):
        if not matching[i]:
            i += 1
            continue
        j = i
        while j + 1 < len(times) and (matching[j + 1] or times[j + 1] == times[j]):
            j += 1
        best = i + int(np.argmax(np.where(matching[i: j + 1], scores[i: j + 1], -np.inf)))
        end = float(times[j + 1]) if j + 1 < len(times) else max(last, float(times[j]))
        found.append(Moment(float(times[i]), end, float(times[best]), float(scores[best]), int(ids[best])))
        i = j + 1
    found.sort(key=lambda m: (-m.score, m.start))
    return found[: options.most]


@dataclass(frozen=True)
class VideoMoments:
    """A video's moments for one query (the best first) under its ``key`` (the caller's: a path
    or a file id)."""

    key: object
    moments: tuple[Moment, ...]

    @property
    def best(self) -> Moment:
        return self.moments[0]


def rank_videos(videos: Sequence[VideoMoments]) -> list[VideoMoments]:
    """Videos with at least one moment, best moment first (ties: the earlier moment, then the
    given order)."""
    ranked = [v for v in videos if v.moments]
    ranked.sort(key=lambda v: (-v.best.score, v.best.start))
    return ranked


def clock(seconds: float) -> str:
    """A time in a video as people write it: ``01:23`` (``1:02:03`` past an hour)."""
    total = max(0, int(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


__all__ = ["Moment", "MomentOptions", "VideoMoments", "clock", "find_moments", "rank_videos"]
