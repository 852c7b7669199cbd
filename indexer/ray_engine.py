"""The Ray Data engine of a build (``--engine ray``): decode and embed on an actor pool.

The driver (this process) keeps what makes an index an index: discovery, the update plan, id
assignment, the precision record and every commit, through the same
:func:`indexer.embed.write_batches` as the local engine. Ray does the heavy part: the files to
embed become a dataset of ``(index, path)`` rows, ``map_batches`` sends them through a pool of
:class:`~indexer.ray_actor.EmbedActor` s (one model load per actor, ``num_gpus`` each when GPUs
are asked for), each of which reads, decodes, preprocesses and embeds its batch with the local engine's own
:class:`~indexer.dataset.ImageDataset` and encoder, and the vectors stream back in order.

Every node reads the files at the same path (a shared file system), and has clipsearch and
the model installed at the same place. Nothing here imports ray until a Ray build starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from retrieval.encoders import Encoder
from retrieval.errors import ClipSearchError, EngineError

from . import calibrate
from .build_config import BuildConfig, Decode
from .commit import GenerationWriter
from .discover import ImageFile
from .embed import EmbeddedBatch, write_batches
from .engine import EngineFacts
from .plan import UpdatePlan
from .ray_actor import ActorSpec, EmbedActor, calibrate_remote, from_columns
from .ray_parts import Stage, by_part, part_rows
from .shard_reader import ShardReader
from .sides.registry import decode_options
from .stats import RunStats
from .video.video_config import VideoOptions
from .video.video_rows import VideoSink, VideoStats

RAY_EXTRA = "pip install 'clipsearch[ray]'"
# A cluster address that does not answer fails within this many seconds (Ray itself retries
# for minutes before giving up on an unreachable head).
CONNECT_TIMEOUT_S = 10.0
# CPUs a CPU-only actor asks for by default: its torch and decode threads (more actors of
# fewer threads each do not pay on one machine: benchmarks/README.md, bench_ray).
DEFAULT_CPUS_PER_ACTOR = 4
# Files per block of the input dataset: a block is the unit Ray schedules and retries; more
# blocks than this is scheduling overhead without more parallelism.
MAX_BLOCKS = 4096
# Environment the actors need to act like the driver: the fault points of the crash tests,
# the CPU cap (the same precision candidates), offline switches and model caches.
_FORWARDED_PREFIXES = ("CLIPSEARCH_", "HF_", "TRANSFORMERS_", "OPENCLIP_")
_FORWARDED_NAMES = ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY", "FBGEMM_ENABLE_INSTRUCTIONS",
                    "OMP_WAIT_POLICY", "TORCH_HOME", "XDG_CACHE_HOME")


def import_ray() -> ModuleType:
    """``ray`` (with Ray Data), or a one-line error naming the extra to install."""
    try:
        import ray
        import ray.data  # noqa: F401 - the Data library is a separate extra of ray
    except ImportError as exc:
        raise EngineError(f"--engine ray needs Ray Data, which is not installed: {RAY_EXTRA}") from exc
    return ray


@dataclass(frozen=True)
class Pool:
    """The actor pool a run asks the cluster for."""

    actors: int
    cpus_per_actor: float
    gpus_per_actor: float

    @property
    def device(self) -> str:
        return "cuda" if self.gpus_per_actor > 0 else "cpu"

    @property
    def threads(self) -> int:
        return max(1, int(self.cpus_per_actor))


def plan_pool(cfg: BuildConfig, resources: Mapping[str, float]) -> Pool:
    """Actors and their resources from the options and what the cluster has.

    Raises:
        EngineError: GPUs asked of a cluster without (enough of) them, or more CPUs than it has
            (Ray would wait for them forever).
    """
    total_cpus = float(resources.get("CPU", 0.0))
    total_gpus = float(resources.get("GPU", 0.0))
    gpus = float(cfg.gpus_per_actor)
    if gpus > 0:
        if total_gpus <= 0:
            raise EngineError(f"--gpus-per-actor {gpus:g}: the Ray cluster has no GPUs; leave it out to embed on CPUs")
        actors = cfg.actors or max(1, int(total_gpus // gpus))
        if actors * gpus > total_gpus:
            raise EngineError(f"{actors} actors x {gpus:g} GPUs need {actors * gpus:g} GPUs; the Ray cluster has {total_gpus:g}")
        # The CPUs decode for the GPUs: share them out, keeping one for the driver's node.
        cpus = cfg.cpus_per_actor or max(1.0, math.floor(max(1.0, total_cpus - 1) / actors))
    else:
        cpus = cfg.cpus_per_actor or max(1.0, min(float(DEFAULT_CPUS_PER_ACTOR), total_cpus))
        actors = cfg.actors or max(1, int(total_cpus // cpus))
    if actors * cpus > total_cpus:
        raise EngineError(
            f"{actors} actors x {cpus:g} CPUs need {actors * cpus:g} CPUs; the Ray cluster has {total_cpus:g} "
            "(lower --actors or --cpus-per-actor)"
        )
    return Pool(actors, float(cpus), gpus)


def _host_port(address: str) -> tuple[str, int] | None:
    # "HOST:PORT" (the GCS) or "ray://HOST:PORT" (Ray Client); "auto" and "local" are Ray's own.
    if address in ("auto", "local"):
        return None
    parts = urlsplit(address if "://" in address else f"gcs://{address}")
    if not parts.hostname:
        raise EngineError(f"--ray-address {address!r} is not HOST:PORT, ray://HOST:PORT or auto")
    try:
        port = parts.port
    except ValueError as exc:
        raise EngineError(f"--ray-address {address!r} has a bad port") from exc
    return parts.hostname, port or (10001 if parts.scheme == "ray" else 6379)


def check_reachable(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Fail fast, with one line, when no Ray head answers at ``address``.

    Ray's own connect retries for minutes against an address that is down or is not Ray, so the
    head is probed first: a TCP connection, then the HTTP/2 greeting every gRPC server (Ray's
    GCS and its client server) answers with a SETTINGS frame.

    Raises:
        EngineError: refused, an unknown host, no answer within ``timeout`` seconds, or an
            answer that is not gRPC.
    """
    target = _host_port(address)
    if target is None:
        return
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection(target, timeout=timeout) as sock:
            sock.sendall(_HTTP2_PREFACE + _HTTP2_EMPTY_SETTINGS)
            head = b""
            while len(head) < 9:
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = sock.recv(9 - len(head))
                if not chunk:
                    break
                head += chunk
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or type(exc).__name__)
        raise EngineError(
            f"cannot reach the Ray cluster at {address}: {why}; is its head running (`ray start --head`)?"
        ) from exc
    if len(head) < 9 or head[3] != _HTTP2_SETTINGS:
        raise EngineError(f"{address} does not answer as a Ray head (no gRPC server there); check --ray-address")


# The client side of an HTTP/2 connection's start (RFC 9113, 3.4): the preface, then an empty
# SETTINGS frame; a server answers with a SETTINGS frame (type 0x4) of its own.
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_HTTP2_EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_HTTP2_SETTINGS = 0x04


@contextlib.contextmanager
def connected(address: str | None) -> Iterator[ModuleType]:
    """Ray, connected: to ``address`` (else ``RAY_ADDRESS``), else started on this machine.

    A Ray this process had already initialised is used as it is and left running; one started
    here is shut down at the end.
    """
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        check_reachable(address)
    _quiet_ray()
    try:
        if address:
            ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
        else:
            ray.init(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    except ClipSearchError:
        raise
    except Exception as exc:  # noqa: BLE001 - Ray's connection errors have no common base
        where = f"the Ray cluster at {address}" if address else "Ray on this machine"
        raise EngineError(f"cannot connect to {where}: {_first_line(exc)}") from exc
    try:
        yield ray
    finally:
        ray.shutdown()


def _quiet_ray() -> None:
    # Ray's INFO and WARNING lines (execution plans, log folders, the generated auth token, its
    # progress bars turned off) are for Ray's developers, not for users of the index command,
    # which prints its own progress; errors still show.
    for name in ("ray", "ray.data"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _runtime_env() -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k.startswith(_FORWARDED_PREFIXES) or k in _FORWARDED_NAMES}
    return {"env_vars": env} if env else {}


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
            model=self.cfg.model, device=self.pool.device, precision=precision,
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
                               runtime_env=_runtime_env(), max_retries=2)(calibrate_remote)
        sample = list(files[: calibrate.SAMPLE_TRIES])  # what resolve looks at, not every file
        try:
            info: dict[str, Any] = self.ray.get(task.remote(spec, dict(previous_info) if previous_info else None, sample,
                                                            keep_recorded, decode,
                                                            dict(recorded_decode) if recorded_decode else None))
        except Exception as exc:  # noqa: BLE001 - a RayTaskError wraps the actor's own error
            raise _task_error(exc) from exc
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

        resources = {"num_cpus": self.pool.cpus_per_actor, "num_gpus": self.pool.gpus_per_actor, "runtime_env": _runtime_env()}
        try:
            return embed_on_actors(self.ray, self.spec(images, info), options, files, sink, actors=self.pool.actors,
                                   resources=resources, updated=updated, stop=stop)
        except ClipSearchError:
            raise
        except Exception as exc:  # noqa: BLE001 - a RayTaskError or RayActorError wraps the actor's own error
            raise _task_error(exc) from exc

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
        _quiet_ray()
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
                runtime_env=_runtime_env(),
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
            raise _task_error(exc) from exc


def _task_error(exc: BaseException) -> ClipSearchError:
    cause = getattr(exc, "cause", None)
    if isinstance(cause, ClipSearchError):
        return cause
    return EngineError(f"the Ray job failed: {_first_line(exc)}")


@contextlib.contextmanager
def ray_run(cfg: BuildConfig) -> Iterator[RayRun]:
    """Connect (see :func:`connected`) and plan the actor pool of a ``cfg.engine == "ray"`` build."""
    with connected(cfg.ray_address) as ray:
        resources = {str(k): float(v) for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU", "memory", "object_store_memory")}
        pool = plan_pool(cfg, resources)
        here = ray.util.get_node_ip_address()
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        yield RayRun(ray, cfg, pool, resources, this_machine=all(n.get("NodeManagerAddress") == here for n in nodes))


__all__ = [
    "CONNECT_TIMEOUT_S",
    "RAY_EXTRA",
    "Pool",
    "RayRun",
    "check_reachable",
    "connected",
    "import_ray",
    "plan_pool",
    "ray_run",
]

