"""A shard set on Ray Serve (``serve --ray``) against in-process search, in one run, on one host.

Writes one synthetic collection (clustered unit vectors through the indexer's own write path, no
model: a vector query measures the serving path, not the text tower), splits it into shard sets
and deploys each ``SHARDSxREPLICAS`` configuration on a Ray started here (one router, Serve's
HTTP proxy). For each it sends ``--requests`` vector searches from ``--clients`` concurrent HTTP
clients and reports throughput and p50/p99 latency; beside them, in the same run, the unsharded
index searched in process and the same shards fanned out in process (``PartitionedIndex`` on
threads): the overhead per request of the cluster is its p50 less the in-process one. Each
configuration's first answer is checked against the unsharded index's (``same``).

    python benchmarks/bench_cluster.py [--rows 20000] [--dim 128] [--configs 1x1,2x1,2x2]
        [--requests 200] [--clients 4] [--k 10]
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _common import ROOT
from _harness import Bench, listed, note

sys.path.insert(0, str(ROOT / "tests"))


def _config(text: str) -> tuple[int, int]:
    shards, _, replicas = text.partition("x")
    if not (shards.isdigit() and replicas.isdigit() and int(shards) >= 1 and int(replicas) >= 1):
        raise ValueError(f"a configuration is SHARDSxREPLICAS (2x1), got {text!r}")
    return int(shards), int(replicas)


def percentiles(latencies_s: list[float]) -> dict[str, float]:
    ms = np.asarray(latencies_s) * 1000
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99))}


def load(call: Callable[[int], None], requests: int, clients: int) -> dict[str, float]:
    """``requests`` calls of ``call(n)`` from ``clients`` threads: throughput and latency."""
    latencies: list[float] = []
    lock = threading.Lock()
    counter = iter(range(requests))

    def client() -> None:
        while True:
            with lock:
                n = next(counter, None)
            if n is None:
                return
            t0 = time.perf_counter()
            call(n)
            with lock:
                latencies.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    return {"requests_per_s": len(latencies) / seconds, **percentiles(latencies)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    bench = Bench("bench_cluster", __doc__, "seed", "work_dir")
    p = bench.parser
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--configs", type=listed(_config), default=[(1, 1), (2, 1), (2, 2)], help="SHARDSxREPLICAS, comma-separated")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--k", type=int, default=10)
    args = bench.parse(argv)
    if min(args.rows, args.dim, args.requests, args.clients, args.k) < 1:
        return bench.fail("--rows, --dim, --requests, --clients and --k must be >= 1", 2)
    if max(s for s, _ in args.configs) > args.rows:
        return bench.fail(f"more shards than --rows ({args.rows})", 2)

    import httpx
    import ray
    from vector_indexes import clustered, write_vectors_index

    from clipsearch.server.cluster import ClusterOptions, deploy, undeploy
    from indexer.partition import split_index
    from retrieval.index import ImageIndex
    from retrieval.partition_live import open_partitions
    from retrieval.request import SearchRequest

    rows: list[dict[str, Any]] = []
    with bench.scratch() as work:
        vectors = clustered(args.rows, args.dim, seed=args.seed)
        queries = clustered(args.requests, args.dim, seed=args.seed + 1)
        write_vectors_index(work / "all.idx", vectors, commit_every=args.rows)
        whole = ImageIndex.open(work / "all.idx")
        want = [h.id for h in whole.search(SearchRequest(vector=queries[0], k=args.k))]
        search = lambda index: lambda n: index.search(SearchRequest(vector=queries[n], k=args.k))  # noqa: E731
        load(search(whole), min(20, args.requests), 1)  # warm-up
        rows.append({"config": "in-process, unsharded", "shards": 1, "replicas": 0, "same": True,
                     **load(search(whole), args.requests, args.clients)})
        note(f"in process: {rows[-1]['p50_ms']:.2f} ms p50")
        cores = os.cpu_count() or 1
        port = _free_port()  # Serve's proxy keeps the port it started on across deployments
        ray.init(address="local", num_cpus=max(cores, 4), include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
        try:
            for shards, replicas in args.configs:
                set_dir = work / f"set{shards}"
                if not set_dir.exists():
                    split_index(work / "all.idx", shards, set_dir)
                    local = open_partitions(set_dir)
                    load(search(local), min(20, args.requests), 1)
                    got = [h.id for h in local.search(SearchRequest(vector=queries[0], k=args.k))]
                    rows.append({"config": f"in-process, {shards} shards", "shards": shards, "replicas": 0, "same": got == want,
                                 **load(search(local), args.requests, args.clients)})
                options = ClusterOptions(replicas=replicas, routers=1, shard_cpus=0.5, router_cpus=0.5, verify=False)
                t0 = time.perf_counter()
                deploy(set_dir, options, {"warm": False}, address="auto", http={"host": "127.0.0.1", "port": port},
                       proxy_location="HeadOnly")
                deploy_s = time.perf_counter() - t0
                try:
                    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:

                        def call(n: int, client: httpx.Client = client) -> None:
                            r = client.post("/api/search", json={"vector": queries[n].tolist(), "k": args.k})
                            r.raise_for_status()

                        first = client.post("/api/search", json={"vector": queries[0].tolist(), "k": args.k}).json()
                        for n in range(min(20, args.requests)):
                            call(n)
                        measured = load(call, args.requests, args.clients)
                finally:
                    undeploy(False)
                rows.append({"config": f"Ray Serve, {shards}x{replicas}", "shards": shards, "replicas": replicas, "deploy_s": deploy_s,
                             "same": [r["id"] for r in first["results"]] == want, **measured})
                note(f"{shards}x{replicas}: {rows[-1]['p50_ms']:.2f} ms p50, deployed in {deploy_s:.0f} s")
        finally:
            from ray import serve

            serve.shutdown()
            ray.shutdown()

    base = rows[0]["p50_ms"]
    for row in rows:
        row["overhead_ms"] = row["p50_ms"] - base
    table = [
        f"{args.rows} vectors of dim {args.dim}, k={args.k}, {args.requests} requests from {args.clients} clients",
        f"{'configuration':<26} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'+p50 ms':>8} {'same':>5}",
        *(f"{r['config']:<26} {r['requests_per_s']:>8.1f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['overhead_ms']:>8.2f} "
          f"{'yes' if r['same'] else 'NO':>5}" for r in rows),
    ]
    bench.report({"bench": "cluster", "rows": args.rows, "dim": args.dim, "k": args.k, "requests": args.requests,
                  "clients": args.clients, "results": rows}, table)
    return 0 if all(r["same"] for r in rows) else bench.fail("a configuration answered differently from the unsharded index")


if __name__ == "__main__":
    sys.exit(main())
