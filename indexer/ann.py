"""Building and tuning the FAISS index of a generation from its stored embeddings.

The vectors are streamed from the Parquet parts in chunks (never all in RAM): one pass
gathers a random training sample and held-out query vectors, a second trains nothing and
adds every chunk to the index while computing the queries' exact top-10 on the same chunks.
Then the search parameter (``nprobe`` / ``efSearch``) is raised until recall@10 against that
exact answer reaches the target. The plan itself comes from :func:`indexer.index_types.plan_index`.

:func:`update` is the one place that decides, when a generation is finished, whether the previous
FAISS file is extended (and maybe re-tuned) or a new one is built.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from indexer.index_types import IndexOptions, IndexPlan, candidate_plans, parse_memory
from retrieval import faiss_index, store
from retrieval.errors import TooFewTrainingVectorsError
from retrieval.layout import Manifest

# Held-out collection vectors used as queries when tuning; their own row is excluded from
# both the exact and the approximate top-10 (a query would otherwise trivially find itself).
TUNE_QUERIES = 1000
RECALL_K = 10
# An update re-tunes once the index has grown or shrunk by this fraction since last tuned.
RETUNE_DRIFT = 0.1

Progress = Callable[[str], None]
# ``chunks(start_id)`` streams the stored vectors from ``start_id`` on as ``(first_id, (n, dim))``.
Chunks = Callable[[int], Iterable[tuple[int, np.ndarray]]]


@dataclass(frozen=True)
class FaissBuild:
    """A filled FAISS index and what the manifest records about it."""

    index: Any
    factory: str
    search_params: dict[str, int] = field(default_factory=dict)
    tuning: dict[str, Any] = field(default_factory=dict)
    # Already written there (a re-ranked index streamed to the scratch folder; ``index`` maps it).
    path: Path | None = None


@dataclass(frozen=True)
class FaissInfo:
    """What the manifest says about a FAISS file: its factory string and tuning."""

    factory: str = faiss_index.DEFAULT_INDEX_TYPE
    search_params: Mapping[str, int] = field(default_factory=dict)
    tuning: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PreviousFaiss:
    """The FAISS file an update starts from: its path, the ids it covers (``0..rows-1``) and
    what the manifest recorded about it."""

    path: Path
    rows: int
    info: FaissInfo


# extended: the previous file plus the new rows; retuned: that, with its search parameter tuned
# again; rebuilt: a new index planned, trained, filled and tuned from every stored vector.
UpdateAction = Literal["extended", "retuned", "rebuilt"]


@dataclass(frozen=True)
class FaissUpdate:
    """The FAISS index over every row of a generation, what the manifest records about it, and
    which way :func:`update` got it."""

    index: Any
    info: FaissInfo
    action: UpdateAction
    path: Path | None = None


def _quiet(_: str) -> None:
    return None


def _sample_ids(count: int, n: int, rng: np.random.Generator, exclude: np.ndarray | None = None) -> np.ndarray:
    pool = count - (0 if exclude is None else len(exclude))
    n = min(n, max(pool, 0))
    if n <= 0:
        return np.empty(0, np.int64)
    if exclude is None or not len(exclude):
        return np.sort(rng.choice(count, size=n, replace=False)).astype(np.int64)
    mask = np.ones(count, dtype=bool)
    mask[exclude] = False
    return np.sort(rng.choice(np.flatnonzero(mask), size=n, replace=False)).astype(np.int64)


def build(
    chunks: Chunks,
    dim: int,
    count: int,
    options: IndexOptions,
    *,
    seed: int = 0,
    progress: Progress = _quiet,
    scratch: Path | None = None,
) -> FaissBuild:
    """Plan, train, fill and tune a FAISS index over every stored vector.

    ``auto`` may try several plans (:func:`indexer.index_types.candidate_plans`): the first
    whose tuned recall reaches the target is kept, else the one with the best recall. The
    training sample, tuning queries and their exact answers are computed once for all.

    With a ``scratch`` folder, a re-ranked index's full vectors are never held in RAM: the
    compact codes are filled in memory, the file is written there with the vectors streamed
    from the store (:func:`retrieval.faiss_index.write_refined`), and the index returned maps
    it (``path``); the caller moves the file into place.

    Raises:
        InvalidArgumentError: nothing fits ``max_memory``, FAISS rejects a factory string, or
            ``count`` vectors are too few to train it.
    """
    plans = candidate_plans(count, dim, options)
    check_plans(plans, dim, count)
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    train_ids = _sample_ids(count, max(p.train_rows for p in plans), rng)
    query_ids = np.empty(0, np.int64)
    if any(p.needs_tuning for p in plans):
        # Held out from training when the collection is big enough to spare them.
        held_out = train_ids if count - len(train_ids) >= TUNE_QUERIES else None
        query_ids = _sample_ids(count, TUNE_QUERIES, rng, exclude=held_out)
    wanted = np.union1d(train_ids, query_ids)
    gathered = np.empty((0, dim), np.float32)
    if len(wanted):
        progress(f"reading a sample of {len(wanted)} vectors")
        gathered = store.gather_vectors(chunks(int(wanted[0])), dim, wanted)
    sample = gathered[np.searchsorted(wanted, train_ids)] if len(train_ids) else gathered[:0]
    queries = gathered[np.searchsorted(wanted, query_ids)] if len(query_ids) else gathered[:0]
    sample_s = time.perf_counter() - start
    exact = faiss_index.ExactTopK(queries, RECALL_K + 1) if len(query_ids) else None
    truth: np.ndarray | None = None
    best: FaissBuild | None = None
    tried: list[dict[str, Any]] = []
    for plan in plans:
        t0 = time.perf_counter()
        index = faiss_index.create(plan.factory, dim)
        if not index.is_trained:
            # A random subset of the shared sample (train_ids are sorted by id).
            rows = np.sort(rng.choice(len(sample), size=min(plan.train_rows, len(sample)), replace=False))
            progress(f"training {plan.factory} on {len(rows)} vectors")
            faiss_index.train(index, sample[rows], seed=seed)
        train_s = time.perf_counter() - t0
        progress(f"adding {count} vectors to {plan.factory}")
        t0 = time.perf_counter()
        streamed = scratch is not None and faiss_index.streams_refine(index)
        # Streamed: only the compact codes are added now; the full vectors go to the file below.
        target = faiss_index.refine_of(index).base_index if streamed else index
        faiss_index.reserve(target, count)
        for first, vecs in chunks(0):
            faiss_index.add(target, vecs)
            if exact is not None and truth is None:
                exact.add(first, vecs)
        add_s = time.perf_counter() - t0
        tuning: dict[str, Any] = {"reason": plan.reason, "estimated_bytes": plan.estimated_bytes}
        path: Path | None = None
        if streamed and scratch is not None:
            path = scratch / f"plan-{len(tried)}.faiss"
            progress(f"writing the re-ranking vectors of {plan.factory}")
            t0 = time.perf_counter()
            index = _write_streamed(index, path, (faiss_index.refine_codes(index, vecs) for _, vecs in chunks(0)), count)
            tuning["refine_write_seconds"] = round(time.perf_counter() - t0, 3)
        if plan.mapped_bytes:
            tuning["mapped_bytes"] = plan.mapped_bytes  # on disk, memory-mapped, not in the budget
        params: dict[str, int] = {}
        if exact is not None and plan.needs_tuning:
            if truth is None:
                truth = exact.result()[1]
            params, facts = _tune(index, queries, query_ids, truth, options)
            tuning.update(facts)
        tuning.update(train_seconds=round(train_s, 3), add_seconds=round(add_s, 3), trained_rows=int(min(plan.train_rows, len(sample))))
        built = FaissBuild(index, plan.factory, params, tuning, path)
        reached = tuning.get("reached", True)
        tried.append({"factory": plan.factory, "recall_at_10": tuning.get("recall_at_10"), "reached": reached})
        if best is None or tuning.get("recall_at_10", 1.0) > best.tuning.get("recall_at_10", 1.0):
            best, built = built, best
        if built is not None and built.path is not None:
            built.path.unlink(missing_ok=True)  # a plan not kept: its file goes now, not at the end
        del built, index
        if reached:
            break
        progress(f"{plan.factory} reaches recall@10 {tuning.get('recall_at_10')} < {options.target_recall}")
    if best is None:
        raise RuntimeError("no index plan to build")  # candidate_plans never returns none
    if len(tried) > 1:
        best.tuning["tried"] = tried
    best.tuning["sample_seconds"] = round(sample_s, 3)
    return best


def _write_streamed(index: Any, path: Path, codes: Iterable[np.ndarray], rows: int) -> Any:
    """Write a re-ranked index whose approximate stage is filled, its vectors from ``codes``,
    and return it mapped from ``path`` (which adds file pages, not process memory, while the
    caller's in-memory index is still alive)."""
    path.parent.mkdir(exist_ok=True)
    faiss_index.write_refined(index, path, codes, rows)
    return faiss_index.read(path, mmap=True)


def check_plans(plans: Sequence[IndexPlan], dim: int, count: int) -> None:
    """Fail now, not after a pass over the data, on a factory string FAISS rejects or cannot
    train on the sample a build of ``count`` vectors gives it.

    Raises:
        InvalidArgumentError: naming the factory string and FAISS's reason.
        TooFewTrainingVectorsError: how many training vectors it needs and what to ask for instead.
    """
    for plan in plans:
        need = faiss_index.training_rows_needed(faiss_index.create(plan.factory, dim))
        rows = min(plan.train_rows, count)
        if need > rows:
            have = f"this index has {count}" if rows == count else f"a build trains on at most {rows}"
            raise TooFewTrainingVectorsError(
                f"FAISS index type {plan.factory!r} needs at least {need} training vectors (one per k-means "
                f"centroid), but {have}: use fewer clusters (IVF lists, or bits per PQ code), or --index-type "
                "auto (sized to the collection) or flat"
            )


def choose_options(
    previous: Manifest | None,
    *,
    index_type: str | None = None,
    max_memory: int | str | None = None,
    target_recall: float | None = None,
) -> IndexOptions:
    """The FAISS options of a run: what was asked (None: not asked), else what ``previous``
    recorded, else the defaults. One rule for ``index``, ``reindex`` and ``import``.

    Raises:
        InvalidArgumentError: a bad value (memory size, recall, empty index type).
    """
    recorded = dict(previous.index_options) if previous is not None else {}
    if previous is not None and not recorded:
        # A version-1 index: flat was the only choice, and it stays until asked otherwise.
        recorded = {"index_type": "flat"}
    asked = {
        "index_type": index_type,
        "max_memory": parse_memory(max_memory) if max_memory is not None else None,
        "target_recall": target_recall,
    }
    return IndexOptions.from_dict({**recorded, **{k: v for k, v in asked.items() if v is not None}})


def check_options(options: IndexOptions, dim: int, count: int = 100_000) -> None:
    """:func:`check_plans` for what ``options`` would build over ``count`` vectors.

    Raises:
        InvalidArgumentError: see :func:`check_plans` and :func:`indexer.index_types.candidate_plans`.
    """
    check_plans(candidate_plans(count, dim, options), dim, count)


def _tune(
    index: Any, queries: np.ndarray, query_ids: np.ndarray, truth: np.ndarray, options: IndexOptions
) -> tuple[dict[str, int], dict[str, Any]]:
    t0 = time.perf_counter()
    params, recall, reached = faiss_index.tune(index, queries, truth, options.target_recall, exclude=query_ids, k=RECALL_K)
    return params, {
        "recall_at_10": round(float(recall), 4),
        "target_recall": options.target_recall,
        "reached": bool(reached),
        "queries": int(len(query_ids)),
        "tuned_rows": int(index.ntotal),
        "tune_seconds": round(time.perf_counter() - t0, 3),
    }


def retune(index: Any, chunks: Chunks, dim: int, options: IndexOptions, *, seed: int = 0) -> tuple[dict[str, int], dict[str, Any]]:
    """Tune an already-filled index again (after an update changed its size)."""
    count = int(index.ntotal)
    rng = np.random.default_rng(seed)
    query_ids = _sample_ids(count, TUNE_QUERIES, rng)
    if not len(query_ids):
        return {}, {}
    queries = store.gather_vectors(chunks(int(query_ids[0])), dim, query_ids)
    exact = faiss_index.ExactTopK(queries, RECALL_K + 1)
    for first, vecs in chunks(0):
        exact.add(first, vecs)
    return _tune(index, queries, query_ids, exact.result()[1], options)


def update(
    previous: PreviousFaiss | None,
    chunks: Chunks,
    dim: int,
    count: int,
    options: IndexOptions,
    *,
    progress: Progress | None = None,
    scratch: Path | None = None,
) -> FaissUpdate:
    """The FAISS index over all ``count`` stored rows at the end of a build or update.

    The previous file is extended with the rows after the ones it covers when the options
    still choose its kind of index (:func:`needs_rebuild`), and re-tuned when the row count
    drifted since it was tuned (:func:`needs_retune`); a flat index has nothing to tune.
    Otherwise, and when there is no previous file (a new index, rows removed or renumbered,
    options changed), a new index is built from every stored vector (:func:`build`).

    Args:
        previous: the FAISS file to start from, or None to build a new one.
        chunks: streams the stored vectors from an id on (see :data:`Chunks`).
        dim: vector dimension.
        count: rows of the generation, all of which the result covers.
        options: the index options the generation records.
        progress: receives one line per slow step.
        scratch: a folder (made if needed) on the index's file system; with it, a re-ranked
            index is written there with its full vectors streamed, never all in RAM (``path`` of the
            result; see :func:`build`).
    """
    say = progress or _quiet
    if previous is not None and not needs_rebuild(previous.info.factory, count, dim, options):
        path: Path | None = None
        if scratch is not None and faiss_index.streams_refine_file(previous.path):
            index, old_codes = faiss_index.open_refined(previous.path)
            base = faiss_index.refine_of(index).base_index
            for _, vecs in chunks(previous.rows):
                faiss_index.add(base, vecs)
            path = scratch / "extended.faiss"
            new_codes = (faiss_index.refine_codes(index, vecs) for _, vecs in chunks(previous.rows))
            index = _write_streamed(index, path, itertools.chain(old_codes, new_codes), count)
        else:
            index = faiss_index.read(previous.path)
            for _, vecs in chunks(previous.rows):
                faiss_index.add(index, vecs)
        info = previous.info
        if faiss_index.kind_of(index) != "flat" and needs_retune(dict(info.tuning), count):
            say(f"re-tuning {info.factory} for {count} vectors")
            params, facts = retune(index, chunks, dim, options)
            return FaissUpdate(index, FaissInfo(info.factory, params, {**info.tuning, **facts}), "retuned", path)
        return FaissUpdate(index, info, "extended", path)
    built = build(chunks, dim, count, options, progress=say, scratch=scratch)
    return FaissUpdate(built.index, FaissInfo(built.factory, built.search_params, built.tuning), "rebuilt", built.path)


def needs_rebuild(current_factory: str, count: int, dim: int, options: IndexOptions) -> bool:
    """Whether an update must rebuild the index rather than add to it: the options would no
    longer choose its kind of index (e.g. a collection outgrowing flat search)."""
    return current_factory not in {p.factory for p in candidate_plans(count, dim, options)}


def needs_retune(tuning: dict[str, Any], count: int) -> bool:
    tuned = int(tuning.get("tuned_rows", 0) or 0)
    return "recall_at_10" in tuning and (tuned == 0 or abs(count - tuned) > RETUNE_DRIFT * tuned)


__all__ = [
    "FaissBuild",
    "FaissInfo",
    "FaissUpdate",
    "PreviousFaiss",
    "UpdateAction",
    "build",
    "check_options",
    "choose_options",
    "needs_rebuild",
    "needs_retune",
    "retune",
    "update",
]
