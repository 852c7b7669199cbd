"""Crash injection for the crash-safety tests: ``kill -9`` of this process at a named point.

``CLIPSEARCH_CRASH_AT=point:n`` makes the n-th arrival at ``point`` in this process send
SIGKILL to itself, exactly like an outside ``kill -9`` at that moment. Unset (always, outside
the tests) it costs one dictionary lookup per call.
"""

from __future__ import annotations

import os
import signal

ENV = "CLIPSEARCH_CRASH_AT"
POINTS = ("decode", "embed", "publish", "commit", "finish")

_counts: dict[str, int] = {}


def crash_point(point: str) -> None:
    """Die here if the environment asks for it (see module docstring)."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    name, _, nth = spec.partition(":")
    if name != point:
        return
    _counts[point] = _counts.get(point, 0) + 1
    if _counts[point] >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
