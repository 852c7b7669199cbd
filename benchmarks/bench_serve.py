"""HTTP serving: requests/s and latency of ``clipsearch serve`` under 1 / 8 / 32 concurrent clients.

Two indexes, each served by its own ``clipsearch serve INDEX --port 0`` subprocess on 127.0.0.1
(the script waits for its ``clipsearch: serving http://HOST:PORT/`` line):

* ``demo``: ``data/demo`` indexed with ``data/models/demo-clip`` (as ``make demo`` does), into
  a temp dir;
* ``synthetic``: ``--synthetic-n`` clustered vectors (default 100,000) written through the
  indexer's own write path (``bench_query.build_synthetic_index``) under the same model, so
  text queries run the same text tower.

Query kinds, so that model time and server overhead can be told apart:

* ``text``: ``GET /api/search?q=...&k=K`` (text tower + FAISS + server);
* ``vector``: ``POST /api/search`` ``{"vector": [...], "k": K}`` (FAISS + server, no model);
* ``image_id``: ``POST /api/search`` ``{"image_id": ID, "k": K}`` ("more like this");
* ``health``: ``GET /api/health``, a no-op: what one round trip costs the server framework and
  this client, which shares the machine's cores with the server;
* ``knn_text`` and ``knn_vector``: the same text and vector queries through clip-back's
  ``POST /knn-service`` (``{"text"|"embedding_input", "indice_name", "num_images": K}``), the API
  of clip-retrieval's clients: its overhead beside ``/api/search``'s.

``--workers 1,2`` serves each index once per worker count (``clipsearch serve --workers N``);
each row records the server's resident memory then: every process's RSS, and their PSS (shared
pages counted once), the fair total for workers sharing memory-mapped files.

The client is one asyncio loop speaking raw HTTP/1.1 over keep-alive connections, one per
simulated client: each connection sends ``--warmup`` untimed requests, then all start together
and each sends its share of ``--requests`` timed requests (the run's total, split evenly, rounded
up), one after the other. A request's latency is from writing it to reading the last byte of its
answer. Errors are non-200 answers and exceptions (resets, timeouts); any error, and a server
that does not exit 0 on SIGTERM, makes the script exit 1. The CPU seconds of the client (this
process) and of the server (``/proc/PID/stat``) over each run are divided by its requests.

Before the load, every distinct query is sent once and its answer compared with the same call
in-process (ids in the same order, scores to 1e-5): ``mismatches`` (must be 0). Then the
baseline of the same run, paired: ``--baseline-repeat`` passes over the distinct queries, each
query once in this process (``ImageIndex.search`` / ``search_vectors`` / ``search_similar`` on
the same index, opened with the server's settings) and once over one connection, in turns
(which goes first alternates), so that both sides see the same machine at the same moment on a
shared host. The overhead is the server's p50 minus the in-process p50 of these pairs, at one
client (goal: :data:`OVERHEAD_GOAL_MS`); the 1-client load run that follows gives the server's p50 again.

Prints the run's record as one JSON line (``bench``: ``serve-run``, its ``rows``), then one JSON
line per (index, kind, clients) (``bench``: ``serve``), then a readable table.

    python benchmarks/bench_serve.py [--indexes demo,synthetic] [--kinds text,vector,image_id,health]
        [--clients 1,8,32] [--requests 400] [--warmup 5] [--synthetic-n 100000] [--workers 1,2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import ROOT, latency_summary, peak_rss_mb
from _harness import Bench, listed, note
from _load import Connection, LoadResult, Query, Server, per_client, run_load, self_cpu_seconds, tree_memory_mb

from clipsearch.cli import int_at_least

# torch and faiss-cpu each bring an OpenMP runtime whose spinning idle threads fight over few
# cores (benchmarks/README.md, bench_query); the server gets the same default from the CLI.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

DEMO_IMAGES = ROOT / "data" / "demo"
DEMO_MODEL = ROOT / "data" / "models" / "demo-clip"
DEMO_QUERIES = DEMO_IMAGES / "queries.jsonl"
KINDS = ("text", "vector", "image_id", "health", "knn_text", "knn_vector")
BLAS_ENV = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS")
# The goal: the server's p50 at one client at most this far above in-process.
OVERHEAD_GOAL_MS = 3.0


# -- queries and the in-process baseline ----------------------------------------------------------


def text_queries(n: int) -> list[str]:
    """The demo's own queries (captions of held-out images), then bench_query's generated ones."""
    from bench_query import query_texts

    texts = [json.loads(line)["query"] for line in DEMO_QUERIES.read_text(encoding="utf-8").splitlines() if line.strip()]
    return (texts + query_texts(n))[:n]


def build_queries(index: Any, kind: str, n: int, k: int, vectors: Any) -> list[Query]:
    """``n`` distinct requests of one kind for this index (``vectors``: the vector queries, or
    None for stored embeddings of images spread over the index)."""
    if kind == "health":
        return [Query("GET", "/api/health")]
    if kind == "text":
        return [Query("GET", "/api/search?" + urllib.parse.urlencode({"q": t, "k": k}), text=t) for t in text_queries(n)]
    if kind.startswith("knn_"):
        # The same queries as /api/search's, in clip-back's body (no deduplication: same ranking).
        name = index.directory.resolve().name
        out = []
        for q in build_queries(index, kind.removeprefix("knn_"), n, k, vectors):
            query = {"text": q.text} if q.text is not None else {"embedding_input": q.vector}
            body = {**query, "indice_name": name, "num_images": k, "modality": "image"}
            out.append(Query("POST", "/knn-service", body, text=q.text, vector=q.vector, knn=True))
        return out
    ids = [round(i * (index.count - 1) / max(1, n - 1)) for i in range(min(n, index.count))]
    if kind == "image_id":
        return [Query("POST", "/api/search", {"image_id": i, "k": k}, image_id=i) for i in ids]
    if vectors is None:
        vectors = index.vectors_of(ids)
    # float32 values written as the doubles they are, so that the server reads them back exactly.
    out = []
    for row in vectors[:n]:
        vec = [float(x) for x in row]
        out.append(Query("POST", "/api/search", {"vector": vec, "k": k}, vector=vec))
    return out


def in_process(index: Any, query: Query, k: int) -> list[Any]:
    """The library call the server's answer to ``query`` must equal."""
    import numpy as np

    if query.text is not None:
        # clip-back's /knn-service is k-NN on the embedding; /api/search ranks as the library's
        # default does (hybrid where the index has a keyword side).
        return index.search(query.text, k, mode="vector" if query.knn else None)
    if query.vector is not None:
        return index.search_vectors(np.asarray([query.vector], dtype=np.float32), k)[0]
    if query.image_id is not None:
        return index.search_similar(query.image_id, k)
    raise ValueError("no in-process call for this query")


@dataclass
class Paired:
    """The baseline: the same queries in-process and over HTTP, in turns."""

    local: list[float] = field(default_factory=list)
    remote: list[float] = field(default_factory=list)
    local_cpu_s: float = 0.0
    failures: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        local = latency_summary(self.local)
        remote = latency_summary(self.remote)
        return {
            # this process's CPU time per in-process query (all threads), beside the server's
            "in_process_ms": {**local, "cpu_ms": round(1000 * self.local_cpu_s / max(1, len(self.local)), 3)},
            "paired_server_ms": remote,
            "overhead_p50_ms": round(remote["p50"] - local["p50"], 3),
        }


async def paired(
    host: str, port: int, queries: Sequence[Query], token: str | None, index: Any, k: int, repeat: int, timeout: float
) -> Paired:
    """``repeat`` passes over ``queries``: each in-process and over one connection, in turns."""
    conn = Connection(host, port, timeout)
    result = Paired()
    try:
        for r in range(repeat):
            for j, q in enumerate(queries):
                raw = q.encode(f"{host}:{port}", token)
                for side in ("local", "remote") if (r + j) % 2 == 0 else ("remote", "local"):
                    if side == "local":
                        cpu0, t0 = self_cpu_seconds(), time.perf_counter()
                        in_process(index, q, k)  # blocks the loop on purpose: nothing else runs
                        result.local.append(time.perf_counter() - t0)
                        result.local_cpu_s += self_cpu_seconds() - cpu0
                        continue
                    t0 = time.perf_counter()
                    try:
                        status, _ = await conn.request(raw)
                    except Exception as exc:  # counted with the others
                        result.failures.append(f"{type(exc).__name__}: {exc}")
                        await conn.close()
                        continue
                    if status == 200:
                        result.remote.append(time.perf_counter() - t0)
                    else:
                        result.failures.append(f"HTTP {status}")
    finally:
        await conn.close()
    return result


async def verify(host: str, port: int, queries: Sequence[Query], token: str | None, index: Any, k: int, timeout: float) -> list[str]:
    """Send each query once; the differences from the in-process answer, one line each."""
    conn = Connection(host, port, timeout)
    problems = []
    try:
        for q in queries:
            label = q.text if q.text is not None else f"image_id {q.image_id}" if q.image_id is not None else q.target
            try:
                status, body = await conn.request(q.encode(f"{host}:{port}", token))
            except Exception as exc:  # reported with the others, not a traceback mid-run
                problems.append(f"{label}: {type(exc).__name__}: {exc}")
                await conn.close()
                continue
            if status != 200:
                problems.append(f"{label}: HTTP {status} {body[:200]!r}")
                continue
            if q.text is None and q.vector is None and q.image_id is None:
                continue  # health: a 200 is the answer
            try:
                answer = json.loads(body)
                if q.knn:
                    got = [(int(r["id"]), float(r["similarity"])) for r in answer]
                else:
                    got = [(int(r["id"]), float(r["score"])) for r in answer["results"]]
            except (ValueError, KeyError, TypeError) as exc:
                problems.append(f"{label}: not a search answer ({type(exc).__name__}): {body[:200]!r}")
                continue
            want = [(h.id, h.score) for h in in_process(index, q, k)]
            same_ids = [i for i, _ in got] == [i for i, _ in want]
            if not same_ids or any(abs(a - b) > 1e-5 for (_, a), (_, b) in zip(got, want, strict=True)):
                problems.append(f"{label}: server {got[:3]}... != in-process {want[:3]}...")
    finally:
        await conn.close()
    return problems


# -- the indexes ----------------------------------------------------------------------------------


def build_demo(out: Path, limit: int | None) -> dict[str, Any]:
    """``data/demo`` indexed with the demo CLIP (the first ``limit`` images when given)."""
    from indexer.build import build_index
    from indexer.discover import discover

    files = None
    if limit is not None:
        files = [f.rel for f in discover(DEMO_IMAGES).files[:limit]]
    t0 = time.perf_counter()
    report = build_index(DEMO_IMAGES, out, model=str(DEMO_MODEL), device="cpu", files=files)
    return {"seconds": round(time.perf_counter() - t0, 3), "images": report.indexed}


def build_synthetic(out: Path, n: int, index_type: str, seed: int) -> dict[str, Any]:
    """``n`` synthetic vectors under the demo CLIP's name and fingerprint, through the indexer's write path."""
    from bench_query import SyntheticSpec, build_synthetic_index

    from retrieval.encoders import load_encoder

    encoder = load_encoder(str(DEMO_MODEL), device="cpu")
    from indexer.build import BuildConfig

    # Parts of the indexer's default size: reading one stored vector (image_id) decodes its part's
    # row group, so the part size is part of what an image_id query costs.
    commit_every = BuildConfig().commit_every
    timings = build_synthetic_index(out, encoder, n, SyntheticSpec(seed=seed), commit_every=commit_every, index_type=index_type)
    return {"seconds": timings["total"], "images": n}


# -- the run ------------------------------------------------------------------------------------


def bench_index(name: str, index_dir: Path, args: argparse.Namespace, build: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """Baseline, server, verification and load for one index; returns its rows and problems."""
    import gc

    from bench_query import SyntheticSpec, synthetic_queries

    from retrieval import ImageIndex

    index = ImageIndex.open(index_dir, device=args.device, precision=args.precision)
    kinds = list(args.kinds)
    vectors = None
    if name == "synthetic":
        # Held-out draws from the index's clusters: in-distribution, not in the index.
        vectors = synthetic_queries(args.distinct, index.dim, SyntheticSpec(seed=args.seed))
    per_kind = {kind: build_queries(index, kind, args.distinct, args.k, vectors) for kind in kinds}
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    for workers in args.workers:
        got, found = _bench_server(name, index_dir, index, per_kind, workers, args, build)
        rows += got
        problems += found
    del index
    gc.collect()
    return rows, problems


def _bench_server(
    name: str, index_dir: Path, index: Any, per_kind: dict[str, list[Query]], workers: int, args: argparse.Namespace, build: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[str]]:
    """One server (``--workers workers``) over one index: every kind, every client count."""
    kinds = list(per_kind)
    command = [*args.serve_command, str(index_dir), "--port", "0", "--device", args.device, "--precision", args.precision]
    if workers > 1:
        command += ["--workers", str(workers)]
    if args.token:
        command += ["--token", args.token]
    note(f"{name}: starting {shlex.join(command)}")
    server = Server(command, args.start_timeout)
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    memory: dict[str, Any] = {}
    try:
        host = f"{server.host}:{server.port}"
        for kind in kinds:
            found = asyncio.run(verify(server.host, server.port, per_kind[kind], args.token, index, args.k, args.timeout))
            raw = [q.encode(host, args.token) for q in per_kind[kind]]
            problems += [f"{name} {kind}: {p}" for p in found]
            base = None
            if kind != "health":
                note(f"{name}: {kind}, in-process and over HTTP in turns ...")
                pair = asyncio.run(
                    paired(server.host, server.port, per_kind[kind], args.token, index, args.k, args.baseline_repeat, args.timeout)
                )
                problems += [f"{name} {kind} baseline: {p}" for p in pair.failures[:5]]
                base = pair.summary()
            for clients in args.clients:
                each = per_client(args.requests, clients)
                note(f"{name}: {kind}, {clients} clients x {each} requests ...")
                load = asyncio.run(run_load(server.host, server.port, raw, clients, each, args.warmup, args.timeout, server.pid))
                rows.append({**_row(name, index, kind, clients, args, load, base, len(found), build), "workers": workers})
                if load.errors:
                    problems.append(f"{name} {kind} x{clients}: {load.errors} errors {dict(load.statuses)} {dict(load.exceptions)}")
        server_rss = server.peak_rss_mb()
        memory = tree_memory_mb(server.pid)  # after the load: the workers' pages touched
    finally:
        code = server.stop()
    if code != 0:
        problems.append(f"{name}: the server exited with {code} on SIGTERM: {' | '.join(list(server.stderr)[-5:])}")
    for row in rows:
        row["server"] = {"startup_s": round(server.startup_s, 3), "peak_rss_mb": server_rss, "exit_code": code, **memory}
    return rows, problems


def _row(
    name: str,
    index: Any,
    kind: str,
    clients: int,
    args: argparse.Namespace,
    load: LoadResult,
    base: dict[str, Any] | None,
    mismatches: int,
    build: dict[str, Any],
) -> dict[str, Any]:
    lat = latency_summary(load.latencies)
    done = len(load.latencies)
    return {
        "bench": "serve",
        "index": name,
        "count": index.count,
        "dim": index.dim,
        "index_type": index.info().get("index_type"),
        "build": build,
        "kind": kind,
        "clients": clients,
        "requests": clients * per_client(args.requests, clients),
        "completed": done,
        "k": args.k,
        "wall_s": round(load.wall_s, 3),
        "requests_per_s": round(done / load.wall_s, 1) if load.wall_s > 0 else None,
        "latency_ms": lat,
        "errors": load.errors,
        "statuses": {str(s): n for s, n in sorted(load.statuses.items())},
        "exceptions": dict(load.exceptions),
        "mismatches": mismatches,
        # The baseline pairs (one client, in turns with in-process calls): the same on every
        # row of this kind; the overhead is defined at one client, without queueing.
        "in_process_ms": base and base["in_process_ms"],
        "paired_server_ms": base and base["paired_server_ms"],
        "overhead_p50_ms": base and base["overhead_p50_ms"],
        "client_cpu_ms_per_request": round(1000 * load.client_cpu_s / done, 3) if done else None,
        "server_cpu_ms_per_request": round(1000 * load.server_cpu_s / done, 3) if done else None,
    }


_positive = int_at_least(1)


def main(argv: list[str] | None = None) -> int:
    bench = Bench("bench_serve", __doc__, "seed", "work_dir")
    parser = bench.parser
    parser.add_argument("--indexes", type=listed(str, ("demo", "synthetic")), default=["demo", "synthetic"], help="default: demo,synthetic")
    parser.add_argument("--kinds", type=listed(str, KINDS), default=list(KINDS), help=f"default: {','.join(KINDS)}")
    parser.add_argument("--clients", type=listed(int), default=[1, 8, 32], help="concurrent connections, one run each (default: 1,8,32)")
    parser.add_argument("--workers", type=listed(int), default=[1], help="server worker processes, one server each (default: 1)")
    parser.add_argument(
        "--requests", type=_positive, default=400, help="timed requests per run, split evenly over its clients, rounded up (default: 400)"
    )
    parser.add_argument("--warmup", type=int_at_least(0), default=5, help="untimed requests per client first (default: 5)")
    parser.add_argument("--distinct", type=_positive, default=136, help="distinct queries per kind (default: 136, the demo's)")
    parser.add_argument(
        "--baseline-repeat", type=_positive, default=3, help="passes over the queries in-process and over HTTP in turns (default: 3)"
    )
    parser.add_argument("--k", type=_positive, default=10, help="results per query (default: 10)")
    parser.add_argument("--synthetic-n", type=_positive, default=100_000, help="vectors in the synthetic index (default: 100000)")
    parser.add_argument("--synthetic-type", default="flat", help="its index type (default: flat)")
    parser.add_argument("--demo-limit", type=_positive, default=None, help="index only the first N demo images (tests)")
    parser.add_argument("--device", default="cpu", help="query model device, here and in the server (default: cpu)")
    parser.add_argument("--precision", default="fp32", help="text tower precision, here and in the server (default: fp32)")
    parser.add_argument("--token", help="serve with --token and send it (default: none)")
    parser.add_argument(
        "--serve-command",
        type=shlex.split,
        default=[sys.executable, "-m", "clipsearch", "serve"],
        help="the server command before INDEX_DIR, e.g. 'taskset -c 1 clipsearch serve' (default: this Python -m clipsearch serve)",
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per request before it counts as an error (default: 60)")
    parser.add_argument("--start-timeout", type=float, default=180.0, help="seconds to wait for the server's line (default: 180)")
    args = bench.parse(argv)

    t_start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    with bench.scratch() as work:
        for name in args.indexes:
            index_dir = work / f"{name}.idx"
            note(f"building {name} ...")
            if name == "demo":
                build = build_demo(index_dir, args.demo_limit)
            else:
                build = build_synthetic(index_dir, args.synthetic_n, args.synthetic_type, args.seed)
            got, found = bench_index(name, index_dir, args, build)
            rows += got
            problems += found
    total_s = round(time.perf_counter() - t_start, 1)
    for row in rows:
        # The numpy text tower's BLAS threads busy-wait: their count changes text latency on
        # few cores as much as OpenMP's wait policy does (both reach the server too).
        row.update(bench_peak_rss_mb=round(peak_rss_mb(), 1), total_seconds=total_s,
                   blas_env={k: os.environ[k] for k in BLAS_ENV if k in os.environ})
    bench.report({"bench": "serve-run", "rows": rows, "problems": problems, "total_seconds": total_s}, table(rows, args),
                 rows=rows)
    for p in problems:
        bench.fail(p)
    return 1 if problems else 0


def table(rows: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    head = (
        f"{'index':<10} {'kind':<10} {'workers':>7} {'clients':>7} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}"
        f" {'in-proc p50':>11} {'paired p50':>10} {'overhead p50':>12}"
        f" {'client CPU ms/req':>17} {'server CPU ms/req':>17} {'in-proc CPU ms':>14} {'RSS MB':>14} {'PSS MB':>7}"
    )
    lines = [head, "-" * len(head)]

    def num(value: float | None, digits: int = 2) -> str:
        return "" if value is None else f"{value:.{digits}f}"

    for r in rows:
        # The baseline figures belong to the kind; printed once, on its 1-client row.
        first = r["clients"] == min(args.clients) and r["in_process_ms"] is not None
        local = r["in_process_ms"] if first else None
        remote = r["paired_server_ms"] if first else None
        lines.append(
            f"{r['index']:<10} {r['kind']:<10} {r['workers']:>7} {r['clients']:>7} {num(r['requests_per_s'], 1):>8}"
            f" {num(r['latency_ms']['p50']):>8}"
            f" {num(r['latency_ms']['p99']):>8} {r['errors'] + r['mismatches']:>6} {num(local and local['p50']):>11}"
            f" {num(remote and remote['p50']):>10} {num(r['overhead_p50_ms'] if first else None):>12}"
            f" {num(r['client_cpu_ms_per_request']):>17} {num(r['server_cpu_ms_per_request']):>17}"
            f" {num(local and local['cpu_ms']):>14} {'+'.join(f'{m:.0f}' for m in r['server'].get('rss_mb', [])):>14}"
            f" {num(r['server'].get('pss_total_mb'), 0):>7}"
        )
    sizes = ", ".join(sorted({f"{r['index']} {r['count']:,} x {r['dim']}-d {r['index_type']}" for r in rows}))
    lines.append(
        f"~{args.requests} timed requests per run (split over its clients) after {args.warmup} warm-up per client, k={args.k},"
        f" keep-alive HTTP/1.1 on 127.0.0.1, {args.device} {args.precision}; {sizes};"
        " errors = non-200 + exceptions + answers unlike in-process;"
        f" in-proc / paired p50 = {args.baseline_repeat} passes over the distinct queries, in-process and over HTTP in turns,"
        f" overhead = their difference (goal <= {OVERHEAD_GOAL_MS:g} ms);"
        " RSS = each server process after the load (supervisor + workers), PSS = their total with shared pages counted once;"
        " client and server share the machine's cores"
    )
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
