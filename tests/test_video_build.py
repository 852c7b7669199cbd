"""Videos into an index: a video's sampled frames embedded and appended as rows together, bad
files skipped with their reason (indexer.video.video_rows)."""

from __future__ import annotations

import os
import re
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


def _rows_by_path(index_dir: Path) -> dict[str, int]:
    from retrieval.index import ImageIndex

    index = ImageIndex.open(index_dir)
    paths = index.metadata.paths()
    return {p: paths.count(p) for p in sorted(set(paths))}


def test_index_videos_search_moments_and_update(tmp_path: Path, tiny_model: Path) -> None:
    from indexer import build_index
    from retrieval.index import ImageIndex
    from retrieval.layout import read_manifest
    from retrieval.request import SearchRequest
    from tests.conftest import cli_here
    from tests.photos import photo

    photos = tmp_path / "phone"
    photos.mkdir()
    photo("astronaut.png", 64).save(photos / "astronaut.jpg")
    photo("coffee.png", 64).save(photos / "coffee.jpg")
    write_video(photos / "walk.mp4", [("rocket.jpg", 3.0), ("chelsea.png", 3.0)], gop=8)
    write_video(photos / "cat.webm", [("chelsea.png", 2.0), ("motorcycle_left.png", 2.0)], "libvpx-vp9", gop=8)
    (photos / "broken.mov").write_bytes(b"\x00\x00\x00\x18ftypqt  " + b"\x00" * 64)
    out = tmp_path / "phone.idx"
    opts = {"model": str(tiny_model), "batch_size": 8, "workers": 0, "device": "cpu"}
    report = build_index(photos, out, videos=True, **opts)
    # Two images and two videos added; the damaged QuickTime file skipped with its reason.
    assert (report.added, report.newly_skipped) == (4, 1)
    manifest = read_manifest(out)
    assert manifest.format_version == 5 and manifest.discovery["videos"] is True
    rows = _rows_by_path(out)
    assert rows["astronaut.jpg"] == 1 and rows["walk.mp4"] >= 2 and rows["cat.webm"] >= 2 and "broken.mov" not in rows
    index = ImageIndex.open(out)
    skipped = index.metadata.skipped()
    assert [s.path for s in skipped] == ["broken.mov"] and skipped[0].reason.startswith("damaged or truncated container")
    # A frame of walk.mp4 finds walk.mp4 first, as one hit with its moment around the frame.
    frame = next(r for r in index.rows(range(index.count), ("id", "path", "frame_time")) if r["path"] == "walk.mp4" and r["frame_time"] > 2)
    hits = index.search(SearchRequest(similar_to=frame["id"], k=10))
    assert hits[0].path == "walk.mp4" and hits[0].media == "video" and hits[0].frame_time == frame["frame_time"]
    assert hits[0].start is not None and hits[0].end is not None and hits[0].start <= frame["frame_time"] < hits[0].end
    assert sorted(h.path for h in hits) == ["astronaut.jpg", "cat.webm", "coffee.jpg", "walk.mp4"]
    res = cli_here(["search", out, "a cat", "--media", "video", "--mode", "vector"])
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 2 and all(re.search(r"\.(mp4|webm) \d\d:\d\d-\d\d:\d\d", line) for line in lines), res.stdout
    # Nothing changed: no new generation. A touched video keeps its rows; a changed one is sampled again.
    gen = manifest.generation
    assert build_index(photos, out, **opts).added == 0 and read_manifest(out).generation == gen
    os.utime(photos / "cat.webm", ns=(1, 1))
    write_video(photos / "walk.mp4", [("coffee.png", 2.0)], gop=8)
    again = build_index(photos, out, **opts)
    assert (again.added, again.updated, again.unchanged) == (0, 1, 3)
    after = _rows_by_path(out)
    assert after["cat.webm"] == rows["cat.webm"] and after["walk.mp4"] >= 1
    # Watch mode on an index of videos walks for them too (a walk of images alone would drop them).
    import threading

    from indexer.build_config import BuildConfig
    from indexer.watch import _Watcher
    from indexer.watch_config import WatchConfig
    from retrieval.encoders import load_encoder

    (photos / "later.mkv").write_bytes((photos / "cat.webm").read_bytes())
    os.utime(photos / "later.mkv", ns=(1, 1))  # long settled
    watcher = _Watcher(photos, out, BuildConfig(model=str(tiny_model), device="cpu", workers=0, progress=False),
                       WatchConfig(settle=0.01), load_encoder(str(tiny_model), device="cpu"), threading.Event(), None)
    assert watcher.relevant(os.fsencode((photos / "new.mov").resolve()), False)
    assert watcher.update()
    watched = _rows_by_path(out)
    assert watched["later.mkv"] == after["cat.webm"] and watched["cat.webm"] == after["cat.webm"] and "walk.mp4" in watched
    # --no-videos leaves them out: their rows go, the images stay.
    build_index(photos, out, videos=False, **opts)
    assert _rows_by_path(out) == {"astronaut.jpg": 1, "coffee.jpg": 1}


def test_a_build_killed_between_two_videos_keeps_whole_videos(tmp_path: Path, tiny_model: Path) -> None:
    from tests.conftest import cli_here
    from tests.faultctl import run_killed_at

    photos = tmp_path / "clips"
    photos.mkdir()
    write_video(photos / "a.mp4", [("astronaut.png", 2.0), ("coffee.png", 2.0)], gop=8)
    write_video(photos / "b.mp4", [("rocket.jpg", 2.0), ("chelsea.png", 2.0)], gop=8)
    out = tmp_path / "clips.idx"
    args = ["index", photos, out, "--videos", "--model", tiny_model, "--device", "cpu", "--workers", "0", "--commit-every", "1"]
    # Killed with b.mp4's frames embedded, before they reach the writer: a.mp4 was committed whole.
    assert run_killed_at(args, "video", nth=2).killed
    killed = _rows_by_path(out)
    assert list(killed) == ["a.mp4"] and killed["a.mp4"] >= 2
    # The next run adds b.mp4 whole and keeps a.mp4 as it was.
    res = cli_here(args)
    assert res.returncode == 0, res.stderr
    done = _rows_by_path(out)
    assert done["a.mp4"] == killed["a.mp4"] and done["b.mp4"] >= 2

