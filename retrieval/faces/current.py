"""The people of an opened generation as the user's edits stand now, for searches by person.

An opened index (a server's, above all) lives longer than the user's edits of its people: a
name given, two people merged or a face moved with ``clipsearch people`` while it serves must
apply to the next search. :class:`CurrentPeople` reads the generation's faces side once and
``people.json`` again whenever the file changed (its size, modification time or inode),
applying the new edits to the faces already read.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import NoFacesError
from ..layout import Manifest
from .edits import PEOPLE_FILE, load_edits
from .people import Face, People, no_faces_message

# What says people.json changed (os.stat fields); None while there is no file.
_Stamp = tuple[int, int, int] | None


class CurrentPeople:
    """The people of one generation, re-read when ``people.json`` changes.

    Args:
        directory: the index directory (where ``people.json`` lives).
        manifest: the opened generation's manifest; without a faces side every person query
            raises :class:`~retrieval.errors.NoFacesError`.
    """

    def __init__(self, directory: Path, manifest: Manifest) -> None:
        self.directory = Path(directory)
        self.manifest = manifest
        self._lock = threading.Lock()
        self._people: People | None = None
        self._stamp: _Stamp = None

    @property
    def has_faces(self) -> bool:
        return self.manifest.faces is not None

    def people(self) -> People:
        """The people as the edits stand now.

        Raises:
            NoFacesError: the generation has no faces side.
        """
        if not self.has_faces:
            raise NoFacesError(no_faces_message(self.directory))
        stamp = _stamp(self.directory / PEOPLE_FILE)
        with self._lock:
            if self._people is None:
                self._people = People.of_generation(self.directory, self.manifest)
            elif stamp != self._stamp:
                # Only the edits changed: the generation's faces stay as read.
                self._people = self._people.with_edits(load_edits(self.directory))
            self._stamp = stamp
            return self._people

    def mask(self, refs: Sequence[str], only: bool) -> np.ndarray:
        """Boolean mask over row ids of the images holding all of ``refs`` (see :meth:`People.mask`).

        Raises:
            NoFacesError: no faces side, or a name or number that is no person.
        """
        return self.people().mask(refs, only)

    def in_images(self, ids: Sequence[int] | np.ndarray) -> list[list[Face]] | None:
        """The faces of each image of ``ids``; None where the generation has no faces side."""
        return self.people().in_images(ids) if self.has_faces else None


def _stamp(path: Path) -> _Stamp:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


__all__ = ["CurrentPeople"]
