"""Typed exceptions of clipsearch (over HTTP, statuses: :mod:`clipsearch.server.errors`).

Library code raises these; only the CLI turns them into one-line messages and exit codes.
Every message is written for the person who ran the command: it says what is wrong and,
where there is one, what to do about it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable


class ClipSearchError(Exception):
    """Base class of every error clipsearch raises on purpose."""


class InvalidArgumentError(ClipSearchError, ValueError):
    """A bad value passed by the caller (empty query, k < 1, unknown device, ...)."""


class UnknownBuildOptionError(InvalidArgumentError, TypeError):
    """An option that ``build_index`` does not have (a misspelt keyword argument).

    Also a ``TypeError``, which is what Python raises for an unexpected keyword argument.
    ``option`` is the name given, ``valid`` the names accepted; both are in the message.
    """

    def __init__(self, option: str, valid: Iterable[str]) -> None:
        self.option = option
        self.valid = tuple(sorted(valid))
        super().__init__(f"unknown build option {option!r}; valid options: {', '.join(self.valid)}")


class PhotosDirError(ClipSearchError):
    """The image collection to index is missing, not a directory, or holds no images."""


class ShardSourceError(PhotosDirError):
    """WebDataset shards cannot be read (:mod:`retrieval.shards`): a missing bucket or key, refused
    credentials, an endpoint that does not answer, a damaged or truncated tar, a malformed brace
    range, a URL scheme whose fsspec package is not installed (named)."""


class IndexDirError(ClipSearchError):
    """INDEX_DIR cannot be used: not an index, or a non-index directory we refuse to overwrite."""


class IndexLockedError(IndexDirError):
    """Another process is writing the index."""


class NotAnIndexError(IndexDirError):
    """The directory holds no clipsearch index (no manifest)."""


class ImportSourceError(ClipSearchError):
    """Embeddings to import (``clipsearch import SOURCE``) cannot be used: SOURCE is missing or
    of neither layout, a file lacks a column, row counts or dimensions disagree, or a row holds a
    bad value (NaN, inf, a zero vector, a missing or repeated path).

    ``source`` is the file (or folder) at fault and ``row`` the 0-based row within that file when
    one row is; both are also in the message.
    """

    def __init__(self, source: str | os.PathLike[str], problem: str, *, row: int | None = None) -> None:
        self.source = os.fspath(source)
        self.problem = problem
        self.row = row
        where = self.source if row is None else f"{self.source}: row {row}"
        super().__init__(f"{where}: {problem}")


class IndexFormatError(ClipSearchError):
    """The index exists but cannot be read: unsupported version, damaged or inconsistent files."""


class UnsupportedFormatError(IndexFormatError):
    """The index was written in a format version this code does not read."""


class IndexCorruptError(IndexFormatError):
    """A file of the index is damaged: missing, truncated, or its bytes changed.

    ``path`` is the damaged file and ``fix`` the command that repairs the index (``clipsearch
    reindex`` for a FAISS file, a rebuild otherwise); both are in the message.
    """

    def __init__(self, path: object, problem: str, fix: str) -> None:
        # A library's reason may run over several lines (pyarrow's thrift errors): one line, so
        # that the fix at its end is not cut off where only the first line is shown.
        problem = " ".join(problem.split())
        super().__init__(f"{path} is damaged ({problem}); {fix}")
        self.path = str(path)
        self.problem = problem
        self.fix = fix


class TooFewTrainingVectorsError(InvalidArgumentError):
    """A FAISS index type whose training needs more vectors than the collection gives it (more
    IVF lists or PQ centroids than vectors); the message says how many and what to ask instead."""


class NoFacesError(InvalidArgumentError):
    """The index holds no faces (built without ``--faces``), or no person by that name or number
    (a caller's mistake: 400 over HTTP)."""


class EngineError(ClipSearchError):
    """A distributed build engine (Ray) is missing, unreachable, or cannot run what was asked."""


class ShardUnavailableError(ClipSearchError):
    """A shard of a shard set did not answer in time (:mod:`retrieval.partitions`): its replicas
    are lost or overloaded."""


class ModelLoadError(ClipSearchError):
    """A model checkpoint could not be loaded (missing, offline, not a CLIP checkpoint)."""


class ModelMismatchError(ClipSearchError):
    """The query model is not the model the index was built with."""


class ImageDecodeError(ClipSearchError):
    """An image file could not be decoded. ``reason`` is a short, stable description."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"cannot decode image {path!r}: {reason}")
        self.path = path
        self.reason = reason


class VideoDecodeError(ClipSearchError):
    """A video file could not be indexed (:mod:`indexer.video`): not a video by its content, no
    video stream, a codec without a decoder, damaged beyond reading, or over its time limit.
    ``reason`` is a short, stable description (it becomes the skip list's reason)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"cannot index video {path!r}: {reason}")
        self.path = path
        self.reason = reason


class QueriesFileError(InvalidArgumentError):
    """An evaluation queries file is missing, empty or has a bad line.

    ``path`` is the file (None for queries built in code) and ``line`` the 1-based line number
    (None when the problem is the whole file); both are also in the message.
    """

    def __init__(self, message: str, path: str | None = None, line: int | None = None) -> None:
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        else:
            where = f"line {line}: " if line is not None else ""
        super().__init__(where + message)
        self.path = path
        self.line = line


class EvaluationError(ClipSearchError):
    """An evaluation cannot produce numbers, e.g. no query has a relevant image in the index."""


class DatasetError(ClipSearchError):
    """A caption dataset file (Karpathy split, caption CSV/JSONL, split list) is missing,
    unreadable or malformed.

    Attributes:
        source: the file (or a description of the input) the problem is in.
        line: 1-based line number, for line-oriented files (CSV, JSONL, split lists, JSON syntax).
        record: 0-based index of the offending entry of a Karpathy file's ``images`` list.
        problem: what is wrong, without the location.
    """

    def __init__(self, source: str | os.PathLike[str], problem: str, *, line: int | None = None, record: int | None = None) -> None:
        self.source = os.fspath(source)
        self.problem = problem
        self.line = line
        self.record = record
        where = self.source
        if line is not None:
            where += f":{line}"
        if record is not None:
            where += f": images[{record}]"
        super().__init__(f"{where}: {problem}")


class PairsFileError(InvalidArgumentError):
    """A training pairs file (``{"path", "caption"}`` per line) is missing, unreadable, or holds
    no usable pair. ``path`` is the file; it is also in the message."""

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(f"{path}: {message}" if path is not None else message)
        self.path = path


class FinetuneError(ClipSearchError):
    """Fine-tuning cannot start or go on: an unsupported model, an output directory in the way,
    or a checkpoint that cannot be resumed with the options given."""
