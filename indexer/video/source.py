"""Where a build reads a video: a file under the photos folder, or a member of a WebDataset shard
(``SHARD#KEY.mp4``, as video2dataset and img2dataset write them), and the facts an update compares.

A shard member is read through :class:`MemberView`, a seekable file over the member's bytes
alone: PyAV seeks in it as in a file, and on a store each read is a ranged read of the shard,
so neither the shard nor the whole member is held in memory (a video may be far larger than an
image). The content hash (the same BLAKE2b-128 as an image's) is read in chunks the same way.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from retrieval.shards import describe_error, filesystem, join, parse_storage_options, store_errors

from ..discover import ImageFile
from ..shard_reader import ShardReader
from .probe import VideoSource

# Bytes read at a time while hashing a video, and the read buffer over a shard member.
CHUNK = 1 << 20


class MemberView(io.RawIOBase):
    """The ``size`` bytes at ``offset`` of an open binary file (a shard), as a file of their own:
    position 0 is the member's first byte and reading stops at its end."""

    def __init__(self, handle: IO[bytes], offset: int, size: int, name: str) -> None:
        super().__init__()
        self._handle, self._offset, self._size, self.name = handle, offset, size, name
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        want = max(0, min(len(view), self._size - self._pos))
        if not want:
            return 0
        self._handle.seek(self._offset + self._pos)
        data = self._handle.read(want)
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._handle.close()
        super().close()


def open_member(reader: ShardReader, file: ImageFile) -> IO[bytes]:
    """A buffered, seekable file of a shard member's bytes (its own handle on the shard).

    Raises:
        OSError: the shard cannot be opened, or ``file`` is no shard member.
    """
    sample = file.sample
    if sample is None:
        raise OSError(f"{file.rel!r} is not a shard member")
    url = join(reader.root, sample.shard)
    fs, path = filesystem(url, parse_storage_options(reader.storage_options))
    try:
        handle = fs.open(path, "rb")
    except store_errors() as exc:
        raise OSError(describe_error(url, exc)) from exc
    return io.BufferedReader(MemberView(handle, sample.offset, file.size, file.rel.decode("utf-8", "replace")), CHUNK)


@contextmanager
def opened(file: ImageFile, images: Path | ShardReader) -> Iterator[VideoSource]:
    """What PyAV reads ``file`` from: its path under the folder, or a shard member's view (closed after).

    Raises:
        OSError: a shard member's shard cannot be opened.
    """
    if not isinstance(images, ShardReader):
        yield os.path.join(os.fsencode(images), file.rel)
        return
    member = open_member(images, file)
    try:
        yield member
    finally:
        member.close()


def file_facts(file: ImageFile, images: Path | ShardReader) -> tuple[int, int, str]:
    """Size, mtime (a shard member's: its shard's version) and content hash of a video, read in
    chunks; the stat is the one of the bytes hashed.

    Raises:
        OSError: the file (or shard) cannot be read, or the shard is shorter than listed.
    """
    digest = hashlib.blake2b(digest_size=16)
    if isinstance(images, ShardReader):
        read = 0
        with open_member(images, file) as fh:
            while chunk := fh.read(CHUNK):
                digest.update(chunk)
                read += len(chunk)
        if read != file.size:
            raise OSError("shard shorter than listed (truncated or replaced)")
        return file.size, file.mtime_ns, digest.hexdigest()
    with open(os.path.join(os.fsencode(images), file.rel), "rb") as fh:
        st = os.fstat(fh.fileno())
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return st.st_size, st.st_mtime_ns, digest.hexdigest()


def name_of(file: ImageFile) -> str:
    """What a video's skip reasons and errors call it."""
    return file.rel.decode("utf-8", "backslashreplace")


__all__ = ["CHUNK", "MemberView", "file_facts", "name_of", "open_member", "opened"]
