"""Videos for the index (indexer/video): content sniffing, the probe's facts, the three samplings
on every codec PyAV encodes here, and bad input (empty, not a video, truncated, damaged, no video
stream, an unknown codec, a variable frame rate, a 24-hour file, the time limit)."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("av")

from indexer.video import VideoOptions, is_video_file, sample_video, sniff  # noqa: E402
from indexer.video.sampling import Changes, Deadline, plan_gop  # noqa: E402
from retrieval.errors import InvalidArgumentError, VideoDecodeError  # noqa: E402
from tests.videogen import CODECS, shot_frames, write_audio_only, write_video  # noqa: E402

# Four shots: which photo shows from which second.
SHOTS = [("astronaut.png", 2.0), ("chelsea.png", 3.0), ("coffee.png", 1.0), ("rocket.jpg", 2.0)]
STARTS = [0.0, 2.0, 5.0, 6.0]


def shot_at(t: float) -> str:
    return SHOTS[max(i for i, s in enumerate(STARTS) if s <= t + 1e-6)][0]


def nearest_photo(image: object) -> str:
    arr = np.asarray(image, np.float32)
    ref = {name: shot_frames(name)[0].astype(np.float32) for name, _ in SHOTS}
    return min(ref, key=lambda n: float(np.mean(np.abs(ref[n] - arr))))


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("videos")
    return {codec: write_video(d / f"shots-{codec}.{ext}", SHOTS, codec, gop=16) for codec, ext in CODECS.items()}


@pytest.mark.skipif(not hasattr(os, "sched_getscheduler"), reason="no POSIX scheduling here")
def test_encoding_av1_leaves_the_process_scheduling_as_it_was(tmp_path: Path) -> None:
    """SVT-AV1, run as root (as CI runs), leaves the encoding thread SCHED_FIFO at priority 99;
    every later child of the test worker would inherit it. The test videos' writer puts it back."""
    before = (os.sched_getscheduler(0), os.sched_getparam(0))
    write_video(tmp_path / "a.mkv", [("coffee.png", 0.5)], "libsvtav1")
    assert (os.sched_getscheduler(0), os.sched_getparam(0)) == before


def test_sniff_tells_containers_by_content(tmp_path: Path, videos: dict[str, Path]) -> None:
    kinds = {codec: sniff(p.read_bytes()[:16]) for codec, p in videos.items()}
    assert kinds == {"libx264": "mp4", "libx265": "mp4", "libvpx-vp9": "matroska", "libsvtav1": "matroska", "mpeg4": "avi"}
    assert sniff(b"\xff\xd8\xff\xe0\x00\x10JFIF\x00") is None and sniff(b"") is None
    fake = tmp_path / "notes.mp4"
    fake.write_text("not a video at all")
    assert not is_video_file(fake) and not is_video_file(tmp_path / "missing.mp4")
    renamed = tmp_path / "clip.jpg"
    renamed.write_bytes(videos["libx264"].read_bytes())
    assert is_video_file(renamed)


@pytest.mark.parametrize("codec", list(CODECS))
def test_keyframes_show_the_right_photo_on_every_codec(videos: dict[str, Path], codec: str) -> None:
    info, frames = sample_video(videos[codec], VideoOptions(min_change=0))
    assert info.duration == pytest.approx(8.0, abs=0.2) and info.fps == pytest.approx(8.0)
    assert (info.width, info.height, info.rotation) == (96, 64, 0)
    assert info.codec == {"libx264": "h264", "libx265": "hevc", "libvpx-vp9": "vp9", "libsvtav1": "av1", "mpeg4": "mpeg4"}[codec]
    times = [f.time for f in frames]
    assert times == sorted(times) and times[0] == 0.0
    # Keyframes at least every 2 s and static shots: every shot is sampled, no stretch over the gap.
    assert all(b - a <= 3.0 + 1e-6 for a, b in itertools.pairwise([*times, info.duration]))
    for f in frames:
        assert nearest_photo(f.image) == shot_at(f.time), (codec, f.time)
    assert {shot_at(t) for t in times} == {name for name, _ in SHOTS} - ({"coffee.png"} if codec in ("libvpx-vp9", "libsvtav1") else set())
    # The default drops keyframes that repeat the last kept one (the same still photo).
    _, fewer = sample_video(videos[codec])
    assert len(fewer) < len(frames) and {f.time for f in fewer} <= set(times)


def test_gap_filling_and_near_duplicates(tmp_path: Path) -> None:
    # One keyframe only (a gop longer than the video): the gaps are filled with decoded frames.
    long_gop = write_video(tmp_path / "one-key.mp4", [("astronaut.png", 4.0), ("chelsea.png", 6.0)], gop=1000, drift=1)
    info, frames = sample_video(long_gop, VideoOptions(max_gap=2.0, min_change=0))
    times = [f.time for f in frames]
    assert frames[0].keyframe and sum(not f.keyframe for f in frames) >= 3
    assert len(times) >= 5 and all(b - a <= 2.0 + 1e-6 for a, b in itertools.pairwise([*times, info.duration]))
    # A still shot: every keyframe looks the same, one is kept (min_change), all without it.
    still = write_video(tmp_path / "still.mp4", [("coffee.png", 8.0)], gop=8)
    assert len(sample_video(still)[1]) == 1
    assert len(sample_video(still, VideoOptions(min_change=0))[1]) == 8


def test_rate_and_shot_sampling(videos: dict[str, Path]) -> None:
    _, frames = sample_video(videos["libx264"], VideoOptions(sampling="rate", rate=2.0, min_change=0))
    assert [f.time for f in frames] == [i / 2 for i in range(16)]
    _, shots = sample_video(videos["libvpx-vp9"], VideoOptions(sampling="shots", max_gap=10))
    assert [f.time for f in shots] == STARTS
    assert [nearest_photo(f.image) for f in shots] == [name for name, _ in SHOTS]


def test_rotation_date_place_and_camera(tmp_path: Path) -> None:
    tags = {"com.apple.quicktime.creationdate": "2024-06-01T18:30:00+0200", "com.apple.quicktime.make": "Apple",
            "com.apple.quicktime.model": "iPhone 15", "com.apple.quicktime.location.ISO6709": "+48.8584+002.2945+035.000/"}
    path = write_video(tmp_path / "phone.mov", [("astronaut.png", 1.0)], rotation=-90, metadata=tags)
    info, frames = sample_video(path)
    assert (info.rotation, info.width, info.height) == (-90, 64, 96)
    assert frames[0].image.size == (64, 96)
    # -90 (counter-clockwise) is a quarter turn clockwise: the stored frame's top row becomes the right column.
    upright = np.asarray(frames[0].image, np.float32)
    stored = shot_frames("astronaut.png")[0].astype(np.float32)
    assert np.mean(np.abs(upright - np.rot90(stored, k=-1))) < np.mean(np.abs(upright - np.rot90(stored, k=1)))
    assert info.taken_offset == 120 and info.taken_us == 1717259400 * 1_000_000
    assert info.gps == (48.8584, 2.2945) and info.camera == "Apple iPhone 15"
    utc = write_video(tmp_path / "utc.mp4", [("coffee.png", 1.0)], metadata={"creation_time": "2021-05-06T07:08:09.000000Z"})
    assert sample_video(utc)[0].photo_meta().taken_us == 1620284889 * 1_000_000
    assert sample_video(utc)[0].taken_offset is None


def test_variable_frame_rate_and_a_24_hour_file(tmp_path: Path) -> None:
    times = [0.0, 0.1, 0.15, 1.9, 2.0, 5.5, 5.6, 9.0]
    vfr = write_video(tmp_path / "vfr.mp4", [("astronaut.png", 0.5), ("chelsea.png", 0.5)], fps=8, times=times, drift=2)
    info, frames = sample_video(vfr, VideoOptions(sampling="rate", rate=1.0, min_change=0))
    assert {round(f.time, 3) for f in frames} <= set(times) and frames[-1].time == 9.0
    assert info.duration == pytest.approx(9.0, abs=0.2)
    day_times = [0, 1, 60, 3600, 43200, 86000, 86300, 86399]
    day = write_video(tmp_path / "day.mp4", [("astronaut.png", 1.0), ("chelsea.png", 1.0)], fps=4, times=day_times)
    info, frames = sample_video(day, VideoOptions(max_frames=100, min_change=0))
    assert info.duration == pytest.approx(86399, abs=1) and 1 <= len(frames) <= 8


def test_bad_files_are_refused_with_a_reason(tmp_path: Path, videos: dict[str, Path]) -> None:
    def reason(path: Path, **kw: object) -> str:
        with pytest.raises(VideoDecodeError) as exc:
            sample_video(path, **kw)  # type: ignore[arg-type]
        assert str(path) in str(exc.value)
        return exc.value.reason

    empty = tmp_path / "empty.mp4"
    empty.write_bytes(b"")
    assert reason(empty) == "empty file"
    text = tmp_path / "text.mkv"
    text.write_text("hello")
    assert reason(text).startswith("not a video container")
    assert reason(tmp_path / "gone.mp4").startswith("unreadable")
    assert reason(write_audio_only(tmp_path / "voice.mp4")) == "no video stream"
    # moov at the end: the first half holds no index of the file.
    data = videos["libx264"].read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[: len(data) // 2])
    assert reason(cut).startswith("damaged or truncated container")
    # Matroska names its codec in text: one FFmpeg does not know has no decoder.
    mkv = videos["libsvtav1"].read_bytes()
    assert b"V_AV1" in mkv
    unknown = tmp_path / "unknown.mkv"
    unknown.write_bytes(mkv.replace(b"V_AV1", b"V_ZZZ", 1))
    assert reason(unknown).startswith("unsupported codec")
    ticks = itertools.count(0.0, 10.0)
    assert reason(videos["libx264"], options=VideoOptions(time_limit=25), clock=lambda: next(ticks)).startswith(
        "took longer than the time limit of 25 s")


def test_truncated_stream_keeps_what_decodes_and_damage_never_crashes(tmp_path: Path, videos: dict[str, Path]) -> None:
    data = videos["libvpx-vp9"].read_bytes()
    cut = tmp_path / "cut.webm"
    cut.write_bytes(data[: int(len(data) * 0.6)])
    _, frames = sample_video(cut)
    assert 1 <= len(frames) < len(sample_video(videos["libvpx-vp9"])[1])
    rng = np.random.default_rng(0)
    for codec in ("libx264", "libvpx-vp9"):
        raw = bytearray(videos[codec].read_bytes())
        for at in rng.integers(200, len(raw), 40):
            raw[at] ^= 0xFF
        broken = tmp_path / f"broken-{videos[codec].name}"
        broken.write_bytes(bytes(raw))
        try:
            _, frames = sample_video(broken)
        except VideoDecodeError as exc:
            assert exc.reason
        else:
            assert all(0 <= f.time <= 8.5 for f in frames)


def test_plan_of_a_group_and_the_options() -> None:
    assert plan_gop(None, 0.0, 2.0, 3.0) == plan_gop(None, 0.0, 2.0, 3.0, 0.0)
    plan = plan_gop(None, 0.0, 10.0, 3.0)
    assert plan.take_key and plan.targets == pytest.approx((2.5, 5.0, 7.5)) and plan.last == 7.5
    assert not plan_gop(7.9, 8.0, 9.0, 3.0, spacing=0.5).take_key
    thinned = plan_gop(5.0, 5.2, 12.0, 3.0, spacing=0.5)
    assert not thinned.take_key and all(5.2 < t < 12.0 for t in thinned.targets)
    changes = Changes(0.1)
    a, b = np.zeros((4, 4), np.uint8), np.full((4, 4), 200, np.uint8)
    assert [changes.keep(a), changes.keep(a + 5), changes.keep(b)] == [True, False, True]
    ticks = iter([0.0, 1.0, 3.0])
    deadline = Deadline("x.mp4", 2.0, clock=lambda: next(ticks))
    deadline.check()
    with pytest.raises(VideoDecodeError, match="time limit of 2 s"):
        deadline.check()
    for bad in ({"sampling": "every"}, {"max_gap": 0}, {"rate": -1.0}, {"min_change": 1.5}, {"max_frames": 0},
                {"time_limit": float("nan")}, {"max_gap": True}):
        with pytest.raises(InvalidArgumentError):
            VideoOptions(**bad)  # type: ignore[arg-type]
    assert VideoOptions(max_frames=10).gap(100.0) == 10.0 and VideoOptions().gap(60.0) == 3.0
