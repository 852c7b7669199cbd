"""The frames of one video for the index, decoded with PyAV (FFmpeg) as
:class:`~indexer.video.video_config.VideoOptions` asks: :class:`VideoSampler`.

``keyframes`` reads the file once, a group of pictures at a time: the compressed packets of a
group are held until the next keyframe arrives, and then either the keyframe packet alone is
decoded (a keyframe needs no other frame) or, when the group is longer than the allowed gap,
the whole group, to keep frames at the gap-filling times (:func:`~indexer.video.sampling.plan_gop`).
Not feeding a packet works for every codec, where the decoder's own "skip non-keyframes"
setting is ignored by some (VP9). ``rate`` and ``shots`` decode every frame.

Frames come out turned upright (the container's rotation) and reduced to ``max_side``; a
damaged packet is counted and passed over, a file that ends early keeps the frames before its
end, and a file with no decodable frame, or over its time limit, raises
:class:`~retrieval.errors.VideoDecodeError`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from retrieval.errors import VideoDecodeError

from .probe import VideoInfo, VideoSource, describe, open_video, source_name
from .sampling import SIGNATURE_SIDE, Changes, Deadline, difference, plan_gop
from .video_config import VideoOptions

if TYPE_CHECKING:
    import av
    from av.container import InputContainer
    from av.video.stream import VideoStream

# A frame's time and a target's are compared with this slack (timestamps are rounded to the
# stream's time base).
_EPS = 1e-6
# A max_side no video reaches: the frame as decoded (the faces stage finds faces in these pixels,
# and the server crops them from the same).
NATIVE_SIDE = 1 << 16
# A decoded frame and its presentation time in seconds.
Timed = tuple["av.VideoFrame", float]


@dataclass(frozen=True)
class SampledFrame:
    """One kept frame: its presentation ``time`` in seconds from the start, whether it is a
    ``keyframe``, and the upright RGB ``image``."""

    time: float
    keyframe: bool
    image: Image.Image


class VideoSampler:
    """The sampled frames of the video at ``path`` (or in an open binary file, which ``name``
    names), by iteration; after it, ``info`` (the file's
    facts), ``decoded`` (frames the decoder produced), ``dropped`` (near duplicates left out),
    ``damaged`` (packets the decoder refused) and ``truncated`` (the file ended early).

    Iterating raises :class:`~retrieval.errors.VideoDecodeError` (see :func:`sample_video`).
    """

    def __init__(self, path: VideoSource, options: VideoOptions | None = None, *, max_side: int = 448,
                 clock: Callable[[], float] = time.monotonic, name: str | None = None) -> None:
        self.source = path
        self.path = source_name(path, name)
        self.options = options or VideoOptions()
        self.max_side = max_side
        self.clock = clock
        self.info: VideoInfo | None = None
        self.decoded = 0
        self.dropped = 0
        self.damaged = 0
        self.truncated = False
        self._rotation = 0
        self._last_time = 0.0

    def __iter__(self) -> Iterator[SampledFrame]:
        deadline = Deadline(self.path, self.options.time_limit, self.clock)
        with open_video(self.source, open_timeout=self.options.time_limit, name=self.path) as (container, stream):
            duration = describe(container, stream).duration
            changes = Changes(self.options.min_change)
            kept = 0
            if self.options.sampling == "keyframes":
                chosen = self._keyframes(container, stream, duration, deadline)
            else:
                chosen = self._every_frame(container, stream, duration, deadline)
            for (frame, t), key in chosen:
                deadline.check()
                if not changes.keep(_signature(frame)):
                    self.dropped += 1
                    continue
                kept += 1
                yield SampledFrame(t, key, self._upright(frame))
            self.info = describe(container, stream, self._rotation, self._last_time)
        if kept == 0:
            raise VideoDecodeError(self.path, "no frame could be decoded" + (f" ({self.damaged} damaged packets)" if self.damaged else ""))

    def _decode(self, stream: VideoStream, packet: av.Packet | None) -> list[Timed]:
        """The frames one packet gives (None: flush the decoder) with their times in seconds (from
        the stream's time base: a flushed frame carries none of its own); a refused packet is
        counted, a frame without a timestamp passed over."""
        import av

        try:
            frames = stream.codec_context.decode(packet)
        except av.FFmpegError:
            self.damaged += 1
            return []
        out = []
        for frame in frames:
            self.decoded += 1
            self._rotation = int(frame.rotation or 0)
            if frame.pts is not None and stream.time_base is not None:
                t = float(frame.pts * stream.time_base)
                self._last_time = max(self._last_time, t)
                out.append((frame, t))
        return out

    def _packets(self, container: InputContainer, stream: VideoStream, deadline: Deadline) -> Iterator[av.Packet]:
        """The stream's packets; a damaged or truncated file ends the stream where reading fails."""
        import av

        demux = container.demux(stream)
        while True:
            deadline.check()
            try:
                packet = next(demux)
            except StopIteration:
                return
            except (av.InvalidDataError, av.EOFError, OSError):
                self.truncated = True
                return
            if packet.size:
                yield packet

    def _keyframes(self, container: InputContainer, stream: VideoStream, duration: float,
                   deadline: Deadline) -> Iterator[tuple[Timed, bool]]:
        gap, spacing = self.options.gap(duration), self.options.spacing(duration)
        # Frames leave the decoder late (reordering delay), so what is wanted is remembered across
        # groups: keyframes by timestamp, gap-filling targets by time.
        self._want_keys: set[int] = set()
        self._targets: list[float] = []
        group: list[av.Packet] = []
        prev: float | None = None
        end_time = 0.0
        for packet in self._packets(container, stream, deadline):
            at = _seconds(packet)
            if at is not None:
                end_time = max(end_time, at + float((packet.duration or 0) * packet.time_base))
            if packet.is_keyframe and group:
                prev = yield from self._group(stream, group, prev, at, gap, spacing)
                group = []
            group.append(packet)
        if group:
            yield from self._group(stream, group, prev, max(duration, end_time), gap, spacing)
        yield from self._picked(self._decode(stream, None))

    def _group(self, stream: VideoStream, group: list[av.Packet], prev: float | None, end: float | None,
               gap: float, spacing: float) -> Generator[tuple[Timed, bool], None, float]:
        """Decode one group of pictures as planned; returns the time the next plan counts from."""
        start = _seconds(group[0])
        if start is None or end is None:
            start = prev if prev is not None else 0.0
            end = start + gap
        plan = plan_gop(prev, start, end, gap, spacing)
        if plan.take_key and group[0].is_keyframe and group[0].pts is not None:
            self._want_keys.add(group[0].pts)
        self._targets.extend(plan.targets)
        for packet in group if plan.full else group[:1] if plan.take_key else ():
            yield from self._picked(self._decode(stream, packet))
        return plan.last

    def _picked(self, frames: list[Timed]) -> Iterator[tuple[Timed, bool]]:
        """The wanted ones of decoded ``frames``: a kept keyframe, or the first frame at or after
        a pending gap-filling target."""
        for frame, t in frames:
            if frame.pts in self._want_keys:
                self._want_keys.discard(frame.pts)
            elif self._targets and self._targets[0] <= t + _EPS:
                pass
            else:
                continue
            while self._targets and self._targets[0] <= t + _EPS:
                self._targets.pop(0)
            yield (frame, t), bool(frame.key_frame)

    def _every_frame(self, container: InputContainer, stream: VideoStream, duration: float,
                     deadline: Deadline) -> Iterator[tuple[Timed, bool]]:
        spacing = self.options.spacing(duration)
        step = max(1.0 / self.options.rate, spacing) if self.options.sampling == "rate" else spacing
        gap = self.options.gap(duration)
        shots = self.options.sampling == "shots"
        next_at = 0.0
        last_kept: float | None = None
        previous: np.ndarray | None = None
        frames = (f for p in self._packets(container, stream, deadline) for f in self._decode(stream, p))
        for frame, t in _chain(frames, lambda: self._decode(stream, None)):
            if shots:
                sig = _signature(frame)
                cut = previous is None or difference(sig, previous) > self.options.shot_threshold
                previous = sig
                take = (cut and (last_kept is None or t - last_kept >= step)) or (last_kept is not None and t - last_kept >= gap)
            else:
                take = t + _EPS >= next_at
            if take:
                last_kept = t
                next_at = t + step if not shots else next_at
                yield (frame, t), bool(frame.key_frame)

    def _upright(self, frame: av.VideoFrame) -> Image.Image:
        w, h = frame.width, frame.height
        scale = min(1.0, self.max_side / max(w, h))
        image = frame.reformat(width=max(2, round(w * scale)), height=max(2, round(h * scale)), format="rgb24").to_image()
        if self._rotation % 360:
            image = image.rotate(self._rotation, expand=True)
        return image


def sample_video(path: VideoSource, options: VideoOptions | None = None, *, max_side: int = 448,
                 clock: Callable[[], float] = time.monotonic, name: str | None = None) -> tuple[VideoInfo, list[SampledFrame]]:
    """The facts of the video at ``path`` (or in an open binary file, which ``name`` names) and
    its sampled frames, in time order.

    Raises:
        VideoDecodeError: not a video by its content, an empty, unreadable or damaged file, no
            video stream, a codec without a decoder here, no decodable frame, or more time than
            ``options.time_limit``. Its ``reason`` is the skip list's.
    """
    sampler = VideoSampler(path, options, max_side=max_side, clock=clock, name=name)
    frames = sorted(sampler, key=lambda f: f.time)
    assert sampler.info is not None
    return sampler.info, frames


def frame_at(path: VideoSource, seconds: float, *, max_side: int = 1024, time_limit: float = 30.0,
             clock: Callable[[], float] = time.monotonic, name: str | None = None) -> Image.Image:
    """The upright frame shown at ``seconds`` into the video at ``path`` (or in an open binary
    file, which ``name`` names) (the last one before it
    where none starts exactly there; the first where ``seconds`` is before every frame), reduced
    to ``max_side``: a video hit's picture.

    Raises:
        VideoDecodeError: as :func:`sample_video`, and when no frame decodes.
    """
    sampler = VideoSampler(path, VideoOptions(time_limit=time_limit), max_side=max_side, clock=clock, name=name)
    deadline = Deadline(sampler.path, time_limit, clock)
    with open_video(sampler.source, open_timeout=time_limit, name=sampler.path) as (container, stream):
        # Seek to the keyframe at or before the time, then decode forward to it.
        if stream.time_base is not None and seconds > 0:
            try:
                container.seek(int(seconds / stream.time_base), stream=stream, backward=True, any_frame=False)
            except Exception:  # noqa: BLE001  # FFmpeg refuses to seek some files: decode from the start
                container.seek(0, stream=stream)
        shown: Timed | None = None
        for packet in _chain_packets(sampler._packets(container, stream, deadline)):
            for frame, t in sampler._decode(stream, packet):
                if shown is not None and t > seconds + _EPS:
                    return sampler._upright(shown[0])
                shown = (frame, t)
        if shown is None:
            raise VideoDecodeError(sampler.path, "no frame could be decoded")
        return sampler._upright(shown[0])


def _chain_packets(packets: Iterable[av.Packet]) -> Iterator[av.Packet | None]:
    # The packets, then None: flushing the decoder gives the frames it still holds.
    yield from packets
    yield None


def _seconds(packet: av.Packet) -> float | None:
    stamp = packet.pts if packet.pts is not None else packet.dts
    return float(stamp * packet.time_base) if stamp is not None and packet.time_base is not None else None


def _signature(frame: av.VideoFrame) -> np.ndarray:
    return frame.reformat(width=SIGNATURE_SIDE, height=SIGNATURE_SIDE, format="gray").to_ndarray()


def _chain(first: Iterable[Timed], then: Callable[[], list[Timed]]) -> Iterator[Timed]:
    yield from first
    yield from then()


__all__ = ["NATIVE_SIDE", "SampledFrame", "VideoSampler", "frame_at", "sample_video"]
