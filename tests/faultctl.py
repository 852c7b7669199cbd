"""Driving :mod:`retrieval.faults` from a test: start the CLI with a crash or pause point, hold it
there, act, release it.

Nothing here waits for a duration: :meth:`Pauses.wait` returns when the process has written the
point's ``.reached`` file (it is then stopped there until :meth:`Pauses.release`), and fails at
once when the process exits instead. The timeouts are safety nets against a hung test only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from conftest import clipsearch_exe

from retrieval.faults import ENV, PAUSE_DIR_ENV, PAUSE_ENV

SAFETY_TIMEOUT = 180.0


@dataclass
class Finished:
    """How a CLI process ended."""

    pid: int
    returncode: int
    stdout: str
    stderr: str

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL


class Cli:
    """A ``clipsearch`` process started in the background (output to files: no pipe fills up)."""

    def __init__(self, args: Sequence[str | os.PathLike[str]], env: dict[str, str] | None = None) -> None:
        self._out = tempfile.TemporaryFile(mode="w+")
        self._err = tempfile.TemporaryFile(mode="w+")
        full_env = {**os.environ, "PYTHONWARNINGS": "default", **(env or {})}
        self.proc = subprocess.Popen([clipsearch_exe(), *map(os.fspath, args)], stdout=self._out, stderr=self._err, text=True, env=full_env)
        self.pid = self.proc.pid
        self._result: Finished | None = None

    def running(self) -> bool:
        return self.proc.poll() is None

    def finish(self, timeout: float = SAFETY_TIMEOUT) -> Finished:
        """Wait for the process to end (killing it if the safety net runs out)."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        if self._result is None:
            self._out.seek(0)
            self._err.seek(0)
            self._result = Finished(self.pid, self.proc.returncode, self._out.read(), self._err.read())
            self._out.close()
            self._err.close()
        return self._result


def wait_until(condition: Callable[[], bool], cli: Cli, what: str) -> None:
    """Poll ``condition`` (a state on disk) until it holds or ``cli`` has ended."""
    deadline = time.monotonic() + SAFETY_TIMEOUT
    while not condition() and cli.running():
        if time.monotonic() > deadline:
            cli.proc.kill()
            raise AssertionError(f"pid {cli.pid} never got to {what}")
        time.sleep(0.005)


def run_killed_at(args: Sequence[str | os.PathLike[str]], point: str, nth: int = 1) -> Finished:
    """Run the CLI with ``CLIPSEARCH_CRASH_AT=point:nth`` and return how it ended."""
    return Cli(args, env={ENV: f"{point}:{nth}"}).finish()


class Pauses:
    """The handshake folder of ``CLIPSEARCH_PAUSE_AT`` (see :mod:`retrieval.faults`)."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder

    def env(self, spec: str) -> dict[str, str]:
        """The environment that makes a process pause at ``spec`` (``point[:n][,...]``)."""
        return {PAUSE_ENV: spec, PAUSE_DIR_ENV: str(self.folder)}

    def wait(self, cli: Cli, point: str, arrival: int = 1) -> int | None:
        """Wait until ``cli`` (or a process it started) is held at the ``arrival``-th visit of ``point``.

        Returns:
            The pid of the process held there, or None when ``cli`` finished without getting
            there (the caller then reads its result with ``cli.finish()``).
        """
        reached = self.folder / f"{point}-{arrival}.reached"
        wait_until(reached.exists, cli, f"{point}:{arrival}")
        return int(reached.read_text(encoding="ascii")) if reached.exists() else None

    def release(self, point: str, arrival: int = 1) -> None:
        """Let the process held at ``point``'s ``arrival``-th visit go on."""
        (self.folder / f"{point}-{arrival}.go").touch()
