"""The served indexes: each INDEX_DIR opened once as a ``LiveIndex``, named by its directory."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from retrieval.errors import InvalidArgumentError
from retrieval.index import ImageIndex
from retrieval.live import LiveIndex

from .errors import NotFoundError

# Text queries of one index run one at a time; image queries overlap (ServedIndex.model_call).
# Text: the numpy text tower's BLAS calls already use every core, so overlapping ones only fight
# over them (serialised served more requests per second, measured with 8 client threads). Image:
# a lock would also cover decoding and preprocessing the upload (most of an image query), which
# overlap usefully with another query's model call.
SERIALIZE_TEXT = True
SERIALIZE_IMAGE = False


@dataclass
class ServedIndex:
    """One INDEX_DIR as served: its name, its live handle and the lock of its model calls."""

    name: str
    live: LiveIndex
    serialize_text: bool = SERIALIZE_TEXT
    serialize_image: bool = SERIALIZE_IMAGE
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # Told the kind and the seconds of each model call once it ends (the server's metrics).
    on_model_call: Callable[[str, float], None] | None = field(default=None, repr=False)

    def current(self) -> ImageIndex:
        """The newest published generation; a request calls this once and keeps the answer."""
        return self.live.current()

    def model_call(self, kind: str) -> AbstractContextManager[object]:
        """Held around a query that runs the ``text`` or ``image`` tower (a no-op where that kind
        is not serialised).

        The lock belongs to the served directory, not to a generation, so a reopen (which shares
        the loaded models) does not let two calls into the same model at once.
        """
        serialize = self.serialize_text if kind == "text" else self.serialize_image
        held: AbstractContextManager[object] = self._lock if serialize else nullcontext()
        return held if self.on_model_call is None else _timed(held, kind, self.on_model_call)


@contextmanager
def _timed(held: AbstractContextManager[object], kind: str, observe: Callable[[str, float], None]) -> Iterator[object]:
    # Timed once the lock is held: the model call's own time, not the wait for another's.
    with held:
        started = time.perf_counter()
        try:
            yield None
        finally:
            observe(kind, time.perf_counter() - started)


class IndexSet:
    """The indexes a server answers for, by name; the first is the default.

    Args:
        directories: the INDEX_DIRs, each opened now (raising the usual typed errors).
        open_live: opens one directory (``LiveIndex`` with the query settings).

    Raises:
        InvalidArgumentError: no directory, or two with the same base name.
        NotAnIndexError, IndexFormatError, ...: a directory that cannot be opened.
    """

    def __init__(self, directories: Sequence[str | os.PathLike[str]], open_live: Callable[[str], LiveIndex]) -> None:
        if isinstance(directories, (str, os.PathLike)):
            directories = [directories]
        if not directories:
            raise InvalidArgumentError("give at least one INDEX_DIR to serve")
        names: dict[str, str] = {}
        for d in directories:
            name = _name_of(d)
            if name in names:
                raise InvalidArgumentError(
                    f"two indexes are named {name!r} ({names[name]} and {os.fspath(d)}); serve directories with different names"
                )
            names[name] = os.fspath(d)
        self._indexes = {name: ServedIndex(name, open_live(path)) for name, path in names.items()}
        self.default = next(iter(self._indexes))

    @property
    def names(self) -> list[str]:
        return list(self._indexes)

    def __iter__(self) -> Iterator[ServedIndex]:
        return iter(self._indexes.values())

    def get(self, name: str | None) -> ServedIndex:
        """The index called ``name`` (the default for None).

        Raises:
            NotFoundError: no index has that name.
        """
        if name is None or name == "":
            return self._indexes[self.default]
        try:
            return self._indexes[name]
        except KeyError:
            raise NotFoundError(f"unknown index {name!r}; served: {', '.join(self._indexes)}") from None


def _name_of(directory: str | os.PathLike[str]) -> str:
    # As LiveIndex.name: the resolved directory's base name (``.`` is served by its real name).
    path = Path(directory).resolve()
    return path.name or str(path)
