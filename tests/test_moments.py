"""Moments (retrieval/moments.py): neighbouring matching frames of a video merge into one stretch,
a video may hold several, videos rank by their best, and the clock text of the CLI."""

from __future__ import annotations

import math

import numpy as np
import pytest

from retrieval.errors import InvalidArgumentError
from retrieval.moments import Moment, MomentOptions, VideoMoments, clock, find_moments, rank_videos

TIMES = np.array([0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0])
IDS = np.arange(100, 107)


def test_neighbouring_matches_merge_and_separate_ones_do_not() -> None:
    scores = np.array([0.10, 0.30, 0.31, 0.12, 0.29, 0.05, 0.30])
    found = find_moments(TIMES, scores, IDS, duration=13.0, options=MomentOptions(margin=0.02))
    # 2-4 s match together (ends where the next, non-matching, frame starts); 8 s and 12 s alone.
    assert found == [Moment(2.0, 6.0, 4.0, pytest.approx(0.31), 102), Moment(12.0, 13.0, 12.0, pytest.approx(0.30), 106),
                     Moment(8.0, 10.0, 8.0, pytest.approx(0.29), 104)]
    assert [m.start for m in find_moments(TIMES, scores, IDS, options=MomentOptions(margin=0.0))] == [4.0]
    assert len(find_moments(TIMES, scores, IDS, options=MomentOptions(margin=0.5, most=1))) == 1
    whole = find_moments(TIMES, scores, IDS, duration=13.0, options=MomentOptions(margin=0.5))
    assert [(m.start, m.end, m.time) for m in whole] == [(0.0, 13.0, 4.0)]


def test_min_score_order_and_unscored_frames() -> None:
    scores = np.array([0.25, np.nan, 0.26, 0.27, np.nan, np.nan, 0.40])
    shuffled = np.array([6, 2, 0, 4, 1, 3, 5])
    found = find_moments(TIMES[shuffled], scores[shuffled], IDS[shuffled], min_score=0.25)
    # Unscored frames break a stretch; the last frame's stretch ends at its own time without a duration.
    assert [(m.start, m.end, m.id) for m in found] == [(12.0, 12.0, 106), (4.0, 8.0, 103), (0.0, 2.0, 100)]
    assert find_moments(TIMES, np.full(7, np.nan), IDS) == []
    assert find_moments(TIMES, scores, IDS, min_score=0.5) == []
    # Frames at one time (a duplicate row) count once: the better score.
    two = find_moments(np.array([1.0, 1.0, 3.0]), np.array([0.2, 0.3, 0.0]), np.array([7, 8, 9]), min_score=0.25)
    assert [(m.start, m.end, m.id, m.score) for m in two] == [(1.0, 3.0, 8, pytest.approx(0.3))]
    with pytest.raises(InvalidArgumentError):
        find_moments(TIMES, scores[:3], IDS)


def test_videos_rank_by_their_best_moment() -> None:
    a = VideoMoments("a.mp4", (Moment(0, 2, 1, 0.2, 1),))
    b = VideoMoments("b.mp4", (Moment(5, 9, 6, 0.3, 2), Moment(0, 1, 0, 0.1, 3)))
    assert [v.key for v in rank_videos([a, VideoMoments("c.mp4", ()), b])] == ["b.mp4", "a.mp4"]
    assert b.best.to_dict() == {"start": 5, "end": 9, "time": 6, "score": 0.3, "id": 2}


def test_clock_and_options() -> None:
    assert [clock(t) for t in (0, 83.9, 91, 3723.5, -1)] == ["00:00", "01:23", "01:31", "1:02:03", "00:00"]
    for bad in ({"margin": -0.1}, {"margin": math.nan}, {"margin": True}, {"most": 0}):
        with pytest.raises(InvalidArgumentError):
            MomentOptions(**bad)  # type: ignore[arg-type]
