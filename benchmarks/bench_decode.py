"""What JPEG draft decoding is worth on camera-sized photos: speed, and how far it moves vectors.

scikit-image's bundled photos (astronaut, chelsea, coffee, rocket, motorcycle), cropped to 4:3
and upscaled to ``--width`` x ``--height`` (default 4000 x 3000, 12 megapixels; each copy
mirrored or shifted so that no two files are alike), are written as JPEG quality 90. Each model
(random weights, ``retrieval.tools.random_model`` presets) indexes them twice, ``decode="full"`` and
``decode="draft"``, both in fp32, in-process on the CPU:

- speed, for ``--speed-model`` (default the tiny CLIP, so the figure is the decoder's): the
  build's images/s (wall clock, model load and FAISS included, after one warm-up build) and its
  decode images/s per decode thread (decode + preprocess seconds summed over files), best of
  ``--rounds``;
- quality, for every model: the cosine of each file's draft vector to its full vector (mean,
  min), the figure ``decode auto``'s gate compares with 0.99999 (indexer/calibrate.py).

Prints one JSON line, then a table.

    python benchmarks/bench_decode.py [--photos 16] [--width 4000] [--height 3000] [--rounds 2]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _harness import Bench  # noqa: E402

# Model name -> (kind, preset, what it stands for).
MODELS: dict[str, tuple[str, str, str]] = {
    "clip-tiny-64": ("clip", "tiny", "CLIP, 64 px (shortest edge + crop)"),
    "siglip-tiny-64": ("siglip", "siglip-tiny", "SigLIP FixRes, 64 px (squash)"),
    "siglip2-naflex-256": ("siglip", "siglip2-naflex-tiny", "SigLIP 2 NaFlex, <= 256 patches of 16 px"),
    "clip-vit-b-32-224": ("clip", "vit-b-32", "CLIP ViT-B/32, 224 px (shortest edge + crop)"),
}


def write_photos(folder: Path, count: int, width: int, height: int) -> list[Path]:
    """``count`` distinct JPEGs (quality 90) of ``width`` x ``height`` from scikit-image's photos."""
    from photos import PHOTOS, photo
    from PIL import Image, ImageOps

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        img = photo(PHOTOS[i % len(PHOTOS)], max_side=10_000)
        w, h = img.size
        aspect = width / height
        crop = (w, min(h, round(w / aspect))) if w / h < aspect else (min(w, round(h * aspect)), h)
        # Each round over the photos takes another crop position, and every other one is mirrored.
        shift = (i // len(PHOTOS)) * 7
        left, top = min(shift, w - crop[0]), min(shift, h - crop[1])
        img = img.crop((left, top, left + crop[0], top + crop[1])).resize((width, height), Image.Resampling.BICUBIC)
        if (i // len(PHOTOS)) % 2:
            img = ImageOps.mirror(img)
        path = folder / f"photo_{i:03d}.jpg"
        img.save(path, quality=90)
        paths.append(path)
    return paths


def make_model(name: str, folder: Path) -> Path:
    from retrieval.tools.random_model import make_random_clip, make_random_siglip

    kind, preset, _ = MODELS[name]
    if kind == "clip":
        return make_random_clip(folder / name, preset=preset, seed=0)
    return make_random_siglip(folder / name, preset=preset, seed=0)


def build(photos: Path, out: Path, model: Path, decode: str, threads: int | None) -> dict[str, Any]:
    """One fresh fp32 build; its report's figures."""
    from indexer import build_index

    report = build_index(photos, out, model=str(model), decode=decode, precision="fp32", device="cpu", workers=0,
                         batch_size=16, rebuild=True, threads=threads)
    return {"images": report.embedded, "seconds": report.seconds, "decode_seconds": report.decode_seconds,
            "encode_seconds": report.encode_seconds}


def vectors(index_dir: Path) -> dict[str, Any]:
    from retrieval.index import ImageIndex

    idx = ImageIndex.open(index_dir, device="cpu")
    return dict(zip(idx.paths(), idx.embeddings(), strict=True))


def draft_cosines(full: Path, draft: Path) -> list[float]:
    import numpy as np

    a, b = vectors(full), vectors(draft)
    return [float(np.dot(a[k].astype(np.float64), b[k].astype(np.float64))) for k in sorted(a)]


def main(argv: list[str] | None = None) -> int:
    bench = Bench("bench_decode", __doc__, "threads", "work_dir")
    parser = bench.parser
    parser.add_argument("--photos", type=int, default=16, help="JPEGs to index (default 16)")
    parser.add_argument("--width", type=int, default=4000, help="photo width in pixels (default 4000)")
    parser.add_argument("--height", type=int, default=3000, help="photo height in pixels (default 3000)")
    parser.add_argument("--rounds", type=int, default=2, help="builds per decode mode for the speed figures, best taken (default 2)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"models whose cosines are measured (default {','.join(MODELS)})")
    parser.add_argument("--speed-model", default="clip-tiny-64", help="model of the speed figures (default clip-tiny-64)")
    args = bench.parse(argv)
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in [*models, args.speed_model] if m not in MODELS]
    if unknown or args.photos < 1 or args.rounds < 1 or min(args.width, args.height) < 16:
        parser.error(f"unknown model {unknown[0]!r} (choose from {', '.join(MODELS)})" if unknown else
                     "--photos and --rounds must be >= 1, --width and --height >= 16")
    with bench.scratch() as base:
        photos = base / "photos"
        t0 = time.perf_counter()
        write_photos(photos, args.photos, args.width, args.height)
        made_s = time.perf_counter() - t0
        paths = {name: make_model(name, base / "models") for name in dict.fromkeys([args.speed_model, *models])}
        speed: dict[str, dict[str, Any]] = {}
        build(photos, base / "warm-up", paths[args.speed_model], "draft", args.threads)  # imports, caches, model files
        for decode in ("full", "draft"):
            runs = [build(photos, base / f"speed-{decode}", paths[args.speed_model], decode, args.threads) for _ in range(args.rounds)]
            best = min(runs, key=lambda r: r["seconds"])
            speed[decode] = {
                "images_per_s": round(best["images"] / best["seconds"], 2),
                "decode_images_per_s": round(best["images"] / best["decode_seconds"], 2) if best["decode_seconds"] else None,
                **{k: round(v, 3) for k, v in best.items() if k != "images"},
            }
        speed["draft_speedup"] = {"build": round(speed["draft"]["images_per_s"] / speed["full"]["images_per_s"], 2)}
        quality = []
        for name in models:
            for decode in ("full", "draft"):
                build(photos, base / f"{name}-{decode}", paths[name], decode, args.threads)
            cos = draft_cosines(base / f"{name}-full", base / f"{name}-draft")
            quality.append({"model": name, "what": MODELS[name][2], "mean_cosine": round(sum(cos) / len(cos), 7),
                            "min_cosine": round(min(cos), 7), "passes_auto_gate": min(cos) >= 0.99999})
    mp = args.width * args.height / 1e6
    table = [f"{args.photos} JPEGs at {args.width}x{args.height} ({mp:.1f} MP), fp32 build on CPU, {args.speed_model}, "
             f"best of {args.rounds}",
             f"{'decode':<8} {'build img/s':>12} {'build s':>8} {'decode img/s/thread':>20}"]
    for decode in ("full", "draft"):
        row = speed[decode]
        table.append(f"{decode:<8} {row['images_per_s']:>12.2f} {row['seconds']:>8.2f} {row['decode_images_per_s'] or 0:>20.2f}")
    table += [f"draft is {speed['draft_speedup']['build']:.2f}x full", "",
              f"cosine of each file's draft vector to its full one ({args.photos} files)",
              f"{'model':<20} {'mean':>10} {'min':>10}  gate (min >= 0.99999)  what"]
    table += [f"{row['model']:<20} {row['mean_cosine']:>10.7f} {row['min_cosine']:>10.7f}  "
              f"{'passes' if row['passes_auto_gate'] else 'fails':<21}  {row['what']}" for row in quality]
    bench.report({"benchmark": "decode", "photos": args.photos, "size": [args.width, args.height], "jpeg_quality": 90,
                  "photos_seconds": round(made_s, 1), "speed_model": args.speed_model, "rounds": args.rounds, "speed": speed,
                  "quality": quality}, table)
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
