"""``SourceFiles``: the original images of a generation, reached by id only (``index.files``)."""

from __future__ import annotations

from pathlib import Path

from .layout import Manifest
from .rows import Rows, check_id, source_path
from .shard_ranges import ShardMember
from .shards import read_member, split_member


class SourceFiles:
    """Where the indexed images are: a folder's files, or members of WebDataset shards.

    Args:
        directory: the INDEX_DIR.
        manifest: the generation's manifest (its ``source_root`` and count).
        rows: the generation's rows (their stored paths and shard members).
    """

    def __init__(self, directory: Path, manifest: Manifest, rows: Rows) -> None:
        self._directory = directory
        self._manifest = manifest
        self._rows = rows

    def path(self, id: int) -> Path:
        """The original image file the index recorded for ``id``: the indexed folder
        (``manifest.source_root``) joined with the stored relative path, byte for byte.

        Only ids name files: nothing outside the indexed folder can be returned. The file may
        have changed or gone since it was indexed; the caller opens it.

        Raises:
            InvalidArgumentError: ``id`` is not an id of this index.
            IndexCorruptError: the index records no folder, or a path that leaves it.
        """
        checked = check_id(id, self._manifest.count)
        raw = self._rows.rows([checked], columns=("path_bytes",))[0]["path_bytes"]
        return source_path(self._directory, self._manifest, checked, raw)

    def root_of(self, id: int) -> str:
        """The folder :meth:`path` of ``id`` lies under (the index's ``source_root``; empty for
        an index imported from embeddings).

        Raises:
            InvalidArgumentError: ``id`` is not an id of this index.
        """
        check_id(id, self._manifest.count)
        return self._manifest.source_root

    def shard_bytes(self, id: int) -> bytes | None:
        """The bytes of image ``id`` read out of its WebDataset shard (under ``source_root``,
        local or on a store reached with the standard credentials), checked against the recorded
        content hash; None for an image of a folder (see :meth:`path`).

        Raises:
            InvalidArgumentError: ``id`` is not an id of this index.
            ShardSourceError: the shard cannot be read, or changed since it was indexed.
        """
        row = self._rows.rows([check_id(id, self._manifest.count)], columns=("shard", "member_offset", "size", "content_hash"))[0]
        if row["shard"] is None or row["member_offset"] is None:
            return None
        return read_member(self._manifest.source_root, row["shard"], row["member_offset"], row["size"],
                           content_hash=row["content_hash"])

    def shard_member(self, id: int) -> ShardMember | None:
        """Where image (or video) ``id``'s bytes lie in its WebDataset shard, for ranged reads
        (:class:`~retrieval.shard_ranges.VerifiedMembers`); None for a file of a folder, or a
        member with no recorded content hash (read it whole: :meth:`shard_bytes`). Reads no shard.

        Raises:
            InvalidArgumentError: ``id`` is not an id of this index.
        """
        columns = ("path", "shard", "member_offset", "size", "content_hash")
        row = self._rows.rows([check_id(id, self._manifest.count)], columns=columns)[0]
        if row["shard"] is None or row["member_offset"] is None or not row["content_hash"]:
            return None
        _, name = split_member(str(row["path"]))
        return ShardMember(self._manifest.source_root, row["shard"], name, int(row["member_offset"]), int(row["size"]),
                           str(row["content_hash"]))


__all__ = ["SourceFiles"]
