"""Which FAISS index an index directory gets: ``--index-type``, ``--max-memory``, ``--target-recall``.

Pure Python (no faiss): a user's :class:`IndexOptions` and the collection's size and dimension
in, a :class:`IndexPlan` (a FAISS factory string, how much to train on, which search parameter
to tune) out. The rules behind ``auto``:

- up to :data:`FLAT_MAX_ROWS` vectors: exact ``Flat`` search (a full scan of 50k 512-d
  vectors takes a few ms, and exact beats approximate when it is that cheap);
- else the approximate families that fit ``max_memory``, tried in this order until one reaches
  the target recall: HNSW over full vectors (up to :data:`HNSW_AUTO_MAX_ROWS` vectors); IVF
  over full vectors; IVF over 8-bit scalar-quantised vectors (512 B per 512-d vector); then
  compact codes re-ranked against float16 copies of the vectors (``...,Refine(SQfp16)``):
  4-bit scalar-quantised codes (``dim / 2`` bytes per vector), else product-quantised ones
  (``dim / 8`` bytes or fewer).

The re-ranked family is how a collection larger than the budget reaches a high recall: the
compact codes stay resident and choose ``k * k_factor``
candidates, which are re-scored against the float16 vectors; those sit in the same FAISS file,
memory-mapped (:func:`retrieval.faiss_index.read`), so that the page cache holds what queries
touch and ``max_memory`` counts the resident codes only. Its file needs ``2 * dim`` bytes a
vector more on disk.

Every approximate plan is tuned (``nprobe`` or ``efSearch``, and ``k_factor`` for a re-ranked
index) to reach ``target_recall`` recall@10 against exact search; see :mod:`indexer.ann`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from retrieval.checks import is_int, is_positive_int
from retrieval.errors import InvalidArgumentError
from retrieval.faiss_mapping import format_bytes

FLAT_MAX_ROWS = 50_000
DEFAULT_MAX_MEMORY = 4 * 1024**3
DEFAULT_TARGET_RECALL = 0.95
HNSW_M = 32
# Past this many vectors ``auto`` does not try HNSW: its graph is built one insertion at a time,
# slower than training and filling IVF over the same full vectors, and its recall stops short
# where IVF reaches any recall by probing more lists; building HNSW first only to discard it
# would make the large auto builds slower still (figures: benchmarks/README.md).
HNSW_AUTO_MAX_ROWS = 500_000
# Below this many vectors an approximate index has nothing to gain and too little to train on.
MIN_ANN_ROWS = 256
MAX_NLIST = 8192
# Training points per IVF list: FAISS warns below 39; more buys little and costs k-means time.
TRAIN_PER_LIST = 40
MAX_TRAIN_ROWS = 400_000

NAMED_TYPES = ("auto", "flat", "hnsw", "ivf-flat", "ivf-sq8", "ivf-pq", "ivf-sq4-refine", "ivf-pq-refine")
# The re-ranking stage of ``ivf-sq4-refine`` and ``ivf-pq-refine``: float16 copies of the vectors (scores within ~1e-3
# of float32 ones, half their bytes).
REFINE = "Refine(SQfp16)"

_UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1024, "M": 1024**2, "MB": 1024**2, "G": 1024**3, "GB": 1024**3, "T": 1024**4, "TB": 1024**4}
_MEMORY_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?B?|[KMGT]iB)?\s*$", re.IGNORECASE)


def parse_memory(text: str | int) -> int:
    """``"4GB"``, ``"512M"``, ``"1.5GiB"`` or a byte count -> bytes (binary units).

    Raises:
        InvalidArgumentError: not a size, or zero.
    """
    if is_int(text):
        value = int(text)  # a NumPy integer too, as a plain int for the manifest's JSON
    else:
        match = _MEMORY_RE.match(str(text))
        if not match:
            raise InvalidArgumentError(f"cannot read memory size {text!r}; write it like 4GB, 512MB or 1073741824")
        unit = (match.group(2) or "").upper().replace("IB", "B")
        value = int(float(match.group(1)) * _UNITS[unit])
    if value < 1:
        raise InvalidArgumentError(f"memory size must be > 0, got {text!r}")
    return value


@dataclass(frozen=True)
class IndexOptions:
    """What the user asked for; recorded in the manifest so that updates keep it.

    Attributes:
        index_type: ``auto``, ``flat``, ``hnsw``, ``ivf-sq8``, ``ivf-pq`` or a FAISS factory
            string (e.g. ``"IVF1024,PQ32"``), always used with inner product.
        max_memory: bytes the FAISS index may take in RAM (or mapped); ``auto`` chooses within it.
        target_recall: recall@10 against exact search that tuning aims for.
    """

    index_type: str = "auto"
    max_memory: int = DEFAULT_MAX_MEMORY
    target_recall: float = DEFAULT_TARGET_RECALL

    def __post_init__(self) -> None:
        if not isinstance(self.index_type, str) or not self.index_type.strip():
            raise InvalidArgumentError("index type must be a non-empty string")
        if not is_positive_int(self.max_memory):
            raise InvalidArgumentError(f"max_memory must be a positive number of bytes, got {self.max_memory!r}")
        if not isinstance(self.target_recall, (int, float)) or not 0.0 < float(self.target_recall) <= 1.0:
            raise InvalidArgumentError(f"target recall must be in (0, 1], got {self.target_recall!r}")

    @property
    def named(self) -> bool:
        """True for the names above, False for a raw factory string."""
        return self.index_type.lower() in NAMED_TYPES

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> IndexOptions:
        known = {k: data[k] for k in ("index_type", "max_memory", "target_recall") if k in data}
        return cls(**known)


@dataclass(frozen=True)
class IndexPlan:
    """A resolved choice.

    Attributes:
        factory: FAISS factory string (metric: inner product).
        kind: ``flat``, ``hnsw``, ``ivf`` or ``custom``: decides which parameter is tuned.
        train_rows: vectors to train on (0: no training needed).
        estimated_bytes: expected size of what must stay resident in memory.
        reason: one line on why this plan (shown by ``info``).
        mapped_bytes: expected size of what is memory-mapped on top (the float16 vectors of a
            re-ranked index), read through the page cache as queries touch it.
    """

    factory: str
    kind: str
    train_rows: int
    estimated_bytes: int
    reason: str
    mapped_bytes: int = 0

    @property
    def needs_tuning(self) -> bool:
        return self.kind != "flat"


def _pow2_at_most(x: float) -> int:
    return 1 << max(0, int(math.floor(math.log2(max(1.0, x)))))


def ivf_lists(n: int) -> int:
    """IVF list count: the power of two nearest 4 * sqrt(n), with >= 40 vectors per list."""
    target = 4 * math.sqrt(max(n, 1))
    nlist = 1 << max(0, round(math.log2(target)))
    return max(1, min(nlist, MAX_NLIST, _pow2_at_most(n / TRAIN_PER_LIST)))


def _pq_bits(n: int) -> int:
    # 8-bit codebooks need 256 centroids per sub-space; fewer training vectors, fewer bits.
    return max(4, min(8, int(math.floor(math.log2(max(16, n / TRAIN_PER_LIST))))))


def _hnsw_bytes(n: int, dim: int) -> int:
    # Full vectors + level-0 links (2*M ids) + ~5% for upper levels and bookkeeping.
    return int(n * (dim * 4 + 2 * HNSW_M * 4) * 1.05)


def _ivf_bytes(n: int, dim: int, code_bytes: int, nlist: int) -> int:
    return n * (code_bytes + 8) + nlist * dim * 4 * 2


def _pq_m_choices(dim: int) -> list[int]:
    # Sub-quantisers dividing dim, from dim/4 bytes per vector down to 4.
    return [m for m in (dim // 4, dim // 8, dim // 16, dim // 32, 8, 4) if m >= 1 and dim % m == 0]


def _train_rows(n: int, nlist: int, pq: bool) -> int:
    want = max(nlist * TRAIN_PER_LIST, 256 * TRAIN_PER_LIST if pq else 0, 10_000)
    return min(n, want, MAX_TRAIN_ROWS)


def _flat(n: int, dim: int, reason: str) -> IndexPlan:
    return IndexPlan("Flat", "flat", 0, n * dim * 4, reason)


def _hnsw(n: int, dim: int, reason: str) -> IndexPlan:
    return IndexPlan(f"HNSW{HNSW_M}", "hnsw", 0, _hnsw_bytes(n, dim), reason)


def _ivf_prefix(nlist: int) -> str:
    # Past a few thousand lists, assigning vectors to lists by brute force dominates the
    # build; an HNSW graph over the centroids makes it logarithmic.
    return f"IVF{nlist}_HNSW32" if nlist >= 4096 else f"IVF{nlist}"


def _ivf_sq(n: int, dim: int, bits: int, reason: str) -> IndexPlan:
    nlist = ivf_lists(n)
    size = _ivf_bytes(n, dim, math.ceil(dim * bits / 8), nlist)
    return IndexPlan(f"{_ivf_prefix(nlist)},SQ{bits}", "ivf", _train_rows(n, nlist, False), size, reason)


def _ivf_pq(n: int, dim: int, budget: int | None, reason: str, max_m: int | None = None) -> IndexPlan | None:
    """The largest PQ code (at most ``max_m`` sub-quantisers) whose index fits ``budget``."""
    nlist = ivf_lists(n)
    bits = _pq_bits(n)
    for m in _pq_m_choices(dim):
        if max_m is not None and m > max_m:
            continue
        size = _ivf_bytes(n, dim, math.ceil(m * bits / 8), nlist)
        if budget is None or size <= budget:
            # No OPQ rotation: training it took nearly the whole build time (bench_search), for
            # a few points of recall.
            tail = "" if bits == 8 else f"x{bits}"
            factory = f"{_ivf_prefix(nlist)},PQ{m}{tail}"
            return IndexPlan(factory, "ivf", _train_rows(n, nlist, True), size, reason)
    return None


def _refined(plan: IndexPlan, n: int, dim: int) -> IndexPlan:
    """``plan`` with a re-ranking stage: its codes stay the resident budget, the float16
    vectors (``2 * dim`` bytes each) are mapped on top."""
    return dataclasses.replace(plan, factory=f"{plan.factory},{REFINE}", mapped_bytes=n * dim * 2)


def _ivf_sq4_refine(n: int, dim: int, reason: str) -> IndexPlan:
    return _refined(_ivf_sq(n, dim, 4, reason), n, dim)


def _ivf_pq_refine(n: int, dim: int, budget: int | None, reason: str) -> IndexPlan | None:
    # dim / 8 bytes a vector (64 for 512-d): the re-ranking recovers what coarser codes lose,
    # at the price of a deeper re-ranking (2M clustered 512-d vectors, 10k per cluster:
    # recall@10 0.979 at k_factor 256, where 4-bit codes need 16; benchmarks/README.md).
    plan = _ivf_pq(n, dim, budget, reason, max_m=max(1, dim // 8))
    return _refined(plan, n, dim) if plan is not None else None


def _ivf_flat(n: int, dim: int, reason: str) -> IndexPlan:
    nlist = ivf_lists(n)
    return IndexPlan(f"{_ivf_prefix(nlist)},Flat", "ivf", _train_rows(n, nlist, False), _ivf_bytes(n, dim, dim * 4, nlist), reason)


def candidate_plans(n: int, dim: int, options: IndexOptions) -> list[IndexPlan]:
    """The plans to try, best first: the builder keeps the first whose tuning reaches the
    target recall (else the one with the best recall).

    A named type or factory string gives one plan. ``auto`` gives exact flat search for small
    collections, else every approximate family that fits ``max_memory``, from the most
    accurate per byte to the most compressed: HNSW over full vectors, IVF over full vectors
    (exhaustive at ``nprobe = nlist``, so any target is reachable), IVF-SQ8, IVF-PQ.

    Raises:
        InvalidArgumentError: nothing fits in ``max_memory``.
    """
    kind = options.index_type.lower()
    budget = options.max_memory
    few = n < MIN_ANN_ROWS
    if kind == "flat":
        return [_flat(n, dim, "asked for flat (exact) search")]
    if kind in NAMED_TYPES[2:] and few:
        return [_flat(n, dim, f"{kind} asked for, but {n} vectors are too few to need or train it: exact search")]
    if kind == "hnsw":
        return [_hnsw(n, dim, "asked for hnsw")]
    if kind == "ivf-flat":
        return [_ivf_flat(n, dim, "asked for ivf-flat")]
    if kind == "ivf-sq8":
        return [_ivf_sq(n, dim, 8, "asked for ivf-sq8")]
    if kind == "ivf-pq":
        return [_ivf_pq(n, dim, None, "asked for ivf-pq")]  # type: ignore[list-item]  # no budget: always fits
    if kind == "ivf-sq4-refine":
        return [_ivf_sq4_refine(n, dim, "asked for ivf-sq4-refine")]
    if kind == "ivf-pq-refine":
        return [_ivf_pq_refine(n, dim, None, "asked for ivf-pq-refine")]  # type: ignore[list-item]  # no budget: always fits
    if kind != "auto":
        return [IndexPlan(options.index_type, "custom", min(n, MAX_TRAIN_ROWS), 0, "asked for this FAISS factory string")]
    if n <= FLAT_MAX_ROWS and n * dim * 4 <= budget:
        return [_flat(n, dim, f"auto: {n} vectors <= {FLAT_MAX_ROWS}, exact search is fast enough")]
    if few:
        return [_flat(n, dim, f"auto: {n} vectors, too few for an approximate index")]
    fit = f"fits in {format_bytes(budget)}"
    large = n > HNSW_AUTO_MAX_ROWS
    plans = [] if large else [_hnsw(n, dim, f"auto: vectors and graph {fit}")]
    no_hnsw = f" (HNSW is not tried above {HNSW_AUTO_MAX_ROWS:,} vectors: its build costs ~3x IVF's)" if large else ""
    plans += [
        _ivf_flat(n, dim, f"auto: full vectors in IVF lists {fit}{no_hnsw}"),
        _ivf_sq(n, dim, 8, f"auto: 8-bit codes {fit}"),
    ]
    # Re-ranked codes where neither full nor 8-bit vectors fit: 4-bit scalar codes (dim / 2
    # bytes) when they fit, else product-quantised ones. Plain ivf-pq is not tried: its recall is
    # capped by the codes (bench_search at 10M), and re-ranking costs disk, not memory.
    reranked = "re-ranked against memory-mapped float16 vectors"
    plans.append(_ivf_sq4_refine(n, dim, f"auto: 4-bit codes {fit}, {reranked}"))
    pq = _ivf_pq_refine(n, dim, budget, f"auto: product-quantised codes {fit}, {reranked}")
    plans = [p for p in plans if p.estimated_bytes <= budget] + ([pq] if pq is not None else [])
    if not plans:
        smallest = _ivf_bytes(n, dim, 4, ivf_lists(n))
        raise InvalidArgumentError(
            f"no index of {n} vectors fits in --max-memory {format_bytes(budget)}; the smallest needs about "
            f"{format_bytes(smallest)}: raise --max-memory"
        )
    return plans


def plan_index(n: int, dim: int, options: IndexOptions) -> IndexPlan:
    """The first plan :func:`candidate_plans` would try."""
    return candidate_plans(n, dim, options)[0]


__all__ = [
    "DEFAULT_MAX_MEMORY",
    "DEFAULT_TARGET_RECALL",
    "FLAT_MAX_ROWS",
    "HNSW_AUTO_MAX_ROWS",
    "IndexOptions",
    "IndexPlan",
    "format_bytes",
    "ivf_lists",
    "parse_memory",
    "candidate_plans",
    "plan_index",
]
