"""Which frames of a video to keep, decided without decoding: the plan of one group of pictures
(a keyframe and the frames up to the next), the near-duplicate test on small grey signatures,
and the per-file time limit. The decoding that follows the plan is :mod:`indexer.video.frames`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from retrieval.errors import VideoDecodeError

# Side of the grey thumbnail two frames are compared on: enough to tell a cut or a pan from noise.
SIGNATURE_SIDE = 32


@dataclass(frozen=True)
class GopPlan:
    """What to decode of one group of pictures that starts at ``start`` (its keyframe's time).

    ``take_key``: decode the keyframe packet alone and keep its frame; ``targets``: times inside
    the group to keep a frame at (the first frame at or after each), which needs the whole
    group decoded; ``last``: the time the next group's plan counts its gap from.
    """

    take_key: bool
    targets: tuple[float, ...]
    last: float

    @property
    def full(self) -> bool:
        """Whether the group's every packet must be decoded (it holds a gap-filling target)."""
        return bool(self.targets)


def plan_gop(prev: float | None, start: float, end: float, gap: float, spacing: float = 0.0) -> GopPlan:
    """The plan of the group of pictures spanning ``start`` to ``end`` seconds, given the time of
    the last planned frame before it (``prev``; None for the first group).

    The keyframe is kept unless it follows the last planned frame by less than ``spacing`` (a
    long video's frame budget); a stretch from the last kept time to ``end`` longer than ``gap``
    is split evenly by targets inside the group, so no stretch exceeds ``gap``.
    """
    take_key = prev is None or start - prev >= spacing
    anchor = start if take_key or prev is None else prev
    span = end - anchor
    targets: tuple[float, ...] = ()
    if span > gap > 0:
        pieces = math.ceil(span / gap - 1e-9)
        targets = tuple(t for t in (anchor + span * j / pieces for j in range(1, pieces)) if start < t < end)
    return GopPlan(take_key, targets, targets[-1] if targets else anchor)


def difference(a: np.ndarray, b: np.ndarray) -> float:
    """The mean absolute difference of two grey signatures (uint8), as a share of full scale."""
    return float(np.mean(np.abs(a.astype(np.int16) - b.astype(np.int16)))) / 255.0


class Changes:
    """The near-duplicate test: a frame is new when its signature differs from the last kept
    frame's by at least ``min_change`` (0 keeps every frame)."""

    def __init__(self, min_change: float) -> None:
        self.min_change = min_change
        self.last: np.ndarray | None = None

    def keep(self, signature: np.ndarray) -> bool:
        """Whether the frame of ``signature`` is kept; a kept frame becomes the one compared to."""
        if self.last is not None and self.min_change > 0 and difference(signature, self.last) < self.min_change:
            return False
        self.last = signature
        return True


class Deadline:
    """The time limit of one file, checked between packets (``clock`` is passed in for tests)."""

    def __init__(self, path: str, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.seconds = seconds
        self.clock = clock
        self.until = clock() + seconds

    def check(self) -> None:
        """Raises:
        VideoDecodeError: the file has taken longer than its limit."""
        if self.clock() > self.until:
            raise VideoDecodeError(self.path, f"took longer than the time limit of {self.seconds:g} s")


__all__ = ["SIGNATURE_SIDE", "Changes", "Deadline", "GopPlan", "difference", "plan_gop"]
