"""``WatchConfig``: the settings of watch mode (``clipsearch index --watch``,
:func:`indexer.watch.watch_index`), beside the ``BuildConfig`` of its updates
(:mod:`indexer.build_config`).

Declared once, as ``BuildConfig`` is: the ``--watch-*`` flags and the docs' table are derived
from its fields' :func:`~retrieval.options.option` metadata.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from retrieval.checks import is_number
from retrieval.errors import InvalidArgumentError
from retrieval.options import option


@dataclass(frozen=True)
class WatchConfig:
    """Settings of watch mode (``clipsearch index --watch``, :func:`indexer.watch.watch_index`),
    beside the :class:`BuildConfig` of its updates."""

    settle: float = field(
        default=2.0,
        metadata=option(
            "a changed file is indexed once its size and modification time have stayed the same this long (a file "
            "still being written waits); also the quiet time after file events before an update",
            flag="--watch-settle",
            metavar="SECONDS",
            minimum=0,
            positive=True,
        ),
    )
    rescan: float = field(
        default=60.0,
        metadata=option(
            "walk the whole folder this often as well, for changes no file event reported (network mounts)",
            flag="--watch-rescan",
            metavar="SECONDS",
            minimum=0,
            positive=True,
        ),
    )
    events: bool = field(
        default=True,
        metadata=option(
            "follow file events (watchdog); without them changes are found by the rescans alone",
            flag="--watch-no-events",
            negate=True,
            flag_help="no file events: find changes by the rescans alone",
        ),
    )

    def __post_init__(self) -> None:
        for name in ("settle", "rescan"):
            value = getattr(self, name)
            if not is_number(value) or value <= 0:
                raise InvalidArgumentError(f"watch {name} must be a number of seconds > 0, got {value!r}")


__all__ = ["WatchConfig"]
