"""The first queries of a freshly opened memory-mapped index: cold page cache against warm.

A reader maps a large FAISS file instead of reading it (``ImageIndex.open(mmap=True)``, the
default from 64 MB up), so its first queries fault the pages they touch in from disk. This
bench opens an existing index several times, each time after the kernel dropped its page
cache, and times single queries (held-out synthetic vectors, drawn as ``bench_search.py``
draws them, a new set per pass):

- ``faiss-advice``: the file mapped as FAISS leaves it (``MADV_RANDOM`` on the whole file: no
  read-ahead, each 4 KB page of a scanned IVF list is its own disk read);
- ``read-ahead``: as clipsearch opens it (read-ahead back on the lists, the re-ranking vectors
  still random-access);
- ``warmed``: after :meth:`ImageIndex.warm` (``vectors=False``) and waiting for the lists to be
  read (what ``serve`` does at start when the file exceeds half the available memory), the
  re-ranking vectors still on disk;
- ``cached``: the whole file in the page cache (a machine whose RAM holds it, after a while).

Dropping the page cache needs root (``/proc/sys/vm/drop_caches``); without it the passes are
labelled ``"dropped": false`` and are not cold.

```bash
python benchmarks/bench_cold.py INDEX_DIR [--queries 300] [--clusters 1000] [--seed 0]
```
"""

from __future__ import annotations

import gc
import json
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from _common import latency_summary, read_through  # noqa: E402
from _harness import Bench, note  # noqa: E402
from bench_query import SyntheticSpec, synthetic_queries  # noqa: E402
from bench_search import exact_truth, recall  # noqa: E402

from clipsearch.cli import int_at_least  # noqa: E402

PASSES = ("faiss-advice", "read-ahead", "warmed", "cached")


def drop_page_cache() -> bool:
    """Write back and drop the kernel's clean page cache; False where that is not allowed."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def run_pass(index_dir: Path, name: str, queries: Any, truth: Any, k: int) -> dict[str, Any]:
    from retrieval import ImageIndex, faiss_index

    gc.collect()
    dropped = drop_page_cache()
    real_advise = faiss_index.io._advise
    if name == "faiss-advice":
        faiss_index.io._advise = lambda *_: 0  # type: ignore[assignment]  # the mapping as FAISS made it
    try:
        t0 = time.perf_counter()
        index = ImageIndex.open(index_dir, mmap=True)
        open_s = time.perf_counter() - t0
    finally:
        faiss_index.io._advise = real_advise  # type: ignore[assignment]
    row: dict[str, Any] = {"pass": name, "dropped": dropped, "open_seconds": round(open_s, 3)}
    faiss_path = index_dir / index.manifest.faiss.path
    if name == "warmed":
        asked = index.warm(vectors=False)
        row["warm_bytes"] = asked
        row["warm_seconds"] = round(read_through(faiss_path, asked), 3)  # waits for what warm() asked
    elif name == "cached":
        row["warm_bytes"] = faiss_path.stat().st_size
        row["warm_seconds"] = round(read_through(faiss_path, faiss_path.stat().st_size), 3)
    times, found = [], []
    for q in queries:
        t0 = time.perf_counter()
        _, ids = index.search_ids(q[None], k)
        times.append(time.perf_counter() - t0)
        found.append(ids[0])
    import numpy as np

    row["search_ms"] = latency_summary(times)
    row["recall_at_10"] = round(recall(np.stack(found), truth, min(k, 10)), 4)
    row["first_10_ms"] = round(sum(times[:10]) * 1000, 1)
    del index
    return row


def main(argv: list[str] | None = None) -> int:
    bench = Bench("bench_cold", __doc__, "seed")
    parser = bench.parser
    parser.add_argument("index", type=Path, help="an existing index directory (e.g. one bench_search.py kept)")
    parser.add_argument("--queries", type=int_at_least(1), default=300, help="timed queries per pass (default: 300)")
    parser.add_argument("--k", type=int_at_least(1), default=10)
    parser.add_argument("--clusters", type=int_at_least(1), default=1000, help="the clusters the index's vectors were drawn from")
    parser.add_argument("--noise", type=float, default=0.8)
    args = bench.parse(argv)

    from retrieval import ImageIndex

    try:
        manifest = ImageIndex.open(args.index, mmap=True).manifest
    except Exception as exc:  # noqa: BLE001  # one line for the user, whatever the reason
        return bench.fail(f"{args.index}: {exc}")
    spec = SyntheticSpec(clusters=args.clusters, noise=args.noise, seed=args.seed)
    queries = synthetic_queries(args.queries * len(PASSES), manifest.dim, spec)
    t0 = time.perf_counter()
    truth = exact_truth(args.index, queries, args.k)
    truth_s = time.perf_counter() - t0
    rows = []
    for i, name in enumerate(PASSES):
        part = slice(i * args.queries, (i + 1) * args.queries)
        rows.append(run_pass(args.index, name, queries[part], truth[part], args.k))
        note(f"{name}: {json.dumps(rows[-1])}")
    table = [f"{manifest.count:,} vectors, {manifest.index_type} {dict(manifest.search_params)}, {args.queries} queries per pass",
             "| pass | page cache dropped | open s | warm-up read s | first 10 queries ms | p50 / p99 ms | recall@10 |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        ms = r["search_ms"]
        table.append(f"| {r['pass']} | {'yes' if r['dropped'] else 'no'} | {r['open_seconds']} | {r.get('warm_seconds', '')} | "
                     f"{r['first_10_ms']} | {ms['p50']:.2f} / {ms['p99']:.2f} | {r['recall_at_10']} |")
    bench.report({
        "bench": "cold",
        "vectors": manifest.count,
        "factory": manifest.index_type,
        "search_params": dict(manifest.search_params),
        "faiss_bytes": (args.index / manifest.faiss.path).stat().st_size if manifest.faiss else 0,
        "queries_per_pass": args.queries,
        "exact_truth_seconds": round(truth_s, 1),
        "passes": rows,
    }, table)
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
