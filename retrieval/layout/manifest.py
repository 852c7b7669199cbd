"""The manifest: what a generation holds, which format version it is, and its own digest.

Readers refuse a manifest whose ``format_version`` is newer than :data:`FORMAT_VERSION`, and
say to upgrade clipsearch; they refuse a damaged one and say to rebuild the index.

Format versions: 1 = flat FAISS only; 2 = any FAISS index type with its tuned search
parameters (``search_params``: a version-1 reader would search an approximate index untuned),
the options it was chosen with (``index_options``), how tuning went (``index_tuning``), and
path side files. Version-1 indexes are still read (and updated to version 2 when written).
3 = a FAISS file that re-ranks (``index_type`` ends in ``Refine(...)``: compressed codes plus
float16 copies of the vectors, which readers memory-map) with a ``k_factor`` among its
``search_params``; a version-2 reader would read the whole file into RAM and search it with
filters that FAISS ignores there. Writers record the lowest version that describes the index
(:func:`format_version_for`): 3 only for such a file, so that every other index stays readable
by version-2 readers. An index is upgraded (re-planned as ``auto`` chooses today) by its next
``reindex``, or by the next update whose options no longer choose its FAISS type.
4 = parts whose ids were assigned when they were linked into the index (``PartRef.id_offset``:
a part written by a Ray actor before its first id was known stores ids ``0 .. rows - 1``,
readers add the offset); written only when a part has one, so that other indexes stay readable
by version-2 and -3 readers, which would take the stored ids for the index's.
5 = rows of video frames (``VIDEO_COLUMNS``: several rows per file, ``media`` ``video``); a
version-4 reader would list each frame as an image of the video's path and fail to decode it as
one. Written only when the index holds a video, so that an index of images stays readable by
older readers.

Integrity, within version 2 (every addition is optional and ignored by readers that do not know
it, who read such an index correctly, only without the checks): ``checksums`` records the size
and sha256 of every data file of the generation; ``manifest_digest`` is the sha256 of the
manifest's own canonical JSON (every key but itself, sorted, compact), so that any change to the
manifest is detected on open; Parquet files carry page CRCs, verified whenever a page is read.
Manifests without them are read without these checks; :func:`retrieval.tools.verify.verify_index`
reports the missing checksums, and the next writer of a generation records them.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..checks import is_positive_int
from ..errors import IndexCorruptError, IndexFormatError, NotAnIndexError, UnsupportedFormatError
from .checksums import CHECKSUM_ALGORITHM, FileChecksum
from .durable import atomic_write
from .file_refs import FacesRef, FaissRef, KeywordsRef, PartRef, check_relative
from .filenames import MANIFEST_FILE

FORMAT_VERSION = 5
FORMAT_NAME = "clipsearch-index"
MANIFEST_DIGEST_KEY = "manifest_digest"


def format_version_for(index_type: str, parts: Sequence[PartRef] = (), videos: bool = False) -> int:
    """The format version a manifest of this FAISS type and these parts is written with: the
    lowest that describes them (see the module docstring); ``videos``: it holds video rows."""
    if videos:
        return 5
    if any(p.id_offset for p in parts):
        return 4
    return 3 if "Refine(" in index_type else 2


@dataclass(frozen=True)
class Manifest:
    """The contents of ``manifest.json``.

    Attributes:
        model: the model id or the absolute path of the local checkpoint the index was built with.
        model_fingerprint: sha256 over the checkpoint's weight files (see ``encoders``).
        backend: which encoder family produced the vectors (``"hf"`` for Hugging Face CLIP).
        dim: embedding dimension.
        count: number of indexed images (rows over all parts, vectors in FAISS).
        skipped: number of files that were found but could not be decoded.
        preprocess: the image preprocessing used, as a JSON-able dict.
        index_type: FAISS factory string of the FAISS file.
        generation: id of this generation (its directory is ``gen-<generation>``).
        source_root: absolute path of the indexed folder at build time (informational).
        created: ISO-8601 UTC time of this generation.
        tool_version: clipsearch version that wrote the index.
        parts: the Parquet parts, in id order.
        faiss: the FAISS file, or None when readers build it from the parts.
        skipped_file: the skip list (Parquet).
        complete: False while a build or update that committed this generation is still to
            finish (or was interrupted: running it again resumes).
        metric: always ``"inner_product"`` over L2-normalised vectors (cosine similarity).
        model_info: what the encoder reports about its model (backend, architecture, pretrained
            tag or weights hash, the backend's own preprocessing settings, ...); informational,
            ``{}`` in indexes that do not record it.
        index_options: what the index type was chosen from (``index_type`` as asked, e.g.
            ``auto``, ``max_memory``, ``target_recall``); updates keep them.
        search_params: FAISS search parameters tuned for the FAISS file (``nprobe``,
            ``efSearch``); readers apply them. ``{}`` for flat.
        index_tuning: how the FAISS file was chosen and tuned (recall@10 reached, queries,
            timings); informational.
        checksums: size and digest of every file of the generation (:meth:`files`), by path;
            ``{}`` in indexes that do not record them.
        discovery: what the walk of the photos left out (``include_hidden``, the ``exclude``
            patterns); updates keep it. ``{}`` in indexes that do not record it (their walks
            left nothing out; their next update records the defaults).
        keywords: the keyword side (:class:`KeywordsRef`), None in indexes built before it
            (their next ``index`` run adds it without embedding again).
        faces: the faces side (:class:`FacesRef`), None in indexes built without ``--faces``.
    """

    model: str
    model_fingerprint: str
    backend: str
    dim: int
    count: int
    skipped: int
    preprocess: Mapping[str, Any]
    index_type: str
    generation: str
    source_root: str
    created: str
    tool_version: str
    parts: tuple[PartRef, ...]
    faiss: FaissRef | None
    skipped_file: str
    complete: bool = True
    metric: str = "inner_product"
    normalized: bool = True
    model_info: Mapping[str, Any] = field(default_factory=dict)
    index_options: Mapping[str, Any] = field(default_factory=dict)
    search_params: Mapping[str, int] = field(default_factory=dict)
    index_tuning: Mapping[str, Any] = field(default_factory=dict)
    checksums: Mapping[str, FileChecksum] = field(default_factory=dict)
    discovery: Mapping[str, Any] = field(default_factory=dict)
    keywords: KeywordsRef | None = None
    faces: FacesRef | None = None
    format: str = FORMAT_NAME
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        if self.dim < 1:
            raise ValueError(f"manifest dim must be >= 1, got {self.dim}")
        if self.count < 0 or self.skipped < 0:
            raise ValueError("manifest counts must be >= 0")
        if self.metric != "inner_product":
            raise ValueError(f"unsupported metric {self.metric!r}")
        for name in ("model_info", "index_options", "search_params", "index_tuning", "discovery"):
            if not isinstance(getattr(self, name), Mapping):
                raise ValueError(f"{name} must be a mapping, got {type(getattr(self, name)).__name__}")
        known = ("nprobe", "efSearch", "k_factor") if self.format_version >= 3 else ("nprobe", "efSearch")
        for key, value in self.search_params.items():
            if key not in known or not is_positive_int(value):
                raise ValueError(f"unknown search parameter {key}={value!r}")
        if format_version_for(self.index_type) == 3 and self.format_version < 3:
            raise ValueError(f"index type {self.index_type!r} needs format version 3, got {self.format_version}")
        if self.format_version < 4 and any(p.id_offset for p in self.parts):
            raise ValueError(f"parts with an id_offset need format version 4, got {self.format_version}")
        check_relative(self.skipped_file, "skipped_file")
        next_id = 0
        for part in self.parts:
            if part.first_id != next_id:
                raise ValueError(f"part {part.path} starts at id {part.first_id}, expected {next_id}")
            next_id += part.rows
        if next_id != self.count:
            raise ValueError(f"parts hold {next_id} rows but count is {self.count}")
        if self.faiss is not None and self.faiss.rows > self.count:
            raise ValueError(f"the faiss file holds {self.faiss.rows} rows, more than count {self.count}")
        if not isinstance(self.checksums, Mapping):
            raise ValueError("checksums must be a mapping")
        if self.checksums and set(self.checksums) != set(self.files()):
            # All or nothing: a checksum missing for one file would let its damage pass unseen.
            missing = sorted(set(self.files()) - set(self.checksums))
            extra = sorted(set(self.checksums) - set(self.files()))
            raise ValueError(f"checksums do not cover the generation's files (missing {missing}, unknown {extra})")
        if self.keywords is not None and self.keywords.rows != self.count:
            raise ValueError(f"the keyword side holds {self.keywords.rows} rows for count {self.count}")
        if self.faces is not None and self.faces.rows != self.count:
            raise ValueError(f"the faces side covers {self.faces.rows} rows for count {self.count}")

    def files(self) -> dict[str, str]:
        """Every data file of this generation: relative path -> kind (``part``, ``paths``,
        ``faiss``, ``skipped``), in id order of the parts."""
        out: dict[str, str] = {}
        for part in self.parts:
            out[part.path] = "part"
            if part.paths is not None:
                out[part.paths] = "paths"
        if self.faiss is not None:
            out[self.faiss.path] = "faiss"
        out[self.skipped_file] = "skipped"
        return out

    def to_dict(self) -> dict[str, Any]:
        """The manifest as plain JSON-able data, as ``manifest.json`` holds it (without its digest)."""
        data = asdict(self)
        data["preprocess"] = dict(self.preprocess)
        for name in ("model_info", "index_options", "search_params", "index_tuning", "discovery"):
            data[name] = dict(getattr(self, name))
        # id_offset only where set: a manifest without such parts is written as before version 4.
        data["parts"] = [{k: v for k, v in asdict(p).items() if k != "id_offset" or v} for p in self.parts]
        data["faiss"] = asdict(self.faiss) if self.faiss is not None else None
        data["checksums"] = {path: asdict(c) for path, c in self.checksums.items()}
        if self.keywords is None:
            del data["keywords"]  # an index without one is written as before it existed
        else:
            data["keywords"]["sources"] = list(self.keywords.sources)
        if self.faces is None:
            del data["faces"]
        else:
            data["faces"] = self.faces.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "manifest") -> Manifest:
        """Validate and build a manifest from its JSON data (without the digest).

        Args:
            data: the parsed ``manifest.json``.
            where: how error messages name the manifest (its path).

        Returns:
            The manifest.

        Raises:
            UnsupportedFormatError: ``format_version`` is newer than :data:`FORMAT_VERSION`.
            IndexFormatError: not a clipsearch manifest, or a field is missing or invalid.
        """
        if data.get("format") != FORMAT_NAME:
            raise IndexFormatError(f"{where} is not a clipsearch manifest (format={data.get('format')!r})")
        version = data.get("format_version")
        if not isinstance(version, int):
            raise IndexFormatError(f"{where} has no integer format_version")
        if version > FORMAT_VERSION:
            raise UnsupportedFormatError(
                f"{where} has index format version {version}, newer than this clipsearch reads "
                f"(version {FORMAT_VERSION}); upgrade clipsearch to open it"
            )
        if version < 1:
            raise IndexFormatError(f"{where} has invalid format_version {version}")
        known = {f.name for f in cls.__dataclass_fields__.values()}
        try:
            kwargs = {k: v for k, v in data.items() if k in known}
            kwargs["parts"] = tuple(PartRef(**p) for p in data["parts"])
            kwargs["faiss"] = FaissRef(**data["faiss"]) if data.get("faiss") is not None else None
            kwargs["checksums"] = {str(k): FileChecksum(**v) for k, v in (data.get("checksums") or {}).items()}
            kwargs["keywords"] = KeywordsRef.from_dict(data["keywords"]) if data.get("keywords") is not None else None
            kwargs["faces"] = FacesRef.from_dict(data["faces"]) if data.get("faces") is not None else None
            return cls(**kwargs)
        except KeyError as exc:
            raise IndexFormatError(f"{where} is damaged (missing {exc})") from exc
        except (TypeError, ValueError, AttributeError) as exc:
            raise IndexFormatError(f"{where} is damaged: {exc}") from exc


# An unreadable manifest cannot name the index's model, which a rebuild otherwise keeps: it takes the default.
UNKNOWN_MODEL_NOTE = " (add --model MODEL if it was built with another model than the default: its manifest cannot tell)"


def read_manifest(index_dir: str | os.PathLike[str]) -> Manifest:
    """Read and validate ``INDEX_DIR/manifest.json``, its digest first.

    Args:
        index_dir: the index directory.

    Returns:
        The current generation's manifest.

    Raises:
        NotAnIndexError: the directory does not exist or has no manifest.
        UnsupportedFormatError: the index is newer than this code reads.
        IndexFormatError: the manifest is unreadable or invalid.
    """
    index_dir = Path(index_dir)
    path = index_dir / MANIFEST_FILE
    if not index_dir.is_dir():
        raise NotAnIndexError(f"{index_dir} is not a clipsearch index: no such directory")
    if not path.is_file():
        raise NotAnIndexError(f"{index_dir} is not a clipsearch index: it has no {MANIFEST_FILE}")
    fix = f"rebuild the index with `clipsearch index PHOTOS_DIR {index_dir} --rebuild`{UNKNOWN_MODEL_NOTE}"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise IndexFormatError(f"{path} cannot be read: {exc}") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise IndexCorruptError(path, f"not valid JSON: {exc}", fix) from exc
    if not isinstance(data, dict):
        raise IndexCorruptError(path, "not a JSON object", fix)
    # The digest first: a damaged manifest must not be read as some other valid one (a flipped
    # bit can turn format_version 2 into 3 or 6, which would otherwise say "upgrade").
    recorded = data.pop(MANIFEST_DIGEST_KEY, None)
    if recorded is not None:
        expected = {"algorithm": CHECKSUM_ALGORITHM, "digest": manifest_digest(data)}
        if recorded != expected:
            raise IndexCorruptError(path, "its content does not match its digest", fix)
    return Manifest.from_dict(data, where=str(path))


def manifest_digest(data: Mapping[str, Any]) -> str:
    """sha256 (hex) of a manifest's canonical JSON: keys sorted, compact, UTF-8.

    Computed over the parsed data, not the bytes, so a manifest rewritten with other spacing
    keeps its digest. The scheme is fixed across format versions: readers check it first.
    """
    text = json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def write_manifest(index_dir: str | os.PathLike[str], manifest: Manifest) -> None:
    """Atomically write the manifest, with its digest; call this only after every data file is in place.

    Raises:
        OSError: the manifest cannot be written; the previous one is then left as it was.
    """
    data = manifest.to_dict()
    data[MANIFEST_DIGEST_KEY] = {"algorithm": CHECKSUM_ALGORITHM, "digest": manifest_digest(data)}
    text = json.dumps(data, indent=2, ensure_ascii=False, sort_keys=True) + "\n"
    atomic_write(Path(index_dir) / MANIFEST_FILE, lambda fh: fh.write(text.encode("utf-8")))
