"""``RunStats``: the counters and timings one build's embedding stage accumulates, and
``TextStats``, those of reading the text of images already indexed.

Both engines (:func:`indexer.embed.embed_planned`, :meth:`indexer.ray_engine.RayRun.embed`)
fill one through :func:`indexer.embed.write_batches`; :mod:`indexer.build` turns it into the
run's :class:`~indexer.build_config.BuildReport`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .build_config import BuildConfig, default_batch_size


@dataclass
class TextStats:
    """What reading the text of images already indexed did
    (:func:`indexer.backfill.read_missing_text`): images whose text was read (``read``), those
    with text found (``with_text``), those OCR or the file system could not read (``notes``,
    indexed without text), and the seconds spent committing generations (``write_seconds``)."""

    read: int = 0
    with_text: int = 0
    notes: int = 0
    write_seconds: float = 0.0


@dataclass
class RunStats:
    """What the embedding stage of one run did and how long each part took.

    Attributes:
        batch_size: images per model call.
        workers: decode workers (local engine) or encoder actors (Ray); 0 when nothing was embedded.
        threads: torch threads per model (local) or per actor (Ray).
        added: new files embedded.
        updated: changed files re-embedded.
        lost: changed files that no longer decode, whose rows were dropped.
        newly_skipped: files this run recorded as skipped.
        decode_seconds, encode_seconds, write_seconds: time spent decoding, in the model, and
            committing generations.
        text_notes: images indexed whose embedded metadata was ignored (malformed or huge XMP)
            or that OCR could not read; each is indexed without that text.
        with_ocr_text: images in which OCR found text.
        text_read: images already in the index whose text was read without embedding them
            again (``index --ocr`` on an index embedded without it, :mod:`indexer.backfill`).
    """

    batch_size: int
    workers: int = 0
    threads: int = 0
    added: int = 0
    updated: int = 0
    lost: int = 0
    newly_skipped: int = 0
    decode_seconds: float = 0.0
    encode_seconds: float = 0.0
    write_seconds: float = 0.0
    text_notes: int = 0
    with_ocr_text: int = 0
    text_read: int = 0
    # Who wrote the Parquet parts where the engine offers a choice (Ray: actors, driver or
    # actors+driver, indexer.ray_parts); empty where it does not.
    written_by: str = ""

    @classmethod
    def start(cls, cfg: BuildConfig, device_type: str) -> RunStats:
        """Empty counters for a run of ``cfg`` on ``device_type``, before any batch."""
        return cls(batch_size=cfg.batch_size or default_batch_size(device_type))

    def add_text(self, text: TextStats) -> None:
        """Count what :func:`indexer.backfill.read_missing_text` did in this run."""
        self.text_read += text.read
        self.with_ocr_text += text.with_text
        self.text_notes += text.notes
        self.write_seconds += text.write_seconds

    @property
    def embedded(self) -> int:
        """Images embedded by this run (new and changed files)."""
        return self.added + self.updated


__all__ = ["RunStats", "TextStats"]
