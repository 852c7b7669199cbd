"""The people of an index, its faces side read with the user's edits (``clipsearch people``: :mod:`clipsearch.cli.people`).

:class:`People` is what the CLI, the HTTP API and a person filter ask: who is there, with how
many faces in how many images, which faces are a person's, which images hold a set of people.
It reads the current generation's faces side (:data:`~retrieval.layout.FACES_SCHEMA`) and
``people.json`` (:mod:`.edits`) once, when opened.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from .. import store
from ..errors import NoFacesError
from ..layout import FACES_SCHEMA, Manifest, display_path, read_manifest
from .edits import NOBODY, PeopleEdits, face_keys, load_edits


@dataclass(frozen=True)
class Face:
    """One face: its key (for moves and splits), the image it is in, where, and whose it is."""

    key: str
    id: int
    path: str
    box: tuple[float, float, float, float]
    score: float
    person: int


@dataclass(frozen=True)
class Person:
    """One person: number, name (None until named), faces and images, and the largest face."""

    id: int
    name: str | None
    hidden: bool
    faces: int
    images: int
    cover: Face

    @property
    def label(self) -> str:
        return self.name or f"#{self.id}"


class People:
    """The people of one index generation (see the module docstring)."""

    def __init__(self, faces: pa.Table, edits: PeopleEdits, rows: int) -> None:
        self.edits = edits
        self.rows = rows
        self._ids = faces.column("id").to_numpy()
        self._path_bytes = faces.column("path_bytes")
        self._keys = face_keys(faces)
        self._boxes = np.stack([faces.column(c).to_numpy() for c in ("left", "top", "right", "bottom")], axis=1) \
            if faces.num_rows else np.zeros((0, 4), np.float32)
        self._scores = faces.column("score").to_numpy()
        self.labels = faces.column("person").to_numpy()
        # Each key's position, made once edits move faces by hand and kept for the next edits (with_edits).
        self._positions: dict[str, int] | None = None
        self.person_of = edits.apply(self.labels, self._keys_for(edits))
        # Face numbers in image-id order, made on the first "who is in these images".
        self._by_image: np.ndarray | None = None

    def with_edits(self, edits: PeopleEdits) -> People:
        """These faces with ``edits`` instead of the ones read (the faces side is not read again)."""
        other = copy.copy(self)
        other.edits = edits
        other.person_of = edits.apply(self.labels, other._keys_for(edits))
        return other

    def _keys_for(self, edits: PeopleEdits) -> Sequence[str] | dict[str, int]:
        """The keys ``edits.apply`` reads: by position where faces were moved by hand (made once)."""
        if not edits.faces:
            return self._keys
        if self._positions is None:
            self._positions = {k: i for i, k in enumerate(self._keys)}
        return self._positions

    @classmethod
    def open(cls, index_dir: str | Path) -> People:
        """The people of the index at ``index_dir`` (its current generation).

        Raises:
            NoFacesError: the index was built without ``--faces``.
        """
        return cls.of_generation(index_dir, read_manifest(index_dir))

    @classmethod
    def of_generation(cls, index_dir: str | Path, manifest: Manifest) -> People:
        """The people of the generation ``manifest`` describes, with the index's edits as they are now.

        Raises:
            NoFacesError: the generation has no faces side.
        """
        if manifest.faces is None:
            raise NoFacesError(no_faces_message(index_dir))
        pf = store.open_parquet(Path(index_dir) / manifest.faces.path)
        with store.reading(pf):
            faces = pf.read(columns=[n for n in FACES_SCHEMA.names if n not in ("landmarks", "descriptor")])
        return cls(faces, load_edits(index_dir), manifest.count)

    # -- who ----------------------------------------------------------------------------------

    def _face(self, i: int) -> Face:
        left, top, right, bottom = (float(v) for v in self._boxes[i])
        path = display_path(self._path_bytes[i].as_py())
        return Face(self._keys[i], int(self._ids[i]), path, (left, top, right, bottom), float(self._scores[i]),
                    int(self.person_of[i]))

    def everyone(self, include_hidden: bool = False) -> list[Person]:
        """Every person, the one with the most faces first (hidden ones only when asked)."""
        found: list[Person] = []
        for person in np.unique(self.person_of[self.person_of != NOBODY]):
            mine = np.flatnonzero(self.person_of == person)
            hidden = int(person) in self.edits.hidden
            if hidden and not include_hidden:
                continue
            sizes = np.minimum(self._boxes[mine, 2] - self._boxes[mine, 0], self._boxes[mine, 3] - self._boxes[mine, 1])
            found.append(Person(int(person), self.edits.names.get(int(person)), hidden, len(mine),
                                len(np.unique(self._ids[mine])), self._face(int(mine[int(np.argmax(sizes))]))))
        return sorted(found, key=lambda p: (-p.faces, p.id))

    def find(self, ref: str | int) -> int:
        """The person a name or number (``7``, ``#7``, ``"Alice"``) names.

        Raises:
            NoFacesError: no such person.
        """
        text = str(ref).strip()
        number = text[1:] if text.startswith("#") else text
        if number.isdigit():
            person = self.edits.resolve(int(number))
            if (self.person_of == person).any():
                return person
            raise NoFacesError(f"no person #{number} in this index (`clipsearch people list` shows who is there)")
        named = self.edits.person_named(text) if text else None
        if named is None:
            raise NoFacesError(f"no person called {text!r} in this index (`clipsearch people list` shows who is there)")
        return named

    def faces_of(self, person: int) -> list[Face]:
        """The faces of ``person``, by image id."""
        return [self._face(int(i)) for i in np.flatnonzero(self.person_of == person)]

    def faces_in(self, image_id: int) -> list[Face]:
        """The faces of the image with row id ``image_id`` ("who is in this photo")."""
        return [self._face(int(i)) for i in np.flatnonzero(self._ids == image_id)]

    def face(self, key: str) -> Face:
        """The face with ``key`` (``CONTENT_HASH/N``).

        Raises:
            NoFacesError: no face has that key.
        """
        try:
            return self._face(self._keys.index(key))
        except ValueError:
            raise NoFacesError(f"no face {key!r} in this index (`clipsearch people show PERSON` lists face keys)") from None

    def images_with(self, people: Sequence[int], only: bool = False) -> np.ndarray:
        """Row ids of the images holding every one of ``people`` (and, with ``only``, nobody else
        who is a person: faces of nobody are not counted)."""
        if not people:
            raise NoFacesError("name at least one person")
        mask = np.ones(self.rows, dtype=bool)
        for person in people:
            has = np.zeros(self.rows, dtype=bool)
            has[self._ids[self.person_of == person]] = True
            mask &= has
        if only:
            others = np.zeros(self.rows, dtype=bool)
            others[self._ids[(self.person_of != NOBODY) & ~np.isin(self.person_of, list(people))]] = True
            mask &= ~others
        return np.flatnonzero(mask)

    def mask(self, refs: Sequence[str | int], only: bool = False) -> np.ndarray:
        """Boolean mask over row ids: the images holding every person ``refs`` names (names or
        numbers, as :meth:`find` reads them), and with ``only`` nobody else.

        Raises:
            NoFacesError: a name or number that is no person here.
        """
        mask = np.zeros(self.rows, dtype=bool)
        mask[self.images_with([self.find(ref) for ref in refs], only)] = True
        return mask

    def in_images(self, ids: Sequence[int] | np.ndarray) -> list[list[Face]]:
        """The faces of each image of ``ids`` (by row id, in the order given), largest first."""
        if self._by_image is None:
            self._by_image = np.argsort(self._ids, kind="stable")
        order = self._by_image
        sorted_ids = self._ids[order]
        out: list[list[Face]] = []
        for image in np.asarray(ids, dtype=np.int64).tolist():
            lo, hi = np.searchsorted(sorted_ids, image, "left"), np.searchsorted(sorted_ids, image, "right")
            mine = order[lo:hi]
            sizes = (self._boxes[mine, 2] - self._boxes[mine, 0]) * (self._boxes[mine, 3] - self._boxes[mine, 1])
            out.append([self._face(int(i)) for i in mine[np.argsort(-sizes, kind="stable")]])
        return out

    def first_free(self) -> int:
        """A person number no face of the grouping holds yet."""
        used = [int(self.labels.max()) + 1 if len(self.labels) else 0, int(self.person_of.max()) + 1 if len(self.person_of) else 0]
        return max(used)


def no_faces_message(index_dir: str | Path) -> str:
    """What to do about an index without faces, in one line."""
    return f"{index_dir} holds no faces: run `clipsearch index PHOTOS_DIR {index_dir} --faces` to find them"


__all__ = ["Face", "People", "Person", "no_faces_message"]
