"""``clipsearch serve``: the HTTP API and the web UI over one or more indexes.

FastAPI and uvicorn (the ``server`` extra) are imported only when the command runs, so the rest
of the CLI works without them.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import gc
import ipaddress
import os
import socket
import sys
from typing import TYPE_CHECKING, Any

from retrieval.errors import ClipSearchError, InvalidArgumentError

from ._common import PROG, add_device_arguments, add_precision_argument, int_at_least, positive_int

if TYPE_CHECKING:
    from ._common import Subparsers

TOKEN_ENV = "CLIPSEARCH_TOKEN"
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


class ServerExtraMissingError(ClipSearchError):
    """FastAPI / uvicorn are not installed."""


class ServerStartError(ClipSearchError):
    """A worker process could not start."""


def _worker_count(value: str) -> int:
    from clipsearch.server.workers import cpu_count

    return cpu_count() if value == "auto" else int(value)


def _workers(text: str) -> str:
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of processes or auto, got {text!r}") from None
    if not 1 <= value <= 256:
        raise argparse.ArgumentTypeError(f"must be in 1..256 (or auto), got {value}")
    return str(value)


def _resource(text: str) -> tuple[str, float]:
    name, _, amount = text.partition("=")
    try:
        value = float(amount) if amount else 1.0
    except ValueError:
        value = 0.0
    if not name or not value > 0:
        raise argparse.ArgumentTypeError(f"a resource is NAME or NAME=AMOUNT with AMOUNT > 0, got {text!r}")
    return name, value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value <= 300:
        raise argparse.ArgumentTypeError(f"must be in (0, 300], got {text}")
    return value


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound now: a port in use is a one-line error before any model loads."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise InvalidArgumentError(f"cannot listen on {host}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise InvalidArgumentError(f"port {port} on {host} is in use; pick another with --port (0: any free port)") from None
        raise InvalidArgumentError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock


def _url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}/"


def run(args: argparse.Namespace) -> int:
    """Serve the indexes until Ctrl-C or SIGTERM (exit 0)."""
    try:
        import uvicorn  # noqa: F401  # imported here to fail early, used by _serve_forever
        from threadpoolctl import ThreadpoolController

        from clipsearch.server import create_app
    except ImportError:
        raise ServerExtraMissingError("install the server extra: pip install 'clipsearch[server]'") from None

    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV) or None
    workers = _worker_count(args.workers)
    settings: dict[str, Any] = {
        "token": token,
        "max_upload_mb": args.max_upload_mb,
        "cache_dir": args.cache_dir,
        "browser_ui": not args.no_browser_ui,
        "model": args.model,
        "device": args.device,
        "precision": args.precision,
        "query_cache": args.query_cache,
        "allow_image_urls": args.allow_image_urls,
        "cors_origins": list(args.cors_origin or ()),
        "metrics": not args.no_metrics,
    }
    if args.image_url_timeout is not None:  # else ServerConfig's default
        settings["image_url_timeout_s"] = args.image_url_timeout
    # Requests run side by side and each matrix product of a text query is small: OpenBLAS's
    # extra threads (which busy-wait between calls) only take cores from the other requests
    # (bench_serve's measurements: benchmarks/README.md).
    ThreadpoolController().select(internal_api="openblas").limit(limits=args.blas_threads)
    if args.ray:
        return _serve_ray(args, settings)
    sock = _bind(args.host, args.port)
    try:
        if token is None and not _is_loopback(args.host):
            print(
                f"{PROG}: warning: serving on {args.host} without a token: anyone who can reach it can search "
                f"and read the indexed images; set --token or {TOKEN_ENV}",
                file=sys.stderr,
            )
        url = _url(args.host, sock.getsockname()[1])
        if workers > 1:
            _serve_workers(args, settings, sock, url, workers)
        else:
            _serve_forever(create_app(args.index_dirs, **settings), sock, url, args.log_level)
    finally:
        sock.close()
    return 0


def _serve_workers(args: argparse.Namespace, settings: dict[str, Any], sock: socket.socket, url: str, workers: int) -> None:
    from clipsearch.server import create_app
    from clipsearch.server.workers import serve_workers

    # Opened here first (no model loaded): a directory that is not an index is a one-line
    # error now, not a worker dying N times.
    create_app(args.index_dirs, **{**settings, "metrics": False}, warm=False, mmap=True)
    gc.collect()  # the checking app holds reference cycles: free its indexes before serving
    index_dirs = [os.path.abspath(d) for d in args.index_dirs]
    cache_dir = os.path.abspath(args.cache_dir) if args.cache_dir else None

    def announce() -> None:
        print(f"{PROG}: {workers} workers", file=sys.stderr)
        print(f"{PROG}: serving {url}", file=sys.stderr, flush=True)

    full = {**settings, "index_dirs": index_dirs, "cache_dir": cache_dir, "blas_threads": args.blas_threads}
    if not serve_workers(full, sock, workers, announce, args.log_level):
        raise ServerStartError("a worker failed to start (its error is above)")


def _serve_ray(args: argparse.Namespace, settings: dict[str, Any]) -> int:
    """Deploy the shard set on Ray Serve and wait for Ctrl-C; the application is deleted on the way out."""
    import signal
    import threading

    try:
        from clipsearch.server.cluster import ClusterOptions, deploy, undeploy
    except ImportError:
        raise ServerExtraMissingError("install the cluster extra: pip install 'clipsearch[cluster]'") from None
    if len(args.index_dirs) != 1:
        raise InvalidArgumentError("serve --ray takes one shard set (made by `clipsearch shard`)")
    if args.workers != "1":
        raise InvalidArgumentError("serve --ray runs --routers replicas instead of --workers processes")
    options = ClusterOptions(replicas=args.replicas, routers=args.routers, deadline_s=args.shard_deadline,
                             max_replicas_per_node=args.max_replicas_per_node, max_routers_per_node=args.max_routers_per_node,
                             shard_resources=tuple(args.shard_resource or ()), router_resources=tuple(args.router_resource or ()))
    started = deploy(args.index_dirs[0], options, settings, address=args.address, http={"host": args.host, "port": args.port})
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"{PROG}: serving {_url(args.host, args.port)} on Ray Serve ({args.replicas} replicas per shard, {args.routers} routers)",
          file=sys.stderr, flush=True)
    try:
        stop.wait()
    finally:
        undeploy(started)
    return 0


def _serve_forever(app: Any, sock: socket.socket, url: str, log_level: str) -> None:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, saying once where it listens, and leaving on SIGINT/SIGTERM cleanly."""

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                print(f"{PROG}: serving {url}", file=sys.stderr, flush=True)

        def handle_exit(self, sig: int, frame: Any) -> None:
            super().handle_exit(sig, frame)
            # uvicorn re-raises the signal after its graceful shutdown (the process would die of
            # it, or raise KeyboardInterrupt); a requested stop is a clean exit (0) here.
            with contextlib.suppress(AttributeError):
                self._captured_signals.clear()

    # uvicorn's access log only when asked for (--log-level info/debug); no lifespan: the app
    # loads everything in create_app, before the first request can arrive.
    config = uvicorn.Config(app, log_level=log_level, access_log=log_level in ("info", "debug"), server_header=False, lifespan="off")
    Server(config).run(sockets=[sock])


def _upload_mb(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of MiB, got {text!r}") from None
    if not 0 < value <= 4096:
        raise argparse.ArgumentTypeError(f"must be in (0, 4096], got {text}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be in 0..65535, got {value}")
    return value


def register(subparsers: Subparsers) -> None:
    """Add ``serve`` to the ``clipsearch`` sub-parsers."""
    p = subparsers.add_parser(
        "serve",
        help="serve indexes over HTTP: a JSON search API and a web UI",
        description="Serve one or more indexes over HTTP: a JSON search API under /api, OpenAPI docs at /docs, "
        "and a web UI at /. Indexes updated by `clipsearch index` or `reindex` are picked up without a restart.",
    )
    p.add_argument("index_dirs", metavar="INDEX_DIR", nargs="+", help="indexes to serve, by directory name (the first is the default)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=_port, default=8000, help="port (default: 8000; 0 picks a free one)")
    p.add_argument("--model", help="query model (default: the one recorded in each index; must be the same weights)")
    add_device_arguments(p)
    add_precision_argument(p, "auto", "text query tower precision")
    p.add_argument(
        "--query-cache", type=int_at_least(0), default=1024, metavar="N",
        help="distinct query texts per index whose vectors are kept, so a repeated query skips the text tower (default: 1024; 0: none)",
    )
    p.add_argument("--max-upload-mb", type=_upload_mb, default=20, metavar="MB", help="largest query image accepted (default: 20)")
    p.add_argument("--token", help=f"require 'Authorization: Bearer TOKEN' on every /api request (default: ${TOKEN_ENV})")
    p.add_argument("--cache-dir", metavar="DIR", help="thumbnail cache (default: $XDG_CACHE_HOME/clipsearch/thumbnails)")
    p.add_argument("--no-browser-ui", action="store_true", help="serve the API only, not the web UI at /")
    p.add_argument(
        "--blas-threads", type=positive_int, default=1, metavar="N",
        help="OpenBLAS threads per matrix product (numpy text tower, FAISS batches; the exact text tower's ONNX Runtime "
        "session takes the same count); 1 (default) suits concurrent requests",
    )
    p.add_argument(
        "--workers", type=_workers, default="1", metavar="N",
        help="worker processes sharing the port and the memory-mapped index files; auto: one per core (default: 1)",
    )
    p.add_argument(
        "--cors-origin", action="append", metavar="ORIGIN",
        help="let web pages from ORIGIN (scheme://host[:port], or * for any) call the API, e.g. clip-front; repeatable (default: none)",
    )
    p.add_argument(
        "--allow-image-urls", action="store_true",
        help="let /knn-service fetch the image_url a caller names (off by default: the server would fetch any URL it is given)",
    )
    p.add_argument(
        "--image-url-timeout", type=_seconds, metavar="S",
        help="longest image_url fetch, in seconds; its size cap is --max-upload-mb (default: 10)",
    )
    p.add_argument("--no-metrics", action="store_true", help="do not serve Prometheus metrics at /metrics")
    p.add_argument(
        "--ray", action="store_true",
        help="serve a shard set (clipsearch shard) on Ray Serve: each shard a deployment, routers that fan out and merge",
    )
    p.add_argument("--address", help="--ray: the Ray cluster to join (default: $RAY_ADDRESS, else a local Ray is started)")
    p.add_argument("--replicas", type=positive_int, default=2, metavar="R", help="--ray: replicas of each shard (default: 2)")
    p.add_argument("--routers", type=positive_int, default=2, metavar="N", help="--ray: router replicas (default: 2)")
    p.add_argument(
        "--max-replicas-per-node", type=positive_int, metavar="N",
        help="--ray: at most N replicas of one shard on a node (1: a lost node loses one replica of a shard at most)",
    )
    p.add_argument(
        "--max-routers-per-node", type=positive_int, metavar="N",
        help="--ray: at most N routers on a node (1, with --routers the number of nodes: a router on each node, "
        "so that a lost node fails no request entering another node)",
    )
    p.add_argument(
        "--shard-resource", action="append", type=_resource, metavar="NAME[=N]",
        help="--ray: a custom Ray resource every shard replica needs (default amount 1; repeatable)",
    )
    p.add_argument(
        "--router-resource", action="append", type=_resource, metavar="NAME[=N]",
        help="--ray: a custom Ray resource every router replica needs (keep routers off the shard nodes)",
    )
    p.add_argument(
        "--shard-deadline", type=_seconds, default=5.0, metavar="S",
        help="seconds each shard has to answer; a result without a shard says partial (default: 5)",
    )
    p.add_argument(
        "--log-level", choices=LOG_LEVELS, default="warning", help="server log level; info and debug log every request (default: warning)"
    )
    p.set_defaults(handler=run)
