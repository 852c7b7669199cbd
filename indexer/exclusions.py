"""What a walk of PHOTOS_DIR leaves out: hidden names, thumbnail caches, ``--exclude`` patterns
and the collection's ``.clipsearchignore``.

By default every file or folder whose name starts with a dot is left out (``.thumbnails``,
``.AppleDouble``, ``._IMG_0001.JPG`` resource forks, ``.@__thumb``, ``.picasaoriginals``,
``.Trash-1000``, ``.git``), and so are the folders and files named in
:data:`DEFAULT_EXCLUDED_NAMES` (caches and recycle bins that NAS systems and operating systems
put beside the photos); ``include_hidden`` keeps both. Patterns, from ``--exclude`` and from
``PHOTOS_DIR/.clipsearchignore``, are gitignore lines matched by ``pathspec``'s
``GitIgnoreSpec`` against paths relative to PHOTOS_DIR. As in git, a file inside an excluded
folder cannot be re-included: the walk never enters such a folder (a Synology ``@eaDir`` tree can
hold more files than the photos beside it).

The walk's options (``include_hidden`` and the ``--exclude`` patterns, :class:`WalkOptions`)
are recorded in the manifest's ``discovery``; an update that does not give them keeps the
recorded ones. The ignore file is read afresh by every run.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retrieval.errors import IndexFormatError, InvalidArgumentError
from retrieval.layout import is_index_dir, read_manifest

# The ignore file at the root of a collection; a dot-name itself, so never a candidate image.
IGNORE_FILE = ".clipsearchignore"

# Names (of folders, or files) that are left out wherever they appear, besides dot-names.
DEFAULT_EXCLUDED_NAMES: tuple[str, ...] = (
    "@eaDir",  # Synology: thumbnails and metadata beside every photo folder
    "@__thumb",  # QNAP thumbnails (also as the hidden .@__thumb)
    "#recycle",  # Synology recycle bin: deleted photos
    "#snapshot",  # Synology snapshots: old copies of the photos
    "@Recycle",  # QNAP recycle bin
    "@Recently-Snapshot",  # QNAP snapshots
    "$RECYCLE.BIN",  # Windows recycle bin of a drive
    "System Volume Information",  # Windows drive metadata
    "__MACOSX",  # resource forks unpacked from zip archives made on macOS
    "Thumbs.db",  # Windows thumbnail cache
)
_DEFAULT_NAMES = frozenset(os.fsencode(n) for n in DEFAULT_EXCLUDED_NAMES)


@dataclass(frozen=True)
class WalkOptions:
    """The walk's recorded options: keep hidden names and caches, the ``--exclude`` patterns,
    and whether video files are indexed beside images (``--videos``)."""

    include_hidden: bool = False
    exclude: tuple[str, ...] = ()
    videos: bool = False

    def to_dict(self) -> dict[str, Any]:
        """As the manifest's ``discovery`` holds them (``videos`` only when on, so that an index
        of images records what it did before videos were known)."""
        return {"include_hidden": self.include_hidden, "exclude": list(self.exclude), **({"videos": True} if self.videos else {})}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> WalkOptions:
        """The options a manifest recorded (the defaults for an index from before they were)."""
        data = data or {}
        exclude = data.get("exclude") or ()
        return cls(bool(data.get("include_hidden", False)), tuple(str(p) for p in exclude), bool(data.get("videos", False)))


def walk_options(include_hidden: bool | None, exclude: Sequence[str] | None, recorded: Mapping[str, Any] | None,
                 videos: bool | None = None) -> WalkOptions:
    """This run's walk options: each one given (not None) replaces the recorded one.

    Empty patterns are dropped, so ``exclude=("",)`` (``--exclude ''``) clears the recorded
    patterns; ``recorded`` is the manifest's ``discovery`` (None for a new index).
    """
    before = WalkOptions.from_dict(recorded)
    return WalkOptions(
        before.include_hidden if include_hidden is None else include_hidden,
        before.exclude if exclude is None else tuple(p for p in exclude if p.strip()),
        before.videos if videos is None else videos,
    )


def recorded_walk(index_dir: str | os.PathLike[str], include_hidden: bool | None, exclude: Sequence[str] | None,
                  videos: bool | None = None) -> WalkOptions:
    """:func:`walk_options` over what the index in ``index_dir`` records (nothing for a new
    index, or one whose manifest cannot be read: the build then fails or rebuilds it)."""
    recorded = None
    if is_index_dir(index_dir):
        with contextlib.suppress(IndexFormatError):
            recorded = read_manifest(index_dir).discovery
    return walk_options(include_hidden, exclude, recorded, videos)


def check_patterns(patterns: Iterable[Any], where: str = "exclude pattern") -> None:
    """Refuse what is not a gitignore pattern, naming it.

    Raises:
        InvalidArgumentError: a pattern that is not a string, or that pathspec rejects.
    """
    _compile(patterns, lambda _, p: f"{where} {p!r}")


def _compile(patterns: Iterable[Any], name: Any) -> Any:
    from pathspec import GitIgnoreSpec

    lines = list(patterns)
    for i, line in enumerate(lines):
        if not isinstance(line, str):
            raise InvalidArgumentError(f"{name(i, line)} is not a string")
        try:
            GitIgnoreSpec.from_lines([line])
        except ValueError as exc:  # pathspec's GitIgnorePatternError
            raise InvalidArgumentError(f"{name(i, line)} is not a valid gitignore pattern: {exc}") from exc
    return GitIgnoreSpec.from_lines(lines) if any(line.strip() for line in lines) else None


class Exclusions:
    """Decides, name by name during a walk, what is left out.

    Args:
        options: hidden names and caches kept or not, and the ``--exclude`` patterns.
        ignore_lines: the lines of ``.clipsearchignore`` (matched before ``options.exclude``,
            so a command-line pattern has the last word, as a later gitignore line does).
        ignore_file: how errors name the ignore file.
    """

    def __init__(self, options: WalkOptions, ignore_lines: Sequence[str] = (), ignore_file: str = IGNORE_FILE) -> None:
        self.options = options
        n_file = len(ignore_lines)
        self._spec = _compile(
            [*ignore_lines, *options.exclude],
            lambda i, p: f"{ignore_file}, line {i + 1}," if i < n_file else f"exclude pattern {p!r}",
        )

    def _name_excluded(self, name: bytes) -> bool:
        return not self.options.include_hidden and (name.startswith(b".") or name in _DEFAULT_NAMES)

    def _matches(self, rel: bytes, is_dir: bool) -> bool:
        if self._spec is None:
            return False
        text = os.fsdecode(rel)
        return bool(self._spec.match_file(text + "/" if is_dir else text))

    def skips_dir(self, rel: bytes, name: bytes) -> bool:
        """True when the walk must not enter the folder ``rel`` (relative path, as bytes)."""
        return self._name_excluded(name) or self._matches(rel, True)

    def skips_file(self, rel: bytes, name: bytes) -> bool:
        """True when the file ``rel`` (relative path, as bytes) is left out."""
        return self._name_excluded(name) or self._matches(rel, False)

    def skips_path(self, rel: bytes, is_dir: bool) -> bool:
        """True when ``rel`` or a folder above it is left out: for a path named by a file event,
        which no walk reached."""
        parts = rel.split(b"/")
        for depth in range(1, len(parts)):
            if self.skips_dir(b"/".join(parts[:depth]), parts[depth - 1]):
                return True
        return (self.skips_dir if is_dir else self.skips_file)(rel, parts[-1])


def load_exclusions(root: str | os.PathLike[str], options: WalkOptions) -> Exclusions:
    """The exclusions of a walk of ``root``: ``options`` plus ``root/.clipsearchignore`` if any.

    Raises:
        InvalidArgumentError: the ignore file cannot be read, is not UTF-8 text, or holds a
            line that is not a gitignore pattern (its line number named); a bad ``--exclude``.
    """
    path = Path(root) / IGNORE_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = b""
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidArgumentError(f"{path} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from exc
    return Exclusions(options, text.splitlines(), str(path))


__all__ = [
    "DEFAULT_EXCLUDED_NAMES",
    "IGNORE_FILE",
    "Exclusions",
    "WalkOptions",
    "check_patterns",
    "load_exclusions",
    "recorded_walk",
    "walk_options",
]
