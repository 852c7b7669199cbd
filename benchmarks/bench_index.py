"""End-to-end indexing speed: clipsearch's indexer in every precision mode against a naive
baseline, in one run, with the quality gate of each reduced mode and the achieved GFLOP/s.

The baseline is what a hand-rolled script does: a plain loop of PIL open + the checkpoint's
processor + ``get_image_features`` (``CLIPModel``, or SigLIP's model for the SigLIP presets) over
the same files, same model, same batch size. All run on
the same generated 640x480 photo-like JPEGs with a randomly initialised model (weights do not
change speed). Prints one JSON line, then a readable table.

    python benchmarks/bench_index.py [--preset vit-b-32|vit-l-14|tiny|siglip-b-16|siglip2-naflex-b-16] [--images 256]
        [--batch-size N]
        [--modes fp32,int8,bf16,auto] [--workers N] [--threads N] [--device cpu|cuda]
        [--unique N] [--baseline-images N] [--sample-stacks DIR] [--steady]

On a GPU, where thousands of images pass per second, ``--unique`` generates fewer distinct
photos (in parallel) and fills the rest with copies; the quality gate then compares the distinct
images only (copies would tie in the top-10). ``--baseline-images`` times the naive loop on the
first N files only (it runs at a small fraction of the speed); its images/s is still per image.

``--steady`` also runs every pipeline (each mode and the naive loop) on the first half of its
files and reports the marginal rate, (N - N/2) / (t(N) - t(N/2)): the steady-state speed of a
long build, without the costs paid once per run (model load, weights fingerprint, ``auto``'s
calibration, FAISS set-up), which a whole-run figure on a few hundred images still carries.

``--peers onnxruntime,openvino`` (``_peers.py``) adds a model-only table in the same run: our
pipelines (``default``, ``fp32``, ``fp32-torch``, ``bf16-torch``, ``int8-torch``), the naive model call and each
peer's fp32, bf16 (OpenVINO) and int8 on the same decoded batches, batch size and threads, in steady state, ``--rounds``
interleaved rounds (``_model_only.py``); ``--peers ""`` gives ours alone. ``--skip-builds`` leaves
out the end-to-end builds. Each row has ``pipeline``, ``images_per_second``, ``x_naive``,
``mean_cosine`` and ``min_cosine`` against the naive loop's fp32 vectors; a peer that is not
installed is a row with ``skipped`` and why. The ONNX export our fp32 path caches is made once, in
the run's work directory (``CLIPSEARCH_ONNX_CACHE``), before anything is timed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from pathlib import Path

from _common import ROOT, StackSampler, peak_rss_mb
from _harness import Bench, note

# SigLIP shapes (retrieval.tools.random_model.siglip): the naive loop is then the SigLIP model's own
# processor and get_image_features, as for CLIP.
SIGLIP_BENCH_PRESETS = ("siglip-b-16", "siglip2-naflex-b-16", "siglip-tiny", "siglip2-naflex-tiny")

sys.path.insert(0, str(ROOT / "tests"))


def run_baseline(model_dir: Path, files: list[Path], batch_size: int, device: str) -> float:
    import torch
    from PIL import Image
    from transformers import AutoModel, AutoProcessor

    # Timed from model load, like build_index's figure (which also includes discovery, the
    # weights fingerprint and writing the index). AutoModel/AutoProcessor: CLIPModel and
    # CLIPProcessor for CLIP, the SigLIP (and SigLIP 2 NaFlex) model and processor for those.
    start = time.perf_counter()
    model = AutoModel.from_pretrained(model_dir).eval().to(device)
    proc = AutoProcessor.from_pretrained(model_dir)
    with torch.inference_mode():
        for i in range(0, len(files), batch_size):
            images = [Image.open(p).convert("RGB") for p in files[i : i + batch_size]]
            out = model.get_image_features(**proc(images=images, return_tensors="pt").to(device))
            feats = out.pooler_output if hasattr(out, "pooler_output") else out
            (feats / feats.norm(dim=-1, keepdim=True)).cpu().numpy()
    return time.perf_counter() - start


def run_ours(model_dir: Path, photos: Path, out: Path, batch_size: int | None, workers: int | None, threads: int | None,
             device: str, precision: str | None, files: list[str] | None = None) -> dict:
    from indexer import build_index

    shutil.rmtree(out, ignore_errors=True)
    return build_index(photos, out, model=str(model_dir), batch_size=batch_size, workers=workers, threads=threads,
                       device=device, precision=precision, files=files).to_dict()


def marginal_rate(n_all: int, seconds_all: float, n_part: int, seconds_part: float) -> float | None:
    """Images per second between a run on ``n_part`` images and one on ``n_all`` (fixed costs
    cancel); None where the longer run was not slower (noise larger than the work)."""
    if n_all <= n_part or seconds_all <= seconds_part:
        return None
    return (n_all - n_part) / (seconds_all - seconds_part)


def embeddings(index_dir: Path, names: set[str] | None = None):
    """The index's vectors in path order; only those of ``names`` when given."""
    import numpy as np

    from retrieval import ImageIndex

    index = ImageIndex.open(index_dir)
    paths = index.paths()
    order = np.array(sorted(range(len(paths)), key=paths.__getitem__), dtype=np.int64)
    if names is not None:
        order = np.array([i for i in order if paths[i] in names], dtype=np.int64)
    return index.embeddings()[order]


def _photo_jpeg(args: tuple[int, int, int]) -> bytes:
    from imagegen import _jpeg_bytes, photo_like

    return _jpeg_bytes(photo_like(*args))


def make_photos(root: Path, count: int, unique: int, size: tuple[int, int]) -> list[Path]:
    """``count`` JPEGs like ``imagegen.make_jpegs`` (image i = seed i), generated on every core;
    images from ``unique`` on are copies of the first ``unique``."""
    from multiprocessing import get_context

    root.mkdir(parents=True, exist_ok=True)
    unique = max(1, min(unique, count))
    with get_context("spawn").Pool(os.cpu_count() or 1) as pool:
        datas = pool.map(_photo_jpeg, [(size[0], size[1], i) for i in range(unique)], chunksize=16)
    paths = []
    for i in range(count):
        p = root / f"img_{i:06d}.jpg"
        p.write_bytes(datas[i % unique])
        paths.append(p)
    return paths


def gpu_facts(device: str) -> dict:
    import torch

    if not device.startswith("cuda") or not torch.cuda.is_available():
        return {}
    props = torch.cuda.get_device_properties(torch.device(device))
    return {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "multiprocessors": props.multi_processor_count, "torch": torch.__version__,
            "cuda": torch.version.cuda}


def flops_per_image(model_dir: Path) -> float:
    """FLOPs of one 640x480 image through the vision tower and its projection, as the
    checkpoint's own processor prepares it (FlopCounterMode: 2 per multiply-add)."""
    import torch
    from PIL import Image
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModel, AutoProcessor

    model = AutoModel.from_pretrained(model_dir).eval()
    inputs = AutoProcessor.from_pretrained(model_dir)(images=[Image.new("RGB", (640, 480))], return_tensors="pt")
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        model.get_image_features(**inputs)
    return float(counter.get_total_flops())


def cpu_peak_gflops() -> dict:
    """fp32 peak = cores x clock x 64 FLOP/cycle (2 AVX-512 FMA units x 16 lanes x 2 FLOP).

    The clock is /proc/cpuinfo's "cpu MHz" (a VM reports its nominal clock; turbo may be higher).
    With AVX-512 VNNI, int8 products peak 4x higher (vpdpbusd: 64 MACs per unit and cycle).
    """
    mhz = 0.0
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                mhz = float(line.split(":")[1])
                break
    except OSError:
        pass
    cores = os.cpu_count() or 1
    fp32 = cores * mhz / 1000 * 64
    return {"cores": cores, "mhz": mhz, "fp32_peak_gflops": round(fp32, 1), "int8_peak_gops": round(fp32 * 4, 1)}


def decode_per_core(files: list[Path], model_dir: Path) -> dict:
    """Decode + preprocess only, in this process with one torch thread: images/s per core."""
    import torch

    from retrieval.encoders import HFClipEncoder
    from retrieval.images import load_pixels

    cfg = HFClipEncoder.load(str(model_dir), device="cpu").preprocess
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = {}
    try:
        for draft in (True, False):
            t0 = time.perf_counter()
            for f in files:
                load_pixels(f, cfg, draft=draft)
            out["draft" if draft else "full"] = round(len(files) / (time.perf_counter() - t0), 1)
    finally:
        torch.set_num_threads(threads)
    return out


def main(argv: list[str] | None = None) -> int:
    bench = Bench("bench_index", __doc__, "threads", "work_dir")
    parser = bench.parser
    parser.add_argument("--preset", default="vit-b-32", choices=["vit-b-32", "vit-l-14", "tiny", *SIGLIP_BENCH_PRESETS])
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=None, help="default: the build's (64 on CPU, 512 on GPU)")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--unique", type=int, default=None, help="distinct photos (default: all); the rest are copies")
    parser.add_argument("--baseline-images", type=int, default=None, help="time the naive loop on this many files")
    parser.add_argument("--modes", default="fp32,int8,bf16,auto",
                        help="precision modes to run (fp32 is always run first; auto is the default of a new index)")
    parser.add_argument("--sample-stacks", type=Path, default=None, metavar="DIR",
                        help="write where each build's Python threads spent their time to DIR/stacks-MODE.txt "
                             "(collapsed stacks, sampled every 10 ms)")
    parser.add_argument("--steady", action="store_true",
                        help="also run each pipeline on half the files and report the marginal (steady-state) rate")
    parser.add_argument("--peers", default=None, metavar="LIST",
                        help="model-only rows of ours and these runtimes (onnxruntime,openvino; '' for ours alone)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the model-only rows (default 3)")
    parser.add_argument("--skip-builds", action="store_true", help="only the model-only rows (with --peers)")
    args = bench.parse(argv)
    if args.steady and args.images < 4:
        parser.error("--steady needs --images >= 4 (it also runs on half of them)")
    from _model_only import model_only, onnx_cache, pre_export
    from _model_only import table as model_only_table
    from _peers import parse_peers

    try:
        peers = None if args.peers is None else parse_peers(args.peers)
    except ValueError as exc:
        parser.error(str(exc))
    if args.skip_builds and peers is None:
        parser.error("--skip-builds needs --peers")
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")

    from retrieval.encoders.precision import gate
    from retrieval.tools.random_model import make_random_clip
    from retrieval.tools.random_model.siglip import make_random_siglip

    modes = [] if args.skip_builds else ["fp32"] + [m for m in args.modes.split(",") if m and m != "fp32"]
    runs: dict[str, dict] = {}
    model_rows = None
    with bench.scratch() as tmp_path, onnx_cache(tmp_path / "onnx"):
        make = make_random_siglip if args.preset in SIGLIP_BENCH_PRESETS else make_random_clip
        model_dir = make(tmp_path / "model", preset=args.preset, seed=0)
        unique = args.unique or args.images
        files = make_photos(tmp_path / "photos", args.images, unique, (640, 480))
        distinct = {f.name for f in files[:unique]} if unique < len(files) else None
        # Warm the page cache for every run alike.
        for f in files:
            f.read_bytes()
        decode = decode_per_core(files[: min(64, len(files))], model_dir)
        pre_export(model_dir)
        if peers is not None:
            threads = args.threads or os.cpu_count() or 1
            model_rows = model_only(model_dir, files, args.batch_size or 64, threads, peers, args.rounds)
            if args.skip_builds:
                bench.report({"bench": "index", "preset": args.preset, "images": len(files), "model_only": model_rows},
                             model_only_table(model_rows))
                return 0
        # Warm-up (imports, first FAISS write, allocator), not timed.
        from indexer import build_index

        build_index(tmp_path / "photos", tmp_path / "warm", model=str(model_dir), files=[f.name for f in files[:8]],
                    workers=0, device=args.device)
        ref = None
        for mode in modes:
            out = tmp_path / f"idx-{mode}"
            with StackSampler() if args.sample_stacks else contextlib.nullcontext() as sampler:
                r = run_ours(model_dir, tmp_path / "photos", out, args.batch_size, args.workers, args.threads, args.device, mode)
            vectors = embeddings(out, distinct)
            if ref is None:
                ref = vectors
            runs[mode] = {
                "images_per_second": r["images_per_second"],
                "seconds": r["seconds"],
                "precision": r["precision"],
                "workers": r["workers"],
                "threads": r["threads"],
                "batch_size": r["batch_size"],
                "stage_seconds": {k: r[f"{k}_seconds"] for k in ("decode", "encode", "write")},
                "model_images_per_second": round(r["embedded"] / r["encode_seconds"], 2) if r["encode_seconds"] else None,
                "gate": gate(mode, ref, vectors).to_dict() if mode != "fp32" else None,
            }
            if args.steady:
                half = [f.name for f in files[: len(files) // 2]]
                part = run_ours(model_dir, tmp_path / "photos", tmp_path / f"half-{mode}", args.batch_size, args.workers,
                                args.threads, args.device, mode, files=half)
                rate = marginal_rate(len(files), r["seconds"], len(half), part["seconds"])
                runs[mode]["steady"] = {"half_images": len(half), "half_seconds": part["seconds"],
                                        "images_per_second": None if rate is None else round(rate, 2)}
            if sampler is not None:
                path = sampler.write(args.sample_stacks / f"stacks-{mode}.txt")
                runs[mode]["stack_samples"] = {"file": str(path), "samples": sampler.samples}
                note(f"stacks of the {mode} build: {path} ({sampler.samples} samples)")
        ours_rss = peak_rss_mb()
        base_files = files[: args.baseline_images] if args.baseline_images else files
        # The naive loop at the build's batch size.
        batch_size = next(iter(runs.values()))["batch_size"]
        base_s = run_baseline(model_dir, base_files, batch_size, args.device)
        base_half = base_files[: len(base_files) // 2]
        base_half_s = run_baseline(model_dir, base_half, batch_size, args.device) if args.steady else None
        flops = flops_per_image(model_dir)

    base_ips = len(base_files) / base_s
    base_steady = (marginal_rate(len(base_files), base_s, len(base_half), base_half_s)
                   if base_half_s is not None else None)
    # Rounded once, as each mode's steady rate is, so that a steady ratio is the quotient of the
    # two rates printed (and recorded) beside it.
    base_steady = None if base_steady is None else round(base_steady, 2)
    peak = cpu_peak_gflops()
    for run in runs.values():
        run["speedup"] = round(run["images_per_second"] / base_ips, 3)
        steady = run.get("steady")
        if steady is not None:
            ok = steady["images_per_second"] is not None and bool(base_steady)  # None, or 0.0 once rounded
            steady["speedup"] = round(steady["images_per_second"] / base_steady, 3) if ok else None
        mips = run["model_images_per_second"]
        run["model_gflops"] = round(flops * mips / 1e9, 1) if mips else None
        run["end_to_end_gflops"] = round(flops * run["images_per_second"] / 1e9, 1)
    result = {
        "bench": "index", "preset": args.preset, "images": len(files), "image_size": [640, 480], "batch_size": batch_size,
        "device": args.device, "modes": runs, "unique_images": unique, "baseline_images": len(base_files),
        "baseline_images_per_second": round(base_ips, 2), "baseline_seconds": round(base_s, 3),
        "baseline_steady_images_per_second": base_steady, "gflop_per_image": round(flops / 1e9, 3), "cpu_peak": peak,
        "decode_images_per_second_per_core": decode, "peak_rss_mb_after_ours": round(ours_rss, 1), "gpu": gpu_facts(args.device),
    }
    if model_rows is not None:
        result["model_only"] = model_rows
    table = [*model_only_table(model_rows), ""] if model_rows is not None else []
    table.append(f"{'pipeline':<46}{'images/s':>10}{'seconds':>9}{'model img/s':>13}{'GFLOP/s':>9}{'x naive':>9}"
                 "  gate (mean / min cosine, top-10 overlap)")
    for mode, run in runs.items():
        g = run["gate"]
        gate_text = ("reference" if g is None else
                     f"{g['mean_cosine']:.6f} / {g['min_cosine']:.6f}, {g['topk_overlap']:.3f} {'pass' if g['passed'] else 'FAIL'}")
        label = f"build_index --precision {mode}" + (f" (default: {run['precision']})" if mode == "auto" else "")
        table.append(f"{label:<46}{run['images_per_second']:>10.2f}{run['seconds']:>9.2f}{run['model_images_per_second'] or 0:>13.2f}"
                     f"{run['model_gflops'] or 0:>9.1f}{run['speedup']:>8.2f}x  {gate_text}")
    table.append(f"{'naive CLIPProcessor loop':<46}{base_ips:>10.2f}{base_s:>9.2f}{'':>13}{'':>9}{1:>8.2f}x"
                 + (f"  ({len(base_files)} images)" if len(base_files) != len(files) else ""))
    if args.steady:
        table += ["", f"steady state: marginal rate between {len(files) // 2} and {len(files)} images "
                      f"(naive loop: {len(base_half)} and {len(base_files)})"]
        for mode, run in runs.items():
            st = run["steady"]
            shown = "noise" if st["images_per_second"] is None else f"{st['images_per_second']:.2f}"
            ratio = "" if st["speedup"] is None else f"{st['speedup']:.2f}x"
            table.append(f"{'build_index --precision ' + mode:<46}{shown:>10}{ratio:>40}")
        table.append(f"{'naive CLIPProcessor loop':<46}{'noise' if base_steady is None else f'{base_steady:.2f}':>10}{'1.00x':>40}")
    if result["gpu"]:
        g = result["gpu"]
        table.append(f"{flops / 1e9:.2f} GFLOP per image; {g['gpu']} ({g['multiprocessors']} SMs), torch {g['torch']}, CUDA {g['cuda']}")
    else:
        table.append(f"{flops / 1e9:.2f} GFLOP per image; CPU fp32 peak {peak['fp32_peak_gflops']} GFLOP/s "
                     f"({peak['cores']} cores x {peak['mhz']:.0f} MHz x 64), int8 peak {peak['int8_peak_gops']} GOP/s")
    table.append(f"decode + preprocess only, 1 thread: {decode['draft']} img/s with JPEG draft, {decode['full']} img/s without")
    table.append(f"({args.preset}, {len(files)} JPEGs 640x480 ({unique} distinct), batch {batch_size}, {args.device})")
    bench.report(result, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
