"""A run's chunk commits (:class:`ChunkCommits`): a generation every so many images or seconds,
so that a killed run loses at most one chunk. The embedding of images (:mod:`indexer.embed`) and
of videos (:mod:`indexer.build`), and the side stages that read the rows again
(:mod:`indexer.backfill`), commit through it.
"""

from __future__ import annotations

import time

from .build_config import BuildConfig
from .commit import GenerationWriter


class ChunkCommits:
    """A run's chunk commits: a generation every ``cfg.commit_every`` images or
    ``cfg.commit_seconds``, whichever comes first, so a killed run loses at most one chunk."""

    def __init__(self, cfg: BuildConfig, writer: GenerationWriter) -> None:
        self._cfg, self._writer = cfg, writer
        self._since, self._last = 0, time.monotonic()

    def after(self, images: int) -> float:
        """Count ``images`` more done; commit when a chunk is due. Returns the seconds spent writing."""
        self._since += images
        if self._since < self._cfg.commit_every and time.monotonic() - self._last < self._cfg.commit_seconds:
            return 0.0
        t0 = time.perf_counter()
        self._writer.commit(complete=False)
        self._since, self._last = 0, time.monotonic()
        return time.perf_counter() - t0


__all__ = ["ChunkCommits"]
