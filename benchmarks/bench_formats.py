"""Decode + preprocess throughput per photo format, on the same photographs, in one run.

scikit-image's bundled photos (astronaut, chelsea, coffee, rocket, motorcycle) are resized so
their longer side is ``--size`` pixels, then written as JPEG (quality 90), HEIC (pillow-heif,
quality 90), AVIF (Pillow, quality 90), and DNG twice: with an embedded RGB preview as large as
the photo (``RAW preview``: the preview is decoded) and without one (``RAW demosaic``: the
16-bit RGGB mosaic is demosaiced by LibRaw with the camera's white balance). Each file is
decoded from memory and preprocessed for a 224 px CLIP model (``load_pixels``: what an indexer
worker does per file) on one thread, ``--rounds`` times; the table gives images/s and the ratio
to JPEG, and the JSON line records the machine.

    python benchmarks/bench_formats.py [--size 1024] [--rounds 5]
"""

from __future__ import annotations

import io
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _harness import Bench  # noqa: E402

FORMATS = ("JPEG", "HEIC", "AVIF", "RAW preview", "RAW demosaic")
SUFFIX = {"JPEG": ".jpg", "HEIC": ".heic", "AVIF": ".avif", "RAW preview": ".dng", "RAW demosaic": ".dng"}


def encode_all(size: int, tmp: Path) -> dict[str, list[bytes]]:
    """Each photo in each format, as bytes."""
    from photos import PHOTOS, encoded, photo, write_dng
    from PIL import Image

    out: dict[str, list[bytes]] = {name: [] for name in FORMATS}
    for name in PHOTOS:
        img = photo(name, max_side=10_000)
        scale = size / max(img.size)
        img = img.resize((max(2, round(img.width * scale)), max(2, round(img.height * scale))), Image.Resampling.LANCZOS)
        out["JPEG"].append(encoded(img, "JPEG", quality=90))
        out["HEIC"].append(encoded(img, "HEIF", quality=90))
        out["AVIF"].append(encoded(img, "AVIF", quality=90))
        out["RAW preview"].append(write_dng(tmp / "p.dng", img, preview=True).read_bytes())
        out["RAW demosaic"].append(write_dng(tmp / "d.dng", img, preview=False).read_bytes())
    return out


def measure(files: list[bytes], suffix: str, rounds: int) -> tuple[float, str]:
    """images/s of decode + preprocess over ``files`` (one thread), and the RAW source used."""
    import torch

    from retrieval.images import PreprocessConfig, decode_image, load_pixels

    torch.set_num_threads(1)
    cfg = PreprocessConfig()
    source = decode_image(io.BytesIO(files[0]), min_edge=cfg.min_decode_edge, name=f"x{suffix}").meta.raw_source or ""
    for data in files:  # warm-up: libraries loaded, caches filled
        load_pixels(io.BytesIO(data), cfg, name=f"x{suffix}")
    t0 = time.perf_counter()
    for _ in range(rounds):
        for data in files:
            load_pixels(io.BytesIO(data), cfg, name=f"x{suffix}")
    return rounds * len(files) / (time.perf_counter() - t0), source


def main(argv: list[str] | None = None) -> int:
    bench = Bench("bench_formats", __doc__)
    bench.parser.add_argument("--size", type=int, default=1024, help="longer side of the photos in pixels (default 1024)")
    bench.parser.add_argument("--rounds", type=int, default=5, help="passes over the photos per format (default 5)")
    args = bench.parse(argv)
    if args.size < 232 or args.rounds < 1:
        bench.parser.error("--size must be >= 232 (the RAW preview must cover the model's 224 px) and --rounds >= 1")
    with bench.scratch() as tmp:
        files = encode_all(args.size, tmp)
    rows = []
    for name in FORMATS:
        rate, source = measure(files[name], SUFFIX[name], args.rounds)
        mean_kb = sum(len(f) for f in files[name]) / len(files[name]) / 1024
        rows.append({"format": name, "images_per_s": round(rate, 1), "raw_source": source or None, "mean_file_kb": round(mean_kb, 1)})
    jpeg = rows[0]["images_per_s"]
    for row in rows:
        row["vs_jpeg"] = round(float(row["images_per_s"]) / float(jpeg), 3)  # type: ignore[arg-type]  # numbers above
    table = [f"decode + preprocess to 224 px, one thread, {len(files['JPEG'])} photos at {args.size} px (longer side)",
             f"{'format':<14} {'images/s':>9} {'vs JPEG':>8} {'file KiB':>9}  source"]
    table += [f"{r['format']:<14} {r['images_per_s']:>9.1f} {r['vs_jpeg']:>7.2f}x {r['mean_file_kb']:>9.1f}  {r['raw_source'] or ''}"
              for r in rows]
    bench.report({"benchmark": "formats", "size": args.size, "photos": len(files["JPEG"]), "rounds": args.rounds, "threads": 1,
                  "model_input": 224, "results": rows}, table)
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
