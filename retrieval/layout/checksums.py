"""Content checksums of an index's data files, as ``Manifest.checksums`` records them."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from ..checks import is_int

CHECKSUM_ALGORITHM = "sha256"
# Files are hashed in chunks of this size: memory stays flat whatever the file size.
_HASH_CHUNK = 1 << 20


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
