"""Indexing on Ray against the local engine, in one run, on the same files and model.

Builds one generated collection (640x480 photo-like JPEGs, a randomly initialised model of
ViT-B/32 shapes: weights do not change speed) with ``--engine local`` and with ``--engine ray``
on a Ray started on this machine, with 1 actor (all cores) and with 2 actors (half the cores
each). Reports whole-build seconds and images/s (actor start-up, model loads and the
calibration task included: what a user waits for), Ray's overhead ratio against the local build,
the peak resident memory of the whole process tree (driver, Ray's daemons, actors) and the
largest vector difference against the local index. Prints one JSON line, then a table.

    python benchmarks/bench_ray.py [--images 2000] [--preset vit-b-32|tiny] [--repeat 1]
        [--configs local,ray1,ray2] [--precision auto]
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from _common import ROOT
from _harness import Bench, note
from bench_index import make_photos

sys.path.insert(0, str(ROOT / "tests"))

PAGE = os.sysconf("SC_PAGE_SIZE")


def tree_rss_mb(root_pid: int) -> float:
    """Resident memory of ``root_pid`` and every descendant (Ray's raylet, GCS, workers), MiB."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
            with open(f"/proc/{entry}/statm", "rb") as fh:
                pages = int(fh.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents[int(entry)] = int(fields[1])
        rss[int(entry)] = pages
    tree, frontier = {root_pid}, [root_pid]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in tree:
                tree.add(child)
                frontier.append(child)
    return sum(rss.get(p, 0) for p in tree) * PAGE / 2**20


class PeakSampler:
    """Samples :func:`tree_rss_mb` of this process every 0.2 s while a build runs."""

    def __init__(self) -> None:
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss_mb(os.getpid()))
            self._stop.wait(0.2)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, tree_rss_mb(os.getpid()))


def timed(build: Callable[[], dict]) -> dict:
    with PeakSampler() as sampler:
        t0 = time.perf_counter()
        report = build()
        seconds = time.perf_counter() - t0
    return {"seconds": seconds, "peak_tree_rss_mb": sampler.peak, "report": report}


def max_difference(a: Path, b: Path) -> float:
    import numpy as np

    from retrieval import ImageIndex

    ia, ib = ImageIndex.open(a), ImageIndex.open(b)
    if ia.paths() != ib.paths():
        return float("inf")
    return float(np.abs(ia.embeddings() - ib.embeddings()).max())


def main(argv: list[str] | None = None) -> int:
    bench = Bench("bench_ray", __doc__, "work_dir")
    parser = bench.parser
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--preset", default="vit-b-32", choices=["vit-b-32", "tiny"])
    parser.add_argument("--repeat", type=int, default=1, help="runs of each config, interleaved; the median is reported")
    parser.add_argument("--configs", default="local,ray1,ray2")
    parser.add_argument("--precision", default="auto")
    args = bench.parse(argv)

    import logging

    import ray

    from indexer import build_index
    from retrieval.tools.random_model import make_random_clip

    cores = os.cpu_count() or 1
    configs = [c for c in args.configs.split(",") if c]
    results: dict[str, list[dict]] = {c: [] for c in configs}
    with bench.scratch() as tmp_path:
        model = make_random_clip(tmp_path / "model", preset=args.preset, seed=0)
        files = make_photos(tmp_path / "photos", args.images, args.images, (640, 480))
        for f in files:
            f.read_bytes()  # every run reads from the page cache alike
        t0 = time.perf_counter()
        ray.init(address="local", num_cpus=cores, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
        ray_init_s = time.perf_counter() - t0
        # Warm-up, not timed: imports and first writes in this process.
        build_index(tmp_path / "photos", tmp_path / "warm", model=str(model), files=[f.name for f in files[:8]], device="cpu")

        def build(config: str, out: Path) -> dict:
            shutil.rmtree(out, ignore_errors=True)
            common = dict(model=str(model), device="cpu", precision=args.precision)
            if config == "local":
                return build_index(tmp_path / "photos", out, **common).to_dict()
            actors = int(config.removeprefix("ray"))
            return build_index(tmp_path / "photos", out, engine="ray", actors=actors, cpus_per_actor=max(1, cores // actors),
                               **common).to_dict()

        for _ in range(args.repeat):
            for config in configs:
                results[config].append(timed(lambda c=config: build(c, tmp_path / f"{c}.idx")))
                note(f"{config}: {results[config][-1]['seconds']:.1f} s")
        diffs = {c: max_difference(tmp_path / "local.idx", tmp_path / f"{c}.idx") for c in configs if c != "local" and "local" in configs}
        ray.shutdown()

    summary = {}
    for config, runs in results.items():
        seconds = statistics.median(r["seconds"] for r in runs)
        summary[config] = {
            "seconds": round(seconds, 2),
            "images_per_second": round(args.images / seconds, 1),
            "peak_tree_rss_mb": round(max(r["peak_tree_rss_mb"] for r in runs)),
            "actors": runs[-1]["report"].get("actors", 0),
            "precision": runs[-1]["report"]["precision"],
        }
    if "local" in summary:
        for config, row in summary.items():
            row["time_vs_local"] = round(row["seconds"] / summary["local"]["seconds"], 2)
            if config in diffs:
                row["max_abs_diff_vs_local"] = diffs[config]
    table = [f"({args.preset}, {args.images} JPEGs 640x480, {cores} cores; Ray started once: {ray_init_s:.1f} s, not counted below)",
             f"{'engine':<10} {'actors':>6} {'seconds':>8} {'images/s':>9} {'x local':>8} {'peak RSS MB':>12} {'max |diff|':>11}"]
    for config, row in summary.items():
        diff = row.get("max_abs_diff_vs_local")
        table.append(f"{config:<10} {row['actors']:>6} {row['seconds']:>8.1f} {row['images_per_second']:>9.1f} "
                     f"{row.get('time_vs_local', float('nan')):>8.2f} {row['peak_tree_rss_mb']:>12} "
                     f"{'' if diff is None else f'{diff:.1e}':>11}")
    bench.report({"benchmark": "bench_ray", "images": args.images, "preset": args.preset, "repeat": args.repeat,
                  "ray": ray.__version__, "ray_init_s": round(ray_init_s, 2), "configs": summary}, table)
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
