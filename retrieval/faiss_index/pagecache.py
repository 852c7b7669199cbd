"""The page cache under a memory-mapped index: where its parts lie in the file, ``madvise`` over
this process's mappings of it, and the memory available to warm it."""

from __future__ import annotations

import mmap as _mmap
import os
from pathlib import Path

from .structure import FaissIndex, refine_of


def warm(index: FaissIndex, path: str | os.PathLike[str], vectors: bool | None = None) -> int:
    """Ask the kernel to read, in the background, a memory-mapped index's file: what every
    query scans (a re-ranked index's IVF lists and codes; any other index's whole file) and,
    with ``vectors``, a re-ranked index's refine vectors too (a query reads only
    ``k * k_factor`` of them, each a random disk read until cached).

    Args:
        index: the index read from ``path`` with ``mmap=True``.
        path: its file.
        vectors: whether to warm a re-ranked index's refine vectors; None: those too when the
            whole file takes at most half the memory available now.

    Returns:
        The bytes asked for; 0 where ``madvise`` is missing.
    """
    advice = getattr(_mmap, "MADV_WILLNEED", None)
    if advice is None:
        return 0
    size = Path(path).stat().st_size
    if vectors is None:
        vectors = size <= available_memory() // 2
    return _advise(path, 0, size if vectors else _scanned_bytes(index, path), advice)


def available_memory() -> int:
    """The kernel's MemAvailable in bytes (0 where /proc/meminfo is missing or lacks it)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _mappings(path: str | os.PathLike[str]) -> list[tuple[int, int, int]]:
    """``(start, end, file offset)`` of this process's memory mappings of ``path``'s file (by
    inode, as ``/proc/self/maps`` lists them); empty where that file does not exist."""
    try:
        inode = os.stat(path).st_ino
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[4] == str(inode) and fields[5].startswith("/"):
            start, end = (int(v, 16) for v in fields[0].split("-"))
            found.append((start, end, int(fields[2], 16)))
    return found


def _advise(path: str | os.PathLike[str], first: int, last: int, advice: int) -> int:
    """``madvise`` the pages holding bytes ``[first, last)`` of ``path`` in every mapping of it
    in this process; the bytes advised (0 where the platform has no ``madvise``)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    page = _mmap.PAGESIZE
    done = 0
    for start, end, offset in _mappings(path):
        lo, hi = max(first, offset), min(last, offset + end - start)
        if lo >= hi:
            continue
        addr = start + lo - offset
        aligned = addr - addr % page
        length = start + hi - offset - aligned
        if libc.madvise(ctypes.c_void_p(aligned), ctypes.c_size_t(length), ctypes.c_int(advice)) == 0:
            done += hi - lo
    return done


def _refine_vector_bytes(index: FaissIndex, path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """Where a re-ranked index's refine vectors lie in its file (they are written last, before
    the 4 bytes of ``k_factor``), or None without a refine stage."""
    refine = refine_of(index)
    if refine is None:
        return None
    size = Path(path).stat().st_size
    first = size - 4 - int(refine.ntotal) * int(refine.refine_index.sa_code_size())
    return (first, size - 4) if first > 0 else None


def _scanned_bytes(index: FaissIndex, path: str | os.PathLike[str]) -> int:
    """How much of an index file, from its start, queries scan: all of it, or a re-ranked
    index's up to its refine vectors."""
    vectors = _refine_vector_bytes(index, path)
    return vectors[0] if vectors is not None else Path(path).stat().st_size
