"""Index files: write, and read into memory or memory-mapped."""

from __future__ import annotations

import mmap as _mmap
import os
from pathlib import Path

from ..errors import IndexFormatError
from .pagecache import _advise, _scanned_bytes
from .structure import FaissIndex

# The header FAISS writes first for an IndexRefine (index_write.cpp).
_REFINE_FOURCC = b"IxRF"
# Flat indexes (inner product, L2, generic): their vectors are one code array that MMAP_IFC maps.
_FLAT_FOURCCS = (b"IxFI", b"IxF2", b"IxFl")


def write(index: FaissIndex, path: str | os.PathLike[str]) -> None:
    """Serialise ``index`` to ``path`` (callers handle the atomic rename)."""
    import faiss

    faiss.write_index(index, os.fspath(path))


def read(path: str | os.PathLike[str], mmap: bool = False) -> FaissIndex:
    """Load an index; ``mmap`` maps it read-only instead of reading it into memory.

    Raises:
        IndexFormatError: missing or unreadable file.
    """
    import faiss

    path = Path(path)
    if not path.is_file():
        raise IndexFormatError(f"{path} is missing; rebuild the index with `clipsearch index`")
    flags = 0
    if mmap:
        # IO_FLAG_MMAP maps IVF lists but copies a flat index's or a refine stage's vectors into
        # RAM; MMAP_IFC maps those vectors (and the IVF lists), so opening adds no anonymous
        # memory: queries fault in what they scan and re-score, and server workers share one copy.
        # FAISS refuses the two flags together.
        flags = (faiss.IO_FLAG_MMAP_IFC if _fourcc(path) in (_REFINE_FOURCC, *_FLAT_FOURCCS) else faiss.IO_FLAG_MMAP)
        flags |= faiss.IO_FLAG_READ_ONLY
    try:
        index = faiss.read_index(os.fspath(path), flags)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "unknown error"
        raise IndexFormatError(f"{path} is damaged ({first}); rebuild the index with `clipsearch index`") from exc
    normal = getattr(_mmap, "MADV_NORMAL", None)
    if mmap and normal is not None:
        # FAISS maps the whole file MADV_RANDOM: no read-ahead, so a query scanning a cold IVF
        # list faults its pages in one disk read at a time. Read-ahead is restored for what
        # queries scan (the lists); a re-ranked index's vectors, read k * k_factor at scattered
        # places, stay random-access.
        _advise(path, 0, _scanned_bytes(index, path), normal)
    return index


def _fourcc(path: str | os.PathLike[str]) -> bytes:
    with open(path, "rb") as f:
        return f.read(4)


def _is_refined_file(path: str | os.PathLike[str]) -> bool:
    return _fourcc(path) == _REFINE_FOURCC
