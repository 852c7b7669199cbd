"""``indexer.ahead.Ahead``: a pipeline stage in a helper thread, results in order."""

from __future__ import annotations

import threading
import time

import pytest

from indexer.ahead import Ahead


def test_results_in_order_computed_in_another_thread() -> None:
    threads = set()

    def square(x: int) -> int:
        threads.add(threading.current_thread().name)
        return x * x

    assert list(Ahead(range(50), square, depth=3, name="helper")) == [x * x for x in range(50)]
    assert threads == {"helper"}


def test_runs_at_most_depth_ahead() -> None:
    seen: list[int] = []

    def note(x: int) -> int:
        seen.append(x)
        return x

    it = Ahead(range(100), note, depth=2)
    assert next(it) == 0
    # One handed out, two queued, one computed and waiting for room: the helper gets that far
    # by construction (waited for, however slow the machine), and then no further.
    deadline = time.monotonic() + 60
    while len(seen) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(seen) == 4
    time.sleep(0.3)  # room for a helper that does not stop to overrun
    assert len(seen) == 4
    it.close()


def test_error_in_helper_is_raised_at_its_item() -> None:
    def boom(x: int) -> int:
        if x == 3:
            raise ValueError("bad item 3")
        return x

    it = Ahead(range(10), boom)
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="bad item 3"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)


def test_error_in_source_iterator_is_raised() -> None:
    def source():
        yield 1
        raise OSError("disk gone")

    it = Ahead(source(), lambda x: x)
    assert next(it) == 1
    with pytest.raises(OSError, match="disk gone"):
        next(it)


def test_close_stops_the_helper_early() -> None:
    computed: list[int] = []

    def slow(x: int) -> int:
        computed.append(x)
        return x

    with Ahead(range(10_000), slow, depth=1) as it:
        assert next(it) == 0
    assert not it._thread.is_alive()
    assert len(computed) < 10_000
    with pytest.raises(StopIteration):
        next(it)


def test_rejects_bad_depth() -> None:
    with pytest.raises(ValueError, match="depth"):
        Ahead([], lambda x: x, depth=0)
