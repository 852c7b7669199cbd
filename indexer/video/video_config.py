"""``VideoOptions``: how the frames of a video are chosen for the index, and the per-file limits.

The default, ``keyframes``, decodes only the packets the encoder marked as keyframes (no
reference frames to decode first, so a fraction of a full decode), fills a gap between
keyframes longer than ``max_gap`` with a decoded frame, and drops a frame that barely differs
from the last one kept (a static shot gives one row, not one per keyframe). ``rate`` decodes
every frame and keeps ``rate`` a second (the common "one frame a second" baseline); ``shots``
decodes every frame and keeps the first of each shot, cut where consecutive frames differ by
more than ``shot_threshold``, with the same gap filling. Each option is a field with its
meaning (:func:`retrieval.options.option`), so a front end can derive its flags from them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from retrieval.errors import InvalidArgumentError
from retrieval.options import option

Sampling = Literal["keyframes", "rate", "shots"]
SAMPLINGS: tuple[str, ...] = ("keyframes", "rate", "shots")


def _seconds(name: str, value: object, *, zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidArgumentError(f"video {name} must be a number, got {value!r}")
    if value < 0 or (value == 0 and not zero):
        raise InvalidArgumentError(f"video {name} must be {'>= 0' if zero else '> 0'}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class VideoOptions:
    """How a video is sampled (:func:`indexer.video.frames.sample_video`); checked when made.

    Raises:
        InvalidArgumentError: an unknown ``sampling``, a negative or non-finite number, a share
            outside [0, 1], ``max_frames`` below 1.
    """

    sampling: str = field(default="keyframes", metadata=option(
        "how frames are chosen: keyframes (+ gap filling), rate (a full decode, --video-rate a second) "
        "or shots (a full decode, the first frame of each shot)", choices=SAMPLINGS))
    max_gap: float = field(default=3.0, metadata=option(
        "keyframes and shots: the longest stretch of video without a sampled frame, in seconds", metavar="S", positive=True))
    rate: float = field(default=1.0, metadata=option("rate: frames kept a second", metavar="FPS", positive=True))
    min_change: float = field(default=0.03, metadata=option(
        "a frame whose mean pixel difference to the last kept frame is below this share (0 to 1) is dropped; 0 keeps all",
        metavar="SHARE"))
    shot_threshold: float = field(default=0.15, metadata=option(
        "shots: the mean pixel difference (0 to 1) between consecutive frames that starts a new shot", metavar="SHARE"))
    max_frames: int = field(default=3600, metadata=option(
        "the most frames sampled from one video: a longer one is sampled more sparsely", minimum=1))
    time_limit: float = field(default=300.0, metadata=option(
        "seconds one video may take to sample; a slower one is skipped with that reason", metavar="S", positive=True))

    def __post_init__(self) -> None:
        if self.sampling not in SAMPLINGS:
            raise InvalidArgumentError(f"video sampling must be one of {', '.join(SAMPLINGS)}, got {self.sampling!r}")
        _seconds("max_gap", self.max_gap)
        _seconds("rate", self.rate)
        _seconds("time_limit", self.time_limit)
        for name in ("min_change", "shot_threshold"):
            if _seconds(name, getattr(self, name), zero=True) > 1:
                raise InvalidArgumentError(f"video {name} is a share from 0 to 1, got {getattr(self, name)!r}")
        if isinstance(self.max_frames, bool) or not isinstance(self.max_frames, int) or self.max_frames < 1:
            raise InvalidArgumentError(f"video max_frames must be an integer >= 1, got {self.max_frames!r}")

    def spacing(self, duration: float) -> float:
        """The least time between two sampled frames of a video ``duration`` seconds long, so that
        it gives at most ``max_frames`` (for a phone clip, a small fraction of a frame's time)."""
        return max(duration, 0.0) / self.max_frames

    def gap(self, duration: float) -> float:
        """The longest unsampled stretch allowed in a video ``duration`` seconds long."""
        return max(self.max_gap, self.spacing(duration))


__all__ = ["SAMPLINGS", "Sampling", "VideoOptions"]
