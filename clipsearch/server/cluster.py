"""``clipsearch serve --ray``: a shard set served by Ray Serve.

Each shard is a Serve deployment of ``replicas`` replicas (:class:`ShardReplica`, a
:class:`~retrieval.partition_shard.ShardSearcher`; Serve spreads them over the nodes); the
routers are ``routers`` replicas of one ingress deployment whose ASGI app is the same app as
``clipsearch serve``'s (:func:`clipsearch.server.create_app`), its shards reached through
deployment handles (:class:`RayShard`). Serve's HTTP proxy on every node answers the API and UI.

A request's path survives the loss of any node but the one it entered: a call to a shard whose
replica is lost is sent again to another replica (:class:`RayShard`), and Serve's proxy hands a
request only to a router on its own node where one lives there
(:class:`~clipsearch.server.node_routing.OwnNodeRouters`), which never refuses one
(:data:`ROUTER_MAX_ONGOING`); so with a router on each node that takes traffic
(``max_routers_per_node=1``), no request waits in a router on another node. A request in a
router that dies fails (Serve's proxy does not send it again), hence the rule.

Before anything is deployed, every shard is checked against the set and verified (its files'
checksums); a failure names the shard. A deployment that fails to start is deleted, and a Ray
started here is shut down: nothing half-deployed is left running. Ray comes from ``--address``,
else ``RAY_ADDRESS``, else a local Ray is started.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from indexer.ray_cluster import check_reachable
from retrieval.checks import is_positive_int
from retrieval.errors import ClipSearchError, EngineError, IndexCorruptError, InvalidArgumentError
from retrieval.partition_set import PartitionSet, ShardRef, check_shards, read_partition_set
from retrieval.partition_shard import ShardSearcher
from retrieval.partitions import DEFAULT_DEADLINE_S, Pending, ShardClient

APP_NAME = "clipsearch"
# Seconds a TCP connection to a Ray address has before it is called unreachable.
CONNECT_TIMEOUT_S = 5.0
# The HTTP proxy gives a request this many shard deadlines (the query's embedding, the fan-out,
# the hits' rows) before it answers with a timeout.
REQUEST_TIMEOUT_FACTOR = 6
# Tries of one shard call whose replica is lost or slow (each on a replica Serve still knows).
TRIES = 3
# The share of the deadline after which a call not answered yet is also sent to another replica.
HEDGE_AFTER = 0.5
# With two tries out, how long each is waited for in turn.
POLL_S = 0.02
# Requests a router replica takes at once before Serve's proxy looks for another router: high
# enough never to be reached (the proxy's request timeout bounds a queue instead), so that a
# proxy keeps every request on its own node's router rather than one on another node, whose
# loss would fail the request.
ROUTER_MAX_ONGOING = 10_000


@dataclass(frozen=True)
class ClusterOptions:
    """How a set is deployed: ``replicas`` per shard, ``routers``, the per-shard deadline, the
    CPUs each replica reserves, whether shards are verified first, how each replica reads its
    FAISS file (``mmap``, as ``serve --mmap``) and at most how many replicas of one shard a node
    holds (``max_replicas_per_node``, Serve's: 1 puts each replica of a shard on another node,
    so that losing a node loses one replica of a shard at most; None leaves it to Serve), at
    most how many routers a node holds (``max_routers_per_node``: 1 with ``routers`` the number
    of nodes puts a router on each, so that every node's proxy has a router of its own), and
    the custom Ray resources a shard replica and a router replica each need (``{"shard": 1}``:
    only on nodes started with ``--resources '{"shard": N}'``: shards on the nodes with the
    memory, routers on others, so that losing a shard node loses no router).

    Raises:
        InvalidArgumentError: a count below 1, a deadline or CPU share not above 0.
    """

    replicas: int = 2
    routers: int = 2
    deadline_s: float = DEFAULT_DEADLINE_S
    shard_cpus: float = 1.0
    router_cpus: float = 1.0
    verify: bool = True
    mmap: bool | None = None
    max_replicas_per_node: int | None = None
    max_routers_per_node: int | None = None
    shard_resources: tuple[tuple[str, float], ...] = ()
    router_resources: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        for name in ("replicas", "routers", "max_replicas_per_node", "max_routers_per_node"):
            if name.startswith("max_") and getattr(self, name) is None:
                continue
            if not is_positive_int(getattr(self, name)):
                raise InvalidArgumentError(f"--{name.replace('_', '-')} must be an integer >= 1, got {getattr(self, name)!r}")
        for name in ("deadline_s", "shard_cpus", "router_cpus"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise InvalidArgumentError(f"{name} must be a number > 0, got {value!r}")
        for name in ("shard_resources", "router_resources"):
            for pair in getattr(self, name):
                if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str) and pair[0]
                        and isinstance(pair[1], (int, float)) and not isinstance(pair[1], bool) and pair[1] > 0):
                    raise InvalidArgumentError(f"{name} holds (resource name, amount > 0) pairs, got {pair!r}")


class ShardReplica:
    """A replica of one shard's deployment: its :class:`ShardSearcher`'s methods, by name."""

    def __init__(self, directory: str, mmap: bool | None) -> None:
        self._searcher = ShardSearcher.open(directory, mmap=mmap)

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self._searcher, method)(*args)


class _RayPending:
    """A call to a shard deployment, answered by the first replica that answers within the
    deadline. A try whose replica was lost is sent again (up to :data:`TRIES` in all); a try not
    answered by :data:`HEDGE_AFTER` of the deadline is also sent to another replica (a hedged
    request): a replica on a node that died without a word hangs until Ray notices, and the
    second try answers in the meantime. Serve sends each try to the replica with the fewest calls
    in flight, which is not the one holding the first."""

    def __init__(self, handle: Any, method: str, args: tuple[Any, ...]) -> None:
        self._handle, self._method, self._args = handle, method, args
        self._tries = [self._send()]
        self._sent = 1

    def _send(self) -> Any:
        return self._handle.call.remote(self._method, *self._args)

    def result(self, timeout: float | None = None) -> Any:
        started = time.monotonic()
        hedge_at = None if timeout is None else timeout * HEDGE_AFTER
        while True:
            elapsed = time.monotonic() - started
            if timeout is not None and elapsed >= timeout:
                self._cancel()  # not queued for a replica that will never take it
                raise TimeoutError(f"no replica answered {self._method} within {timeout} s")
            if hedge_at is not None and elapsed >= hedge_at and self._sent < TRIES and len(self._tries) == 1:
                self._tries.append(self._send())
                self._sent += 1
            # One try: wait for it up to the hedge (or the deadline); two: short turns on each.
            if len(self._tries) > 1:
                wait: float | None = POLL_S
            elif hedge_at is not None and elapsed < hedge_at:
                wait = hedge_at - elapsed
            else:
                wait = None if timeout is None else timeout - elapsed
            for response in list(self._tries):
                try:
                    value = response.result(timeout_s=wait)
                except ClipSearchError:
                    raise
                except TimeoutError:
                    continue
                except Exception:
                    # The replica was lost: another try, or the other try's answer.
                    self._tries.remove(response)
                    if self._sent < TRIES:
                        self._tries.append(self._send())
                        self._sent += 1
                    elif not self._tries:
                        raise
                    continue
                self._tries.remove(response)
                self._cancel()
                return value

    def _cancel(self) -> None:
        for response in self._tries:
            response.cancel()
        self._tries.clear()


class RayShard:
    """A shard reached through its Serve deployment's handle."""

    def __init__(self, name: str, handle: Any) -> None:
        self.name = name
        self._handle = handle

    def call(self, method: str, *args: Any) -> Pending:
        return _RayPending(self._handle, method, args)


class Router:
    """A router replica: ``clipsearch serve``'s app over the set, its shards reached by handle."""

    def __init__(self, set_dir: str, handles: dict[str, Any], settings: dict[str, Any], deadline_s: float) -> None:
        self._set_dir = set_dir
        self._handles = handles
        self._settings = settings
        self._deadline_s = deadline_s

    def __serve_build_asgi_app__(self) -> Any:
        from . import create_app

        handles = self._handles

        def connect(root: Path, shard: ShardRef) -> ShardClient:
            return RayShard(shard.name, handles[shard.name])

        return create_app([self._set_dir], **self._settings, shard_connect=connect, shard_deadline_s=self._deadline_s)


def check_set(set_dir: str | os.PathLike[str], verify: bool = True) -> PartitionSet:
    """The set at ``set_dir``, every shard checked against it and (``verify``) its files verified.

    Raises:
        NotAnIndexError, IndexFormatError: no set, a missing shard, a shard that disagrees with it.
        IndexCorruptError: a shard whose files fail ``clipsearch verify`` (named).
    """
    from retrieval.tools.verify import verify_index

    parts = read_partition_set(set_dir)
    check_shards(set_dir, parts)
    if verify:
        for shard in parts.shards:
            report = verify_index(Path(set_dir) / shard.path)
            if not report.ok:
                problem = report.problems[0]
                raise IndexCorruptError(
                    f"shard {shard.name!r} ({Path(set_dir) / shard.path / problem.file})", f"{problem.check}: {problem.detail}",
                    f"{problem.fix}, or make the set again; nothing was deployed",
                )
    return parts


def application(set_dir: str | os.PathLike[str], parts: PartitionSet, options: ClusterOptions, settings: dict[str, Any]) -> Any:
    """The Serve application of the set: a deployment per shard, the routers' ingress deployment."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from .node_routing import OwnNodeRouters

    root = Path(set_dir).resolve()
    spread: dict[str, Any] = {} if options.max_replicas_per_node is None else {"max_replicas_per_node": options.max_replicas_per_node}
    shard_apps = {
        s.name: serve.deployment(name=s.name, num_replicas=options.replicas,
                                 ray_actor_options={"num_cpus": options.shard_cpus, "resources": dict(options.shard_resources)},
                                 **spread)(ShardReplica).bind(str(root / s.path), options.mmap)
        for s in parts.shards
    }
    per_node: dict[str, Any] = {} if options.max_routers_per_node is None else {"max_replicas_per_node": options.max_routers_per_node}
    router = serve.deployment(name="router", num_replicas=options.routers, max_ongoing_requests=ROUTER_MAX_ONGOING,
                              ray_actor_options={"num_cpus": options.router_cpus, "resources": dict(options.router_resources)},
                              # (Ray annotates RequestRouterConfig's **kwargs as dicts)
                              request_router_config=RequestRouterConfig(request_router_class=OwnNodeRouters),  # type: ignore[arg-type]
                              **per_node)(serve.ingress()(Router))
    return router.bind(str(root), shard_apps, settings, options.deadline_s)


def connect_ray(address: str | None) -> bool:
    """Join the Ray at ``address`` (else ``RAY_ADDRESS``), or start one here; True when started here.

    Raises:
        EngineError: the address does not answer.
    """
    import ray

    address = address or os.environ.get("RAY_ADDRESS") or None
    if address not in (None, "auto", "local"):
        # The build's probe: a TCP connection, then gRPC's greeting (Ray's own connect retries
        # for minutes against an address that is down or is not Ray).
        check_reachable(address, CONNECT_TIMEOUT_S)
    try:
        ray.init(address=address, ignore_reinit_error=True, include_dashboard=False, logging_level=logging.ERROR,
                 log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise EngineError(f"cannot join Ray at {address}: {exc}".splitlines()[0]) from None
    return address is None


def deploy(set_dir: str | os.PathLike[str], options: ClusterOptions, settings: dict[str, Any], *,
           address: str | None = None, http: dict[str, Any] | None = None, proxy_location: str = "EveryNode",
           name: str = APP_NAME, route_prefix: str = "/") -> bool:
    """Check the set, join (or start) Ray and deploy the set on Serve as application ``name`` at
    ``route_prefix``; returns whether Ray was started here (the caller's :func:`undeploy` then
    stops it). ``http`` and ``proxy_location`` are Serve's (where its HTTP proxies listen:
    ``EveryNode``, ``HeadOnly``); they apply where this call starts Serve.

    Raises:
        The errors of :func:`check_set` and :func:`connect_ray`; EngineError: the deployment
        failed to start (its replicas' error named), after it was deleted.
    """
    from ray import serve

    parts = check_set(set_dir, options.verify)
    started = connect_ray(address)
    try:
        # A request that waits on a lost router gets the proxy's timeout, not a hang.
        http_options = {"host": "127.0.0.1", "port": 8000, "request_timeout_s": REQUEST_TIMEOUT_FACTOR * options.deadline_s, **(http or {})}
        serve.start(proxy_location=proxy_location, http_options=http_options)
        serve.run(application(set_dir, parts, options, settings), name=name, route_prefix=route_prefix)
    except BaseException as exc:
        undeploy(started, name)
        if isinstance(exc, ClipSearchError):
            raise
        said = str(exc).strip()
        raise EngineError(f"the shard set could not be deployed: {said.splitlines()[-1] if said else repr(exc)}") from None
    return started


def undeploy(started: bool, name: str = APP_NAME) -> None:
    """Delete the application ``name`` (and shut Serve and Ray down where Ray was started here)."""
    import ray
    from ray import serve

    if not ray.is_initialized():
        return
    try:
        serve.delete(name)
        if started:
            serve.shutdown()
    finally:
        if started:
            ray.shutdown()


__all__ = [
    "APP_NAME", "ROUTER_MAX_ONGOING", "ClusterOptions", "RayShard", "Router", "ShardReplica", "application", "check_set", "connect_ray",
    "deploy", "undeploy",
]
