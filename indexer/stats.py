"""``RunStats``: the counters and timings one build's embedding stage accumulates.

Both engines (:func:`indexer.embed.embed_planned`, :meth:`indexer.ray_engine.RayRun.embed`)
fill one through :func:`indexer.embed.write_batches`; :mod:`indexer.build` turns it into the
run's :class:`~indexer.build_report.BuildReport`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .build_config import BuildConfig, default_batch_size


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
        sides: what each side stage (:mod:`indexer.sides`) counted in the rows embedded, by the
            stage's name, then by report field.
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
    sides: dict[str, dict[str, int]] = field(default_factory=dict)
    # Who wrote the Parquet parts where the engine offers a choice (Ray: actors, driver or
    # actors+driver, indexer.ray_parts); empty where it does not.
    written_by: str = ""

    @classmethod
    def start(cls, cfg: BuildConfig, device_type: str) -> RunStats:
        """Empty counters for a run of ``cfg`` on ``device_type``, before any batch."""
        return cls(batch_size=cfg.batch_size or default_batch_size(device_type))

    def count_sides(self, counts: Mapping[str, Mapping[str, int]]) -> None:
        """Add the side stages' counts of a batch (by stage name, then by report field)."""
        for name, fields in counts.items():
            mine = self.sides.setdefault(name, {})
            for key, n in fields.items():
                mine[key] = mine.get(key, 0) + n

    @property
    def embedded(self) -> int:
        """Images embedded by this run (new and changed files)."""
        return self.added + self.updated


__all__ = ["RunStats"]
