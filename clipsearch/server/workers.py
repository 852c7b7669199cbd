"""``clipsearch serve --workers N``: N uvicorn worker processes on one listening socket.

Each worker builds its own app from the same settings (passed in an environment variable, as
spawned processes inherit it) and opens every index with its FAISS file memory-mapped, so the
workers share the index's pages in the kernel's page cache instead of holding a copy each; each
follows new generations on its own (:class:`~retrieval.live.LiveIndex`). The query models are
loaded by every worker (they are not shared). Metrics use prometheus-client's multiprocess mode
in a temporary directory (:mod:`clipsearch.server.prometheus`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors.multiprocess import Multiprocess, Process

from retrieval.errors import ClipSearchError

from .app import create_app
from .prometheus import MULTIPROC_ENV, multiprocess_dir

SETTINGS_ENV = "CLIPSEARCH_SERVE_SETTINGS"
# How long a worker may take to load its indexes and models before the start counts as failed.
START_TIMEOUT_S = 600.0


def cpu_count() -> int:
    """The cores this process may run on (``--workers auto``)."""
    from retrieval.encoders.cpu import usable_cores

    return usable_cores()


def worker_app() -> FastAPI:
    """The app of one worker process (uvicorn's factory): :func:`create_app` over the settings
    the supervising process put in ``CLIPSEARCH_SERVE_SETTINGS``, FAISS files memory-mapped."""
    from threadpoolctl import ThreadpoolController

    settings: dict[str, Any] = json.loads(os.environ[SETTINGS_ENV])
    # Limits are per process: the supervisor's do not reach a spawned worker.
    ThreadpoolController().select(internal_api="openblas").limit(limits=int(settings.pop("blas_threads", 1)))
    index_dirs = settings.pop("index_dirs")
    try:
        return create_app(index_dirs, mmap=True, **settings)
    except ClipSearchError as exc:
        # One line, and the exit code that tells the supervisor not to start it again. Written in
        # one call: print() writes the text and its newline apart, and two workers failing at once
        # interleaved them on the shared stderr (one worker's line ran into the other's).
        sys.stderr.write(f"clipsearch: error: worker {os.getpid()}: {exc}\n")
        sys.stderr.flush()
        raise SystemExit(STARTUP_FAILURE) from None


class _Worker(Process):
    """uvicorn's worker process, its server made before the healthcheck thread starts.

    uvicorn makes a worker's ``Server`` on first use of ``Process.server``, and both the
    healthcheck thread (answering a ping already waiting) and the main thread (about to run the
    server) may make one at once. When the healthcheck's is the one kept, every answer says "not
    started" while the other server serves, and the supervisor waits :data:`START_TIMEOUT_S` for a
    worker that is ready. Workers uvicorn starts itself are its own ``Process``: one started
    again after a crash is only asked whether it answers, which either server does; one started by
    uvicorn's SIGHUP restart is asked whether it is ready, and there the race makes uvicorn give up
    the restart and keep the worker it had.
    """

    def target(self, sockets: list[socket.socket] | None = None) -> None:  # pragma: no cover (in the worker)
        self.server  # noqa: B018  # made here, in one thread, before the healthcheck thread exists
        super().target(sockets)


class _StopAsked(threading.Event):
    """Whether SIGINT or SIGTERM has come: uvicorn's handlers queue signals, and its supervisor
    reads the queue only once every worker is up, too late for a stop asked while they load. It
    reads that queue rather than being set by a handler of ours: setting an Event takes a lock,
    which a handler that interrupts its own thread must not."""

    def __init__(self, queue: list[int]) -> None:
        super().__init__()
        self.queue = queue

    def is_set(self) -> bool:
        return any(sig in (signal.SIGINT, signal.SIGTERM) for sig in self.queue)


class _Supervisor(Multiprocess):
    """uvicorn's supervisor, announcing once every worker is ready, and stopping at SIGINT/SIGTERM
    while they load."""

    def __init__(self, config: uvicorn.Config, sockets: list[socket.socket], on_ready: Callable[[], None]) -> None:
        super().__init__(config, sockets)
        self.on_ready = on_ready
        self.ready = False
        self.stopped_loading = False

    def init_processes(self) -> None:
        for _ in range(self.processes_num):
            process = _Worker(self.config, self.sockets)
            process.start()
            self.processes.append(process)
        stop = _StopAsked(self.signal_queue)
        if all(p.wait_until_ready(START_TIMEOUT_S, stop) for p in self.processes):
            self.ready = True
            self.on_ready()
        else:
            # A worker that failed to load would fail again, and a stop asked for now is a stop:
            # either way, stop them all.
            self.stopped_loading = stop.is_set()
            self.should_exit.set()


@contextmanager
def _main_not_rerun() -> Iterator[None]:
    # A spawned process runs the parent's __main__ script again (as __mp_main__) unless that is
    # guarded by `if __name__ == "__main__"`, which not every launcher of `clipsearch` is; the
    # workers need nothing from it (they import the app factory by name).
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or path is None or getattr(main, "__spec__", None) is not None:
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


def serve_workers(
    settings: Mapping[str, Any],
    sock: socket.socket,
    workers: int,
    on_ready: Callable[[], None],
    log_level: str = "warning",
) -> bool:
    """Serve with ``workers`` processes on ``sock`` until SIGINT/SIGTERM.

    Args:
        settings: :func:`create_app`'s arguments (JSON-able; ``index_dirs`` absolute), and
            ``blas_threads``.
        sock: the bound, listening socket the workers share.
        workers: how many worker processes.
        on_ready: called once every worker answers.
        log_level: uvicorn's log level.

    Returns:
        Whether every worker started or a stop was asked for while they loaded (False: one
        failed while loading; its error is on stderr).
    """
    os.environ[SETTINGS_ENV] = json.dumps(dict(settings))
    own_dir = None
    if multiprocess_dir() is None:
        own_dir = tempfile.mkdtemp(prefix="clipsearch-metrics-")
        os.environ[MULTIPROC_ENV] = own_dir
    try:
        config = uvicorn.Config(
            f"{__name__}:worker_app",
            factory=True,
            workers=workers,
            log_level=log_level,
            access_log=log_level in ("info", "debug"),
            server_header=False,
            lifespan="off",
        )
        supervisor = _Supervisor(config, [sock], on_ready)
        with _main_not_rerun():
            supervisor.run()
        return supervisor.ready or supervisor.stopped_loading
    finally:
        os.environ.pop(SETTINGS_ENV, None)
        if own_dir is not None:
            os.environ.pop(MULTIPROC_ENV, None)
            shutil.rmtree(own_dir, ignore_errors=True)


__all__ = ["SETTINGS_ENV", "cpu_count", "serve_workers", "worker_app"]
