"""Keep freed memory in the process while embedding (glibc), instead of faulting it in anew.

Each layer of a batch allocates activations of tens of MB (ViT-B/32, batch 64: 39 MB for one
MLP output). glibc serves such blocks with ``mmap`` and returns them to the system on ``free``,
so every layer of every batch pays for page faults and the kernel zeroing fresh pages.
While a build embeds, :func:`retained_heap` tells malloc to use its heap for every size and
to keep up to 1 GiB free at its top; on exit it restores glibc's defaults and trims the heap.

No-op where the C library is not glibc, or when ``CLIPSEARCH_SYSTEM_MALLOC`` is set.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
from collections.abc import Iterator

# mallopt parameters (malloc.h) and glibc's defaults for them.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_DEFAULTS = {_M_TRIM_THRESHOLD: 128 * 1024, _M_MMAP_MAX: 65536}
_RETAINED = {_M_MMAP_MAX: 0, _M_TRIM_THRESHOLD: 1 << 30}

OPT_OUT_ENV = "CLIPSEARCH_SYSTEM_MALLOC"


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
        # Looking a symbol up raises AttributeError when it is missing; only glibc has all three.
        for symbol in ("gnu_get_libc_version", "mallopt", "malloc_trim"):
            getattr(libc, symbol)
    except (OSError, AttributeError):
        return None
    return libc


@contextlib.contextmanager
def retained_heap() -> Iterator[bool]:
    """Within the block, freed memory stays in the process for reuse; yields whether it applied."""
    libc = None if os.environ.get(OPT_OUT_ENV) else _glibc()
    applied = libc is not None and all(libc.mallopt(p, v) == 1 for p, v in _RETAINED.items())
    try:
        yield applied
    finally:
        if libc is not None:
            for param, value in _DEFAULTS.items():
                libc.mallopt(param, value)
            libc.malloc_trim(0)


__all__ = ["OPT_OUT_ENV", "retained_heap"]
