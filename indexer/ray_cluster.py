"""The Ray cluster of an ``--engine ray`` build: reached, and the actor pool sized to it.

The only module of the build that imports ray, inside functions, so that a local build never
does (the engine that runs on the cluster: :mod:`indexer.ray_engine`). An address that does not
answer as a Ray head fails in seconds with one line rather than after Ray's minutes of retries;
the pool's actors, CPUs and GPUs are planned from the options and what the cluster has; the
environment the actors need travels with them, and Ray's own errors and log lines become ours.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

from retrieval.errors import ClipSearchError, EngineError

from .build_config import BuildConfig

RAY_EXTRA = "pip install 'clipsearch[ray]'"
# A cluster address that does not answer fails within this many seconds (Ray itself retries
# for minutes before giving up on an unreachable head).
CONNECT_TIMEOUT_S = 10.0
# CPUs a CPU-only actor asks for by default: its torch and decode threads (more actors of
# fewer threads each do not pay on one machine: benchmarks/README.md, bench_ray).
DEFAULT_CPUS_PER_ACTOR = 4
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
        raise EngineError(f"the Ray address {address!r} is not HOST:PORT, ray://HOST:PORT or auto")
    try:
        port = parts.port
    except ValueError as exc:
        raise EngineError(f"the Ray address {address!r} has a bad port") from exc
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
        raise EngineError(f"{address} does not answer as a Ray head (no gRPC server there); check the Ray address")


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
    quiet_ray()
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


def quiet_ray() -> None:
    """Ray's own loggers down to errors."""
    # Ray's INFO and WARNING lines (execution plans, log folders, the generated auth token, its
    # progress bars turned off) are for Ray's developers, not for users of the index command,
    # which prints its own progress; errors still show.
    for name in ("ray", "ray.data"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def runtime_env() -> dict[str, Any]:
    """What a task or actor of the run starts with: the driver's environment variables it needs."""
    env = {k: v for k, v in os.environ.items() if k.startswith(_FORWARDED_PREFIXES) or k in _FORWARDED_NAMES}
    return {"env_vars": env} if env else {}


def task_error(exc: BaseException) -> ClipSearchError:
    """A failed Ray task or actor as our error: the actor's own typed error where Ray wraps one."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, ClipSearchError):
        return cause
    return EngineError(f"the Ray job failed: {_first_line(exc)}")


__all__ = [
    "CONNECT_TIMEOUT_S",
    "DEFAULT_CPUS_PER_ACTOR",
    "RAY_EXTRA",
    "Pool",
    "check_reachable",
    "connected",
    "import_ray",
    "plan_pool",
    "quiet_ray",
    "runtime_env",
    "task_error",
]
