"""What an update has to do: compare the files found now with what the index holds.

A pure function over plain data (plus a hash callback), so every case is tested alone:

- a path the index does not hold is *added* (embedded);
- a path whose size and mtime are unchanged is *unchanged* (neither read nor decoded);
- a path whose size or mtime changed is hashed: the same content hash means a touched but
  identical file (kept, its mtime refreshed), another hash means *updated* (re-embedded);
- a path the index holds that is no longer found (deleted, or now excluded) is *removed*;
- a file skipped as broken before is retried only when its size or mtime changed.

A file's rows are compared together: a video has one per sampled frame, sharing its path, size,
mtime and hash, so it is kept, refreshed, re-embedded or removed whole.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from retrieval.layout import SkipRecord

from .discover import ImageFile


@dataclass(frozen=True)
class IndexedFacts:
    """Per-row facts of the current index, in id order."""

    paths: Sequence[bytes]
    sizes: np.ndarray
    mtimes_ns: np.ndarray
    hashes: Sequence[str]

    def __len__(self) -> int:
        return len(self.paths)


@dataclass
class UpdatePlan:
    """The work of one run.

    Attributes:
        keep_ids: ids of current rows that stay, ascending (they are renumbered 0..n-1).
        refreshed: old id -> new mtime_ns for touched-but-identical files that stay.
        to_embed: files to decode and embed, in discovery order.
        updated_paths: the paths among ``to_embed`` that replace an existing row.
        removed: rows dropped because their file is gone (changed files are not counted).
        unchanged: files kept as they are (touched-but-identical ones included).
        carried_skips: skip records kept because their file did not change.
        total_before: rows in the index before the run.
    """

    keep_ids: np.ndarray
    refreshed: dict[int, int] = field(default_factory=dict)
    to_embed: list[ImageFile] = field(default_factory=list)
    updated_paths: set[bytes] = field(default_factory=set)
    removed: int = 0
    unchanged: int = 0
    carried_skips: list[SkipRecord] = field(default_factory=list)
    total_before: int = 0

    @property
    def changes_rows(self) -> bool:
        """True when existing rows must be dropped or rewritten (not only appended to)."""
        return bool(self.refreshed) or len(self.keep_ids) != self.total_before


def plan_update(
    indexed: IndexedFacts,
    skipped: Sequence[SkipRecord],
    found: Sequence[ImageFile],
    hash_file: Callable[[bytes], str | None],
) -> UpdatePlan:
    """Compare ``found`` with the index and say what to embed, keep, refresh and remove.

    Args:
        indexed: facts of the rows the index holds.
        skipped: the index's skip list.
        found: the files found now (discovery order).
        hash_file: content hash of a relative path, or None if it cannot be read now; called
            only for files whose size or mtime changed.
    """
    # A video holds a row per sampled frame, all with its path: a file's rows go together.
    by_path: dict[bytes, list[int]] = {}
    for i, p in enumerate(indexed.paths):
        by_path.setdefault(p, []).append(i)
    skips = {s.path: s for s in skipped}
    keep = np.ones(len(indexed), dtype=bool)
    seen = np.zeros(len(indexed), dtype=bool)
    plan = UpdatePlan(keep_ids=np.empty(0, np.int64), total_before=len(indexed))
    for f in found:
        rows = by_path.get(f.rel)
        if rows is None:
            old = skips.get(f.rel)
            if old is not None and old.size == f.size and old.mtime_ns == f.mtime_ns:
                plan.carried_skips.append(old)
            else:
                plan.to_embed.append(f)
            continue
        seen[rows] = True
        i = rows[0]
        if int(indexed.sizes[i]) == f.size and int(indexed.mtimes_ns[i]) == f.mtime_ns:
            plan.unchanged += 1
            continue
        if int(indexed.sizes[i]) == f.size and hash_file(f.rel) == indexed.hashes[i]:
            plan.unchanged += 1
            plan.refreshed.update(dict.fromkeys(rows, f.mtime_ns))
            continue
        keep[rows] = False
        plan.to_embed.append(f)
        plan.updated_paths.add(f.rel)
    gone = ~seen
    plan.removed = int(gone.sum())
    keep &= seen
    plan.keep_ids = np.flatnonzero(keep).astype(np.int64)
    return plan
