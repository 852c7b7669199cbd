"""FAISS: build, write, read and search. The only module that imports faiss.

Vectors are L2-normalised float32 and searched by inner product, so scores are cosines.
FAISS row i holds the image with id i; :mod:`retrieval.index` checks this on open.
"""

from __future__ import annotations

import mmap as _mmap
import os
import re
import struct
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .errors import IndexFormatError, InvalidArgumentError

DEFAULT_INDEX_TYPE = "Flat"
# Re-ranking depths tried when tuning an index with a refine stage (``...,Refine(SQfp16)``): the
# approximate codes return ``k * k_factor`` candidates, re-scored against the refine vectors.
K_FACTORS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
# The header FAISS writes first for an IndexRefine (index_write.cpp).
_REFINE_FOURCC = b"IxRF"
# k-means iterations when training IVF/PQ: past ~10 the centroids barely move for retrieval.
TRAIN_ITERATIONS = 10
# efSearch of an HNSW coarse quantizer while vectors are added: FAISS's default (16) assigns
# some vectors to a list that is not their nearest centroid's, where searches probing the
# nearest lists never find them (2M clustered 512-d vectors in IVF4096_HNSW32,SQ8: recall@10
# capped at 0.927 against 0.974 with a flat quantizer).
QUANTIZER_ADD_EF = 128


def build(vectors: np.ndarray, index_type: str = DEFAULT_INDEX_TYPE) -> Any:
    """Build an inner-product index of ``vectors`` (row i gets label i).

    Args:
        vectors: ``(n, dim)`` float32, L2-normalised.
        index_type: a FAISS factory string; ``"Flat"`` is exact search.

    Raises:
        ValueError: bad shape or an index type that needs training data we cannot give.
    """
    import faiss

    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[1] < 1:
        raise ValueError(f"expected (n, dim) vectors, got shape {vectors.shape}")
    index = faiss.index_factory(vectors.shape[1], index_type, faiss.METRIC_INNER_PRODUCT)
    if not index.is_trained:
        index.train(vectors)
    add(index, vectors)
    return index


def create(factory: str, dim: int) -> Any:
    """An empty inner-product index from a FAISS factory string.

    Raises:
        InvalidArgumentError: FAISS does not understand ``factory`` for this dimension.
    """
    import faiss

    try:
        index = faiss.index_factory(int(dim), factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as exc:
        last = str(exc).strip().splitlines()[-1] if str(exc).strip() else "unknown error"
        # "Error in faiss::Index* faiss::index_factory(...) at /project/faiss/index_factory.cpp:1228: could not ..."
        reason = re.sub(r"^Error in .* at \S+:\d+: ", "", last)
        raise InvalidArgumentError(f"FAISS cannot build index type {factory!r} for {dim}-d vectors: {reason}") from exc
    ivf = _ivf_of(index)
    if ivf is not None:
        ivf.cp.niter = TRAIN_ITERATIONS
        pq = faiss.downcast_index(ivf)
        if isinstance(pq, faiss.IndexIVFPQ):
            # On by default in factory-made IVF-PQ, for polysemous (Hamming) filtering, which we
            # never search with: it was 50 of 66 s of training IVF2048,PQ64 on 82k vectors here.
            pq.do_polysemous_training = False
    return index


def train(index: Any, sample: np.ndarray, seed: int = 0) -> None:
    """Train ``index`` (IVF centroids, PQ/SQ codebooks, OPQ rotation) on ``sample`` if it needs it."""
    if index.is_trained:
        return
    ivf = _ivf_of(index)
    if ivf is not None:
        ivf.cp.seed = seed
    index.train(np.ascontiguousarray(sample, dtype=np.float32))


def kind_of(index: Any) -> str:
    """``ivf``, ``hnsw`` or ``flat`` (anything else searched as it is)."""
    if _ivf_of(index) is not None:
        return "ivf"
    if _hnsw_of(index) is not None:
        return "hnsw"
    return "flat"


def _ivf_of(index: Any) -> Any:
    import faiss

    try:
        return faiss.extract_index_ivf(index)
    except (RuntimeError, AttributeError):
        return None


def _hnsw_of(index: Any) -> Any:
    import faiss

    inner = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexPreTransform) else index
    inner = faiss.downcast_index(inner)
    return inner if hasattr(inner, "hnsw") else None


def refine_of(index: Any) -> Any:
    """The ``IndexRefine`` wrapping ``index``'s approximate search (codes re-ranked against a
    second copy of the vectors, e.g. ``IVF4096,PQ64,Refine(SQfp16)``), or None."""
    import faiss

    inner = faiss.downcast_index(index)
    return inner if isinstance(inner, faiss.IndexRefine) else None


def tunable(index: Any) -> tuple[str, list[int]] | None:
    """The search parameter that trades speed for recall, and the values worth trying."""
    ivf = _ivf_of(index)
    if ivf is not None:
        values, v = [], 1
        while v < ivf.nlist:
            values.append(v)
            v *= 2
        return "nprobe", values + [int(ivf.nlist)]
    if _hnsw_of(index) is not None:
        return "efSearch", [16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048]
    return None


def set_search_params(index: Any, params: Mapping[str, int]) -> None:
    """Apply tuned search parameters (``{"nprobe": 32}``, ``{"efSearch": 64}``, and
    ``{"k_factor": 16}`` for a refine stage) to ``index``."""
    refine = refine_of(index)
    if "k_factor" in params and refine is not None:
        refine.k_factor = float(params["k_factor"])
    ivf = _ivf_of(index)
    if "nprobe" in params and ivf is not None:
        ivf.nprobe = int(params["nprobe"])
        quantizer = _hnsw_of(ivf.quantizer)
        if quantizer is not None:
            # An HNSW coarse quantizer must return at least nprobe good lists.
            quantizer.hnsw.efSearch = max(64, 2 * int(params["nprobe"]))
    hnsw = _hnsw_of(index)
    if "efSearch" in params and hnsw is not None:
        hnsw.hnsw.efSearch = int(params["efSearch"])


def _selector(allowed: np.ndarray) -> Any:
    import faiss

    bits = np.packbits(np.asarray(allowed, dtype=bool), bitorder="little")
    sel = faiss.IDSelectorBitmap(bits)
    sel.bits_ref = bits  # keep the buffer alive as long as the selector
    return sel


def _filtered_params(index: Any, sel: Any, boost: int) -> Any:
    """Search parameters restricting results to ``sel``; ``boost`` multiplies nprobe/efSearch."""
    import faiss

    refine = refine_of(index)
    if refine is not None:
        # IndexRefine ignores a selector of its own: the base search must apply it (the refine
        # stage only re-scores what the base returned).
        base = _filtered_params(refine.base_index, sel, boost)
        outer = faiss.IndexRefineSearchParameters(k_factor=float(refine.k_factor), base_index_params=base)
        outer.inner_ref = base
        return outer
    ivf = _ivf_of(index)
    if ivf is not None:
        inner: Any = faiss.SearchParametersIVF(sel=sel, nprobe=min(int(ivf.nlist), max(1, int(ivf.nprobe)) * boost))
    elif _hnsw_of(index) is not None:
        inner = faiss.SearchParametersHNSW(sel=sel, efSearch=int(_hnsw_of(index).hnsw.efSearch) * boost)
    else:
        inner = faiss.SearchParameters(sel=sel)
    if isinstance(faiss.downcast_index(index), faiss.IndexPreTransform):
        outer = faiss.SearchParametersPreTransform(index_params=inner)
        outer.inner_ref = inner
        return outer
    return inner


def reserve(index: Any, rows: int) -> None:
    """Make room for ``rows`` vectors in a refine stage's code array before adding them.

    FAISS grows that array (float16 vectors: 10 GB at 10M x 512-d) by reallocation, doubling
    its capacity, so a build peaked at the old and the new array together: a 10M build was
    killed for memory on a 24 GB machine. Sizing it once to the final size (then back to the
    rows it holds: the capacity stays) leaves the adds no reallocation to make.
    """
    import faiss

    refine = refine_of(index)
    if refine is None:
        return
    inner = faiss.downcast_index(refine.refine_index)
    if not isinstance(inner, faiss.IndexFlatCodes):
        return
    held = int(inner.ntotal) * int(inner.code_size)
    want = int(rows) * int(inner.code_size)
    if want > held:
        inner.codes.resize(want)
        inner.codes.resize(held)


def add(index: Any, vectors: np.ndarray) -> None:
    """Append vectors (labels continue from ``index.ntotal``)."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if not len(vectors):
        return
    ivf = _ivf_of(index)
    quantizer = _hnsw_of(ivf.quantizer) if ivf is not None else None
    if quantizer is None:
        index.add(vectors)
        return
    searching = int(quantizer.hnsw.efSearch)
    quantizer.hnsw.efSearch = max(searching, QUANTIZER_ADD_EF)
    try:
        index.add(vectors)
    finally:
        quantizer.hnsw.efSearch = searching


def write(index: Any, path: str | os.PathLike[str]) -> None:
    """Serialise ``index`` to ``path`` (callers handle the atomic rename)."""
    import faiss

    faiss.write_index(index, os.fspath(path))


def _empty_refine(refine: Any) -> Any:
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


def _over_empty_refine(base: Any, refine: Any) -> tuple[Any, Any]:
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


def streams_refine(index: Any) -> bool:
    """Whether ``index`` has a refine stage that :func:`write_refined` can write from a stream
    (so that its vectors, the largest part of the file, never have to be held in RAM)."""
    refine = refine_of(index)
    return refine is not None and _empty_refine(refine.refine_index) is not None


def streams_refine_file(path: str | os.PathLike[str]) -> bool:
    """:func:`streams_refine` for the index in a file (which :func:`open_refined` can then
    extend); a file without a refine stage is not opened."""
    return _is_refined_file(path) and streams_refine(read(path, mmap=True))


def _is_refined_file(path: str | os.PathLike[str]) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == _REFINE_FOURCC


def refine_codes(index: Any, vectors: np.ndarray) -> np.ndarray:
    """``vectors`` as ``index``'s refine stage stores them (``(n, code_size)`` uint8)."""
    refine = refine_of(index)
    return np.asarray(refine.refine_index.sa_encode(np.ascontiguousarray(vectors, dtype=np.float32)))


def write_refined(index: Any, path: str | os.PathLike[str], codes: Iterable[np.ndarray], rows: int) -> None:
    """Write ``index`` (an ``IndexRefine`` whose approximate stage holds all ``rows`` vectors and
    whose refine stage holds none of them) with the refine vectors taken from ``codes``, blocks
    of :func:`refine_codes` output in id order: the same bytes as :func:`write` of the index with
    every vector added, without the vectors in RAM (10 GB at 10M x 512-d in float16).

    FAISS writes a refine stage's vectors last, as a length then the bytes, followed only by
    ``k_factor``: the file is written with an empty refine stage that claims ``rows``, and
    the vectors are spliced in where the empty array's length was (checked, not assumed).

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


def _refine_prefix_bytes(d: int, metric: int) -> int:
    """Bytes FAISS writes for an ``IndexRefine`` before its approximate stage (fourcc and
    header), measured on a tiny index with the same dimension and metric."""
    import faiss

    base, refine = faiss.IndexFlat(d, metric), faiss.IndexFlat(d, metric)
    both = faiss.IndexRefine(base, refine)
    whole = len(faiss.serialize_index(both))
    return whole - len(faiss.serialize_index(base)) - len(faiss.serialize_index(refine)) - 4


def open_refined(path: str | os.PathLike[str], block_rows: int = 65536) -> tuple[Any, Iterator[np.ndarray]]:
    """Open a re-ranked index's file to extend it without its vectors in RAM: an ``IndexRefine``
    whose approximate stage is read into RAM (add to ``refine_of(index).base_index``) and whose
    refine stage is empty, and the file's refine vectors as a lazy stream of blocks (read from
    the file's tail) to pass, followed by the new rows' :func:`refine_codes`, to
    :func:`write_refined`.

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

    def blocks() -> Iterator[np.ndarray]:
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


def _refine_vector_bytes(index: Any, path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """Where a re-ranked index's refine vectors lie in its file (they are written last, before
    the 4 bytes of ``k_factor``), or None without a refine stage."""
    refine = refine_of(index)
    if refine is None:
        return None
    size = Path(path).stat().st_size
    first = size - 4 - int(refine.ntotal) * int(refine.refine_index.sa_code_size())
    return (first, size - 4) if first > 0 else None


def warm(index: Any, path: str | os.PathLike[str], vectors: bool | None = None) -> int:
    """Ask the kernel to read, in the background, a memory-mapped index's file: what every
    query scans (a re-ranked index's IVF lists and codes; any other index's whole file) and,
    with ``vectors``, a re-ranked index's refine vectors too (a query reads only
    ``k * k_factor`` of them, each a random disk read until cached). ``vectors=None``: those
    too when the whole file takes at most half the memory available now. Returns the bytes
    asked for; 0 where ``madvise`` is missing.

    10M x 512-d ``IVF8192_HNSW32,SQ4,Refine(SQfp16)``, page cache dropped, 300 queries each
    (benchmarks/README.md): p50 46 ms as opened, 44 ms with the lists read, 2.1 ms with the
    whole file cached.
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


def _scanned_bytes(index: Any, path: str | os.PathLike[str]) -> int:
    """How much of an index file, from its start, queries scan: all of it, or a re-ranked
    index's up to its refine vectors."""
    vectors = _refine_vector_bytes(index, path)
    return vectors[0] if vectors is not None else Path(path).stat().st_size


def read(path: str | os.PathLike[str], mmap: bool = False) -> Any:
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
        refined = _is_refined_file(path)
        # IO_FLAG_MMAP maps IVF lists but copies a refine stage's vectors into RAM; MMAP_IFC maps
        # both the IVF lists and the refine vectors (opening a 200k-vector file grows anonymous
        # RSS by 0 MB): queries fault in the lists they scan and the vectors they re-score.
        # FAISS refuses the two flags together.
        flags = (faiss.IO_FLAG_MMAP_IFC if refined else faiss.IO_FLAG_MMAP) | faiss.IO_FLAG_READ_ONLY
    try:
        index = faiss.read_index(os.fspath(path), flags)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "unknown error"
        raise IndexFormatError(f"{path} is damaged ({first}); rebuild the index with `clipsearch index`") from exc
    normal = getattr(_mmap, "MADV_NORMAL", None)
    if mmap and normal is not None:
        # FAISS maps the whole file MADV_RANDOM: no read-ahead, so a query scanning a cold IVF
        # list of ~300 KB faults its pages in one disk read at a time. Read-ahead is restored
        # for what queries scan (the lists); a re-ranked index's vectors, read k * k_factor
        # scattered 1 KB at a time, stay random-access.
        _advise(path, 0, _scanned_bytes(index, path), normal)
    return index


def stored_vectors(index: Any, ids: np.ndarray) -> tuple[np.ndarray, bool] | None:
    """The vectors ``index`` holds for ``ids``, and whether they are exact copies.

    Flat storage (flat, HNSW over flat, IVF-flat) holds the vectors as given: they must equal
    the stored embeddings. Compressed codes (SQ, PQ, OPQ rotations) decode to approximations.
    None when the index type cannot return its vectors.
    """
    import faiss

    ids = np.asarray(ids, dtype=np.int64)
    # A refine stage reconstructs from its own copy of the vectors, by id.
    ivf = _ivf_of(index) if refine_of(index) is None else None
    inner = faiss.downcast_index(index)
    exact = not isinstance(inner, faiss.IndexPreTransform) and (
        isinstance(inner, faiss.IndexFlat)
        or isinstance(inner, faiss.IndexIVFFlat)
        or (_hnsw_of(index) is not None and isinstance(faiss.downcast_index(_hnsw_of(index).storage), faiss.IndexFlat))
    )
    try:
        if ivf is not None:
            # id -> (list, offset), built in memory: IVF lists are not addressable by id otherwise.
            ivf.make_direct_map()
        out = np.empty((len(ids), int(index.d)), np.float32)
        for row, i in enumerate(ids.tolist()):
            out[row] = index.reconstruct(int(i))
    except RuntimeError:
        return None
    return out, exact


def search(
    index: Any, queries: np.ndarray, k: int, allowed: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` search: returns ``(scores, ids)``, each ``(n_queries, min(k, ntotal))``.

    Results are ordered by descending score; ties are ordered by ascending id so that the
    ranking is deterministic. Missing results (an approximate index found fewer) have id -1.

    Args:
        allowed: optional boolean mask over ids; only those ids are returned. An
            approximate index is searched with growing ``nprobe``/``efSearch`` until every
            query has ``min(k, allowed.sum())`` results (an IVF index at ``nprobe = nlist``
            and HNSW's flat storage are exhaustive), so a filter never yields fewer results.
    """
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    if queries.ndim == 1:
        queries = queries[None, :]
    if allowed is None:
        return _search(index, queries, min(int(k), int(index.ntotal)), int(index.ntotal), None)
    allowed = np.asarray(allowed, dtype=bool)
    if len(allowed) != index.ntotal:
        raise ValueError(f"allowed mask has {len(allowed)} entries for {index.ntotal} vectors")
    matches = int(allowed.sum())
    k = min(int(k), matches)
    sel = _selector(allowed)
    boost = 1
    while True:
        params = _filtered_params(index, sel, boost)
        scores, ids = _search(index, queries, k, matches, params)
        if k == 0 or bool(np.all(ids[:, k - 1] >= 0)):
            return scores, ids
        if not _can_boost(index, boost):
            break
        boost *= 4
    # HNSW's graph can strand a selective filter: scan its flat storage with the same filter.
    hnsw = _hnsw_of(index)
    if hnsw is not None and not _is_pretransform(index):
        import faiss

        storage = faiss.downcast_index(hnsw.storage)
        return _search(storage, queries, k, matches, faiss.SearchParameters(sel=sel))
    return scores, ids


def range_search(index: Any, queries: np.ndarray, min_score: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every stored vector scoring at least ``min_score`` with each query: ``(lims, scores,
    ids)`` in FAISS's layout (query ``i``'s results are ``[lims[i]:lims[i+1]]``, unordered).

    Exact for flat indexes; approximate ones (IVF at the tuned nprobe, HNSW, compressed codes)
    may miss vectors and return approximate scores.
    """
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    if refine_of(index) is not None:
        return _refine_range_search(index, queries, min_score)
    # FAISS keeps inner products strictly above the radius: step just below min_score.
    radius = float(np.nextafter(np.float32(min_score), np.float32(-np.inf)))
    step = _hnsw_range_chunk(index)
    if step is None or len(queries) <= step:
        lims, scores, ids = index.range_search(queries, radius)
    else:
        parts = [index.range_search(queries[i : i + step], radius) for i in range(0, len(queries), step)]
        counts = np.concatenate([np.diff(p[0]) for p in parts])
        lims = np.concatenate([[0], np.cumsum(counts)]).astype(parts[0][0].dtype)
        scores = np.concatenate([p[1] for p in parts])
        ids = np.concatenate([p[2] for p in parts])
    keep = scores >= min_score
    if keep.all():
        return lims, scores, ids
    owner = np.repeat(np.arange(len(queries)), np.diff(lims))[keep]
    return np.searchsorted(owner, np.arange(len(queries) + 1)).astype(lims.dtype), scores[keep], ids[keep]


def _refine_range_search(index: Any, queries: np.ndarray, min_score: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`range_search` for an index with a refine stage, which FAISS answers with no results
    at all (IndexRefine has no range search): top-k searches, k growing for the queries whose
    k-th re-scored hit still reaches ``min_score``, so the scores are the refine stage's."""
    n = len(queries)
    found: list[tuple[np.ndarray, np.ndarray]] = [(np.empty(0, np.float32), np.empty(0, np.int64))] * n
    todo = np.arange(n)
    k = 32
    while len(todo):
        k = min(k, int(index.ntotal))
        scores, ids = index.search(queries[todo], k)
        more = []
        for row, q in enumerate(todo.tolist()):
            keep = (ids[row] >= 0) & (scores[row] >= min_score)
            found[q] = (scores[row][keep], ids[row][keep])
            if keep.all() and k < index.ntotal:
                more.append(q)
        todo = np.asarray(more, dtype=np.int64)
        k *= 4
    counts = np.array([len(s) for s, _ in found], dtype=np.int64)
    lims = np.concatenate([[0], np.cumsum(counts)]).astype(np.uint64)
    if not n:
        return lims, np.empty(0, np.float32), np.empty(0, np.int64)
    return lims, np.concatenate([s for s, _ in found]).astype(np.float32), np.concatenate([i for _, i in found]).astype(np.int64)


def _hnsw_range_chunk(index: Any) -> int | None:
    """Queries per ``range_search`` call that an HNSW index answers in one block, else None.

    FAISS's HNSW search walks the queries in blocks of ``InterruptCallback.get_period_hint(
    max_level * d * efSearch)`` (1e8 / flops while Python's interrupt callback is installed),
    and its range-search result handler allocates the result once per block: a second block
    aborts the process ("labels == nullptr && distances == nullptr failed", faiss 1.15). One
    block per call avoids it.
    """
    hnsw = _hnsw_of(index)
    if hnsw is None:
        return None
    flops = max(1, int(hnsw.hnsw.max_level)) * int(index.d) * max(1, int(hnsw.hnsw.efSearch))
    return max(1, 10**8 // (flops + 1) // 2)


def _is_pretransform(index: Any) -> bool:
    import faiss

    return isinstance(faiss.downcast_index(index), faiss.IndexPreTransform)


def _can_boost(index: Any, boost: int) -> bool:
    ivf = _ivf_of(index)
    if ivf is not None:
        return max(1, int(ivf.nprobe)) * boost < int(ivf.nlist)
    hnsw = _hnsw_of(index)
    if hnsw is not None:
        return int(hnsw.hnsw.efSearch) * boost < max(4096, int(index.ntotal) // 16)
    return False


def _search(index: Any, queries: np.ndarray, k: int, limit: int, params: Any) -> tuple[np.ndarray, np.ndarray]:
    if k <= 0:
        return np.empty((len(queries), 0), np.float32), np.empty((len(queries), 0), np.int64)
    # FAISS keeps an arbitrary member of a group of equal scores that straddles position k.
    # Fetch past the cut until no row ties across it, so that sorting (score desc, id asc)
    # and cutting gives the documented order and search(k) is a prefix of search(k + 1).
    # ``limit`` caps the fetch (the number of vectors that can be returned at all).
    # One past the cut first: a re-ranked index scores ``fetch * k_factor`` candidates, so a
    # first fetch of 2k would double its work (and re-rank deeper than it was tuned for).
    fetch = k
    while True:
        fetch = min(limit, k + 1 if fetch == k else fetch * 2)
        scores, ids = index.search(queries, fetch) if params is None else index.search(queries, fetch, params=params)
        tied = (scores[:, k - 1] == scores[:, fetch - 1]) & (ids[:, fetch - 1] >= 0)
        if fetch >= limit or not np.any(tied):
            break
    # Missing results (-1) sort last whatever their placeholder score.
    order = np.lexsort((ids, -scores, ids < 0), axis=1)[:, :k]
    return np.take_along_axis(scores, order, 1), np.take_along_axis(ids, order, 1)


class ExactTopK:
    """Exact top-``k`` by inner product for fixed queries, over vectors fed in chunks.

    Memory is one chunk plus ``(n_queries, k)`` results, whatever the collection size.
    """

    def __init__(self, queries: np.ndarray, k: int) -> None:
        import faiss

        self.queries = np.ascontiguousarray(queries, dtype=np.float32)
        self.k = k
        self._heap = faiss.ResultHeap(len(self.queries), k, keep_max=True)

    def add(self, first_id: int, vectors: np.ndarray) -> None:
        import faiss

        if not len(vectors) or not len(self.queries):
            return
        flat = faiss.IndexFlatIP(self.queries.shape[1])
        flat.add(np.ascontiguousarray(vectors, dtype=np.float32))
        scores, ids = flat.search(self.queries, min(self.k, len(vectors)))
        if scores.shape[1] < self.k:
            pad = self.k - scores.shape[1]
            scores = np.pad(scores, ((0, 0), (0, pad)), constant_values=-np.inf)
            ids = np.pad(ids, ((0, 0), (0, pad)), constant_values=-1)
        self._heap.add_result(np.ascontiguousarray(scores), np.ascontiguousarray(np.where(ids >= 0, ids + first_id, -1)))

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """``(scores, ids)`` sorted by descending score (call once, after the last chunk)."""
        self._heap.finalize()
        return self._heap.D, self._heap.I


def recall_at(found: np.ndarray, truth: np.ndarray, exclude: np.ndarray | None = None, k: int = 10) -> float:
    """Mean fraction of each query's true top-``k`` found in its approximate top-``k``.

    ``exclude`` (one id per query) drops the query's own vector from both lists: a collection
    vector used as a query would otherwise always find itself.
    """
    total = 0.0
    for i in range(len(truth)):
        drop = int(exclude[i]) if exclude is not None else -1
        want = [int(t) for t in truth[i] if t >= 0 and t != drop][:k]
        got = [int(f) for f in found[i] if f >= 0 and f != drop][:k]
        total += len(set(got).intersection(want)) / max(1, len(want))
    return total / max(1, len(truth))


def tune(
    index: Any,
    queries: np.ndarray,
    truth: np.ndarray,
    target: float,
    exclude: np.ndarray | None = None,
    k: int = 10,
) -> tuple[dict[str, int], float, bool]:
    """The cheapest ``nprobe``/``efSearch`` whose recall@``k`` reaches ``target``.

    Returns:
        ``(params, recall, reached)``; when no value reaches the target, the best one tried.
    """
    if refine_of(index) is not None and _ivf_of(index) is not None:
        return _tune_refine(index, queries, truth, target, exclude, k)
    knob = tunable(index)
    if knob is None:
        _, found = index.search(np.ascontiguousarray(queries, dtype=np.float32), k + 1)
        return {}, recall_at(found, truth, exclude, k), True
    name, values = knob
    best: tuple[dict[str, int], float] = ({}, -1.0)
    fetch = k + (1 if exclude is not None else 0)
    gains: list[float] = []
    for value in values:
        set_search_params(index, {name: value})
        _, found = index.search(np.ascontiguousarray(queries, dtype=np.float32), fetch)
        recall = recall_at(found, truth, exclude, k)
        gains.append(recall - max(best[1], 0.0))
        if recall > best[1] + 1e-9:
            best = ({name: value}, recall)
        if recall >= target:
            return {name: value}, recall, True
        # Compressed codes cap recall below the target: once two doublings each gained under
        # 1% of the remaining gap, larger values only cost time (up to a full scan of 10M).
        if len(gains) >= 3 and all(g < 0.01 * (target - best[1]) for g in gains[-2:]):
            break
    set_search_params(index, best[0])
    return best[0], best[1], False


def refine_cost(index: Any, nprobe: int, k_factor: int, k: int = 10) -> float:
    """A machine-independent estimate of one query's work in an IVF index with a refine stage
    (bytes touched): scanning ``nprobe`` lists of codes (plus their lookup tables), then
    re-scoring ``k * k_factor`` candidates against the refine vectors, each a random read of a
    full vector that is decoded and multiplied. Used to choose between (nprobe, k_factor) pairs
    reaching the same recall without timing anything (a build must not depend on the load of
    the machine it ran on)."""
    ivf = _ivf_of(index)
    refine = refine_of(index)
    per_list = int(index.ntotal) / max(1, int(ivf.nlist))
    scan = nprobe * (per_list * (int(ivf.code_size) + 8) + 256 * int(index.d))
    # A refine vector costs its bytes twice over a scanned code: a cache miss, then a decode.
    rescore = k * k_factor * 2 * int(refine.refine_index.sa_code_size()) * 2
    return float(scan + rescore)


def _tune_refine(
    index: Any, queries: np.ndarray, truth: np.ndarray, target: float, exclude: np.ndarray | None, k: int
) -> tuple[dict[str, int], float, bool]:
    """Two knobs: the lists probed (``nprobe``) and the re-ranking depth (``k_factor``).

    For each ``nprobe`` (doubling), the smallest ``k_factor`` reaching ``target``; more lists
    need no deeper re-ranking, so each step only searches below the last depth found. Of the
    pairs reaching the target, the one with the lowest :func:`refine_cost`; the walk stops once
    the scan alone of the next ``nprobe`` costs more than that. When none reaches it, the pair
    with the best recall (the deepest re-ranking, at the ``nprobe`` where recall stopped rising).
    """
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    fetch = k + (1 if exclude is not None else 0)
    nprobes = [int(v) for v in tunable(index)[1]]  # type: ignore[index]  # an IVF index has one
    factors = [f for f in K_FACTORS if f * fetch <= max(fetch, int(index.ntotal))] or [1]

    def recall_of(nprobe: int, k_factor: int) -> float:
        set_search_params(index, {"nprobe": nprobe, "k_factor": k_factor})
        # Through :func:`search`, as readers search: the candidates re-ranked depend on how
        # many results are fetched.
        _, found = search(index, queries, fetch)
        return recall_at(found, truth, exclude, k)

    best: tuple[dict[str, int], float] = ({}, -1.0)
    chosen: tuple[dict[str, int], float, float] | None = None  # params, recall, cost
    deepest: list[float] = []
    top = len(factors) - 1
    for nprobe in nprobes:
        if chosen is not None and refine_cost(index, nprobe, 0, k) >= chosen[2]:
            break
        recall = recall_of(nprobe, factors[top])
        if recall > best[1] + 1e-9:
            best = ({"nprobe": nprobe, "k_factor": factors[top]}, recall)
        if recall < target:
            deepest.append(recall)
            # Recall stopped rising with more lists at the deepest re-ranking: the codes, not the
            # lists probed, are the limit.
            if len(deepest) >= 3 and deepest[-1] - deepest[-3] < 0.01 * (target - best[1]) + 1e-9:
                break
            continue
        reach = (top, recall)
        while reach[0] > 0:
            below = recall_of(nprobe, factors[reach[0] - 1])
            if below < target:
                break
            reach = (reach[0] - 1, below)
        top = reach[0]
        cost = refine_cost(index, nprobe, factors[top], k)
        if chosen is None or cost < chosen[2]:
            chosen = ({"nprobe": nprobe, "k_factor": factors[top]}, reach[1], cost)
        if top == 0:
            break
    if chosen is not None:
        set_search_params(index, chosen[0])
        return chosen[0], chosen[1], True
    set_search_params(index, best[0])
    return best[0], best[1], False
