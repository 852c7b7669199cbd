"""Videos into an index: a video's sampled frames embedded and appended as rows together, bad
files skipped with their reason (indexer.video.video_rows)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("av")

from indexer.dataset import content_hash  # noqa: E402
from indexer.discover import ImageFile  # noqa: E402
from indexer.video import VideoOptions  # noqa: E402
from indexer.video.video_rows import VideoSink, embed_videos, is_video_path  # noqa: E402
from retrieval.layout import SkipRecord  # noqa: E402
from tests.videogen import write_audio_only, write_video  # noqa: E402


class Collected:
    def __init__(self) -> None:
        self.appended: list[tuple[list[Any], np.ndarray]] = []
        self.skips: list[SkipRecord] = []
        self.commits: list[int] = []

    def sink(self) -> VideoSink:
        return VideoSink(lambda records, vectors: self.appended.append((records, vectors)), self.skips.append, self.commits.append)


def _file(root: Path, name: str) -> ImageFile:
    st = (root / name).stat()
    return ImageFile(name.encode(), st.st_size, st.st_mtime_ns)


def test_embed_videos_rows_per_frame_and_skips(tmp_path: Path, tiny_model: Path) -> None:
    from retrieval.encoders import load_encoder

    enc = load_encoder(str(tiny_model), device="cpu")
    root = tmp_path / "clips"
    root.mkdir()
    write_video(root / "walk.mp4", [("astronaut.png", 2.0), ("coffee.png", 2.0), ("rocket.jpg", 2.0)], gop=8, drift=1)
    write_video(root / "turned.webm", [("chelsea.png", 2.0)], "libvpx-vp9", rotation=90)
    (root / "notes.mp4").write_text("not a video at all")
    write_audio_only(root / "song.mp4")
    (root / "empty.mkv").write_bytes(b"")
    names = ["walk.mp4", "turned.webm", "notes.mp4", "song.mp4", "empty.mkv"]
    assert all(is_video_path(n) for n in names) and not is_video_path("photo.jpg")
    got = Collected()
    stats = embed_videos([_file(root, n) for n in names], root, enc, VideoOptions(), got.sink(), updated=frozenset({b"notes.mp4"}))
    assert (stats.videos, stats.skipped, stats.lost) == (2, 3, 1)
    # One append per video, after all its frames: a commit never holds half a video.
    (walk, walk_vectors), (turned, _) = got.appended
    assert got.commits == [len(walk), len(turned)]
    assert {r.path for r in walk} == {b"walk.mp4"} and walk_vectors.shape == (len(walk), enc.dim)
    assert np.allclose(np.linalg.norm(walk_vectors, axis=1), 1, atol=1e-4)
    times = [r.frame.time for r in walk]
    assert times == sorted(times) and times[0] == 0.0 and len(walk) >= 3
    # No stretch longer than the allowed gap goes unsampled.
    assert max(np.diff([*times, 6.0])) <= VideoOptions().max_gap + 0.2
    first = walk[0]
    assert first.frame.keyframe and first.frame.codec == "h264" and first.frame.duration == pytest.approx(6.0, abs=0.2)
    assert (first.width, first.height) == (96, 64)
    assert first.content_hash == content_hash((root / "walk.mp4").read_bytes())
    # Rotated: the displayed size, upright.
    assert (turned[0].width, turned[0].height, turned[0].frame.rotation) == (64, 96, 90)
    reasons = {s.path: s.reason for s in got.skips}
    assert set(reasons) == {b"notes.mp4", b"song.mp4", b"empty.mkv"}
    assert "not a video container" in reasons[b"notes.mp4"] and reasons[b"song.mp4"] == "no video stream"
    assert reasons[b"empty.mkv"] == "empty file"
    # A skip keeps the file's facts, so an unchanged bad file is not retried.
    assert next(s for s in got.skips if s.path == b"song.mp4").size == (root / "song.mp4").stat().st_size
