"""The user's word on people: names, merges, hidden people and faces moved by hand.

Kept in ``INDEX_DIR/people.json``, beside the generations rather than in one, so that no update,
rebuild of the FAISS file or new grouping of the faces can lose it. The file is versioned
(:data:`FORMAT`, :data:`VERSION`; a newer one is refused with what to do), replaced atomically
(a crash leaves the old file or the new one), and changed under its own lock
(``people.json.lock``), so a build and a rename never wait for each other.

People are numbered by the grouping (:mod:`indexer.faces.grouping`); an edit names those numbers
and faces:

- ``names``: a person's name (unique, case-insensitive);
- ``hidden``: people left out of listings (their faces are kept);
- ``merged``: person A's faces are person B's (A is then only an alias of B);
- ``faces``: a face moved by hand, to a person or to nobody (-1), by its key
  (``CONTENT_HASH/N``: the image's content hash and the face's number in it), which
  follows the image's content through moves and updates.

``next_person`` is the first number no grouping may give a new person: a person made by hand
(a split) is never handed to another group of faces later.
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import IndexFormatError, InvalidArgumentError, UnsupportedFormatError
from ..layout import atomic_write

PEOPLE_FILE = "people.json"
FORMAT = "clipsearch-people"
VERSION = 1
NOBODY = -1
MAX_NAME = 200


def face_key(content_hash: str, face: int) -> str:
    """The key of face number ``face`` of the image whose content hash is ``content_hash``."""
    return f"{content_hash}/{face}"


def face_keys(faces: pa.Table) -> list[str]:
    """The key of every face of a faces table (its ``content_hash`` and ``face`` columns), as
    :func:`face_key` makes it."""
    numbers = pc.cast(faces.column("face"), pa.string())
    return pc.binary_join_element_wise(faces.column("content_hash"), numbers, "/").to_pylist()


def _person(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(f"{what} must be a person number (0 or more), got {value!r}")
    return value


def check_name(name: object) -> str:
    """A person's name, trimmed; one line, not empty."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidArgumentError("a person's name must not be empty")
    text = " ".join(name.split())
    if len(text) > MAX_NAME:
        raise InvalidArgumentError(f"a person's name is at most {MAX_NAME} characters, got {len(text)}")
    return text


@dataclass(frozen=True)
class PeopleEdits:
    """Every edit the user made to the people of one index (see the module docstring)."""

    names: Mapping[int, str] = field(default_factory=dict)
    hidden: frozenset[int] = frozenset()
    merged: Mapping[int, int] = field(default_factory=dict)
    faces: Mapping[str, int] = field(default_factory=dict)
    next_person: int = 0

    # -- reading -----------------------------------------------------------------------------

    def resolve(self, person: int) -> int:
        """The person ``person`` stands for once merges are followed (-1 stays -1)."""
        seen = set()
        while person in self.merged and person not in seen:
            seen.add(person)
            person = self.merged[person]
        return person

    def apply(self, labels: np.ndarray, keys: Sequence[str] | Mapping[str, int]) -> np.ndarray:
        """The people of faces labelled ``labels`` by the grouping, after the user's edits.

        ``keys`` are the faces' keys in the order of ``labels``, or a mapping of each key to its
        position (a caller applying edits to the same faces again keeps one).
        """
        labels = np.asarray(labels, dtype=np.int64)
        # Merges are followed once per person, not once per face.
        people, inverse = np.unique(labels, return_inverse=True)
        out = np.array([self.resolve(int(p)) if p != NOBODY else NOBODY for p in people.tolist()], dtype=np.int64)[inverse]
        if self.faces:
            positions = keys if isinstance(keys, Mapping) else {k: i for i, k in enumerate(keys)}
            for key, person in self.faces.items():
                i = positions.get(key)
                if i is not None:
                    out[i] = person
        return out.reshape(labels.shape)

    def person_named(self, name: str) -> int | None:
        """The person called ``name`` (case-insensitive), if any."""
        wanted = check_name(name).casefold()
        return next((p for p, n in self.names.items() if n.casefold() == wanted), None)

    # -- editing (each returns the new edits) -------------------------------------------------

    def named(self, person: int, name: str) -> PeopleEdits:
        person, text = self.resolve(_person(person, "the person")), check_name(name)
        other = self.person_named(text)
        if other is not None and other != person:
            raise InvalidArgumentError(f"another person (#{other}) is already called {text!r}")
        return replace(self, names={**self.names, person: text})

    def merged_into(self, source: int, target: int) -> PeopleEdits:
        source, target = self.resolve(_person(source, "the person merged")), self.resolve(_person(target, "the person merged into"))
        if source == target:
            raise InvalidArgumentError(f"cannot merge person #{source} into itself")
        names = dict(self.names)
        if source in names and target not in names:
            names[target] = names[source]
        names.pop(source, None)
        faces = {k: (target if p == source else p) for k, p in self.faces.items()}
        return replace(self, names=names, merged={**self.merged, source: target}, faces=faces,
                       hidden=self.hidden - {source})

    def with_hidden(self, person: int, hidden: bool = True) -> PeopleEdits:
        person = self.resolve(_person(person, "the person"))
        return replace(self, hidden=self.hidden | {person} if hidden else self.hidden - {person})

    def moved(self, keys: list[str], person: int) -> PeopleEdits:
        """``keys``' faces moved to ``person`` (-1: to nobody)."""
        target = NOBODY if person == NOBODY else self.resolve(_person(person, "the person"))
        return replace(self, faces={**self.faces, **dict.fromkeys(keys, target)})

    def split(self, keys: list[str], first_free: int) -> tuple[PeopleEdits, int]:
        """``keys``' faces moved to a new person; returns the edits and its number."""
        if not keys:
            raise InvalidArgumentError("a split needs at least one face")
        new = max(self.next_person, first_free)
        return replace(self, faces={**self.faces, **dict.fromkeys(keys, new)}, next_person=new + 1), new

    # -- the file -----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "version": VERSION, "next_person": self.next_person,
            "names": {str(p): n for p, n in sorted(self.names.items())}, "hidden": sorted(self.hidden),
            "merged": {str(a): b for a, b in sorted(self.merged.items())}, "faces": dict(sorted(self.faces.items())),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = PEOPLE_FILE) -> PeopleEdits:
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            raise IndexFormatError(f"{where} is not a clipsearch people file (format {FORMAT!r})")
        version = data.get("version")
        if not isinstance(version, int) or version < 1:
            raise IndexFormatError(f"{where} has no valid version")
        if version > VERSION:
            raise UnsupportedFormatError(f"{where} is people file version {version}, newer than this clipsearch reads "
                                         f"({VERSION}); upgrade clipsearch to read it")
        try:
            names = {_person(int(p), "a named person"): check_name(n) for p, n in dict(data.get("names") or {}).items()}
            merged = {_person(int(a), "a merged person"): _person(int(b), "a person merged into")
                      for a, b in dict(data.get("merged") or {}).items()}
            faces = {str(k): (NOBODY if int(p) == NOBODY else _person(int(p), "a face's person"))
                     for k, p in dict(data.get("faces") or {}).items()}
            hidden = frozenset(_person(int(p), "a hidden person") for p in data.get("hidden") or [])
            next_person = _person(int(data.get("next_person", 0)), "next_person")
        except (TypeError, ValueError) as exc:
            raise IndexFormatError(f"{where} is damaged: {exc}") from None
        return cls(names, hidden, merged, faces, next_person)


def load_edits(index_dir: str | Path) -> PeopleEdits:
    """The edits of the index at ``index_dir`` (none where it has no people file)."""
    path = Path(index_dir) / PEOPLE_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return PeopleEdits()
    try:
        return PeopleEdits.from_dict(json.loads(text), str(path))
    except json.JSONDecodeError as exc:
        raise IndexFormatError(f"{path} is damaged: {exc}") from None


def save_edits(index_dir: str | Path, edits: PeopleEdits) -> None:
    """Replace the people file atomically (callers hold :func:`editing`)."""
    data = (json.dumps(edits.to_dict(), ensure_ascii=False, indent=1) + "\n").encode("utf-8")
    atomic_write(Path(index_dir) / PEOPLE_FILE, lambda fh: fh.write(data))


@contextmanager
def editing(index_dir: str | Path) -> Iterator[list[PeopleEdits]]:
    """The edits under the people file's lock: change ``box[0]``; it is saved when the block ends
    without an error (an error leaves the file as it was)."""
    lock = Path(index_dir) / f"{PEOPLE_FILE}.lock"
    with open(lock, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            box = [load_edits(index_dir)]
            before = box[0]
            yield box
            if box[0] != before:
                save_edits(index_dir, box[0])
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


__all__ = ["NOBODY", "PEOPLE_FILE", "PeopleEdits", "check_name", "editing", "face_key", "face_keys", "load_edits", "save_edits"]
