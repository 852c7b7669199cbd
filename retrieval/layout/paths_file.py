"""The ``.paths`` side file of a Parquet part: its ``path`` column in a form a search can
memory-map, reading (and checking) only the paths of its hits.

Layout, all integers little-endian: :data:`PATHS_HEADER` (:data:`PATHS_MAGIC`, the part's file
id as 32 ASCII hex characters, the row count as u64), count + 1 offsets (u64) into the UTF-8
bytes that follow, the bytes, then a trailer: one CRC-32 (u32) per path and
:data:`PATHS_CRC_MAGIC`. The trailer is optional: readers that do not know it ignore the bytes
after the paths, readers that know it check each path they read.
"""

from __future__ import annotations

import itertools
import struct
import zlib
from typing import IO, Any

from .filenames import EMBEDDINGS_DIR, PATHS_DIR, PATHS_SUFFIX

PATHS_MAGIC = b"CSPATHS1"
PATHS_HEADER = struct.Struct("<8s32sQ")
PATHS_CRC_MAGIC = b"CSPCRC32"


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
    and the trailer of per-path CRC-32s (a search reads single paths: each is checked alone).

    Args:
        fh: the binary file to write to, positioned at its start.
        file_id: the part's file id (32 hex characters), also recorded in the part and manifest.
        offsets: count + 1 ascending integers from 0, the bounds of each path in ``data``.
        data: the UTF-8 bytes of every path, concatenated in id order.

    Raises:
        ValueError: ``file_id`` is not 32 characters long.
    """
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
