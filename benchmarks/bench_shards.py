"""Index the same images from a folder, from local WebDataset shards and from S3 shards, in one run.

``--images`` photo-like JPEGs (``--size`` px on the longer side, quality 90) are written as
files of a folder and as img2dataset-style shards (``KEY.jpg``, ``KEY.txt``, ``KEY.json``,
``--per-shard`` samples each), which are also uploaded to moto's S3 server on loopback (the S3
wire protocol through s3fs, as a real bucket is read, without its network). Each source is
indexed into a fresh index with the same random-weight model (``--preset``; random weights: the
figures are about reading, not quality) on the CPU, ``--rounds`` times; the table gives the
best build's images/s, the ratio to the folder, the share of the build spent listing shards, and
checks that every source gave the folder's vectors (min cosine) and the shards' captions.

Then Ray's write path (``--engine ray``): ``--ray-write-rows`` rows of precomputed 512-d vectors
through 1 and 2 actors, written by the driver (``--ray-write driver``) and by the actors into
the index's staging folder (``--ray-write actors``): rows/s, the driver's CPU per row (the
ceiling at many GPUs) and the finishing commit (see ``_ray_write.py``).

    python benchmarks/bench_shards.py [--images 512] [--per-shard 128] [--size 384] [--preset vit-b-32]
        [--ray-write-rows 131072] [--ray-write-only]
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _harness import Bench  # noqa: E402

BUCKET = "bench"
_AWS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL")


def _vectors_by_key(index_dir: Path) -> dict[str, object]:
    from retrieval import ImageIndex

    index = ImageIndex.open(index_dir)
    keys = [p.rpartition("#")[2].rsplit(".", 1)[0] for p in index.paths()]
    return dict(zip(keys, index.embeddings(), strict=True))


def _captions(index_dir: Path) -> list[str | None]:
    from retrieval import ImageIndex

    index = ImageIndex.open(index_dir)
    return [r["caption"] for r in index.rows(range(index.count), columns=("caption",))]


def _s3(shards: list[Path]) -> tuple[object, str]:
    """moto's S3 on loopback holding the shards; the AWS_* variables point at it."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    os.environ.update({k: "bench" for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}, AWS_DEFAULT_REGION="us-east-1",
                      AWS_ENDPOINT_URL=url)
    s3 = boto3.client("s3", endpoint_url=url)
    s3.create_bucket(Bucket=BUCKET)
    for shard in shards:
        s3.upload_file(str(shard), BUCKET, f"shards/{shard.name}")
    return server, url


def main(argv: list[str] | None = None) -> int:
    bench = Bench("bench_shards", __doc__, "work_dir")
    parser = bench.parser
    parser.add_argument("--images", type=int, default=512, help="images (default 512)")
    parser.add_argument("--per-shard", type=int, default=128, help="samples per shard (default 128)")
    parser.add_argument("--size", type=int, default=384, help="longer side of the photos in pixels (default 384)")
    parser.add_argument("--preset", default="vit-b-32", help="random CLIP preset (retrieval.tools.random_model; default vit-b-32)")
    parser.add_argument("--rounds", type=int, default=2, help="builds per source, the best is kept (default 2)")
    parser.add_argument("--batch-size", type=int, default=64, help="images per model call (default 64)")
    parser.add_argument("--ray-write-rows", type=int, default=131072, help="rows of Ray's write measurement (0: none)")
    parser.add_argument("--ray-commit-every", type=int, default=4096, help="chunk commits of that measurement (default 4096)")
    parser.add_argument("--ray-write-only", action="store_true", help="only Ray's write measurement, not the sources")
    parser.add_argument("--ray-actors", type=int, nargs="+", default=[1, 2], help="actor counts of that measurement (default 1 2)")
    args = bench.parse(argv)
    if min(args.images, args.per_shard, args.size, args.rounds, args.ray_commit_every, *args.ray_actors) < 1 or args.ray_write_rows < 0:
        parser.error("--images, --per-shard, --size, --rounds, --ray-commit-every and --ray-actors must be >= 1, --ray-write-rows >= 0")
    ray_rows: list[dict[str, object]] = []
    if args.ray_write_rows:
        import _ray_write

        with bench.scratch() as tmp:
            ray_rows = _ray_write.run_all(args.ray_write_rows, args.rounds, args.batch_size, args.ray_commit_every, tmp,
                                              tuple(args.ray_actors))
    ray_table = _ray_write.table(ray_rows, args.ray_write_rows) if ray_rows else []
    if args.ray_write_only:
        bench.report({"benchmark": "shards", "ray_write": ray_rows, "ray_write_rows": args.ray_write_rows,
                      "batch_size": args.batch_size, "ray_commit_every": args.ray_commit_every, "rounds": args.rounds}, ray_table)
        return 0

    from shardgen import make_samples, write_folder, write_shards

    from indexer import build_index
    from indexer.shards import list_source, resolve
    from retrieval.tools.random_model import make_random_clip

    with bench.scratch() as base:
        samples = make_samples(args.images, size=args.size)
        folder = write_folder(base / "photos", samples, args.per_shard)
        shards = write_shards(base / "shards", samples, args.per_shard)
        model = make_random_clip(base / "model", preset=args.preset, seed=0)
        saved = {k: os.environ.get(k) for k in _AWS}
        server, _ = _s3(shards)
        sources = {"folder": str(folder), "local shards": str(base / "shards"), "S3 shards (moto)": f"s3://{BUCKET}/shards/"}
        opts = {"model": str(model), "device": "cpu", "precision": "fp32", "batch_size": args.batch_size, "workers": 0}
        rows = []
        try:
            reference = None
            for name, source in sources.items():
                best = None
                for r in range(args.rounds):
                    out = base / f"{name.split()[0]}-{r}.idx"
                    report = build_index(source, out, **opts)
                    if best is None or report.seconds < best[0].seconds:
                        best = (report, out)
                assert best is not None
                report, out = best
                listing = 0.0
                if name != "folder":
                    t0 = time.perf_counter()
                    list_source(resolve(source))
                    listing = time.perf_counter() - t0
                vectors = _vectors_by_key(out)
                if reference is None:
                    reference = vectors
                cos = min(float((vectors[k] * reference[k]).sum()) for k in reference)  # type: ignore[operator]  # arrays
                captions = _captions(out)
                rows.append({
                    "source": name, "images": report.embedded, "seconds": report.seconds,
                    "images_per_s": report.images_per_second, "list_seconds": round(listing, 3),
                    "min_cosine_vs_folder": round(cos, 7), "captions": sum(c is not None for c in captions),
                })
        finally:
            server.stop()  # type: ignore[attr-defined]  # ThreadedMotoServer
            for k, v in saved.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    folder_rate = rows[0]["images_per_s"]
    for row in rows:
        row["vs_folder"] = round(float(row["images_per_s"]) / float(folder_rate), 3) if folder_rate else None  # type: ignore[arg-type]
    table = [f"{args.images} JPEGs at {args.size} px, {args.per_shard} per shard, random {args.preset}, fp32 on CPU, best of {args.rounds}",
             f"{'source':<18} {'images/s':>9} {'vs folder':>9} {'listing s':>9} {'min cos':>10} {'captions':>8}"]
    table += [f"{row['source']:<18} {row['images_per_s']:>9.1f} {row['vs_folder']:>8.2f}x {row['list_seconds']:>9.3f} "
              f"{row['min_cosine_vs_folder']:>10.7f} {row['captions']:>8}" for row in rows]
    bench.report({"benchmark": "shards", "images": args.images, "per_shard": args.per_shard, "size": args.size,
                  "preset": args.preset, "batch_size": args.batch_size, "rounds": args.rounds, "results": rows,
                  "ray_write": ray_rows, "ray_write_rows": args.ray_write_rows, "ray_commit_every": args.ray_commit_every},
                 table + ([""] + ray_table if ray_table else []))
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
