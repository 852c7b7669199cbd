"""Tiny test videos made from the photos scikit-image ships (:mod:`tests.photos`), with PyAV's
encoders: H.264 and HEVC in MP4, VP9 in WebM, AV1 in Matroska, MPEG-4 Part 2 in AVI.

A video is a list of shots, each one photo held for some seconds (optionally drifting a few
pixels a frame, so consecutive frames differ), so a test knows which photo shows at which second.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from pathlib import Path

import numpy as np
from PIL import Image

# SVT-AV1 (libsvtav1), run as root, leaves the encoding thread SCHED_FIFO at priority 99: every
# process the test worker starts after it would inherit real-time priority (a suite run hung).
from benchmarks._common import scheduling_kept
from tests.photos import photo

# codec -> file extension PyAV writes it in
CODECS: dict[str, str] = {"libx264": "mp4", "libx265": "mp4", "libvpx-vp9": "webm", "libsvtav1": "mkv", "mpeg4": "avi"}
SIZE = (96, 64)


def shot_frames(name: str, size: tuple[int, int] = SIZE, drift: int = 0, frames: int = 1) -> list[np.ndarray]:
    """``frames`` RGB arrays of photo ``name`` fitted to ``size``; with ``drift`` each frame is
    shifted that many pixels further right (a slow pan)."""
    img = photo(name, max_side=max(size) * 2).resize((size[0] + drift * frames, size[1]), Image.Resampling.BILINEAR)
    arr = np.asarray(img)
    return [np.ascontiguousarray(arr[:, i * drift: i * drift + size[0]]) for i in range(frames)]


def write_video(path: Path, shots: Sequence[tuple[str, float]], codec: str = "libx264", *, fps: int = 8, gop: int | None = None,
                drift: int = 0, rotation: int | None = None, metadata: Mapping[str, str] | None = None,
                times: Sequence[float] | None = None, size: tuple[int, int] = SIZE) -> Path:
    """A video of ``shots`` (photo name, seconds) at ``fps``, a keyframe at least every ``gop``
    frames (the encoder's default otherwise); ``rotation`` writes a display matrix (degrees
    counter-clockwise), ``metadata`` container tags. ``times`` gives each frame's own
    presentation time in seconds instead (a variable frame rate)."""
    import av

    frames = [f for name, secs in shots for f in shot_frames(name, size, drift, max(1, round(secs * fps)))]
    # Keys such as com.apple.quicktime.creationdate are written as QuickTime's mdta tags, as phones do.
    mdta = path.suffix in (".mp4", ".mov") and any("." in k for k in metadata or {})
    with scheduling_kept(), av.open(str(path), "w", options={"movflags": "use_metadata_tags"} if mdta else None) as container:
        if metadata:
            container.metadata.update(metadata)
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        if gop is not None:
            stream.codec_context.gop_size = gop
        if times is not None:
            stream.time_base = stream.codec_context.time_base = Fraction(1, 1000)
        if rotation is not None:
            stream.set_display_rotation(rotation)
        for i, arr in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(arr, format="rgb24")
            if times is not None:
                frame.pts = round(times[i] * 1000)
                frame.time_base = stream.time_base
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def write_audio_only(path: Path, seconds: float = 1.0) -> Path:
    """An MP4 holding one AAC audio stream and no video."""
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("aac", rate=16000)
        samples = int(16000 * seconds)
        for start in range(0, samples, 1024):
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            frame.sample_rate = 16000
            frame.pts = start
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


__all__ = ["CODECS", "SIZE", "shot_frames", "write_audio_only", "write_video"]
