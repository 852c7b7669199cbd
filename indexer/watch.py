"""Watch mode: index a folder, then keep its index up to date as files come, change and go.

Every update is an ordinary incremental update (:func:`indexer.build.update_index`, the same
plan, embedding and crash-safe commit as ``clipsearch index``) over a walk made here, with the
model loaded once. What starts an update:

- file events (``watchdog``'s native observer: inotify, FSEvents, ReadDirectoryChangesW) on
  images, folders and ``.clipsearchignore``, once no event came for ``settle`` seconds (or
  after :data:`MAX_BATCH_WAIT` seconds of unbroken events, e.g. a long copy);
- a rescan every ``rescan`` seconds, which finds what no event reported (network mounts, an
  observer that could not start).

A file still being written is not indexed half-written: a new or changed file enters an update
once its modification time is ``settle`` seconds old, or its size and modification time stayed
the same for ``settle`` seconds (a clock that disagrees with the file server's). Until then a
new file waits and a changed one keeps its row as it was. An update that finds nothing changed
since the last one commits nothing.

Stopping (``stop`` set: Ctrl-C or SIGTERM in the CLI) ends the embedding after its current
batch, commits what was embedded, and returns; a process killed at any moment leaves the last
commit, which the next run resumes from. A watched folder that disappears raises
:class:`~retrieval.errors.PhotosDirError`; the index keeps its last commit.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from retrieval.encoders import Encoder
from retrieval.errors import IndexLockedError, InvalidArgumentError, PhotosDirError
from retrieval.images import IMAGE_EXTENSIONS

from . import build
from .build_config import BuildConfig
from .build_report import BuildReport
from .discover import Discovery, ImageFile, discover
from .exclusions import IGNORE_FILE, Exclusions, load_exclusions, recorded_walk
from .video.probe import VIDEO_EXTENSIONS
from .watch_config import WatchConfig

# An update waits for a quiet moment at most this long (seconds, or 10 settle times if more):
# a copy of thousands of files sends events without pause, and must not starve the index.
MAX_BATCH_WAIT = 30.0
# How often the waiting loop looks at the stop flag and the clock (seconds).
_TICK = 0.1
_IMAGE_SUFFIXES = frozenset(e.lower() for e in IMAGE_EXTENSIONS)
# Events that say nothing changed: our own reads of the files open and close them.
_QUIET_EVENTS = frozenset({"opened", "closed_no_write"})


@dataclass
class WatchReport:
    """What a watch did until it stopped: the updates it committed and their totals."""

    updates: int = 0
    added: int = 0
    updated: int = 0
    removed: int = 0
    last: BuildReport | None = None
    events: bool = False  # whether file events were followed (else rescans alone)

    def count(self, report: BuildReport) -> None:
        self.updates += 1
        self.added += report.added
        self.updated += report.updated
        self.removed += report.removed
        self.last = report

    def to_dict(self) -> dict[str, Any]:
        return {
            "updates": self.updates,
            "added": self.added,
            "updated": self.updated,
            "removed": self.removed,
            "total": self.last.total if self.last is not None else 0,
            "events": self.events,
        }


@dataclass
class _Unsettled:
    size: int
    mtime_ns: int
    since: float  # monotonic time these facts were first seen


@dataclass
class _Changes:
    """What the observer thread tells the watching loop (under ``lock``)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    first: float | None = None  # monotonic time of the first event not yet handled
    last: float = 0.0  # of the latest one

    def note(self) -> None:
        now = time.monotonic()
        with self.lock:
            self.first = now if self.first is None else self.first
            self.last = now

    def take(self) -> None:
        with self.lock:
            self.first = None


class _Handler(FileSystemEventHandler):
    """Runs in watchdog's thread: notes the events that may change what the index holds."""

    def __init__(self, watcher: _Watcher) -> None:
        self.watcher = watcher

    def dispatch(self, event: FileSystemEvent) -> None:
        if event.event_type in _QUIET_EVENTS or (event.is_directory and event.event_type == "modified"):
            return
        paths = [event.src_path, event.dest_path]
        if any(p and self.watcher.relevant(os.fsencode(p), event.is_directory) for p in paths):
            self.watcher.changes.note()


class _Watcher:
    """The watching loop's state: the encoder, the last walk handed to an update, files waiting."""

    def __init__(self, photos: Path, out: Path, cfg: BuildConfig, wcfg: WatchConfig, enc: Encoder,
                 stop: threading.Event, on_update: Callable[[BuildReport], None] | None) -> None:
        self.photos, self.out, self.cfg, self.wcfg, self.enc = photos, out, cfg, wcfg, enc
        self.stop, self.on_update = stop, on_update
        self.root = os.fsencode(photos.resolve())
        resolved_out = os.fsencode(out.resolve())
        # An INDEX_DIR inside PHOTOS_DIR: its commits are not changes to the photos.
        self.index_rel = os.path.relpath(resolved_out, self.root) if resolved_out.startswith(self.root + b"/") else None
        self.extensions: frozenset[str] = _IMAGE_SUFFIXES
        self.exclusions: Exclusions = self._exclusions()
        self.changes = _Changes()
        self.snapshot: dict[bytes, ImageFile] | None = None  # the walk the last update was given
        self.unsettled: dict[bytes, _Unsettled] = {}
        self.report = WatchReport()

    def _exclusions(self) -> Exclusions:
        walk = recorded_walk(self.out, self.cfg.include_hidden, self.cfg.exclude, self.cfg.videos)
        # An index of videos (--videos) watches for them too: a walk without them would remove their rows.
        self.extensions = _IMAGE_SUFFIXES | VIDEO_EXTENSIONS if walk.videos else _IMAGE_SUFFIXES
        return load_exclusions(self.photos, walk)

    def relevant(self, path: bytes, is_dir: bool) -> bool:
        """Whether an event on ``path`` (absolute) may change what the index holds."""
        if path == self.root or not path.startswith(self.root + b"/"):
            return path == self.root  # the watched folder itself: deleted or moved away
        rel = path[len(self.root) + 1 :]
        if rel == IGNORE_FILE.encode():
            return True
        if self.index_rel is not None and (rel == self.index_rel or rel.startswith(self.index_rel + b"/")):
            return False
        if self.exclusions.skips_path(rel, is_dir):
            return False
        return is_dir or os.path.splitext(os.fsdecode(rel))[1].lower() in self.extensions

    def _check_root(self) -> None:
        if not self.photos.is_dir():
            raise PhotosDirError(
                f"the watched folder {self.photos} was deleted or moved away; the index keeps its last commit"
            )

    def _settled(self, f: ImageFile, now: float, wall_ns: int) -> bool:
        """A new or changed file enters an update once it stopped changing (see the module)."""
        if wall_ns - f.mtime_ns >= self.wcfg.settle * 1e9:
            self.unsettled.pop(f.rel, None)
            return True
        seen = self.unsettled.get(f.rel)
        if seen is None or (seen.size, seen.mtime_ns) != (f.size, f.mtime_ns):
            self.unsettled[f.rel] = _Unsettled(f.size, f.mtime_ns, now)
            return False
        if now - seen.since >= self.wcfg.settle:
            del self.unsettled[f.rel]
            return True
        return False

    def update(self) -> bool:
        """Walk, and run an update when the walk differs from the last one; True if one ran."""
        self._check_root()
        self.exclusions = self._exclusions()  # .clipsearchignore may have changed
        found = discover(self.photos, self.extensions, exclude=self.exclusions)
        self._check_root()  # deleted during the walk: the walk saw an empty or partial folder
        now, wall_ns = time.monotonic(), time.time_ns()
        before = self.snapshot or {}
        files: list[ImageFile] = []
        for f in found.files:
            old = before.get(f.rel)
            if old is not None and (old.size, old.mtime_ns) == (f.size, f.mtime_ns):
                files.append(f)
            elif self._settled(f, now, wall_ns):
                files.append(f)
            elif old is not None:
                files.append(old)  # still being written: its row stays as it was
        present = {f.rel for f in found.files}
        self.unsettled = {rel: u for rel, u in self.unsettled.items() if rel in present}
        walk = {f.rel: f for f in files}
        if self.snapshot is not None and walk == self.snapshot:
            return False
        if not files and self.unsettled:
            return False  # only files still being written: wait for them
        report = build.update_index(self.photos, self.out, self.cfg, self.enc,
                                    Discovery(files, found.unreadable_dirs), stop=self.stop.is_set)
        self.snapshot = walk
        self.report.count(report)
        if self.on_update is not None:
            self.on_update(report)
        return True

    def next_round(self, next_rescan: float) -> bool:
        """Wait until an update is due (True) or ``stop`` is set (False)."""
        settle = self.wcfg.settle
        while not self.stop.is_set():
            now = time.monotonic()
            with self.changes.lock:
                first, last = self.changes.first, self.changes.last
            if first is not None and (now - last >= settle or now - first >= max(MAX_BATCH_WAIT, 10 * settle)):
                return True
            if now >= next_rescan:
                return True
            if self.unsettled and now >= min(u.since for u in self.unsettled.values()) + settle:
                return True
            self.stop.wait(_TICK)
        return False


def _observe(watcher: _Watcher, log: Callable[[str], None]) -> Any:
    """Start watchdog's observer on the folder, or say why not (then rescans alone find changes)."""
    observer = Observer()
    try:
        observer.schedule(_Handler(watcher), os.fsdecode(watcher.root), recursive=True)
        observer.start()
    except OSError as exc:  # e.g. the inotify watch limit
        log(f"no file events for {watcher.photos} ({exc.strerror or exc}); finding changes by rescans alone")
        return None
    return observer


def watch_index(
    photos_dir: str | os.PathLike[str],
    index_dir: str | os.PathLike[str],
    config: BuildConfig | str | None = None,
    watch: WatchConfig | None = None,
    *,
    stop: threading.Event | None = None,
    on_update: Callable[[BuildReport], None] | None = None,
    log: Callable[[str], None] | None = None,
    **overrides: Any,
) -> WatchReport:
    """Index ``photos_dir`` into ``index_dir``, then keep the index up to date until ``stop`` is set.

    Args:
        photos_dir: the folder to index and watch.
        index_dir: the index to create or update (as :func:`indexer.build_index`).
        config: the updates' settings, as for :func:`indexer.build_index` (``files`` and
            ``engine="ray"`` are not for watching).
        watch: the watch's own settings (:class:`~indexer.watch_config.WatchConfig`).
        stop: set it (from another thread or a signal handler) to stop: the update under way
            ends after its current batch and commits what it embedded.
        on_update: called with each committed update's :class:`BuildReport`.
        log: takes one-line notices (file events unavailable); default: none.
        overrides: :class:`BuildConfig` fields to change.

    Returns:
        A :class:`WatchReport`: the updates committed and their totals.

    Raises:
        PhotosDirError: the folder is missing, holds no images, or disappears while watched.
        InvalidArgumentError: a bad option or ``.clipsearchignore``; ``engine="ray"``.
        Any error of :func:`indexer.build_index`; the index keeps its last commit.
    """
    cfg = build.build_config(config, overrides)
    wcfg = watch if watch is not None else WatchConfig()
    if cfg.engine != "local":
        raise InvalidArgumentError("watch mode runs with engine 'local'; index with --engine ray, then watch locally")
    stop = stop if stop is not None else threading.Event()
    say = log if log is not None else (lambda _msg: None)
    photos, out = Path(photos_dir), Path(index_dir)
    if not photos.is_dir():
        raise PhotosDirError(f"photos directory {photos} does not exist or is not a directory")
    watcher = _Watcher(photos, out, cfg, wcfg, build.load_model(cfg, out), stop, on_update)
    observer = _observe(watcher, say) if wcfg.events else None
    watcher.report.events = observer is not None
    try:
        next_rescan = 0.0
        while watcher.next_round(next_rescan):
            watcher.changes.take()
            try:
                watcher.update()
            except IndexLockedError as exc:
                say(f"{exc}; trying again in {wcfg.settle:g} s")
                watcher.changes.note()
            next_rescan = time.monotonic() + wcfg.rescan
    finally:
        if observer is not None:
            observer.stop()
            observer.join(timeout=5)
    return watcher.report


__all__ = ["MAX_BATCH_WAIT", "WatchReport", "watch_index"]
