"""A shard set: one collection split into shard indexes, and the manifest that names them.

Each shard is a normal index directory (opened, verified, updated on its own); the set's
``partitions.json`` records the model every shard was embedded with, and per shard its
directory and the id ranges it holds: ``(first global id, first local id, rows)``. A split gives
each shard one contiguous range; adding images gives the shard they went to a new range at the
end of the global ids, so the set's ids stay ``0 .. count - 1`` with no gap and no id moves.
Written by :mod:`indexer.partition`, searched by :mod:`retrieval.partitions`.

Readers refuse a set newer than :data:`PARTITIONS_VERSION`, a missing shard, and a shard whose
model, dimension or row count disagrees with the set, each naming the shard and what to do.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import IndexFormatError, InvalidArgumentError, NotAnIndexError, UnsupportedFormatError
from .layout import Manifest, atomic_write, read_manifest

PARTITIONS_FILE = "partitions.json"
PARTITIONS_FORMAT = "clipsearch-partitions"
PARTITIONS_VERSION = 1


@dataclass(frozen=True)
class IdRange:
    """``rows`` consecutive ids: global ``first_global ..`` are the shard's local ``first_local ..``."""

    first_global: int
    first_local: int
    rows: int


@dataclass(frozen=True)
class ShardRef:
    """One shard of a set: its name, its directory (relative to the set) and its id ranges."""

    name: str
    path: str
    ranges: tuple[IdRange, ...]

    @property
    def count(self) -> int:
        return sum(r.rows for r in self.ranges)

    def global_ids(self, local: np.ndarray) -> np.ndarray:
        """The set's ids of this shard's local ``ids`` (each must be one of its rows)."""
        local = np.asarray(local, np.int64)
        firsts = np.array([r.first_local for r in self.ranges], np.int64)
        shift = np.array([r.first_global - r.first_local for r in self.ranges], np.int64)
        return local + shift[np.searchsorted(firsts, local, side="right") - 1]


@dataclass(frozen=True)
class PartitionSet:
    """The manifest of a shard set (``partitions.json``).

    Attributes:
        model, model_fingerprint, dim: what every shard was embedded with.
        shards: the shards, in order.
        generation: changes with every write of the set (a reader reopens on a new one).
    """

    model: str
    model_fingerprint: str
    dim: int
    shards: tuple[ShardRef, ...]
    generation: int = 1

    @property
    def count(self) -> int:
        return sum(s.count for s in self.shards)

    def locate(self, ids: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(shard number, local id)`` of each of the set's ``ids``.

        Raises:
            InvalidArgumentError: an id outside ``0 .. count - 1``.
        """
        ids = np.asarray(ids, np.int64)
        if len(ids) and (ids.min() < 0 or ids.max() >= self.count):
            raise InvalidArgumentError(f"no image with id {int(ids.max())} (ids are 0..{self.count - 1})")
        table = sorted((r.first_global, r.first_local, n) for n, s in enumerate(self.shards) for r in s.ranges)
        starts = np.array([t[0] for t in table], np.int64)
        at = np.searchsorted(starts, ids, side="right") - 1
        shard = np.array([t[2] for t in table], np.int64)[at]
        local = ids - starts[at] + np.array([t[1] for t in table], np.int64)[at]
        return shard, local

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": PARTITIONS_FORMAT,
            "version": PARTITIONS_VERSION,
            "generation": self.generation,
            "model": self.model,
            "model_fingerprint": self.model_fingerprint,
            "dim": self.dim,
            "count": self.count,
            "shards": [
                {"name": s.name, "path": s.path, "count": s.count,
                 "ranges": [[r.first_global, r.first_local, r.rows] for r in s.ranges]}
                for s in self.shards
            ],
        }


def is_partition_set(directory: str | os.PathLike[str]) -> bool:
    """Whether ``directory`` holds a shard set (its ``partitions.json``)."""
    return (Path(directory) / PARTITIONS_FILE).is_file()


def write_partition_set(directory: str | os.PathLike[str], parts: PartitionSet) -> None:
    """Atomically write ``partitions.json`` (after every shard it names is published)."""
    text = json.dumps(parts.to_dict(), indent=2, sort_keys=True) + "\n"
    atomic_write(Path(directory) / PARTITIONS_FILE, lambda fh: fh.write(text.encode("utf-8")))


def read_partition_set(directory: str | os.PathLike[str]) -> PartitionSet:
    """Read and check ``DIR/partitions.json`` (the manifest alone; :func:`check_shards` opens the shards' manifests).

    Raises:
        NotAnIndexError: no shard set there.
        UnsupportedFormatError: written by a newer clipsearch.
        IndexFormatError: the file is damaged or inconsistent.
    """
    path = Path(directory) / PARTITIONS_FILE
    if not path.is_file():
        raise NotAnIndexError(
            f"{directory} holds no shard set (no {PARTITIONS_FILE}): make one with `clipsearch shard INDEX_DIR --shards N OUT`"
        )
    try:
        data = json.loads(path.read_text("utf-8"))
        if data.get("format") != PARTITIONS_FORMAT:
            raise ValueError(f"format is {data.get('format')!r}, not {PARTITIONS_FORMAT!r}")
        if int(data["version"]) > PARTITIONS_VERSION:
            raise UnsupportedFormatError(
                f"{path} is version {data['version']}; this clipsearch reads up to {PARTITIONS_VERSION}: upgrade clipsearch"
            )
        shards = tuple(
            ShardRef(str(s["name"]), str(s["path"]), tuple(IdRange(int(a), int(b), int(c)) for a, b, c in s["ranges"]))
            for s in data["shards"]
        )
        parts = PartitionSet(str(data["model"]), str(data["model_fingerprint"]), int(data["dim"]), shards, int(data["generation"]))
    except UnsupportedFormatError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise IndexFormatError(f"{path} is damaged ({exc}): make the shard set again with `clipsearch shard`") from None
    _check_ranges(parts, path)
    return parts


def _check_ranges(parts: PartitionSet, path: Path) -> None:
    if not parts.shards:
        raise IndexFormatError(f"{path} names no shard: make the shard set again with `clipsearch shard`")
    names = [s.name for s in parts.shards]
    if len(set(names)) != len(names):
        raise IndexFormatError(f"{path} names a shard twice: make the shard set again with `clipsearch shard`")
    covered = sorted((r.first_global, r.rows) for s in parts.shards for r in s.ranges)
    expected = 0
    for first, rows in covered:
        if first != expected or rows < 1:
            raise IndexFormatError(f"{path}: the shards' id ranges leave a gap or overlap at id {expected}")
        expected += rows
    for s in parts.shards:
        local = 0
        for r in s.ranges:
            if r.first_local != local:
                raise IndexFormatError(f"{path}: shard {s.name!r}'s local ids are not consecutive at {local}")
            local += r.rows


def check_shards(directory: str | os.PathLike[str], parts: PartitionSet) -> list[Manifest]:
    """The manifests of the set's shards, each checked against the set.

    Raises:
        NotAnIndexError: a shard is missing (named).
        IndexFormatError: a shard of another model or dimension, or whose row count is not the
            set's (updated alone without ``clipsearch shard add``), named with what to do.
    """
    out = []
    for s in parts.shards:
        where = Path(directory) / s.path
        try:
            manifest = read_manifest(where)
        except NotAnIndexError:
            raise NotAnIndexError(
                f"shard {s.name!r} is missing ({where}): restore it, or make the shard set again with `clipsearch shard`"
            ) from None
        if manifest.model_fingerprint != parts.model_fingerprint or manifest.dim != parts.dim:
            raise IndexFormatError(
                f"shard {s.name!r} was embedded with {manifest.model} (dim {manifest.dim}), the set with {parts.model} "
                f"(dim {parts.dim}): every shard of a set needs the same model; make the set again from one index"
            )
        if manifest.count != s.count:
            raise IndexFormatError(
                f"shard {s.name!r} holds {manifest.count} images, the set records {s.count}: add images with "
                "`clipsearch shard add SET NEW_INDEX`, not to a shard alone"
            )
        out.append(manifest)
    return out


__all__ = [
    "PARTITIONS_FILE",
    "PARTITIONS_VERSION",
    "IdRange",
    "PartitionSet",
    "ShardRef",
    "check_shards",
    "is_partition_set",
    "read_partition_set",
    "write_partition_set",
]
