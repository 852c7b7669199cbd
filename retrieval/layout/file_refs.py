"""What a manifest (:mod:`retrieval.layout.manifest`) records of each file of a generation.

``PartRef`` (a Parquet part, its ids and path side file), ``FaissRef`` (the FAISS file), and the
side files, each with its own checksum: ``KeywordsRef`` (the keyword side) and ``FacesRef`` (the
faces side). Each path is checked to stay inside the index: a manifest must not make readers open
files elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .checksums import FileChecksum


def check_relative(path: Any, what: str) -> None:
    """Refuse a path that is not relative inside the index (``what`` names it in the message).

    Raises:
        ValueError: an absolute path, a backslash, an empty, ``.`` or ``..`` component, or not a string.
    """
    parts = path.split("/") if isinstance(path, str) else []
    if not parts or path.startswith("/") or "\\" in path or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"{what} must be a relative path inside the index, got {path!r}")


@dataclass(frozen=True)
class PartRef:
    """One Parquet part: ``rows`` rows with ids ``first_id .. first_id + rows - 1``.

    ``paths`` names its path side file (format 2); None in version-1 indexes. ``id_offset``
    (format 4) is added to the part's stored ``id`` column to give the index's ids: a part
    written before its first id was known (by a Ray actor) stores ``0 .. rows - 1`` and is
    linked with ``id_offset == first_id``; 0 (and left out of the manifest) for every other part.
    """

    path: str
    rows: int
    first_id: int
    file_id: str
    paths: str | None = None
    id_offset: int = 0

    @property
    def stored_first_id(self) -> int:
        """The first value of the part's stored ``id`` column."""
        return self.first_id - self.id_offset

    def __post_init__(self) -> None:
        check_relative(self.path, "a part path")
        if self.paths is not None:
            check_relative(self.paths, "a part's paths file")
        if self.rows < 1 or self.first_id < 0:
            raise ValueError(f"part {self.path}: rows must be >= 1 and first_id >= 0")
        if isinstance(self.id_offset, bool) or not isinstance(self.id_offset, int) or not 0 <= self.id_offset <= self.first_id:
            raise ValueError(f"part {self.path}: id_offset must be an integer in 0..first_id, got {self.id_offset!r}")


@dataclass(frozen=True)
class FaissRef:
    """The FAISS file and how many rows (ids ``0 .. rows - 1``) it holds."""

    path: str
    rows: int

    def __post_init__(self) -> None:
        check_relative(self.path, "the faiss path")
        if self.rows < 0:
            raise ValueError("faiss rows must be >= 0")


@dataclass(frozen=True)
class KeywordsRef:
    """The keyword side of a generation (:mod:`retrieval.keywords`): an SQLite FTS5 file over
    ``rows`` images (ids ``0 .. rows - 1``, always ``count``), with its own checksum.

    Recorded under ``keywords`` rather than in ``checksums``, so that a reader that does not
    know the key ignores the whole side (and the file) and still checks every other file.
    ``sources`` are the sources it indexes, ``with_text`` how many images have text besides
    their path, ``ocr`` whether the build recognised text in the pixels (``index --ocr``, kept
    by updates).
    """

    path: str
    rows: int
    checksum: FileChecksum
    sources: tuple[str, ...] = ()
    with_text: int = 0
    ocr: bool = False

    def __post_init__(self) -> None:
        check_relative(self.path, "the keywords path")
        if self.rows < 0 or self.with_text < 0:
            raise ValueError("keywords rows must be >= 0")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KeywordsRef:
        return cls(
            path=data["path"], rows=data["rows"], checksum=FileChecksum(**data["checksum"]),
            sources=tuple(data.get("sources", ())), with_text=int(data.get("with_text", 0)), ocr=bool(data.get("ocr", False)),
        )


@dataclass(frozen=True)
class FacesRef:
    """The faces side of a generation (``index --faces``, :mod:`indexer.faces`): the faces found
    (``path``, :data:`~retrieval.layout.schemas.FACES_SCHEMA`) and the images read
    (``read_path``), each file with its own checksum.

    Recorded under ``faces`` rather than in ``checksums``, like the keyword side, so that a
    reader that does not know the key ignores the whole side. ``read`` of the generation's rows
    have been read (all of them when ``read == rows``); ``faces`` is the number of faces,
    ``people`` the number of people they form; ``options`` are the detector's and the grouping's
    settings, which later runs keep.
    """

    path: str
    read_path: str
    rows: int
    read: int
    faces: int
    people: int
    checksum: FileChecksum
    read_checksum: FileChecksum
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_relative(self.path, "the faces path")
        check_relative(self.read_path, "the faces read path")
        if min(self.rows, self.read, self.faces, self.people) < 0 or self.read > self.rows:
            raise ValueError(f"faces counts must be >= 0 and read <= rows (rows {self.rows}, read {self.read})")
        if not isinstance(self.options, Mapping):
            raise ValueError("faces options must be a mapping")

    @property
    def complete(self) -> bool:
        """Whether every row of the generation has been read."""
        return self.read == self.rows

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["options"] = dict(self.options)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FacesRef:
        return cls(
            path=data["path"], read_path=data["read_path"], rows=int(data["rows"]), read=int(data["read"]),
            faces=int(data["faces"]), people=int(data["people"]), checksum=FileChecksum(**data["checksum"]),
            read_checksum=FileChecksum(**data["read_checksum"]), options=dict(data.get("options") or {}),
        )


__all__ = ["FacesRef", "FaissRef", "KeywordsRef", "PartRef", "check_relative"]
