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
* end to end (--e2e types): ``ImageIndex.search(text, 10)`` with a ViT-B/32-shaped text tower
  (tokenise, encode, search, paths of the 10 hits);
* serving memory: RSS growth of opening the index and running the queries.

Prints one JSON line, then a readable table.

    python benchmarks/bench_search.py [--sizes 100000,1000000] [--types flat,auto,ivf-sq8]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Before torch and faiss load: two OpenMP runtimes spinning on 2 cores make single-query
# latency erratic (benchmarks/README.md); the CLI sets the same default.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from _common import ROOT, latency_summary, machine_facts, peak_rss_mb  # noqa: E402
from bench_query import SyntheticSpec, build_synthetic_index, query_texts, synthetic_queries  # noqa: E402

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


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
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
    index_dir: Path, queries: Any, truth: Any, k: int, encoders: dict[str, Any], texts: list[str], warmup: int
) -> dict[str, Any]:
    import numpy as np

    from retrieval import ImageIndex
    from retrieval.index import MMAP_MIN_BYTES

    gc.collect()
    rss0 = rss_mb()
    t0 = time.perf_counter()
    index = ImageIndex.open(index_dir)
    open_s = time.perf_counter() - t0
    for q in queries[:warmup]:
        index.search_ids(q[None], k)
    times, found = [], []
    for q in queries:
        t0 = time.perf_counter()
        _, ids = index.search_ids(q[None], k)
        times.append(time.perf_counter() - t0)
        found.append(ids[0])
    out: dict[str, Any] = {
        "open_seconds": round(open_s, 3),
        "search_ms": latency_summary(times),
        "recall_at_10": round(recall(np.stack(found), truth, min(k, 10)), 4),
        "serving_rss_mb": round(rss_mb() - rss0, 1),
        "mmap": index.info()["faiss_bytes"] >= MMAP_MIN_BYTES,  # what open(mmap=None) did
    }
    del index
    for precision, encoder in encoders.items() if texts else ():
        # The public call with this query-tower precision: tokenise, encode, search, paths.
        gc.collect()
        index = ImageIndex.open(index_dir, encoder=encoder)
        for text in texts[:warmup]:
            index.search(text, 10)
        e2e = []
        for text in texts[warmup:]:
            t0 = time.perf_counter()
            hits = index.search(text, 10)
            e2e.append(time.perf_counter() - t0)
            if len(hits) != 10:
                raise RuntimeError(f"expected 10 hits, got {len(hits)}")
        out.setdefault("end_to_end_ms", {})[precision] = latency_summary(e2e)
        del index
    gc.collect()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000", help="index sizes, comma-separated (default: 100000,1000000)")
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
    parser.add_argument("--text-precisions", default="fp32,int8", help="query-tower precisions timed end to end (default: fp32,int8)")
    parser.add_argument("--clusters", type=int_at_least(1), default=1000)
    parser.add_argument("--noise", type=float, default=0.8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", help="where to write indexes (default: a temp dir, removed)")
    args = parser.parse_args(argv)
    sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip()]
    types = [t.strip() for t in args.types.split(",") if t.strip()]
    e2e_types = {t.strip() for t in args.e2e.split(",") if t.strip()}
    spec = SyntheticSpec(clusters=args.clusters, noise=args.noise, seed=args.seed)

    from retrieval.encoders import load_encoder
    from retrieval.random_model import make_random_clip

    results = []
    with tempfile.TemporaryDirectory(dir=args.work_dir) as tmp:
        work = Path(tmp)
        model_dir = make_random_clip(work / "model", preset=args.preset, seed=0)
        encoders = {p: load_encoder(str(model_dir), device="cpu", precision=p) for p in args.text_precisions.split(",") if p}
        for enc in encoders.values():
            enc.embed_texts(["warm up"])
        encoder = next(iter(encoders.values()))
        if encoder.dim != args.dim:
            parser.error(f"--dim {args.dim} but the {args.preset} text tower has dim {encoder.dim}")
        texts = query_texts(args.warmup + args.text_queries) if args.text_queries else []
        queries = synthetic_queries(args.queries, args.dim, spec)
        for n in sizes:
            out = work / f"synthetic-{n}.idx"
            t0 = time.perf_counter()
            # Beyond --flat-max a flat index would not fit in RAM: the write job finishes with a
            # small placeholder index (every measured type is then built by reindex).
            placeholder = "flat" if n <= args.flat_max else "IVF256,PQ8"
            write = build_synthetic_index(out, encoder, n, spec, args.commit_every, index_type=placeholder)
            write_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            truth = exact_truth(out, queries, args.k)
            truth_s = time.perf_counter() - t0
            rows = []
            for index_type in types:
                if index_type == "flat" and n > args.flat_max:
                    continue
                built = reindex_subprocess(out, index_type, args.max_memory, args.target_recall)
                measured = measure_type(out, queries, truth, args.k, encoders, texts if index_type in e2e_types else [], args.warmup)
                rows.append({"type": index_type, "factory": built["index_type"], "search_params": built["search_params"],
                             "tuning": built["index_tuning"], "build_seconds": built["seconds"],
                             "build_peak_rss_mb": round(built["peak_rss_mb"], 1),
                             "build_rss_growth_mb": round(built["peak_rss_mb"] - built["base_rss_mb"], 1),
                             "faiss_bytes_per_vector": round(built["faiss_bytes"] / n, 1), **measured})
                print(f"# {n:,} {index_type}: {json.dumps(rows[-1])}", file=sys.stderr, flush=True)
            results.append(
                {"n": n, "write_seconds": round(write_s, 1), "write": write, "exact_truth_seconds": round(truth_s, 1), "types": rows}
            )
            shutil.rmtree(out, ignore_errors=True)

    report = {
        "bench": "search",
        "date": time.strftime("%Y-%m-%d"),
        "dim": args.dim,
        "k": args.k,
        "queries": args.queries,
        "text_queries": args.text_queries,
        "max_memory": args.max_memory,
        "target_recall": args.target_recall,
        "synthetic": {"clusters": spec.clusters, "noise": spec.noise, "seed": spec.seed},
        "sizes": results,
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "machine": machine_facts(),
    }
    print(json.dumps(report))
    print()
    head = (f"{'vectors':>10} {'type':<8} {'factory':<26} {'params':<13} {'build s':>8} {'+MB':>7} {'B/vec':>7} "
            f"{'search p50/p99 ms':>18} {'recall@10':>9} {'e2e p50/p99 ms by text precision':>34}")
    print(head)
    print("-" * len(head))
    for r in results:
        for t in r["types"]:
            params = ",".join(f"{k}={v}" for k, v in t["search_params"].items()) or "-"
            e2e = t.get("end_to_end_ms", {})
            e2e_s = " ".join(f"{p} {v['p50']:.1f}/{v['p99']:.1f}" for p, v in e2e.items()) or "-"
            print(f"{r['n']:>10,} {t['type']:<8} {t['factory']:<26} {params:<13} {t['build_seconds']:>8.1f} "
                  f"{t['build_rss_growth_mb']:>7.0f} "
                  f"{t['faiss_bytes_per_vector']:>7.0f} {t['search_ms']['p50']:>8.3f}/{t['search_ms']['p99']:<9.3f} "
                  f"{t['recall_at_10']:>9.3f} {e2e_s:>34}")
    print("+MB: peak RSS growth of the reindex process over its RSS after imports")
    print(f"single queries, k={args.k}, {args.queries} held-out in-distribution queries; recall against exact search; "
          f"--max-memory {args.max_memory}, target recall {args.target_recall}; "
          f"{report['machine']['cores']} cores, {report['machine']['cpu']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
