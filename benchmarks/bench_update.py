"""Updating an index after a few files changed, against a full rebuild, in one run.

Builds an index of N photo-like JPEGs (default 10,000; files are copies of a pool of distinct
images, which does not change the cost of anything measured), then changes K of them (default
10: a third deleted, a third new files, the rest given new content in place), and times

- ``update``: ``build_index`` on the existing index (plan + embed only what changed + commit);
- ``rebuild``: a fresh ``build_index`` of the same folder into a new directory.

Prints one JSON line with both times and their ratio, then a table.

    python benchmarks/bench_update.py [--images 10000] [--changes 10] [--preset tiny|vit-b-32]
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _harness import Bench  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    bench = Bench("bench_update", __doc__, "work_dir")
    parser = bench.parser
    parser.add_argument("--images", type=int, default=10_000)
    parser.add_argument("--changes", type=int, default=10)
    parser.add_argument("--pool", type=int, default=200, help="distinct images the collection is copied from")
    parser.add_argument("--preset", default="tiny", choices=["tiny", "vit-b-32"])
    parser.add_argument("--size", default="320x240", help="image size WxH (default 320x240)")
    parser.add_argument("--batch-size", type=int, default=64)
    args = bench.parse(argv)
    if args.changes < 3 or args.changes > args.images:
        parser.error("--changes must be between 3 and --images")
    width, height = (int(v) for v in args.size.lower().split("x"))

    from imagegen import make_jpegs, photo_like

    from indexer import build_index
    from retrieval.tools.random_model import make_random_clip

    with bench.scratch() as tmp_path:
        model = make_random_clip(tmp_path / "model", preset=args.preset, seed=0)
        pool = make_jpegs(tmp_path / "pool", args.pool, size=(width, height))
        photos = tmp_path / "photos"
        for i in range(args.images):
            sub = photos / f"d{i // 1000:02d}"
            sub.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(pool[i % len(pool)], sub / f"img_{i:06d}.jpg")
        t0 = time.perf_counter()
        first = build_index(photos, tmp_path / "idx", model=str(model), batch_size=args.batch_size)
        first_s = time.perf_counter() - t0

        files = sorted(photos.rglob("*.jpg"))
        n_del = n_add = args.changes // 3
        n_mod = args.changes - n_del - n_add
        for j, path in enumerate(files[:n_mod]):
            photo_like(width, height, seed=10_000 + j).save(path, quality=85)
        for path in files[n_mod : n_mod + n_del]:
            path.unlink()
        for j in range(n_add):
            photo_like(width, height, seed=20_000 + j).save(photos / f"new_{j:03d}.jpg", quality=85)

        t0 = time.perf_counter()
        update = build_index(photos, tmp_path / "idx", model=str(model), batch_size=args.batch_size)
        update_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        rebuild = build_index(photos, tmp_path / "rebuilt", model=str(model), batch_size=args.batch_size)
        rebuild_s = time.perf_counter() - t0

    bench.report({
        "bench": "update",
        "preset": args.preset,
        "images": args.images,
        "image_size": [width, height],
        "changes": {"updated": update.updated, "removed": update.removed, "added": update.added, "unchanged": update.unchanged},
        "first_build_seconds": round(first_s, 2),
        "update_seconds": round(update_s, 2),
        "rebuild_seconds": round(rebuild_s, 2),
        "rebuild_over_update": round(rebuild_s / update_s, 1),
        "update_embedded": update.embedded,
        "rebuild_embedded": rebuild.embedded,
        "total_after": update.total,
        "first_build_images_per_second": first.images_per_second,
    }, [
        f"{'run':<34}{'seconds':>10}{'embedded':>10}",
        f"{'first build':<34}{first_s:>10.2f}{first.embedded:>10}",
        f"{'update after ' + str(args.changes) + ' changes':<34}{update_s:>10.2f}{update.embedded:>10}",
        f"{'full rebuild':<34}{rebuild_s:>10.2f}{rebuild.embedded:>10}",
        f"update is {round(rebuild_s / update_s, 1)}x faster than a rebuild ({args.images} images, {args.preset})",
    ])
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
