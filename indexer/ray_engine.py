"""The Ray Data engine of a build (``--engine ray``): decode and embed on an actor pool.

The driver (this process) keeps what makes an index an index: discovery, the update plan, id
assignment, the precision record and every commit, through the same
:func:`indexer.embed.write_batches` as the local engine. Ray does the heavy part: the files to
embed become a dataset of ``(index, path)`` rows, ``map_batches`` sends them through a pool of
:class:`~indexer.ray_actor.EmbedActor` s (one model load per actor, ``num_gpus`` each when GPUs
are asked for), each of which reads, decodes, preprocesses and embeds its batch with the local engine's own
:class:`~indexer.dataset.ImageDataset` and encoder, and the vectors stream back in order.

Every node reads the files at the same path (a shared file system), and has clipsearch and
the model installed at the same place. The cluster is reached, and the pool sized to it, by
:mod:`indexer.ray_cluster`, which alone imports ray: this module works with the module it hands over.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from retrieval.encoders import DEFAULT_MODEL, Encoder
from retrieval.errors import ClipSearchError, EngineError

from . import calibrate
from .build_config import BuildConfig, Decode
from .commit import GenerationWriter
from .discover import ImageFile
from .embed import EmbeddedBatch, write_batches
from .engine import EngineFacts
from .plan import UpdatePlan
from .ray_actor import ActorSpec, EmbedActor, calibrate_remote, from_columns
from .ray_cluster import Pool, connected, plan_pool, quiet_ray, runtime_env, task_error
from .ray_parts import Stage, by_part, part_rows
from .shard_reader import ShardReader
from .sides.registry import decode_options
from .stats import RunStats
from .video.video_config import VideoOptions
from .video.video_rows import VideoSink, VideoStats

# Files per block of the input dataset: a block is the unit Ray schedules and retries; more
# blocks than this is scheduling overhead without more parallelism.
MAX_BLOCKS = 4096


@dataclass
class RayRun:
    """A connected Ray session for one build: resolves the precision, then embeds."""

    ray: ModuleType
    cfg: BuildConfig
    pool: Pool
    resources: dict[str, float]
    # Every node of the cluster is this machine (Ray started here, or nodes started beside it).
    this_machine: bool = False

    def calibrates_here(self, enc: Encoder) -> bool:
        """Whether the driver's own calibration speaks for the actors: they run on this machine,
        on the driver encoder's kind of device. Otherwise one Ray task calibrates on a node."""
        return self.this_machine and enc.device.type == self.pool.device

    def spec(self, photos: Path | ShardReader, info: Mapping[str, Any], ocr: bool = False, draft: bool = False) -> ActorSpec:
        """What an actor embeds with, from an encoder's ``info``: its precision (the mode chosen,
        or the one requested while ``auto`` is unresolved), int8 activation bits, image size, the
        runtime chosen (fp32 and int8), and the run's JPEG decoding (``draft``)."""
        precision = str(info.get("precision") or "fp32")
        size = info.get("embed_image_size")
        bits = info.get("int8_activation_bits") if precision == "int8" else None
        return ActorSpec(
            # The build resolved the model (named, or the index's) before opening this engine.
            model=self.cfg.model or DEFAULT_MODEL, device=self.pool.device, precision=precision,
            image_size=int(size) if size is not None else None, int8_activation_bits=int(bits) if bits is not None else None,
            root=b"" if isinstance(photos, ShardReader) else os.fsencode(photos), max_pixels=self.cfg.max_pixels,
            draft=draft, threads=self.pool.threads, shards=photos if isinstance(photos, ShardReader) else None,
            ocr=ocr, image_runtime=str(info["image_runtime"]) if info.get("image_runtime") else None,
        )

    def resolve_precision(self, enc: Encoder, photos: Path | ShardReader, previous_info: Mapping[str, Any] | None,
                          files: Sequence[ImageFile], keep_recorded: bool, decode: Decode = "auto",
                          recorded_decode: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The model info an actor's encoder reports after the local engine's calibration,
        run as one Ray task with an actor's resources on the first files to embed; its
        ``_decode`` is the run's JPEG decoding (:func:`indexer.calibrate.resolve_decode`), decided
        there too, from ``decode`` and the index's ``recorded_decode``."""
        spec = self.spec(photos, enc.info)  # the requested mode: auto, calibrated in the task
        task = self.ray.remote(num_cpus=self.pool.cpus_per_actor, num_gpus=self.pool.gpus_per_actor,
                               runtime_env=runtime_env(), max_retries=2)(calibrate_remote)
        sample = list(files[: calibrate.SAMPLE_TRIES])  # what resolve looks at, not every file
        try:
            info: dict[str, Any] = self.ray.get(task.remote(spec, dict(previous_info) if previous_info else None, sample,
                                                            keep_recorded, decode,
                                                            dict(recorded_decode) if recorded_decode else None))
        except Exception as exc:  # noqa: BLE001 - a RayTaskError wraps the actor's own error
            raise task_error(exc) from exc
        return info

    def resolve_elsewhere(self, enc: Encoder, images: Path | ShardReader, previous_info: Mapping[str, Any] | None,
                          files: Sequence[ImageFile], keep_recorded: bool, decode: Decode,
                          recorded_decode: Mapping[str, Any] | None) -> dict[str, Any]:
        """:class:`~indexer.engine.Engine`'s calibration where the actors run: :meth:`resolve_precision`."""
        return self.resolve_precision(enc, images, previous_info, files, keep_recorded, decode, recorded_decode)

    def embed(self, enc: Encoder, images: Path | ShardReader, info: Mapping[str, Any], plan: UpdatePlan,
              writer: GenerationWriter, *, draft: bool, stop: Callable[[], bool] | None) -> RunStats:
        """:class:`~indexer.engine.Engine`'s embedding: the actors embed with ``info``'s model
        (the driver's encoder only described it); ``stop`` is the local engine's (a Ray job
        is stopped by its driver's interrupt)."""
        return self.embed_spec(self.spec(images, info, **decode_options(writer.meta.sides), draft=draft), plan, writer)

    def embed_videos(self, enc: Encoder, images: Path | ShardReader, info: Mapping[str, Any], files: Sequence[ImageFile],
                     options: VideoOptions, sink: VideoSink, *, updated: frozenset[bytes],
                     stop: Callable[[], bool] | None) -> VideoStats:
        """:class:`~indexer.engine.Engine`'s videos: one video per task on actors with ``info``'s
        model (:mod:`indexer.ray_videos`), written here in order."""
        from .ray_videos import embed_on_actors

        resources = {"num_cpus": self.pool.cpus_per_actor, "num_gpus": self.pool.gpus_per_actor, "runtime_env": runtime_env()}
        try:
            return embed_on_actors(self.ray, self.spec(images, info), options, files, sink, actors=self.pool.actors,
                                   resources=resources, updated=updated, stop=stop)
        except ClipSearchError:
            raise
        except Exception as exc:  # noqa: BLE001 - a RayTaskError or RayActorError wraps the actor's own error
            raise task_error(exc) from exc

    def facts(self, enc: Encoder) -> EngineFacts:
        """The actors' device, their number and the cluster's resources."""
        return EngineFacts(device=self.pool.device, actors=self.pool.actors, resources=dict(self.resources))

    def embed_spec(self, spec: ActorSpec, plan: UpdatePlan, writer: GenerationWriter) -> RunStats:
        """Embed ``plan.to_embed`` on the actor pool into ``writer`` (same stats as the local engine).

        With ``ray_write`` auto or actors the actors write the rows as parts into a staging
        folder of the index and the driver links them (:mod:`indexer.ray_parts`); with driver
        the rows travel back and the driver writes them."""
        stats = RunStats.start(self.cfg, self.pool.device)
        files = plan.to_embed
        stats.workers = self.pool.actors
        stats.threads = self.pool.threads
        if not files:
            return stats
        if self.cfg.ray_write == "driver":
            stats.written_by = "driver"
            self._run(spec, stats.batch_size, plan, writer, stats, None)
            return stats
        stage = Stage(writer, required=self.cfg.ray_write == "actors")
        try:
            self._run(dataclasses.replace(spec, stage=stage.ref, model_batch=stats.batch_size),
                      part_rows(stats.batch_size, len(files), self.pool.actors, self.cfg.commit_every), plan, writer, stats, stage)
        except BaseException:
            stage.discard()
            raise
        stage.release()
        stats.written_by = stage.written_by
        if stage.by_driver and self.cfg.progress:
            print(f"clipsearch: {stage.fallback_note()}", file=sys.stderr, flush=True)
        return stats

    def _run(self, spec: ActorSpec, batch_size: int, plan: UpdatePlan, writer: GenerationWriter, stats: RunStats,
             stage: Stage | None) -> None:
        import pyarrow as pa

        files = plan.to_embed
        # Blocks of whole batches, so that a batch never spans two blocks (two model calls).
        rows = batch_size * max(1, math.ceil(len(files) / (MAX_BLOCKS * batch_size)))
        # A shard member's listing, so that an actor reads its bytes straight from the store; and,
        # where the actor writes the part, all the member came with.
        samples = stage is not None and spec.shards is not None
        blocks = [
            pa.table({"index": pa.array(np.arange(i, min(i + rows, len(files)), dtype=np.int64)),
                      "rel": pa.array([f.rel for f in files[i: i + rows]], pa.binary()),
                      "size": pa.array([f.size for f in files[i: i + rows]], pa.int64()),
                      "mtime": pa.array([f.mtime_ns for f in files[i: i + rows]], pa.int64()),
                      "offset": pa.array([f.sample.offset if f.sample else -1 for f in files[i: i + rows]], pa.int64()),
                      **({"sample": pa.array([json.dumps(dataclasses.asdict(f.sample)) if f.sample else ""
                                              for f in files[i: i + rows]], pa.string())} if samples else {})})
            for i in range(0, len(files), rows)
        ]
        data = self.ray.data
        quiet_ray()
        ctx = data.DataContext.get_current()
        saved = (ctx.execution_options.preserve_order, ctx.enable_progress_bars)
        # Rows come back in the plan's order, so ids are assigned as a local build assigns them.
        ctx.execution_options.preserve_order = True
        ctx.enable_progress_bars = False
        try:
            ds = data.from_arrow(blocks).map_batches(
                EmbedActor,
                fn_constructor_args=(spec,),
                batch_size=batch_size,
                batch_format="numpy",
                compute=data.ActorPoolStrategy(size=self.pool.actors),
                num_cpus=self.pool.cpus_per_actor,
                num_gpus=self.pool.gpus_per_actor or None,
                # Ray Data restarts a killed actor and retries its batch (max_restarts=-1 by
                # default); broken images are skip records inside a batch and never fail it.
                runtime_env=runtime_env(),
            )
            batches = self._in_order(ds, stage)
            if stage is not None:
                batches = stage.link(batches, files, spec.ocr, writer.meta.dim)
            write_batches(self.cfg, plan, writer, batches, stats)
        finally:
            ctx.execution_options.preserve_order, ctx.enable_progress_bars = saved

    def _in_order(self, ds: Any, stage: Stage | None) -> Iterator[EmbeddedBatch]:
        expected = 0
        try:
            for block in ds.iter_batches(batch_size=None, batch_format="numpy"):
                if stage is not None:
                    stage.check_answer(block)
                for cols in by_part(block):
                    batch = from_columns(cols)
                    first = batch.items[0].index if batch.items else expected
                    if first != expected:
                        # ids follow arrival order: anything but the plan's order would not be a
                        # local build's index, so stop before committing it.
                        raise EngineError(f"Ray returned file {first} where file {expected} was due; nothing of it was committed")
                    expected += len(batch.items)
                    yield batch
        except ClipSearchError:
            raise
        except Exception as exc:  # noqa: BLE001 - Ray wraps an actor's error in its own types
            raise task_error(exc) from exc


@contextlib.contextmanager
def ray_run(cfg: BuildConfig) -> Iterator[RayRun]:
    """Connect (see :func:`connected`) and plan the actor pool of a ``cfg.engine == "ray"`` build."""
    with connected(cfg.ray_address) as ray:
        resources = {str(k): float(v) for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU", "memory", "object_store_memory")}
        pool = plan_pool(cfg, resources)
        here = ray.util.get_node_ip_address()
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        yield RayRun(ray, cfg, pool, resources, this_machine=all(n.get("NodeManagerAddress") == here for n in nodes))


__all__ = ["RayRun", "ray_run"]
