"""End-to-end indexing speed: clipsearch's indexer against a naive baseline, in one run.

The baseline is what a hand-rolled script does: a plain loop of PIL open + ``CLIPProcessor`` +
``CLIPModel.get_image_features`` over the same files, same model, same batch size. Both run on
the same generated 640x480 photo-like JPEGs with a randomly initialised model (weights do not
change speed). Prints one JSON line, then a readable table.

    python benchmarks/bench_index.py [--preset vit-b-32|tiny] [--images 256] [--batch-size 64]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, machine_facts, peak_rss_mb

sys.path.insert(0, str(ROOT / "tests"))


def run_baseline(model_dir: Path, files: list[Path], batch_size: int, device: str) -> float:
    import torch
    from PIL import Image
    from transformers import CLIPModel, CLIPProcessor

    # Timed from model load, like build_index's figure (which also includes discovery, the
    # weights fingerprint and writing the index).
    start = time.perf_counter()
    model = CLIPModel.from_pretrained(model_dir).eval().to(device)
    proc = CLIPProcessor.from_pretrained(model_dir)
    with torch.inference_mode():
        for i in range(0, len(files), batch_size):
            images = [Image.open(p).convert("RGB") for p in files[i : i + batch_size]]
            out = model.get_image_features(**proc(images=images, return_tensors="pt").to(device))
            feats = out.pooler_output if hasattr(out, "pooler_output") else out
            (feats / feats.norm(dim=-1, keepdim=True)).cpu().numpy()
    return time.perf_counter() - start


def run_ours(model_dir: Path, photos: Path, out: Path, batch_size: int, workers: int | None, device: str) -> dict:
    from indexer import build_index

    return build_index(photos, out, model=str(model_dir), batch_size=batch_size, workers=workers, device=device).to_dict()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="vit-b-32", choices=["vit-b-32", "tiny"])
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)

    from imagegen import make_jpegs
    from retrieval.random_model import make_random_clip

    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        model_dir = make_random_clip(tmp_path / "model", preset=args.preset, seed=0)
        files = make_jpegs(tmp_path / "photos", args.images, size=(640, 480))
        # Warm the page cache for both runs alike.
        for f in files:
            f.read_bytes()
        ours = run_ours(model_dir, tmp_path / "photos", tmp_path / "idx", args.batch_size, args.workers, args.device)
        ours_rss = peak_rss_mb()
        base_s = run_baseline(model_dir, files, args.batch_size, args.device)
        base_rss = peak_rss_mb()

    base_ips = len(files) / base_s
    result = {
        "bench": "index",
        "date": time.strftime("%Y-%m-%d"),
        "preset": args.preset,
        "images": len(files),
        "image_size": [640, 480],
        "batch_size": args.batch_size,
        "device": args.device,
        "ours_images_per_second": ours["images_per_second"],
        "ours_seconds": ours["seconds"],
        "ours_workers": ours["workers"],
        "ours_stage_seconds": {k: ours[f"{k}_seconds"] for k in ("decode", "encode", "write")},
        "baseline_images_per_second": round(base_ips, 2),
        "baseline_seconds": round(base_s, 3),
        "speedup": round(ours["images_per_second"] / base_ips, 3),
        # ru_maxrss is the peak of the whole process; the baseline ran second, so its figure
        # is the peak over both runs.
        "peak_rss_mb_after_ours": round(ours_rss, 1),
        "peak_rss_mb_after_baseline": round(base_rss, 1),
        "machine": machine_facts(),
    }
    print(json.dumps(result))
    print()
    print(f"{'pipeline':<28}{'images/s':>10}{'seconds':>10}")
    print(f"{'clipsearch build_index':<28}{ours['images_per_second']:>10.2f}{ours['seconds']:>10.2f}")
    print(f"{'naive CLIPProcessor loop':<28}{base_ips:>10.2f}{base_s:>10.2f}")
    print(f"speedup {result['speedup']:.2f}x  ({args.preset}, {len(files)} JPEGs 640x480, batch {args.batch_size}, {args.device})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
