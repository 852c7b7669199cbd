"""What an engine of the build is: the :class:`Engine` protocol a build asks, the facts it
reports, and the local engine (this process).

:mod:`indexer.build` asks an :class:`Engine` five things (whether the driver's calibration
speaks for it, the calibration where it does not, the embedding of a plan's images into the
writer, the sampling and embedding of its videos, and the facts its report states) and names
no engine; :mod:`indexer.engines` says which
engines there are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from retrieval.encoders import Encoder

from .build_config import BuildConfig, Decode
from .commit import GenerationWriter
from .discover import ImageFile
from .embed import embed_planned
from .plan import UpdatePlan
from .shard_reader import ShardReader
from .stats import RunStats
from .video import video_rows
from .video.video_config import VideoOptions

Images = Path | ShardReader


@dataclass(frozen=True)
class EngineFacts:
    """What a build's report says of where it ran: the device its models ran on, the actors
    (0 in this process) and the cluster's resources (empty in this process)."""

    device: str
    actors: int = 0
    resources: Mapping[str, float] = field(default_factory=dict)


class Engine(Protocol):
    """What a build asks of the engine it runs on."""

    def calibrates_here(self, enc: Encoder) -> bool:
        """Whether the driver's own calibration (precision and decoding) speaks for the engine's
        models: they run on this machine, on the driver encoder's kind of device."""
        ...

    def resolve_elsewhere(self, enc: Encoder, images: Images, previous_info: Mapping[str, Any] | None,
                          files: Sequence[ImageFile], keep_recorded: bool, decode: Decode,
                          recorded_decode: Mapping[str, Any] | None) -> dict[str, Any]:
        """The model info the engine's models report once calibrated where they run (asked only
        where :meth:`calibrates_here` is False); its ``_decode`` is the run's JPEG decoding and
        its ``_cpu_level`` the CPU level there."""
        ...

    def embed(self, enc: Encoder, images: Images, info: Mapping[str, Any], plan: UpdatePlan, writer: GenerationWriter,
              *, draft: bool, stop: Callable[[], bool] | None) -> RunStats:
        """Embed ``plan.to_embed`` into ``writer`` with the model ``info`` describes."""
        ...

    def embed_videos(self, enc: Encoder, images: Images, info: Mapping[str, Any], files: Sequence[ImageFile],
                     options: VideoOptions, sink: video_rows.VideoSink, *, updated: frozenset[bytes],
                     stop: Callable[[], bool] | None) -> video_rows.VideoStats:
        """Sample and embed the videos ``files`` with the model ``info`` describes, their rows
        written through ``sink`` in the order of ``files`` (:func:`indexer.video.video_rows.write_videos`)."""
        ...

    def facts(self, enc: Encoder) -> EngineFacts:
        """Where this run's models ran, for the report."""
        ...


@dataclass(frozen=True)
class LocalEngine:
    """This process: decoding in worker processes or threads, the model here (:mod:`indexer.embed`)."""

    cfg: BuildConfig

    def calibrates_here(self, enc: Encoder) -> bool:
        return True

    def resolve_elsewhere(self, enc: Encoder, images: Images, previous_info: Mapping[str, Any] | None,
                          files: Sequence[ImageFile], keep_recorded: bool, decode: Decode,
                          recorded_decode: Mapping[str, Any] | None) -> dict[str, Any]:
        raise AssertionError("the local engine calibrates where the build runs")

    def embed(self, enc: Encoder, images: Images, info: Mapping[str, Any], plan: UpdatePlan, writer: GenerationWriter,
              *, draft: bool, stop: Callable[[], bool] | None) -> RunStats:
        return embed_planned(self.cfg, enc, images, plan, writer, stop=stop, draft=draft)

    def embed_videos(self, enc: Encoder, images: Images, info: Mapping[str, Any], files: Sequence[ImageFile],
                     options: VideoOptions, sink: video_rows.VideoSink, *, updated: frozenset[bytes],
                     stop: Callable[[], bool] | None) -> video_rows.VideoStats:
        return video_rows.embed_videos(files, images, enc, options, sink, updated=updated, stop=stop)

    def facts(self, enc: Encoder) -> EngineFacts:
        return EngineFacts(device=str(enc.device))


__all__ = ["Engine", "EngineFacts", "Images", "LocalEngine"]
