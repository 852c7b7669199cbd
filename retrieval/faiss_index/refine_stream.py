"""A re-ranked index's file written and extended with its refine vectors streamed, never held in RAM.

FAISS writes a refine stage's vectors last, as a length then the bytes, followed only by
``k_factor``: a file is written with an empty refine stage that claims every row, and the
vectors are spliced in where the empty array's length was (checked, not assumed). Reading one
back to extend it takes the approximate stage into RAM and leaves the vectors in the file.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Iterator

import numpy as np
import numpy.typing as npt

from ..errors import IndexFormatError
from .io import _is_refined_file, read
from .pagecache import _refine_vector_bytes
from .structure import FaissIndex, refine_of


def streams_refine(index: FaissIndex) -> bool:
    """Whether ``index`` has a refine stage that :func:`write_refined` can write from a stream
    (so that its vectors, the largest part of the file, never have to be held in RAM)."""
    refine = refine_of(index)
    return refine is not None and _empty_refine(refine.refine_index) is not None


def streams_refine_file(path: str | os.PathLike[str]) -> bool:
    """:func:`streams_refine` for the index in a file (which :func:`open_refined` can then
    extend); a file without a refine stage is not opened."""
    return _is_refined_file(path) and streams_refine(read(path, mmap=True))


def refine_codes(index: FaissIndex, vectors: npt.NDArray[np.float32]) -> npt.NDArray[np.uint8]:
    """``vectors`` as ``index``'s refine stage stores them (``(n, code_size)`` uint8)."""
    refine = refine_of(index)
    return np.asarray(refine.refine_index.sa_encode(np.ascontiguousarray(vectors, dtype=np.float32)))


def write_refined(index: FaissIndex, path: str | os.PathLike[str], codes: Iterable[npt.NDArray[np.uint8]], rows: int) -> None:
    """Write ``index`` (an ``IndexRefine`` whose approximate stage holds all ``rows`` vectors and
    whose refine stage holds none of them) with the refine vectors taken from ``codes``, blocks
    of :func:`refine_codes` output in id order: the same bytes as :func:`~.io.write` of the
    index with every vector added, without the vectors in RAM.

    Raises:
        ValueError: the stage cannot be streamed, or ``codes`` does not hold ``rows`` vectors.
    """
    import faiss

    refine = refine_of(index)
    if refine is None:
        raise ValueError("this index has no refine stage that can be written from a stream")
    base = refine.base_index
    if int(base.ntotal) != rows:
        raise ValueError(f"the approximate stage holds {base.ntotal} vectors, not {rows}")
    view, empty = _over_empty_refine(base, refine)  # the empty stage claims the rows spliced in below
    code_size = int(empty.sa_code_size())
    path = os.fspath(path)
    faiss.write_index(view, path)
    del view
    with open(path, "r+b") as f:
        f.seek(-12, os.SEEK_END)
        tail = f.read(12)
        if struct.unpack("<Q", tail[:8])[0] != 0:
            raise RuntimeError("FAISS did not write the refine vectors last; cannot stream them")
        f.seek(-12, os.SEEK_END)
        f.truncate()
        f.write(struct.pack("<Q", rows * code_size))
        written = 0
        for block in codes:
            block = np.ascontiguousarray(block, dtype=np.uint8)
            if block.ndim != 2 or block.shape[1] != code_size:
                raise ValueError(f"refine codes of shape {block.shape}, expected (n, {code_size})")
            written += len(block)
            if written > rows:
                raise ValueError(f"more than {rows} refine vectors")
            f.write(block.data)
        if written != rows:
            raise ValueError(f"{written} refine vectors for {rows} rows")
        f.write(tail[8:])


def open_refined(path: str | os.PathLike[str], block_rows: int = 65536) -> tuple[FaissIndex, Iterator[npt.NDArray[np.uint8]]]:
    """Open a re-ranked index's file to extend it without its vectors in RAM.

    Args:
        path: a file :func:`streams_refine_file` accepts.
        block_rows: refine vectors per block of the stream returned.

    Returns:
        An ``IndexRefine`` whose approximate stage is read into RAM (add to
        ``refine_of(index).base_index``) and whose refine stage is empty, and the file's refine
        vectors as a lazy stream of blocks (read from the file's tail) to pass, followed by the
        new rows' :func:`refine_codes`, to :func:`write_refined`.

    Raises:
        IndexFormatError: the file is missing, damaged or not a streamable re-ranked index.
    """
    import faiss

    mapped = read(path, mmap=True)
    refine = refine_of(mapped)
    if refine is None or _empty_refine(refine.refine_index) is None:
        raise IndexFormatError(f"{path} is not a re-ranked index; rebuild it with `clipsearch reindex`")
    rows, code_size = int(refine.ntotal), int(refine.refine_index.sa_code_size())
    start = _refine_prefix_bytes(int(refine.d), int(refine.metric_type))
    with open(path, "rb") as f:
        f.seek(start)
        try:
            base = faiss.read_index(faiss.PyCallbackIOReader(f.read))
        except RuntimeError as exc:
            raise IndexFormatError(f"{path} is damaged ({str(exc).strip().splitlines()[0]}); rebuild it with `clipsearch reindex`") from exc
    vectors = _refine_vector_bytes(mapped, path)
    if int(base.ntotal) != rows or vectors is None or vectors[0] < 8:
        raise IndexFormatError(f"{path} is damaged (its stages disagree); rebuild it with `clipsearch reindex`")
    first = vectors[0]
    index, empty = _over_empty_refine(base, refine)
    empty.ntotal = 0
    # The wrapper owns both stages from here on (FAISS's pattern for indexes built in Python).
    index.own_fields = True
    index.own_refine_index = True
    base.this.disown()
    empty.this.disown()
    del mapped

    def blocks() -> Iterator[npt.NDArray[np.uint8]]:
        with open(path, "rb") as f:
            f.seek(first - 8)
            if struct.unpack("<Q", f.read(8))[0] != rows * code_size:
                raise IndexFormatError(f"{path} is damaged (refine vectors); rebuild it with `clipsearch reindex`")
            left = rows
            while left:
                take = min(block_rows, left)
                data = f.read(take * code_size)
                if len(data) != take * code_size:
                    raise IndexFormatError(f"{path} is truncated; rebuild it with `clipsearch reindex`")
                yield np.frombuffer(data, dtype=np.uint8).reshape(take, code_size)
                left -= take

    return index, blocks()


def _empty_refine(refine: FaissIndex) -> FaissIndex | None:
    """A refine stage of ``refine``'s kind holding no vectors, or None where that kind is not
    streamed: one that carries training an empty copy would lose (SQ8's ranges), or a flat
    stage (FAISS writes its array's length in floats, not bytes; written whole instead)."""
    import faiss

    inner = faiss.downcast_index(refine)
    if isinstance(inner, faiss.IndexScalarQuantizer) and inner.sq.qtype in (
        faiss.ScalarQuantizer.QT_fp16,
        faiss.ScalarQuantizer.QT_bf16,
    ):
        return faiss.IndexScalarQuantizer(inner.d, inner.sq.qtype, inner.metric_type)
    return None


def _over_empty_refine(base: FaissIndex, refine: FaissIndex) -> tuple[FaissIndex, FaissIndex]:
    """``(IndexRefine(base, empty), empty)``: ``refine``'s ``k_factor`` over an empty stage of
    its refine stage's kind (:func:`_empty_refine`) that claims ``base``'s count (FAISS's
    constructor requires the two counts to agree). The wrapper borrows both stages."""
    import faiss

    empty = _empty_refine(refine.refine_index)
    if empty is None:
        raise ValueError("this index has no refine stage that can be written from a stream")
    empty.ntotal = base.ntotal
    view = faiss.IndexRefine(base, empty)
    view.k_factor = float(refine.k_factor)
    return view, empty


def _refine_prefix_bytes(d: int, metric: int) -> int:
    """Bytes FAISS writes for an ``IndexRefine`` before its approximate stage (fourcc and
    header), measured on a tiny index with the same dimension and metric."""
    import faiss

    base, refine = faiss.IndexFlat(d, metric), faiss.IndexFlat(d, metric)
    both = faiss.IndexRefine(base, refine)
    whole = len(faiss.serialize_index(both))
    return whole - len(faiss.serialize_index(base)) - len(faiss.serialize_index(refine)) - 4
