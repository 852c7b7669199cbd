"""The on-disk contract of an index directory.

An index directory holds::

    manifest.json                 the current generation: format version, model, the files below
    lock                          locked (POSIX lockf) by the one process writing the index
    gen-<generation>/
        embeddings/part-00000.parquet ...
                                  rows id, path, path_bytes, width, height, size, mtime_ns,
                                  content_hash, embedding; ids run 0..count-1 across the parts
    paths/part-00000.paths ...    (format 2) each part's ``path`` column as offsets + UTF-8
                                  bytes and a CRC-32 per path, memory-mapped so that a search
                                  reads (and checks) the paths of its hits only
                                  (:func:`write_paths_file`)
        index.faiss               FAISS index whose row i is id i, over the first ``faiss.rows``
                                  ids (readers add the vectors of later rows on open)
        skipped.parquet           files that could not be decoded: path, path_bytes, reason, ...

A generation never changes once its manifest is written. A writer builds the next generation in
``.staging-<generation>/`` (hard-linking the parts and FAISS file it keeps from the previous
one, so a commit costs only the new rows), renames it to ``gen-<generation>/``, atomically
replaces ``manifest.json`` and then removes the superseded generation. A crash at any point
leaves a manifest whose files all exist; a reader that opened an older generation keeps its
open files. Readers refuse a manifest whose ``format_version`` is newer than
:data:`FORMAT_VERSION`.

Format history: 1 = flat FAISS only; 2 = any FAISS index type with its tuned search
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

Integrity (still version 2: every addition is optional and ignored by readers that predate it,
who read such an index correctly, only without the checks): ``checksums`` records the size and
sha256 of every data file of the generation; ``manifest_digest`` is the sha256 of the manifest's
own canonical JSON (every key but itself, sorted, compact), so that any change to the manifest is
detected on open; Parquet files carry page CRCs, verified whenever a page is read. Manifests
without them (written before) are read as before; :func:`retrieval.verify.verify_index` reports
the missing checksums, and the next writer of a generation records them.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import struct
import tempfile
import zlib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import pyarrow as pa

from .checks import is_int, is_positive_int
from .errors import IndexCorruptError, IndexFormatError, NotAnIndexError, UnsupportedFormatError

FORMAT_VERSION = 3
FORMAT_NAME = "clipsearch-index"

MANIFEST_FILE = "manifest.json"
EMBEDDINGS_DIR = "embeddings"
PATHS_DIR = "paths"
FAISS_FILE = "index.faiss"
SKIPPED_FILE = "skipped.parquet"
LOCK_FILE = "lock"
PATHS_SUFFIX = ".paths"
# Side file of a part's paths: magic, file id (32 ASCII hex), row count (u64), count + 1
# offsets (u64, little-endian) into the UTF-8 bytes that follow, then (written since checksums)
# a trailer: one CRC-32 (u32) per path and PATHS_CRC_MAGIC. Readers that predate the trailer
# ignore bytes after the paths; readers that know it check each path they read.
PATHS_MAGIC = b"CSPATHS1"
PATHS_HEADER = struct.Struct("<8s32sQ")
PATHS_CRC_MAGIC = b"CSPCRC32"

GENERATION_PREFIX = "gen-"
STAGING_PREFIX = ".staging-"

# Parquet key/value metadata that ties a data file to the manifest entry that names it.
FILE_ID_KEY = b"clipsearch.file_id"

# Content checksums of data files (``Manifest.checksums``) and of the manifest itself.
CHECKSUM_ALGORITHM = "sha256"
MANIFEST_DIGEST_KEY = "manifest_digest"
# Files are hashed in chunks of this size: memory stays flat whatever the file size.
_HASH_CHUNK = 1 << 20


def format_version_for(index_type: str) -> int:
    """The format version a manifest of this FAISS type is written with (see the history above)."""
    return 3 if "Refine(" in index_type else 2


def generation_dir(generation: str) -> str:
    """Name of the directory (inside INDEX_DIR) that holds one generation's data files."""
    return GENERATION_PREFIX + generation


def part_name(number: int) -> str:
    """File name of the ``number``-th part of a generation (zero-padded: name order is id order)."""
    return f"part-{number:05d}.parquet"


def embeddings_schema(dim: int) -> pa.Schema:
    """Schema of ``embeddings.parquet`` for vectors of ``dim`` float32 values.

    ``path`` is the image path relative to the indexed folder, as ``search`` returns it: valid
    UTF-8, with bytes of non-UTF-8 file names written as ``\\xNN``. ``path_bytes`` holds the
    exact file-system bytes of the same relative path, so every file can be opened again.
    """
    if dim < 1:
        raise ValueError(f"embedding dim must be >= 1, got {dim}")
    return pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            pa.field("path", pa.string(), nullable=False),
            pa.field("path_bytes", pa.binary(), nullable=False),
            pa.field("width", pa.int32(), nullable=False),
            pa.field("height", pa.int32(), nullable=False),
            # What was embedded: lets an update skip unchanged files and spot changed ones.
            pa.field("size", pa.int64(), nullable=False),
            pa.field("mtime_ns", pa.int64(), nullable=False),
            pa.field("content_hash", pa.string(), nullable=False),
            pa.field("embedding", pa.list_(pa.float32(), dim), nullable=False),
        ]
    )


SKIPPED_SCHEMA = pa.schema(
    [
        pa.field("path", pa.string(), nullable=False),
        pa.field("path_bytes", pa.binary(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        # Null for entries that are not files (unreadable directories, missing list entries).
        pa.field("size", pa.int64()),
        pa.field("mtime_ns", pa.int64()),
        pa.field("content_hash", pa.string()),
    ]
)


@dataclass(frozen=True)
class SkipRecord:
    """One row of ``skipped.parquet``: a file (or directory) that was not indexed, and why.

    ``path`` is the raw relative path (``path_bytes``; the ``path`` column is its
    :func:`display_path`); the file facts are None for entries that are not files, and in
    skip lists written before they were recorded.
    """

    path: bytes
    reason: str
    size: int | None = None
    mtime_ns: int | None = None
    content_hash: str | None = None


def display_path(raw: bytes) -> str:
    """The UTF-8 form of a relative path stored in ``path``: undecodable bytes become ``\\xNN``."""
    return raw.decode("utf-8", errors="backslashreplace")


def _check_relative(path: Any, what: str) -> None:
    # Relative paths inside the index only: a manifest must not make readers open files elsewhere.
    parts = path.split("/") if isinstance(path, str) else []
    if not parts or path.startswith("/") or "\\" in path or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"{what} must be a relative path inside the index, got {path!r}")


def paths_file_of(part_path: str) -> str:
    """The path side file of a part: ``.../embeddings/part-00000.parquet`` ->
    ``.../paths/part-00000.paths`` (kept out of ``embeddings/`` so that the Parquet parts stay
    readable as one dataset by pandas, DuckDB or Spark)."""
    head, _, name = part_path.rpartition("/")
    stem = name[: -len(".parquet")] if name.endswith(".parquet") else name
    parent = head.rpartition("/")[0] if head.endswith(EMBEDDINGS_DIR) else head
    return "/".join(p for p in (parent, PATHS_DIR, stem + PATHS_SUFFIX) if p)


def write_paths_file(fh: IO[bytes], file_id: str, offsets: Any, data: bytes | memoryview) -> None:
    """Write a path side file: ``offsets`` (count + 1 ascending ints from 0) into ``data``,
    and the trailer of per-path CRC-32s (a search reads single paths: each is checked alone)."""
    import numpy as np

    offsets = np.asarray(offsets, dtype="<u8")
    fid = file_id.encode("ascii")
    if len(fid) != 32:
        raise ValueError(f"file id must be 32 hex characters, got {file_id!r}")
    fh.write(PATHS_HEADER.pack(PATHS_MAGIC, fid, len(offsets) - 1))
    fh.write(offsets.tobytes())
    fh.write(data)
    view = memoryview(data)
    bounds = offsets.tolist()
    crcs = np.fromiter((zlib.crc32(view[a:b]) for a, b in itertools.pairwise(bounds)), dtype="<u4", count=len(bounds) - 1)
    fh.write(crcs.tobytes())
    fh.write(PATHS_CRC_MAGIC)


@dataclass(frozen=True)
class FileChecksum:
    """Size and content digest of one data file, as the manifest records them.

    The size is checked whenever the index is opened (one ``stat``); the digest, which costs a
    read of the whole file, only by ``clipsearch verify``.
    """

    algorithm: str
    digest: str
    size: int

    def __post_init__(self) -> None:
        if self.algorithm != CHECKSUM_ALGORITHM:
            raise ValueError(f"unknown checksum algorithm {self.algorithm!r}")
        if not isinstance(self.digest, str) or len(self.digest) != 64 or any(c not in "0123456789abcdef" for c in self.digest):
            raise ValueError(f"bad {self.algorithm} digest {self.digest!r}")
        if not is_int(self.size) or self.size < 0:
            raise ValueError(f"bad file size {self.size!r}")


def checksum_file(path: str | os.PathLike[str]) -> FileChecksum:
    """Hash a file in chunks (memory stays flat); raises OSError when it cannot be read."""
    h = hashlib.new(CHECKSUM_ALGORITHM)
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return FileChecksum(CHECKSUM_ALGORITHM, h.hexdigest(), size)


@dataclass(frozen=True)
class PartRef:
    """One Parquet part: ``rows`` rows with ids ``first_id .. first_id + rows - 1``.

    ``paths`` names its path side file (format 2); None in version-1 indexes.
    """

    path: str
    rows: int
    first_id: int
    file_id: str
    paths: str | None = None

    def __post_init__(self) -> None:
        _check_relative(self.path, "a part path")
        if self.paths is not None:
            _check_relative(self.paths, "a part's paths file")
        if self.rows < 1 or self.first_id < 0:
            raise ValueError(f"part {self.path}: rows must be >= 1 and first_id >= 0")


@dataclass(frozen=True)
class FaissRef:
    """The FAISS file and how many rows (ids ``0 .. rows - 1``) it holds."""

    path: str
    rows: int

    def __post_init__(self) -> None:
        _check_relative(self.path, "the faiss path")
        if self.rows < 0:
            raise ValueError("faiss rows must be >= 0")


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
            ``{}`` in indexes written before it existed.
        index_options: what the index type was chosen from (``index_type`` as asked, e.g.
            ``auto``, ``max_memory``, ``target_recall``); updates keep them.
        search_params: FAISS search parameters tuned for the FAISS file (``nprobe``,
            ``efSearch``); readers apply them. ``{}`` for flat.
        index_tuning: how the FAISS file was chosen and tuned (recall@10 reached, queries,
            timings); informational.
        checksums: size and digest of every file of the generation (:meth:`files`), by path;
            ``{}`` in indexes written before checksums were recorded.
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
    format: str = FORMAT_NAME
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        if self.dim < 1:
            raise ValueError(f"manifest dim must be >= 1, got {self.dim}")
        if self.count < 0 or self.skipped < 0:
            raise ValueError("manifest counts must be >= 0")
        if self.metric != "inner_product":
            raise ValueError(f"unsupported metric {self.metric!r}")
        for name in ("model_info", "index_options", "search_params", "index_tuning"):
            if not isinstance(getattr(self, name), Mapping):
                raise ValueError(f"{name} must be a mapping, got {type(getattr(self, name)).__name__}")
        known = ("nprobe", "efSearch", "k_factor") if self.format_version >= 3 else ("nprobe", "efSearch")
        for key, value in self.search_params.items():
            if key not in known or not is_positive_int(value):
                raise ValueError(f"unknown search parameter {key}={value!r}")
        if format_version_for(self.index_type) == 3 and self.format_version < 3:
            raise ValueError(f"index type {self.index_type!r} needs format version 3, got {self.format_version}")
        _check_relative(self.skipped_file, "skipped_file")
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
        data = asdict(self)
        data["preprocess"] = dict(self.preprocess)
        for name in ("model_info", "index_options", "search_params", "index_tuning"):
            data[name] = dict(getattr(self, name))
        data["parts"] = [asdict(p) for p in self.parts]
        data["faiss"] = asdict(self.faiss) if self.faiss is not None else None
        data["checksums"] = {path: asdict(c) for path, c in self.checksums.items()}
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "manifest") -> Manifest:
        """Validate and build a manifest; raises IndexFormatError on anything unexpected."""
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
            return cls(**kwargs)
        except KeyError as exc:
            raise IndexFormatError(f"{where} is damaged (missing {exc})") from exc
        except (TypeError, ValueError, AttributeError) as exc:
            raise IndexFormatError(f"{where} is damaged: {exc}") from exc


def read_manifest(index_dir: str | os.PathLike[str]) -> Manifest:
    """Read and validate ``INDEX_DIR/manifest.json``.

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
    fix = f"rebuild the index with `clipsearch index PHOTOS_DIR {index_dir} --rebuild`"
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


def is_index_dir(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` holds a manifest (of any version)."""
    return (Path(path) / MANIFEST_FILE).is_file()


def holds_only_writer_leftovers(path: str | os.PathLike[str]) -> bool:
    """Whether a directory holds nothing but what a writer killed before its first manifest
    leaves behind (its lock file, staging and generation folders): ours to reuse."""
    return all(p.name == LOCK_FILE or p.name.startswith((STAGING_PREFIX, GENERATION_PREFIX)) for p in Path(path).iterdir())


def _fsync_dir(directory: Path) -> None:
    # The rename itself is only durable once the directory entry is flushed.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], object]) -> None:
    """Write a file atomically: ``write`` fills a temp file in the same directory, then rename.

    If ``write`` raises, the temp file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)


def fsync_tree(directory: str | os.PathLike[str]) -> None:
    """Flush every file of a (flat) directory and the directory itself to disk."""
    directory = Path(directory)
    for path in directory.iterdir():
        if path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(directory)


def publish_generation(index_dir: str | os.PathLike[str], staging: str | os.PathLike[str], generation: str) -> Path:
    """Rename a complete staging directory to its generation name (atomic, same file system)."""
    index_dir = Path(index_dir)
    fsync_tree(staging)
    target = index_dir / generation_dir(generation)
    os.rename(staging, target)
    _fsync_dir(index_dir)
    return target


def write_manifest(index_dir: str | os.PathLike[str], manifest: Manifest) -> None:
    """Atomically write the manifest; call this only after every data file is in place."""
    data = manifest.to_dict()
    data[MANIFEST_DIGEST_KEY] = {"algorithm": CHECKSUM_ALGORITHM, "digest": manifest_digest(data)}
    text = json.dumps(data, indent=2, ensure_ascii=False, sort_keys=True) + "\n"
    atomic_write(Path(index_dir) / MANIFEST_FILE, lambda fh: fh.write(text.encode("utf-8")))
