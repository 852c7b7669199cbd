"""Run one pipeline stage in a helper thread, a few items ahead of its consumer.

On GPU the main process does everything the GPU waits for: receive a batch of JPEG bytes from
the workers, decode it with nvJPEG, resize it, run the model, write the vectors. A helper
thread that finishes the next batches while the main thread runs the model overlaps the parts
that release the GIL (nvJPEG, waiting for the GPU, pipe reads) with the Python of the other.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_POLL_SECONDS = 0.1


class Ahead(Generic[R]):
    """Iterate ``fn(item)`` for each of ``items``, computed in a helper thread at most ``depth``
    results ahead. Results come in order; an exception in the helper is raised here, at the
    item where it happened. :meth:`close` (or leaving a ``with`` block) stops the helper early.
    """

    def __init__(self, items: Iterable[T], fn: Callable[[T], R], depth: int = 2, name: str = "clipsearch-ahead") -> None:
        if depth < 1:
            raise ValueError("depth must be >= 1")
        self._queue: queue.Queue[tuple[str, object]] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._run, args=(items, fn), name=name, daemon=True)
        self._thread.start()

    def _put(self, kind: str, value: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put((kind, value), timeout=_POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, items: Iterable[T], fn: Callable[[T], R]) -> None:
        try:
            for item in items:
                if self._stop.is_set() or not self._put("item", fn(item)):
                    return
            self._put("end", None)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            self._put("error", exc)

    def __iter__(self) -> Iterator[R]:
        return self

    def __next__(self) -> R:
        if self._done:
            raise StopIteration
        kind, value = self._queue.get()
        if kind == "item":
            return value  # type: ignore[return-value]  # kind "item" carries an fn result (R)
        self._done = True
        self._thread.join()
        if kind == "error":
            raise value  # type: ignore[misc]  # kind "error" carries the BaseException _run caught
        raise StopIteration

    def close(self) -> None:
        """Stop the helper after the item it is on and wait for it."""
        self._done = True
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> Ahead[R]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
