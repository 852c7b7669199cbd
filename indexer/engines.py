"""Where a build's embedding stage runs: the engines a build plugs in.

:mod:`indexer.build` asks an :class:`Engine` four things (whether the driver's calibration
speaks for it, the calibration where it does not, the embedding of a plan's files into the
writer, and the facts its report states) and names no engine. ``local`` runs in this process
(:mod:`indexer.embed`); ``ray`` on a Ray Data actor pool (:mod:`indexer.ray_engine`, imported
only when a build asks for it). A new engine is one more entry in :data:`ENGINES`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from retrieval.encoders import Encoder

from .commit import GenerationWriter
from .config import BuildConfig, Decode
from .discover import ImageFile
from .embed import embed_planned
from .plan import UpdatePlan
from .shards import ShardReader
from .stats import RunStats

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

    def facts(self, enc: Encoder) -> EngineFacts:
        return EngineFacts(device=str(enc.device))


def _local(cfg: BuildConfig) -> AbstractContextManager[Engine]:
    return contextlib.nullcontext(LocalEngine(cfg))


def _ray(cfg: BuildConfig) -> AbstractContextManager[Engine]:
    from .ray_engine import ray_run  # Ray is imported only by a build that runs on it

    return ray_run(cfg)


# The engines by name (BuildConfig.engine): each opens for one build and closes after it.
# (indexer.config.ENGINES lists the same names for the option's check, before anything is opened.)
ENGINES: dict[str, Callable[[BuildConfig], AbstractContextManager[Engine]]] = {"local": _local, "ray": _ray}


# Engines whose workers load the model themselves, from the build's model name: a build on one
# cannot take an encoder loaded by the caller.
LOADS_ITS_OWN_MODEL = frozenset({"ray"})


def open_engine(cfg: BuildConfig) -> AbstractContextManager[Engine]:
    """The engine ``cfg.engine`` names, opened for one build (a cluster is connected here, so one
    that does not answer fails before the walk and the model load)."""
    return ENGINES[cfg.engine](cfg)


__all__ = ["ENGINES", "LOADS_ITS_OWN_MODEL", "Engine", "EngineFacts", "Images", "LocalEngine", "open_engine"]
