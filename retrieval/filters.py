"""Query-time filters over the stored metadata, which images a search may return (HTTP: :mod:`clipsearch.server.filters`).

A :class:`Filter` turns into a boolean mask over ids, computed from whole metadata columns
(read once per opened index and cached). :func:`retrieval.faiss_index.search` takes that mask
and always returns ``min(k, matches)`` results: the filter restricts the candidates, it never
shortens the answer.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .checks import is_int
from .errors import InvalidArgumentError
from .options import option

ColumnReader = Callable[[str], pa.ChunkedArray]
# The kinds of file ``Filter.media`` chooses between.
MEDIA: tuple[str, ...] = ("image", "video", "all")
# More than any offset from UTC a photo may record (retrieval.images.exif reads up to 14:59).
_OFFSET_NS = 15 * 3600 * 10**9


def _read_time(text: str) -> dt.datetime:
    try:
        return dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidArgumentError(f"cannot read time {text!r}; use an ISO date like 2024-05-01 or 2024-05-01T12:30") from None


def parse_time(text: str) -> int:
    """``2024-05-01`` or ``2024-05-01T12:30:00[+02:00]`` -> ns since the epoch (UTC when no zone).

    Raises:
        InvalidArgumentError: not an ISO-8601 date or time.
    """
    return _epoch_ns(_read_time(text))


def _epoch_ns(when: dt.datetime) -> int:
    """ns since the epoch; a time without a zone read as UTC."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    return (when - epoch) // dt.timedelta(microseconds=1) * 1000


@dataclass(frozen=True)
class LocalTime:
    """A ``taken_after`` / ``taken_before`` bound given without a zone (``2024-01-01``): ``ns``
    is that wall-clock time read as UTC, ns since the epoch, and it is compared with each photo's
    own clock (its time plus the offset it recorded), not with the instant. A plain int bound is
    an instant.

    Raises:
        InvalidArgumentError: ``ns`` is not an integer.
    """

    ns: int

    def __post_init__(self) -> None:
        if not is_int(self.ns):
            raise InvalidArgumentError(f"a local time is an integer of ns, got {self.ns!r}")


def parse_taken(text: str) -> int | LocalTime:
    """A ``taken_after`` / ``taken_before`` bound: ``2024-05-01T12:30+02:00`` -> ns since the
    epoch (an instant); ``2024-05-01`` or ``2024-05-01T12:30`` (no zone) -> a :class:`LocalTime`,
    compared with the camera's clock.

    Raises:
        InvalidArgumentError: not an ISO-8601 date or time.
    """
    when = _read_time(text)
    return LocalTime(_epoch_ns(when)) if when.tzinfo is None else _epoch_ns(when)


def format_time(ns: int) -> str:
    """ns since the epoch as :func:`parse_time` reads it back: ``2024-05-01`` at midnight UTC,
    else ``2024-05-01T12:30:00+00:00``."""
    when = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=ns // 1000)
    return when.date().isoformat() if when.time() == dt.time(0) else when.isoformat()


def _optional_time(text: str) -> int | None:
    # An empty date is no bound, as an empty form field is.
    return parse_time(text) if text else None


def _optional_taken(text: str) -> int | LocalTime | None:
    return parse_taken(text) if text else None


def _ns(bound: int | LocalTime) -> int:
    return bound.ns if isinstance(bound, LocalTime) else bound


def _shown(bound: int | LocalTime) -> str:
    if isinstance(bound, LocalTime):  # said without a zone, as it was given
        return format_time(bound.ns).removesuffix("+00:00")
    return format_time(bound)


@dataclass(frozen=True)
class Filter:
    """Conditions an image must meet to be returned (all of them; None means no condition).

    Each field is also a flag of ``clipsearch search`` and a request field of the HTTP API by
    the same name, derived from its :func:`~retrieval.options.option` metadata. Widths and
    heights are pixels; ``modified_after`` / ``modified_before`` and ``taken_after`` /
    ``taken_before`` are ns since the epoch here, ISO dates on the CLI and over HTTP. A taken
    bound given without a zone is a :class:`LocalTime` (:func:`parse_taken`), compared with each
    photo's clock (the time it was taken, plus the offset it recorded); a plain int is an
    instant, compared with the photo's UTC instant, and a photo that recorded no offset is
    compared as its clock's time read as UTC.
    """

    path_prefix: tuple[str, ...] = field(
        default=(), metadata=option("stored path starts with this (repeat for any of several)", metavar="PREFIX", http=True)
    )
    path_glob: str | None = field(
        default=None,
        metadata=option(
            "stored path matches this shell pattern, e.g. '*/2023-*.jpg' (* also crosses /)", metavar="PATTERN", http=True
        ),
    )
    min_width: int | None = field(default=None, metadata=option("width at least this many pixels", metavar="PX", minimum=0, http=True))
    max_width: int | None = field(default=None, metadata=option("width at most this many pixels", metavar="PX", minimum=0, http=True))
    min_height: int | None = field(default=None, metadata=option("height at least this many pixels", metavar="PX", minimum=0, http=True))
    max_height: int | None = field(default=None, metadata=option("height at most this many pixels", metavar="PX", minimum=0, http=True))
    modified_after: int | None = field(
        default=None,
        metadata=option(
            "file modified at or after this time (ISO 8601, UTC unless a zone is given)",
            metavar="DATE",
            parse=_optional_time,
            text_type="ISO 8601 date",
            http=True,
        ),
    )
    modified_before: int | None = field(
        default=None,
        metadata=option(
            "file modified before this time (ISO 8601, UTC unless a zone is given)",
            metavar="DATE",
            parse=_optional_time,
            text_type="ISO 8601 date",
            http=True,
        ),
    )
    taken_after: int | LocalTime | None = field(
        default=None,
        metadata=option(
            "photo taken (EXIF DateTimeOriginal) at or after this time; undated images never match "
            "(ISO 8601; a time without a zone is the camera's clock)",
            metavar="DATE",
            parse=_optional_taken,
            text_type="ISO 8601 date",
            http=True,
        ),
    )
    taken_before: int | LocalTime | None = field(
        default=None,
        metadata=option(
            "photo taken (EXIF DateTimeOriginal) before this time; undated images never match "
            "(ISO 8601; a time without a zone is the camera's clock)",
            metavar="DATE",
            parse=_optional_taken,
            text_type="ISO 8601 date",
            http=True,
        ),
    )
    media: str | None = field(
        default=None,
        metadata=option("image, video or all: which kind of file may be returned (default: all)", metavar="KIND",
                        choices=MEDIA, http=True),
    )
    person: tuple[str, ...] = field(
        default=(),
        metadata=option(
            "only images with this person, by name or number (#7); repeat for images with all of them "
            "(an index built with --faces; `clipsearch people list` shows who is there)",
            metavar="NAME",
            http=True,
        ),
    )
    only_people: bool = field(
        default=False,
        metadata=option("with --person: only images in which nobody else is a person (faces of nobody aside)",
                        flag="--only", http=True),
    )

    def __post_init__(self) -> None:
        if self.media is not None and self.media not in MEDIA:
            raise InvalidArgumentError(f"media must be one of {', '.join(MEDIA)}, got {self.media!r}")
        if self.media == "all":  # no condition: said once, so equal filters compare equal
            object.__setattr__(self, "media", None)
        if isinstance(self.path_prefix, str):
            object.__setattr__(self, "path_prefix", (self.path_prefix,))
        if not all(isinstance(p, str) and p for p in self.path_prefix):
            raise InvalidArgumentError("path prefixes must be non-empty strings")
        if isinstance(self.person, str):
            object.__setattr__(self, "person", (self.person,))
        if not all(isinstance(p, str) and p.strip() for p in self.person):
            raise InvalidArgumentError("a person is a non-empty name or number (#7)")
        if not isinstance(self.only_people, bool):
            raise InvalidArgumentError(f"only_people must be true or false, got {self.only_people!r}")
        if self.only_people and not self.person:
            raise InvalidArgumentError("--only (only_people) takes the people to keep: give --person NAME")
        if self.path_glob is not None and (not isinstance(self.path_glob, str) or not self.path_glob):
            raise InvalidArgumentError("path glob must be a non-empty string")
        for name in ("min_width", "max_width", "min_height", "max_height", "modified_after", "modified_before", "taken_after",
                     "taken_before"):
            value = getattr(self, name)
            if value is not None and not is_int(value) and not (name.startswith("taken") and isinstance(value, LocalTime)):
                raise InvalidArgumentError(f"{name} must be an integer, got {value!r}")
            if is_int(value) and name.endswith(("width", "height")) and value < 0:
                raise InvalidArgumentError(f"{name} must be >= 0, got {value}")
        for low, high in (("min_width", "max_width"), ("min_height", "max_height"), ("modified_after", "modified_before"),
                          ("taken_after", "taken_before")):
            a, b = getattr(self, low), getattr(self, high)
            if a is None or b is None:
                continue
            # A clock time and an instant: a camera's clock may be up to 14:59 from UTC, so
            # only a gap wider than any offset leaves nothing to match.
            gap = _OFFSET_NS if isinstance(a, LocalTime) != isinstance(b, LocalTime) else 0
            if _ns(a) - gap > _ns(b):
                if low.endswith("_after"):  # times are ns since the epoch: said as the dates they are
                    raise InvalidArgumentError(f"{low} ({_shown(a)}) is after {high} ({_shown(b)}): nothing can match")
                raise InvalidArgumentError(f"{low} ({a}) is greater than {high} ({b}): nothing can match")

    @property
    def active(self) -> bool:
        return any(getattr(self, f.name) not in (None, (), False) for f in fields(self))

    @property
    def metadata_only(self) -> Filter:
        """This filter without its people: what the metadata columns alone decide (the people
        are the faces side's and the user's edits', :meth:`retrieval.rows.Rows.mask`)."""
        return replace(self, person=(), only_people=False) if self.person else self

    def mask(self, column: ColumnReader, count: int) -> np.ndarray:
        """Boolean mask over ids ``0 .. count - 1``: True where the image passes the metadata
        conditions (the people of :attr:`person` are not looked at here)."""
        keep = np.ones(count, dtype=bool)
        if self.path_prefix or self.path_glob is not None:
            paths = column("path")
            if self.path_prefix:
                hit = np.zeros(count, dtype=bool)
                for prefix in self.path_prefix:
                    hit |= _bool(pc.starts_with(paths, pattern=prefix))
                keep &= hit
            if self.path_glob is not None:
                keep &= _bool(pc.match_substring_regex(paths, pattern=_glob_regex(self.path_glob)))
        for name, col, op in (
            ("min_width", "width", np.greater_equal),
            ("max_width", "width", np.less_equal),
            ("min_height", "height", np.greater_equal),
            ("max_height", "height", np.less_equal),
            ("modified_after", "mtime_ns", np.greater_equal),
            ("modified_before", "mtime_ns", np.less),
        ):
            bound = getattr(self, name)
            if bound is not None:
                keep &= op(column(col).to_numpy(), bound)
        if self.taken_after is not None or self.taken_before is not None:
            keep &= self._taken_mask(column)
        if self.media is not None:
            # ``media`` is null for an image (and in every row of an index without videos).
            videos = _bool(pc.fill_null(pc.equal(column("media"), "video"), False))
            keep &= videos if self.media == "video" else ~videos
        return keep

    def _taken_mask(self, column: ColumnReader) -> np.ndarray:
        # ``taken`` is microseconds (a timestamp column, null where a photo has no date): the UTC
        # instant where ``taken_offset`` (minutes) is known, else the camera's clock read as UTC.
        taken = column("taken").cast(pa.int64())
        keep = _bool(pc.is_valid(taken))
        instant = np.asarray(pc.fill_null(taken, 0).to_numpy(), dtype=np.int64)
        clock: np.ndarray | None = None
        for bound, op in ((self.taken_after, np.greater_equal), (self.taken_before, np.less)):
            if bound is None:
                continue
            if isinstance(bound, LocalTime):
                if clock is None:
                    # The camera's clock: the instant plus the offset it recorded (none: as stored).
                    offset = np.asarray(pc.fill_null(column("taken_offset"), 0).to_numpy(), dtype=np.int64)
                    clock = instant + offset * 60_000_000
                keep &= op(clock, -(-bound.ns // 1000))
            else:
                keep &= op(instant, -(-bound // 1000))
        return keep

    def describe(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) not in (None, (), False)}


def _glob_regex(glob: str) -> str:
    # fnmatch.translate writes a Python full-match regex ending in \Z, which RE2 (Arrow's
    # engine) spells \z; for several stars it writes atomic groups (?>...), which RE2 lacks and
    # which only spare Python backtracking: a plain group matches the same strings.
    regex = fnmatch.translate(glob).replace("(?>", "(?:")
    if regex.endswith("\\Z"):
        regex = regex[:-2] + "\\z"
    return "^" + regex


def _bool(arr: pa.ChunkedArray | pa.Array) -> np.ndarray:
    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=bool)


__all__ = ["MEDIA", "Filter", "LocalTime", "parse_taken", "parse_time"]
