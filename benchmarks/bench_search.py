"""Approximate search at scale: build time, memory, latency and recall per index type.

For each size, a real clipsearch index directory of synthetic clustered 512-d vectors (see
``bench_query.py``: Gaussian clusters on the sphere, normalised, written through the indexer's
own write path) is built once; then every index type is built from its stored embeddings with
``clipsearch reindex`` (streamed from Parquet, each in a fresh process so that its peak RSS is
its own) and measured in this process:

* build: wall time of the reindex (sample, train, add, tune) and its peak RSS;
* size: FAISS file bytes per vector;
* search: single-query latency of ``ImageIndex.search_ids`` (p50/p99) on held-out
  in-distribution queries (same clusters, not in the index), and recall@10 of those queries
  against exact search run beside it (flat in-process up to --flat-max, else streamed from
  Parquet with ``faiss_index.ExactTopK``);
* end to end (--e2e types): ``ImageIndex.search(text, 10)`` on short queries (3-8 words) with a
  ViT-B/32-shaped text tower, on the index's own text path at each ``--text-precisions`` value
  (``ImageIndex.open(dir, precision=...)``: tokenise, encode, search, paths of the 10 hits;
  ``default``: ``ImageIndex.open(dir)`` as it comes; ``hf``: the plain Hugging Face
  ``get_text_features`` call, then the same vector search and paths; ``onnxruntime`` and
  ``openvino``: the peers' fp32 text towers, ``_peers.py``, a skipped entry with its reason where
  not installed), and each one's cosine to the fp32 query vectors (``text_cosine_to_fp32``);
* serving memory: RSS growth of opening the index and running the queries, and of anonymous
  memory alone (``anon_open_mb``, ``anon_after_queries_mb``: what a memory budget is about;
  memory-mapped file pages are the kernel's to drop), with how the FAISS file was opened
  (``faiss_mmap``, ``faiss_mmap_reason``).

A type ``NAME@SIZE`` (e.g. ``auto@40MB``) is built with ``--max-memory SIZE`` instead of the
run's: a small-budget row beside the others.

With ``--peer autofaiss``, after our types, autofaiss builds the index it chooses from the same
stored vectors (exported to .npy chunks first, timed apart) under the same memory budget, in a
fresh process, and that index is measured the same way (``type`` "autofaiss" in the same rows).

``--index DIR`` measures an index that already exists (one kept by ``--keep``, made from the
same ``--clusters/--noise/--seed/--dim``) instead of writing new vectors: type ``current``
measures it as it stands (no reindex; its build time is not this run's), other types reindex it
in place. So a 10M index written once serves several runs (a peer, a cached pass). ``--cached``
reads each measured FAISS file through once before its timed queries (the page cache of a
long-running server), ours and the peers' alike.

Prints one JSON line (the whole run), then one JSON line per (size, type) with the flat keys of
:func:`flat_row` (``vectors``, ``build_s``, ``recall_at_10``, ``p50_ms``, ``rss_open_mb``,
``rss_after_query_mb``, ``bytes_per_vector``, ...), then a readable table.

    python benchmarks/bench_search.py [--sizes 100000,1000000] [--types flat,auto,ivf-sq8] [--peer autofaiss]
    python benchmarks/bench_search.py --sizes 200000 --types auto@40MB --e2e auto@40MB --text-precisions default,fp32,hf
    python benchmarks/bench_search.py --index KEPT.idx --types current --peer autofaiss --cached --e2e ""
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# Before torch and faiss load: two OpenMP runtimes spinning on 2 cores make single-query
# latency erratic (benchmarks/README.md); the CLI sets the same default.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from _common import ROOT, latency_summary, peak_rss_mb, read_through  # noqa: E402
from _harness import Bench, listed, note  # noqa: E402
from _search_peers import (  # noqa: E402
    AUTOFAISS_INSTALL,
    PEERS,
    TEXT_PEERS,
    PeerUnavailable,
    autofaiss_subprocess,
    export_npy,
    mem_available_bytes,
    parse_index_param,
    peer_list,
    peer_missing,
    text_search,
)
from bench_query import SyntheticSpec, build_synthetic_index, short_query_texts, synthetic_queries  # noqa: E402

from clipsearch.cli import int_at_least  # noqa: E402

_REINDEX = """
import json, sys
from indexer.reindex import reindex
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the forked parent's image.
status = lambda key: [int(l.split()[1]) / 1024 for l in open("/proc/self/status") if l.startswith(key)][0]
base = status("VmRSS:")
r = reindex(sys.argv[1], index_type=sys.argv[2], max_memory=sys.argv[3], target_recall=float(sys.argv[4]))
print(json.dumps({**r.to_dict(), "peak_rss_mb": status("VmHWM:"), "base_rss_mb": base}))
"""


# The type that measures an index as it stands, without a reindex (its build is not timed).
CURRENT = "current"

def measure_faiss_file(
    path: Path, index_param: str, queries: Any, truth: Any, k: int, warmup: int, cached: bool = False
) -> dict[str, Any]:
    """Measure a bare FAISS index file as :func:`measure_type` measures ours: opened with the
    mmap rule ``ImageIndex.open`` has for an index that records no plan (mapped from
    :data:`~retrieval.faiss_mapping.MMAP_MIN_BYTES`), searched one query at a time through the same
    ``faiss_index.search`` that ``ImageIndex.search_ids`` calls, in this process (same FAISS
    threads), recall@10 against the same exact truth; ``cached``: the file read through first."""
    import faiss

    from retrieval import faiss_index
    from retrieval.faiss_mapping import MMAP_MIN_BYTES

    mmap = path.stat().st_size >= MMAP_MIN_BYTES
    cache_s = read_through(path, path.stat().st_size) if cached else None
    gc.collect()
    rss0, anon0 = rss_mb(), rss_mb("RssAnon:")
    t0 = time.perf_counter()
    index = faiss_index.read(path, mmap=mmap)
    if index_param:
        # What autofaiss set before returning; reapplied because not every parameter it may
        # choose (IVF-HNSW quantizer efSearch, polysemous ht) is guaranteed to be in the file.
        faiss.ParameterSpace().set_index_parameters(index, index_param)
    opened = (time.perf_counter() - t0, rss_mb() - rss0)
    anon_open = rss_mb("RssAnon:") - anon0
    timed = time_queries(_ids_of(faiss_index.search, index, k), queries, truth, k, warmup, rss0, opened)
    out = {**timed, "mmap": mmap, "anon_open_mb": round(anon_open, 1), "anon_after_queries_mb": round(rss_mb("RssAnon:") - anon0, 1),
           "faiss_mmap": mmap, "faiss_mmap_reason": f"no recorded plan: mapped from {MMAP_MIN_BYTES} bytes",
           "cache_read_seconds": None if cache_s is None else round(cache_s, 3)}
    del index
    gc.collect()
    return out


def peer_row(
    peer: str, index_dir: Path, work: Path, n: int, queries: Any, truth: Any, args: argparse.Namespace, max_memory_bytes: int
) -> dict[str, Any]:
    """Export, build and measure one peer at one size: a row with our rows' keys."""
    from indexer.index_types import parse_memory

    if peer != "autofaiss":
        raise ValueError(f"unknown peer {peer!r}")
    folder = work / f"autofaiss-{n}"
    t0 = time.perf_counter()
    export_npy(index_dir, folder / "embeddings")
    export_s = time.perf_counter() - t0
    available = parse_memory(args.peer_memory_available) if args.peer_memory_available else mem_available_bytes()
    index_file = folder / "knn.index"
    log = folder / "autofaiss.log"
    note(f"{n:,} {peer}: building, log in {log}")
    built = autofaiss_subprocess(folder / "embeddings", index_file, max_memory_bytes, available, args.k, args.peer_query_time_ms, log)
    shutil.rmtree(folder / "embeddings")  # the export is as large as the vectors: not kept while measuring
    infos = built["infos"]
    if int(infos.get("nb vectors", n)) != n:
        raise RuntimeError(f"autofaiss indexed {infos.get('nb vectors')} vectors, expected {n}")
    measured = measure_faiss_file(index_file, infos.get("index_param") or "", queries, truth, args.k, args.warmup, args.cached)
    row = {"type": peer, "factory": infos["index_key"], "search_params": parse_index_param(infos.get("index_param") or ""),
           # autofaiss's own figures from its build (speed of its tuned params, compression).
           "tuning": {key: value for key, value in infos.items() if key not in ("index_key", "index_param", "index_path")},
           "build_seconds": round(built["seconds"], 3),
           "build_peak_rss_mb": round(built["peak_rss_mb"], 1),
           "build_rss_growth_mb": round(built["peak_rss_mb"] - built["base_rss_mb"], 1),
           "faiss_bytes_per_vector": round(index_file.stat().st_size / n, 1), **measured,
           "export_seconds": round(export_s, 3), "version": built["version"],
           "max_index_query_time_ms": args.peer_query_time_ms, "current_memory_available": available}
    shutil.rmtree(folder)
    return row


def index_count(index_dir: Path, dim: int) -> int | str:
    """The vector count of an existing index for ``--index``, or why it cannot be measured."""
    from retrieval import ImageIndex
    from retrieval.errors import ClipSearchError

    try:
        info = ImageIndex.open(index_dir, mmap=True).info()
    except ClipSearchError as exc:
        return f"--index {index_dir}: {exc}"
    if info["dim"] != dim:
        return f"--index {index_dir} holds {info['dim']}-d vectors, not --dim {dim}"
    if not info["count"]:
        return f"--index {index_dir} is empty"
    return int(info["count"])


def current_build(index_dir: Path) -> dict[str, Any]:
    """Type ``current``: the index's recorded type, parameters and tuning, as :func:`reindex_subprocess`
    returns them, with no build figures (nothing was built in this run)."""
    from retrieval import ImageIndex

    info = ImageIndex.open(index_dir, mmap=True).info()
    return {"index_type": info["index_type"], "search_params": info["search_params"], "index_tuning": info["index_tuning"],
            "seconds": None, "peak_rss_mb": None, "base_rss_mb": None, "faiss_bytes": info["faiss_bytes"]}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def rss_mb(key: str = "VmRSS:") -> float:
    """This process's ``key`` line of /proc/self/status in MB: ``VmRSS:`` (all resident pages,
    memory-mapped file pages included) or ``RssAnon:`` (what is not page cache)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) / 1024
    return float("nan")


def reindex_subprocess(index_dir: Path, index_type: str, max_memory: str, target_recall: float) -> dict[str, Any]:
    env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    proc = subprocess.run(
        [sys.executable, "-c", _REINDEX, str(index_dir), index_type, max_memory, str(target_recall)],
        capture_output=True, text=True, env=env, cwd=ROOT,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"reindex {index_type} failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def exact_truth(index_dir: Path, queries: Any, k: int) -> Any:
    """Exact top-k of the queries over the stored vectors, streamed (no full copy in RAM)."""
    from retrieval import ImageIndex, faiss_index

    index = ImageIndex.open(index_dir, mmap=True)
    exact = faiss_index.ExactTopK(queries, k)
    for first, vecs in index.iter_embeddings(batch_rows=65536):
        exact.add(first, vecs)
    return exact.result()[1]


def recall(found: Any, truth: Any, k: int) -> float:
    import numpy as np

    return float(np.mean([len(set(a[:k]) & set(b[:k])) / k for a, b in zip(found.tolist(), truth.tolist(), strict=True)]))


def measure_type(
    index_dir: Path, queries: Any, truth: Any, k: int, precisions: list[str], texts: list[str], warmup: int, cached: bool = False,
    model: str | None = None,
) -> dict[str, Any]:
    """Open ``index_dir`` as a reader does and time its single queries (and, for ``texts``, the
    public text search at each precision, with ``model`` if given: the same weights as the
    index's, checked by fingerprint); ``cached``: its FAISS file read through first."""
    from retrieval import ImageIndex

    cache_s = None
    if cached:
        manifest = ImageIndex.open(index_dir, mmap=True).manifest
        if manifest.faiss is not None:
            faiss_file = index_dir / manifest.faiss.path
            cache_s = read_through(faiss_file, faiss_file.stat().st_size)
    gc.collect()
    rss0, anon0 = rss_mb(), rss_mb("RssAnon:")
    t0 = time.perf_counter()
    index = ImageIndex.open(index_dir)
    opened = (time.perf_counter() - t0, rss_mb() - rss0)
    anon_open = rss_mb("RssAnon:") - anon0
    timed = time_queries(_ids_of(type(index).search_ids, index, k), queries, truth, k, warmup, rss0, opened)
    anon_queried = rss_mb("RssAnon:") - anon0
    info = index.info()
    out: dict[str, Any] = {
        **timed,
        "anon_open_mb": round(anon_open, 1),
        "anon_after_queries_mb": round(anon_queried, 1),
        "faiss_mmap": info["faiss_mmap"],
        "faiss_mmap_reason": info["faiss_mmap_reason"],
        "cache_read_seconds": None if cache_s is None else round(cache_s, 3),
    }
    del index
    vectors: dict[str, Any] = {}
    for precision in precisions if texts else ():
        # The public call, on the index's own text path at this precision (what `search` and
        # `serve` run): tokenise, encode, search, paths.
        gc.collect()
        try:
            index, search = text_search(ImageIndex, index_dir, model, precision)
        except PeerUnavailable as exc:  # a runtime not installed: a skipped row with its reason
            out.setdefault("text_skipped", {})[precision] = str(exc)
            continue
        for text in texts[:warmup]:
            search(text)
        e2e = []
        for text in texts[warmup:]:
            t0 = time.perf_counter()
            hits = search(text)
            e2e.append(time.perf_counter() - t0)
            if len(hits) != 10:
                raise RuntimeError(f"expected 10 hits, got {len(hits)}")
        if precision not in ("hf", *TEXT_PEERS):
            out.setdefault("text_path", {})[precision] = index.text_path().to_dict()
            out.setdefault("text_precision", {})[precision] = index.info()["text_precision"]
        vectors[precision] = search.embed(texts[warmup:])
        out.setdefault("end_to_end_ms", {})[precision] = latency_summary(e2e)
        del index, search
    timed = out.get("end_to_end_ms", {})
    if "hf" in timed:
        # How many times faster than the naive HF text tower each path answers (p50 over p50):
        # the figure the default text query is held to.
        out["x_hf_p50"] = {p: round(timed["hf"]["p50"] / v["p50"], 2) for p, v in timed.items() if p != "hf" and v["p50"] > 0}
    if "fp32" in vectors:
        import numpy as np

        for precision, v in vectors.items():
            cos = np.sum(v.astype(np.float64) * vectors["fp32"], axis=1)
            out.setdefault("text_cosine_to_fp32", {})[precision] = {"mean": round(float(cos.mean()), 6), "min": round(float(cos.min()), 6)}
    gc.collect()
    return out


def _ids_of(search: Any, index: Any, k: int) -> Any:
    """``query -> ids`` of ``search(index, query, k)`` (which returns ``(scores, ids)``)."""
    return lambda q: search(index, q, k)[1]


def time_queries(
    search: Any, queries: Any, truth: Any, k: int, warmup: int, rss0: float, opened: tuple[float, float]
) -> dict[str, Any]:
    """Single-query latency and recall of ``search`` (a ``(1, dim)`` query -> ``(1, k)`` ids),
    with the RSS growth over ``rss0`` after one query and after all; ``opened`` is
    ``(open seconds, RSS growth at open)``. The same loop for our types and the peers'."""
    import numpy as np

    search(queries[:1])
    one_query_rss = rss_mb() - rss0
    for q in queries[:warmup]:
        search(q[None])
    times, found = [], []
    for q in queries:
        t0 = time.perf_counter()
        ids = search(q[None])
        times.append(time.perf_counter() - t0)
        found.append(ids[0])
    return {
        "open_seconds": round(opened[0], 3),
        "search_ms": latency_summary(times),
        "recall_at_10": round(recall(np.stack(found), truth, min(k, 10)), 4),
        "open_rss_mb": round(opened[1], 1),
        "rss_after_query_mb": round(one_query_rss, 1),
        "serving_rss_mb": round(rss_mb() - rss0, 1),
        # The whole measuring process (index, Python, the text model it loaded) after the timed
        # queries, page cache not counted: memory-mapped file pages that queries touched are
        # in VmRSS above but are the kernel's to drop.
        "process_anon_rss_mb": round(rss_mb("RssAnon:"), 1),
        "process_file_rss_mb": round(rss_mb("RssFile:"), 1),
    }


def flat_row(n: int, row: dict[str, Any]) -> dict[str, Any]:
    """One (size, type) as its own JSON line, under the names the issue tracker asks for: the
    RSS figures are growth of the measuring process over its RSS before opening (page cache
    not counted), after open, after one query, and after all timed queries."""
    return {
        "bench": "search-row",
        "vectors": n,
        "type": row["type"],
        "factory": row["factory"],
        "search_params": row["search_params"],
        "build_s": row["build_seconds"],
        "recall_at_10": row["recall_at_10"],
        "p50_ms": row["search_ms"]["p50"],
        "p99_ms": row["search_ms"]["p99"],
        "rss_open_mb": row["open_rss_mb"],
        "rss_after_query_mb": row["rss_after_query_mb"],
        "rss_serving_mb": row["serving_rss_mb"],
        "anon_open_mb": row.get("anon_open_mb"),
        "anon_after_queries_mb": row.get("anon_after_queries_mb"),
        "faiss_mmap": row.get("faiss_mmap"),
        "process_anon_rss_mb": row.get("process_anon_rss_mb"),
        "bytes_per_vector": row["faiss_bytes_per_vector"],
        "end_to_end_p50_ms": {p: v["p50"] for p, v in row.get("end_to_end_ms", {}).items()},
        "text_cosine_to_fp32": row.get("text_cosine_to_fp32", {}),
        "text_skipped": row.get("text_skipped", {}),
    }


def main(argv: list[str] | None = None) -> int:
    bench = Bench("bench_search", __doc__, "seed", "work_dir")
    parser = bench.parser
    parser.add_argument("--sizes", type=listed(int), default=[100_000, 1_000_000],
                        help="index sizes, comma-separated (default: 100000,1000000)")
    parser.add_argument("--types", default="flat,auto,ivf-sq8", help="index types to build and compare (default: flat,auto,ivf-sq8)")
    parser.add_argument("--e2e", default="flat,auto", help="types that also get the text-query end-to-end timing (default: flat,auto)")
    parser.add_argument("--queries", type=int_at_least(1), default=500, help="timed single queries per type (default: 500)")
    parser.add_argument("--text-queries", type=int_at_least(0), default=100, help="timed text queries for --e2e types (default: 100)")
    parser.add_argument("--warmup", type=int_at_least(0), default=20)
    parser.add_argument("--k", type=int_at_least(1), default=10)
    parser.add_argument("--dim", type=int_at_least(1), default=512)
    parser.add_argument("--max-memory", default="4GB", help="--max-memory of every build (default: 4GB)")
    parser.add_argument("--target-recall", type=float, default=0.95)
    parser.add_argument("--flat-max", type=int, default=2_000_000, help="largest size that gets an in-RAM flat index (default: 2000000)")
    parser.add_argument(
        "--commit-every", type=int_at_least(1), default=65536, help="rows per committed part while writing (default: 65536)"
    )
    parser.add_argument("--preset", default="vit-b-32", choices=["vit-b-32", "tiny"], help="text tower shape for --e2e (default: vit-b-32)")
    parser.add_argument(
        "--text-precisions", default="default,fp32,hf",
        help="text query paths timed end to end: precisions of the index's own text path, default (ImageIndex.open as it "
        "comes), hf (the plain Hugging Face call), onnxruntime and openvino (their fp32 text towers) "
        "(default: default,fp32,hf)"
    )
    parser.add_argument("--clusters", type=int_at_least(1), default=1000)
    parser.add_argument("--noise", type=float, default=0.8)
    parser.add_argument("--keep", type=Path, help="move each size's index directory here (as synthetic-N.idx) instead of "
                        "removing it, e.g. for bench_cold.py; on the work dir's file system, or it is copied")
    parser.add_argument("--index", type=Path, help="measure this existing index directory (e.g. one kept by --keep, written "
                        "from the same --clusters/--noise/--seed/--dim) instead of writing one; --sizes is then its count; "
                        f"type {CURRENT!r} measures it as it stands, other types reindex it in place")
    parser.add_argument("--cached", action="store_true", help="read each FAISS file through before its timed queries "
                        "(in the page cache, as a long-running server's would be), ours and the peers'")
    parser.add_argument("--peer", type=peer_list, default=[], help=f"other tools to build and measure on the same vectors, "
                        f"comma-separated: {', '.join(PEERS)} (default: none; autofaiss: {AUTOFAISS_INSTALL})")
    parser.add_argument("--peer-query-time-ms", type=float, default=10.0,
                        help="autofaiss's max_index_query_time_ms: it tunes nprobe/efSearch up to this query time (default: 10.0, its own)")
    parser.add_argument("--peer-memory-available",
                        help="autofaiss's current_memory_available, e.g. 16GB (default: MemAvailable just before each build)")
    args = bench.parse(argv)
    from indexer.index_types import parse_memory
    from retrieval.errors import InvalidArgumentError

    try:
        max_memory_bytes = parse_memory(args.max_memory)
        if args.peer_memory_available:
            parse_memory(args.peer_memory_available)
    except InvalidArgumentError as exc:
        parser.error(str(exc))
    sizes = args.sizes
    if args.index is not None:
        if args.keep is not None:
            parser.error("--keep moves an index this script wrote; --index measures one in place")
        count = index_count(args.index, args.dim)
        if isinstance(count, str):
            parser.error(count)
        sizes = [count]
    # A missing peer fails here, in a line, before the model, the vectors and our builds.
    for peer in args.peer:
        why = peer_missing(peer)
        if why is not None:
            return bench.fail(f"--peer {peer}: cannot import {peer} ({why}); install it with: {AUTOFAISS_INSTALL}")
    types = [t.strip() for t in args.types.split(",") if t.strip()]
    e2e_types = {t.strip() for t in args.e2e.split(",") if t.strip()}
    spec = SyntheticSpec(clusters=args.clusters, noise=args.noise, seed=args.seed)

    from retrieval.encoders import load_encoder
    from retrieval.tools.random_model import make_random_clip

    results: list[dict[str, Any]] = []
    with bench.scratch() as work:
        model_dir = make_random_clip(work / "model", preset=args.preset, seed=0)
        precisions = [p for p in args.text_precisions.split(",") if p]
        encoder = load_encoder(str(model_dir), device="cpu")  # the model the indexes are written under
        if encoder.dim != args.dim:
            parser.error(f"--dim {args.dim} but the {args.preset} text tower has dim {encoder.dim}")
        texts = short_query_texts(args.warmup + args.text_queries) if args.text_queries else []
        queries = synthetic_queries(args.queries, args.dim, spec)
        for n in sizes:
            write: dict[str, Any] | None = None
            write_s = None
            if args.index is not None:
                out = args.index
            else:
                out = work / f"synthetic-{n}.idx"
                t0 = time.perf_counter()
                # Beyond --flat-max a flat index would not fit in RAM: the write job finishes with a
                # small placeholder index (every measured type is then built by reindex).
                placeholder = "flat" if n <= args.flat_max else "IVF256,PQ8"
                write = build_synthetic_index(out, encoder, n, spec, args.commit_every, index_type=placeholder)
                write_s = round(time.perf_counter() - t0, 1)
            t0 = time.perf_counter()
            truth = exact_truth(out, queries, args.k)
            truth_s = time.perf_counter() - t0
            rows = []
            for index_type in types:
                if index_type == "flat" and n > args.flat_max:
                    continue
                # NAME@SIZE: built under its own --max-memory (a small-budget row).
                kind, _, budget = index_type.partition("@")
                built = current_build(out) if index_type == CURRENT else reindex_subprocess(
                    out, kind, budget or args.max_memory, args.target_recall)
                measured = measure_type(
                    out, queries, truth, args.k, precisions, texts if index_type in e2e_types else [], args.warmup, args.cached,
                    str(model_dir))
                rows.append({"type": index_type, "factory": built["index_type"], "search_params": built["search_params"],
                             "tuning": built["index_tuning"], "build_seconds": built["seconds"],
                             "build_peak_rss_mb": _round(built["peak_rss_mb"]),
                             "build_rss_growth_mb": _round(built["peak_rss_mb"] - built["base_rss_mb"]
                                                           if built["peak_rss_mb"] is not None else None),
                             "faiss_bytes_per_vector": round(built["faiss_bytes"] / n, 1), **measured})
                note(f"{n:,} {index_type}: {json.dumps(rows[-1])}")
            for peer in args.peer:
                rows.append(peer_row(peer, out, work, n, queries, truth, args, max_memory_bytes))
                note(f"{n:,} {peer}: {json.dumps(rows[-1])}")
            results.append(
                {"n": n, "write_seconds": write_s, "write": write, "index": None if args.index is None else str(args.index),
                 "exact_truth_seconds": round(truth_s, 1), "types": rows}
            )
            if args.index is not None:
                pass  # the caller's index: never moved or removed
            elif args.keep is not None:
                args.keep.mkdir(parents=True, exist_ok=True)
                shutil.move(out, args.keep / out.name)
            else:
                shutil.rmtree(out, ignore_errors=True)

    bench.report({
        "bench": "search", "dim": args.dim, "k": args.k, "queries": args.queries, "text_queries": args.text_queries,
        "max_memory": args.max_memory, "target_recall": args.target_recall, "peers": args.peer, "cached": args.cached,
        "synthetic": {"clusters": spec.clusters, "noise": spec.noise, "seed": spec.seed},
        "sizes": results, "peak_rss_mb": round(peak_rss_mb(), 1),
    }, table(args, results, types), rows=[flat_row(r["n"], t) for r in results for t in r["types"]])
    return 0


def table(args: argparse.Namespace, results: list[dict[str, Any]], types: list[str]) -> list[str]:
    head = (f"{'vectors':>10} {'type':<11} {'factory':<26} {'params':<13} {'build s':>8} {'+MB':>7} {'B/vec':>7} "
            f"{'anon MB open/q':>15} {'search p50/p99 ms':>18} {'recall@10':>9} {'e2e p50/p99 ms by text precision':>34}")
    lines = [head, "-" * len(head)]
    rows = [(r["n"], t) for r in results for t in r["types"]]
    for n, t in rows:
        params = ",".join(f"{k}={v}" for k, v in t["search_params"].items()) or "-"
        e2e = " ".join(f"{p} {v['p50']:.1f}/{v['p99']:.1f}" for p, v in t.get("end_to_end_ms", {}).items()) or "-"
        build_s = "-" if t["build_seconds"] is None else f"{t['build_seconds']:.1f}"
        growth = "-" if t["build_rss_growth_mb"] is None else f"{t['build_rss_growth_mb']:.0f}"
        anon = f"{t['anon_open_mb']:.1f}/{t['anon_after_queries_mb']:.1f}" if "anon_open_mb" in t else "-"
        lines.append(f"{n:>10,} {t['type']:<11} {t['factory']:<26} {params:<13} {build_s:>8} {growth:>7} "
                     f"{t['faiss_bytes_per_vector']:>7.0f} {anon:>15} {t['search_ms']['p50']:>8.3f}/{t['search_ms']['p99']:<9.3f} "
                     f"{t['recall_at_10']:>9.3f} {e2e:>34}")
    lines.append("+MB: peak RSS growth of the build process (reindex, or the peer's) over its RSS after imports; "
                 "anon MB: anonymous RSS growth of the reader at open / after the timed queries")
    for _, t in rows:
        if t.get("x_hf_p50"):
            ratios = " ".join(f"{p} {x:.2f}x" for p, x in t["x_hf_p50"].items())
            lines.append(f"{t['type']} end to end against the HF text tower (p50): {ratios}")
        if t.get("text_cosine_to_fp32"):
            cos = " ".join(f"{p} {c['mean']:.5f}/{c['min']:.5f}" for p, c in t["text_cosine_to_fp32"].items())
            lines.append(f"{t['type']} text vectors' cosine to fp32 (mean/min): {cos}")
        lines += [f"{t['type']} text path {peer}: skipped ({why})" for peer, why in t.get("text_skipped", {}).items()]
    if CURRENT in types:
        lines.append(f"{CURRENT}: the index as it stood, not rebuilt: its build is not timed in this run (see its `tuning`)")
    if args.cached:
        lines.append("--cached: each FAISS file was read through (into the page cache) before its timed queries")
    lines += [f"autofaiss {t['version']} at {n:,}: its own choice of index and search parameters "
              f"(max_index_query_time_ms {t['max_index_query_time_ms']}); build s excludes exporting the vectors "
              f"to .npy ({t['export_seconds']:.1f} s); same queries, search call and exact truth as ours"
              for n, t in rows if t["type"] == "autofaiss"]
    lines.append(f"single queries, k={args.k}, {args.queries} held-out in-distribution queries; recall against exact search; "
                 f"--max-memory {args.max_memory}, target recall {args.target_recall}")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
