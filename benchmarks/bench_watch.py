"""Watch mode: the delay from a file appearing in the folder to a reader finding it in the index.

Indexes N photo-like JPEGs with a random CLIP of the given preset, then for each mode starts
``watch_index`` in a thread (the model loaded once per mode, as the CLI does) and T times writes
one new 640x480 JPEG into the folder and waits until a reader sees it: the manifest replaced and
the new path in ``ImageIndex.open``. The delay is settle time (the file must stop changing) plus
the update (walk, plan, embed one image, commit); the update's own seconds are reported beside
it. Modes: file events with each ``--settle``, and rescans alone (no events; each file is
written at a random point of the rescan cycle).

Prints one JSON line (median, min and max per mode, the machine), then a table.

    python benchmarks/bench_watch.py [--images 200] [--trials 20] [--preset tiny|vit-b-32] [--settle 2.0 0.5]
"""

from __future__ import annotations

import io
import random
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _harness import Bench  # noqa: E402

POLL = 0.01  # seconds between a reader's looks at the manifest


def _seen(index_dir: Path, name: str, last: list[Any]) -> bool:
    """Whether a reader opening the index now finds ``name`` (opened only when the manifest changed)."""
    from retrieval import ImageIndex

    try:
        st = (index_dir / "manifest.json").stat()
    except FileNotFoundError:
        return False
    key = (st.st_ino, st.st_mtime_ns)
    if last and last[0] == key:
        return False
    try:
        found = name in set(ImageIndex.open(index_dir).paths())
    except FileNotFoundError:
        return False  # replaced while opening: look again
    last[:] = [key]
    return found


def run_mode(photos: Path, out: Path, model: Path, label: str, watch: Any, trials: int, batch: int) -> dict[str, Any]:
    from imagegen import photo_like

    from indexer import watch_index

    stop = threading.Event()
    updates: list[float] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            watch_index(photos, out, str(model), watch, stop=stop, on_update=lambda r: updates.append(r.seconds), batch_size=batch)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    # The watch is ready once its first update (nothing to do, or the initial build) is over.
    deadline = time.monotonic() + 600
    while not updates and time.monotonic() < deadline and thread.is_alive():
        time.sleep(POLL)
    time.sleep(0.5)  # a first update that found nothing commits nothing: give it time to end
    delays: list[float] = []
    rng = random.Random(0)
    for i in range(trials):
        if not watch.events:
            # Files arrive at any point of the rescan cycle, not just after an update.
            time.sleep(rng.uniform(0, watch.rescan))
        buf = io.BytesIO()
        photo_like(640, 480, seed=50_000 + len(label) * 1000 + i).save(buf, format="JPEG", quality=90)
        name = f"new_{label.replace(' ', '_')}_{i:03d}.jpg"
        last: list[Any] = []
        t0 = time.perf_counter()
        (photos / name).write_bytes(buf.getvalue())
        while not _seen(out, name, last):
            if errors or not thread.is_alive():
                raise RuntimeError(f"the watch stopped: {errors}")
            if time.perf_counter() - t0 > 300:
                raise RuntimeError(f"{name} never became searchable")
            time.sleep(POLL)
        delays.append(time.perf_counter() - t0)
    stop.set()
    thread.join()
    return {
        "mode": label,
        "settle": watch.settle,
        "rescan": watch.rescan,
        "events": watch.events,
        "trials": trials,
        "median_s": round(statistics.median(delays), 3),
        "min_s": round(min(delays), 3),
        "max_s": round(max(delays), 3),
        "update_median_s": round(statistics.median(updates[1:]), 3) if len(updates) > 1 else None,
        # In order: the first change after a start also pays for making the int8 tower, if any.
        "delays_s": [round(d, 3) for d in delays],
    }


def main(argv: list[str] | None = None) -> int:
    bench = Bench("bench_watch", __doc__, "work_dir")
    parser = bench.parser
    parser.add_argument("--images", type=int, default=200, help="images in the index before the trials")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--preset", default="vit-b-32", choices=["tiny", "vit-b-32"])
    parser.add_argument("--settle", type=float, nargs="+", default=[2.0, 0.5], help="settle times with file events")
    parser.add_argument("--rescan", type=float, default=2.0, help="rescan period of the mode without events")
    parser.add_argument("--batch-size", type=int, default=64)
    args = bench.parse(argv)

    from imagegen import make_jpegs

    from indexer import WatchConfig, build_index
    from retrieval.tools.random_model import make_random_clip

    modes = [(f"events, settle {s:g} s", WatchConfig(settle=s, rescan=60.0)) for s in args.settle]
    modes.append((f"rescans every {args.rescan:g} s, settle 0.5 s", WatchConfig(settle=0.5, rescan=args.rescan, events=False)))
    results = []
    with bench.scratch() as tmp_path:
        model = make_random_clip(tmp_path / "model", preset=args.preset, seed=0)
        photos = tmp_path / "photos"
        pool = make_jpegs(tmp_path / "pool", min(args.images, 100), size=(640, 480))
        photos.mkdir()
        for i in range(args.images):
            shutil.copyfile(pool[i % len(pool)], photos / f"img_{i:05d}.jpg")
        t0 = time.perf_counter()
        build_index(photos, tmp_path / "idx", model=str(model), batch_size=args.batch_size)
        first_s = time.perf_counter() - t0
        for label, watch in modes:
            results.append(run_mode(photos, tmp_path / "idx", model, label, watch, args.trials, args.batch_size))

    table = [f"watch delay, file written -> searchable; {args.images} images, {args.preset}",
             f"{'mode':<36}{'median s':>10}{'min s':>8}{'max s':>8}{'first s':>9}{'update s':>10}"]
    for r in results:
        update = f"{r['update_median_s']:.2f}" if r["update_median_s"] is not None else "-"
        table.append(f"{r['mode']:<36}{r['median_s']:>10.2f}{r['min_s']:>8.2f}{r['max_s']:>8.2f}{r['delays_s'][0]:>9.2f}{update:>10}")
    bench.report({"bench": "watch", "preset": args.preset, "images": args.images, "first_build_seconds": round(first_s, 2),
                  "modes": results}, table)
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
