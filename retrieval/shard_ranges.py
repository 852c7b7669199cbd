"""Byte ranges of one WebDataset shard member (a video a browser seeks in), with the member's
content hash checked once per version of its shard, not on every range (the whole member in one
read, hash checked each time: :func:`retrieval.shards.read_member`).

The first read of a member reads it whole, in chunks, and checks it against the content hash its
row recorded; :class:`VerifiedMembers` then remembers that this member, at this version of its
shard file (its size and mtime and inode on a disk; its ETag, last-modified time, generation or
version on a store: whichever the store's ``info`` offers), holds the indexed bytes. Later
ranges of it are ranged reads of those bytes alone, each followed by one look at the shard's
version: a shard replaced or rewritten since is read whole and checked again, and refused if its
bytes changed. A rewrite that keeps the shard's size, mtime and inode (a disk whose clock does
not move between two writes) is the one change this cannot see.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import InvalidArgumentError, ShardSourceError
from .shards import describe_error, filesystem, join, store_errors

# Bytes read at a time while checking a member whole.
CHUNK = 1 << 20
# How many members' checks a reader remembers (each entry is a few hundred bytes).
DEFAULT_CAPACITY = 1024
# Bytes of a member's start kept with its check (a video's container signature: its content type).
HEAD = 64
# The facts of a shard file's ``info`` that change when it is rewritten or replaced (the ones its
# store offers: a disk's size, mtime and inode; S3's ETag and LastModified; GCS's generation...).
_VERSION_KEYS = ("size", "mtime", "ino", "ETag", "etag", "LastModified", "last_modified", "generation", "VersionId",
                 "version_id", "md5Hash")


@dataclass(frozen=True)
class ShardMember:
    """Where one member's bytes lie: ``size`` bytes at ``offset`` of the shard ``shard`` under
    ``root`` (a folder or a store URL), named ``name`` in the tar, hashing to ``content_hash``
    (BLAKE2b-128, as the indexer recorded it)."""

    root: str
    shard: str
    name: str
    offset: int
    size: int
    content_hash: str

    @property
    def url(self) -> str:
        """The shard's path or URL."""
        return join(self.root, self.shard)


class VerifiedMembers:
    """Ranged reads of shard members, each member's hash checked once per version of its shard
    (see the module docs); safe to share between threads.

    Args:
        capacity: how many checked members to remember (the least recently read is forgotten).
        storage_options: fsspec options for the stores (credentials otherwise the standard way).

    Raises:
        InvalidArgumentError: ``capacity`` is not a positive integer.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY, storage_options: Mapping[str, Any] | None = None) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise InvalidArgumentError(f"capacity must be an integer >= 1, got {capacity!r}")
        self._capacity = capacity
        self._options = dict(storage_options or {})
        self._checked: OrderedDict[tuple[str, int, int, str], tuple[tuple[tuple[str, str], ...], bytes]] = OrderedDict()
        self._lock = threading.Lock()

    def check(self, member: ShardMember) -> bytes:
        """The member's first bytes (up to :data:`HEAD`), once its bytes are known to be the
        indexed ones: a look at the shard's version when this reader checked them before, the
        whole member read and hashed otherwise.

        Raises:
            ShardSourceError: the shard cannot be read, or the member holds other bytes now.
        """
        fs, path = filesystem(member.url, self._options)
        known = self._known(member)
        if known is not None and known[0] == self._version(fs, path, member.url):
            return known[1]
        head, _ = self._read_whole(fs, path, member, 0, -1)
        return head

    def read(self, member: ShardMember, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` (inclusive) of the member: only they are read once the
        member was checked (see :meth:`check`); the first read checks it whole.

        Raises:
            InvalidArgumentError: the span is not within the member.
            ShardSourceError: the shard cannot be read, or the member holds other bytes now.
        """
        if not 0 <= start <= end < member.size:
            raise InvalidArgumentError(f"bytes {start}-{end} are not within the member's {member.size}")
        fs, path = filesystem(member.url, self._options)
        known = self._known(member)
        if known is not None:
            try:
                data = fs.cat_file(path, start=member.offset + start, end=member.offset + end + 1)
            except store_errors() as exc:
                raise ShardSourceError(describe_error(member.url, exc)) from None
            # Looked at after the read: bytes read from another version than the checked one
            # show as another version now, and are read again and checked.
            if len(data) == end + 1 - start and self._version(fs, path, member.url) == known[0]:
                return bytes(data)
        _, piece = self._read_whole(fs, path, member, start, end)
        return piece

    def _known(self, member: ShardMember) -> tuple[tuple[tuple[str, str], ...], bytes] | None:
        with self._lock:
            entry = self._checked.get(_key(member))
            if entry is not None:
                self._checked.move_to_end(_key(member))
            return entry

    def _read_whole(self, fs: Any, path: str, member: ShardMember, start: int, end: int) -> tuple[bytes, bytes]:
        """The member read whole in chunks and hashed; its head and bytes ``start``..``end``
        (none for ``end`` < 0). Remembered as checked when the shard kept one version throughout."""
        with self._lock:
            self._checked.pop(_key(member), None)
        before = self._version(fs, path, member.url)
        digest = hashlib.blake2b(digest_size=16)
        head, piece = bytearray(), bytearray()
        at = 0
        try:
            with fs.open(path, "rb", block_size=CHUNK) as fh:
                fh.seek(member.offset)
                while at < member.size:
                    chunk = fh.read(min(CHUNK, member.size - at))
                    if not chunk:
                        break
                    digest.update(chunk)
                    if len(head) < HEAD:
                        head += chunk[: HEAD - len(head)]
                    if end >= 0 and at <= end and at + len(chunk) > start:
                        piece += chunk[max(0, start - at): end + 1 - at]
                    at += len(chunk)
        except store_errors() as exc:
            raise ShardSourceError(describe_error(member.url, exc)) from None
        if at != member.size or digest.hexdigest() != member.content_hash:
            raise ShardSourceError(f"{member.url}: changed since it was indexed (re-run clipsearch index)")
        if self._version(fs, path, member.url) == before:
            with self._lock:
                self._checked[_key(member)] = (before, bytes(head))
                while len(self._checked) > self._capacity:
                    self._checked.popitem(last=False)
        return bytes(head), bytes(piece)

    @staticmethod
    def _version(fs: Any, path: str, url: str) -> tuple[tuple[str, str], ...]:
        try:
            # A listing the filesystem cached (s3fs answers info from one) would hide a rewrite.
            fs.invalidate_cache(path)
            info = fs.info(path)
        except store_errors() as exc:
            raise ShardSourceError(describe_error(url, exc)) from None
        return tuple((k, str(info[k])) for k in _VERSION_KEYS if info.get(k) is not None)


def _key(member: ShardMember) -> tuple[str, int, int, str]:
    return member.url, member.offset, member.size, member.content_hash


__all__ = ["CHUNK", "DEFAULT_CAPACITY", "HEAD", "ShardMember", "VerifiedMembers"]
