"""One writer per index: an advisory POSIX record lock on ``INDEX_DIR/lock``.

The kernel releases the lock when its process dies, ``kill -9`` included, so a lock left by a
killed writer is simply taken over by the next one; the holder's description written into the
file is what a second writer's error message shows, and what tells the next writer that the
previous run did not finish. A POSIX lock (``lockf``), not ``flock``: forked DataLoader workers
do not inherit it, so a worker that outlives its killed parent for a moment does not keep the
index locked.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from retrieval.errors import IndexLockedError
from retrieval.faults import crash_point
from retrieval.layout import LOCK_FILE

_HELD: set[str] = set()
_HELD_GUARD = threading.Lock()


class IndexLock:
    """Exclusive writer lock of an index directory (use as a context manager).

    Attributes:
        previous_holder: the description left by a writer that died holding the lock, if any.
    """

    def __init__(self, index_dir: str | os.PathLike[str]) -> None:
        self.path = Path(index_dir) / LOCK_FILE
        self._fd: int | None = None
        self.previous_holder: dict[str, Any] | None = None

    def acquire(self) -> IndexLock:
        """Take the lock or fail at once.

        Raises:
            IndexLockedError: another process holds it (the message names that process).
        """
        key = os.path.realpath(self.path)
        with _HELD_GUARD:
            # POSIX locks never conflict within one process: exclude our own second writer here.
            if key in _HELD:
                raise IndexLockedError(f"{self.path.parent} is being written by this process (pid {os.getpid()}); wait for it to finish")
            _HELD.add(key)
        try:
            return self._acquire()
        except BaseException:
            with _HELD_GUARD:
                _HELD.discard(key)
            raise

    def _acquire(self) -> IndexLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EAGAIN):
                os.close(fd)
                raise
            holder = _read_holder(fd)
            os.close(fd)
            raise IndexLockedError(
                f"{self.path.parent} is being written by another clipsearch process ({_describe(holder)}); wait for it to finish"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        self.previous_holder = _read_holder(fd) or None
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": " ".join(sys.argv),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        os.fsync(fd)
        self._fd = fd
        crash_point("locked")
        return self

    def release(self) -> None:
        """Mark a clean finish (empty the file) and unlock."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
            fcntl.lockf(self._fd, fcntl.LOCK_UN)
        finally:
            os.close(self._fd)
            self._fd = None
            with _HELD_GUARD:
                _HELD.discard(os.path.realpath(self.path))

    def __enter__(self) -> IndexLock:
        return self.acquire()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        raw = os.pread(fd, 65536, 0)
        data = json.loads(raw.decode("utf-8")) if raw.strip() else {}
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "holder unknown"
    return f"pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}: {holder.get('command', '')}".rstrip(": ")
