"""Fault points for the crash-safety tests: ``kill -9`` of this process, or a pause, at a named point.

Library code calls :func:`crash_point` where a crash matters; :data:`POINTS` names every such
point and the on-disk state it implies. Two environment variables drive them (read at each
arrival; unset, always outside the tests, a call costs two dictionary lookups):

``CLIPSEARCH_CRASH_AT=point[:n]``
    The n-th arrival at ``point`` in this process (default 1) sends SIGKILL to itself, exactly
    like an outside ``kill -9`` at that moment.

``CLIPSEARCH_PAUSE_AT=point[:n][,point[:n]...]`` with ``CLIPSEARCH_PAUSE_DIR=DIR``
    At every arrival at ``point`` (only the n-th, if given) the process writes
    ``DIR/<point>-<k>.reached`` (k: its arrival count at that point, the file holds its pid) and
    waits until ``DIR/<point>-<k>.go`` exists. A test thus holds a process at a point and acts
    while it is there: kills it, searches, starts a second writer. After
    ``CLIPSEARCH_PAUSE_TIMEOUT`` seconds (default 120; a safety net for a test that forgot to
    release it, never a timing) the wait raises :class:`TimeoutError`.

Arrivals are counted per process (a DataLoader worker counts its own ``decode`` arrivals).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Mapping
from pathlib import Path

ENV = "CLIPSEARCH_CRASH_AT"
PAUSE_ENV = "CLIPSEARCH_PAUSE_AT"
PAUSE_DIR_ENV = "CLIPSEARCH_PAUSE_DIR"
PAUSE_TIMEOUT_ENV = "CLIPSEARCH_PAUSE_TIMEOUT"

# Every point, and what is on disk when a process stops there. "items" counts processed files
# (indexed rows + skipped files) of a build.
POINTS: Mapping[str, str] = {
    # indexer/lock.py, every writer (index, reindex)
    "locked": "the writer lock is taken and names this process; nothing else written yet",
    # indexer/dataset.py and indexer/build.py, clipsearch index
    # ("decode" also while --precision auto decodes its calibration sample, before any commit)
    "decode": "about to read one file; the manifest holds the items of the last commit",
    "embed": "about to embed one batch; the manifest holds the items of the last commit",
    # indexer/commit.py, GenerationWriter.commit (index, reindex)
    "staged": "a complete new generation (its FAISS file included) in .staging-*, not yet renamed",
    "publish": "the new generation renamed to gen-*, the manifest still names the previous one",
    "commit": "the manifest names the new generation; the previous generation is not yet removed",
    # indexer/ray_parts.py, a Ray build whose actors write their parts
    "adopt": "an actor's part written in .staging-ray-*, about to be linked; the manifest holds the last commit's",
    # indexer/video/video_rows.py, index --videos
    "video": "a video's frames sampled and embedded, not yet handed to the writer; the manifest holds the last commit's",
    # indexer/faces/stage.py, index --faces
    "faces": "a chunk of faces found and handed to the writer, not committed; the manifest holds the last commit's",
    # indexer/commit.py, GenerationWriter.finish (index, reindex)
    "finish": "the final FAISS index built (a re-ranked one written in .staging-faiss-*), not published; the manifest is the last commit's",
    # indexer/training/train_state.py, clipsearch finetune
    "checkpoint-staged": "a complete new checkpoint in .checkpoint.tmp/, checkpoint/ is the previous one (if any)",
    "checkpoint-swap": "the previous checkpoint moved to .checkpoint.old/, no checkpoint/, the new one in .checkpoint.tmp/",
    "checkpoint-saved": "the new checkpoint is checkpoint/, nothing else left",
    "export": "every final file moved into OUT except config.json (OUT does not load as a model); checkpoint/ kept",
    "exported": "the final model complete in OUT; checkpoint/ not yet removed",
}

_counts: dict[str, int] = {}
# Decode threads arrive at "decode" concurrently: the n-th arrival must be exactly one of them.
_counts_lock = threading.Lock()


def crash_point(point: str) -> None:
    """Die or pause here if the environment asks for it (see the module docstring)."""
    crash = os.environ.get(ENV)
    pause = os.environ.get(PAUSE_ENV)
    if not crash and not pause:
        return
    if point not in POINTS:
        raise ValueError(f"unknown fault point {point!r}; add it to retrieval.faults.POINTS")
    with _counts_lock:
        _counts[point] = arrival = _counts.get(point, 0) + 1
    if crash and _selects(crash, point, arrival, every=False):
        os.kill(os.getpid(), signal.SIGKILL)
    if pause and _selects(pause, point, arrival, every=True):
        _pause(point, arrival)


def _selects(spec: str, point: str, arrival: int, every: bool) -> bool:
    """Whether ``spec`` (``name[:n]``, comma-separated) selects this arrival at ``point``.

    ``name:n`` selects the n-th arrival; a bare ``name`` the first (``every=False``) or all.
    """
    for item in spec.split(","):
        name, _, nth = item.strip().partition(":")
        if name not in POINTS:
            raise ValueError(f"unknown fault point {name!r} in the environment; known: {', '.join(POINTS)}")
        if name == point and ((every and not nth) or arrival == int(nth or 1)):
            return True
    return False


def _pause(point: str, arrival: int) -> None:
    folder = Path(os.environ.get(PAUSE_DIR_ENV) or ".")
    timeout = float(os.environ.get(PAUSE_TIMEOUT_ENV) or 120.0)
    reached, go = folder / f"{point}-{arrival}.reached", folder / f"{point}-{arrival}.go"
    # Written whole then renamed: a test that sees the file can read the pid in it.
    tmp = folder / f".{point}-{arrival}.{os.getpid()}.tmp"
    tmp.write_text(str(os.getpid()), encoding="ascii")
    os.replace(tmp, reached)
    deadline = time.monotonic() + timeout
    while not go.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"fault point {point} (arrival {arrival}) waited {timeout:g} s for {go}")
        time.sleep(0.005)
