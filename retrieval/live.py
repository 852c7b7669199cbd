"""``LiveIndex``: an index directory followed to its newest generation, for long-lived readers.

A writer (``clipsearch index`` or ``reindex``) publishes a new generation by replacing
``manifest.json`` atomically. :meth:`LiveIndex.current` notices that with one ``stat`` and
answers from the new generation from then on; an :class:`~retrieval.index.ImageIndex` already
handed out keeps answering from the generation it opened, so a caller that takes ``current()``
once per request never sees a mix of two generations.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from .index import ImageIndex
from .layout import MANIFEST_FILE
from .query_cache import DEFAULT_CAPACITY


class LiveIndex:
    """An index directory, reopened when a writer publishes a new generation.

    Opening happens here, so a bad directory fails at once with the errors of
    :meth:`ImageIndex.open`. Thread-safe: concurrent callers of :meth:`current` share one reopen.
    ``warm`` calls ``index.vectors.warm`` on every generation opened (what a server wants).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        model: str | None = None,
        device: str = "auto",
        precision: str = "auto",
        mmap: bool | None = None,
        query_cache: int = DEFAULT_CAPACITY,
        warm: bool = False,
    ) -> None:
        self.directory = Path(directory)
        self._lock = threading.Lock()
        self._stamp = self._manifest_stamp()
        self._warm = warm
        self._index = ImageIndex.open(
            self.directory, model=model, device=device, precision=precision, mmap=mmap, query_cache=query_cache
        )
        self._warming: threading.Thread | None = None
        if warm:
            self._start_warming(self._index)

    @property
    def name(self) -> str:
        """The directory's base name (how a server lists it)."""
        return self.directory.resolve().name

    def current(self) -> ImageIndex:
        """The index of the newest published generation (the same object while none is new).

        Raises:
            The errors of :meth:`ImageIndex.open` when the new generation cannot be opened; the
            next call tries again.
        """
        stamp = self._manifest_stamp()
        if stamp == self._stamp:
            return self._index
        with self._lock:
            if stamp != self._stamp:
                # Stamp first, then read: a manifest replaced again meanwhile changes the stamp
                # once more and is picked up by the next call.
                reopened = self._index.reopen()
                if self._warm and reopened is not self._index:
                    self._start_warming(reopened)
                self._index = reopened
                self._stamp = stamp
            return self._index

    def _start_warming(self, index: ImageIndex) -> None:
        # In a thread: asking the kernel to read ahead a large file can block until the reads
        # are queued (seconds for gigabytes), and queries need not wait for it.
        self._warming = threading.Thread(target=index.vectors.warm, name="clipsearch-warm", daemon=True)
        self._warming.start()

    def _manifest_stamp(self) -> tuple[int, int, int] | None:
        # The manifest is replaced by rename, so a new one has a new inode (and mtime).
        try:
            st = os.stat(self.directory / MANIFEST_FILE)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)


__all__ = ["LiveIndex"]
