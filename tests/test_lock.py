"""The one-writer lock (``indexer.lock.IndexLock``): a second writer fails at once naming the holder,
and the lock of a killed writer is taken over."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from imagegen import write_photos

from indexer import build_index
from indexer.lock import IndexLock
from retrieval import ImageIndex, IndexLockedError


def _record_waits(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[float]]:
    """Record the flags of every ``fcntl.lockf`` call and every ``time.sleep`` of this thread.

    "Fails at once" checked by construction rather than with a stopwatch: the lock is only
    ever asked for without blocking, and nothing sleeps to retry.
    """
    import threading

    flags: list[int] = []
    sleeps: list[float] = []
    lockf, sleep, me = fcntl.lockf, time.sleep, threading.get_ident()

    def recording_lockf(fd: int, cmd: int, *args: int) -> None:
        flags.append(cmd)
        lockf(fd, cmd, *args)

    def recording_sleep(seconds: float) -> None:
        if threading.get_ident() == me:
            sleeps.append(seconds)
        sleep(seconds)

    monkeypatch.setattr(fcntl, "lockf", recording_lockf)
    monkeypatch.setattr(time, "sleep", recording_sleep)
    return flags, sleeps


def test_second_writer_fails_naming_the_holder(tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    photos = write_photos(tmp_path / "photos", 2)
    idx = tmp_path / "idx"
    build_index(photos, idx, model=str(tiny_model), workers=0)
    with IndexLock(idx):
        flags, sleeps = _record_waits(monkeypatch)
        with pytest.raises(IndexLockedError) as err:
            build_index(photos, idx, model=str(tiny_model), workers=0)
        # Refused by the in-process guard before the file lock is even asked for; no retries.
        assert flags == [] and sleeps == []
        monkeypatch.undo()
    assert f"pid {os.getpid()}" in str(err.value)
    assert len(ImageIndex.open(idx)) == 2


def test_lock_of_a_killed_writer_is_taken_over(tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    photos = write_photos(tmp_path / "photos", 2)
    idx = tmp_path / "idx"
    idx.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from indexer.lock import IndexLock; IndexLock(sys.argv[1]).acquire(); "
            "print('locked', flush=True); time.sleep(60)",
            str(idx),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    flags, sleeps = _record_waits(monkeypatch)
    with pytest.raises(IndexLockedError, match=f"pid {holder.pid}"):
        build_index(photos, idx, model=str(tiny_model), workers=0)
    # One non-blocking attempt on the file lock, refused at once: no waiting, no retries.
    assert flags == [fcntl.LOCK_EX | fcntl.LOCK_NB] and sleeps == []
    monkeypatch.undo()
    holder.kill()
    holder.wait()
    report = build_index(photos, idx, model=str(tiny_model), workers=0)
    assert report.total == 2 and report.resumed  # the dead writer's lock was detected and taken over
