"""Vision tower alone: fp32 against the int8 schemes we tried, side by side in one run.

For each: images/s on one batch of random pixels (best of ``--reps``), per-image cosine to the
fp32 vectors (mean, min), and how far a vector moves with its batch-mates (max abs difference
between each of the first images embedded alone and in the batch; 0 means bit-identical).

- ``fp32``: the reference (``CLIPVisionModelWithProjection``, eager).
- ``int8 per-batch``: ``torch.ao.quantization.quantize_dynamic`` (fbgemm), what clipsearch
  used before: one activation scale per batch.
- ``int8 per-row``: clipsearch's ``--precision int8`` (``retrieval.encoders.int8``), with this
  CPU's kernel (8-bit activation codes with int8 dot products, 7-bit without); where that is
  8-bit, also ``int8 per-row, 7-bit codes`` (what an AVX2 CPU runs, for its accuracy).
- ``onnxruntime fp32`` / ``onnxruntime int8``: the tower exported to ONNX and, for int8,
  ``onnxruntime.quantization.quantize_dynamic`` (one activation scale per call), also run one
  image per call (batch-free that way); only when ``onnxruntime`` and ``onnx`` are installed
  (they are not dependencies of clipsearch).

``--products`` adds one row per distinct ``nn.Linear`` shape of the tower (rows = batch x tokens):
fp32's product (``F.linear``) against clipsearch's int8 product alone (as ``Int8Linear`` calls its
kernel, on codes made beforehand) and against the whole ``Int8Linear`` (quantising the input per
row, the product, dequantising). The product's ratio bounds what int8 can give on this CPU: on
AVX2 (``vpmaddubsw``) it stays near 2x fp32's, whatever the code around it does.

All run inside ``indexer.heap.retained_heap`` (freed memory kept for reuse), as ``build_index``
embeds; ``--system-malloc`` runs them with glibc's defaults instead (ONNX Runtime has its own
arena either way).

    python benchmarks/bench_int8.py [--preset vit-b-32|vit-l-14|tiny] [--batch 32] [--reps 3] [--threads N]
        [--system-malloc] [--open-clip] [--products]
"""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
from _harness import Bench


def _timed(run: Callable[[np.ndarray], np.ndarray], x: np.ndarray, reps: int) -> tuple[float, np.ndarray]:
    run(x[:2])  # warm-up: primitive creation, allocator
    best, out = float("inf"), None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = run(x)
        best = min(best, time.perf_counter() - t0)
    assert out is not None
    return len(x) / best, out


def _normalised(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _measure(runners: dict[str, Callable[[np.ndarray], np.ndarray]], x: np.ndarray, reps: int) -> dict[str, dict]:
    """Speed, cosine to the first runner's vectors, and movement with the batch, per runner."""
    rows: dict[str, dict] = {}
    ref = None
    for name, run in runners.items():
        ips, out = _timed(run, x, reps)
        vectors = _normalised(out)
        ref = vectors if ref is None else ref
        cos = np.sum(ref.astype(np.float64) * vectors, axis=1)
        alone = np.concatenate([_normalised(run(x[i : i + 1])) for i in range(min(4, len(x)))])
        rows[name] = {
            "images_per_second": round(ips, 2),
            "mean_cosine": round(float(cos.mean()), 6),
            "min_cosine": round(float(cos.min()), 6),
            "batch_dependence": float(np.abs(alone - vectors[: len(alone)]).max()),
        }
    return rows


def _onnx_runners(model, x: np.ndarray, tmp: Path, threads: int) -> dict[str, Callable[[np.ndarray], np.ndarray]]:
    try:
        import onnxruntime as ort
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError:
        return {}
    import torch

    class Tower(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, pixels):
            return self.m(pixel_values=pixels).image_embeds

    fp32, int8 = tmp / "tower.onnx", tmp / "tower-int8.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Tower(model), (torch.from_numpy(x[:2]),), str(fp32), input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "b"}, "y": {0: "b"}}, opset_version=17, dynamo=False)
        quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    runners = {}
    for name, path in (("onnxruntime fp32", fp32), ("onnxruntime int8", int8)):
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        runners[name] = lambda a, s=session: s.run(None, {"x": a})[0]
    # One image per call: what it takes for ORT's per-tensor int8 to keep a vector batch-free.
    runners["onnxruntime int8, 1 per call"] = lambda a, s=session: np.concatenate(
        [s.run(None, {"x": a[i : i + 1]})[0] for i in range(len(a))]
    )
    return runners


def _open_clip_rows(x: np.ndarray, reps: int) -> dict[str, dict]:
    import open_clip
    import torch

    from retrieval.encoders.int8 import quantize_int8

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = open_clip.create_model("ViT-B-32", pretrained=None).eval()
    def runner(m) -> Callable[[np.ndarray], np.ndarray]:
        def run(a: np.ndarray) -> np.ndarray:
            with torch.inference_mode():
                return m.encode_image(torch.from_numpy(a)).numpy()
        return run

    return _measure({"open_clip fp32": runner(model), "open_clip int8 per-row": runner(quantize_int8(model))}, x, reps)


def _product_rows(model, rows: int, reps: int, kernel) -> list[dict]:
    """Each distinct linear shape of ``model`` timed alone on ``rows`` rows (best of ``reps``)."""
    import torch
    import torch.nn.functional as F

    from retrieval.encoders.int8 import Int8Linear
    from retrieval.encoders.int8.codes import shifted_row_codes

    shapes: dict[tuple[int, int], torch.nn.Linear] = {}
    for module in model.vision_model.encoder.modules():
        if isinstance(module, torch.nn.Linear):
            shapes.setdefault((module.in_features, module.out_features), module)
    hidden = model.config.hidden_size
    fused = torch.nn.Linear(hidden, 3 * hidden)  # q, k and v run as one product in int8 (and here in fp32)
    shapes.setdefault((hidden, 3 * hidden), fused)

    def best(run: Callable[[], object]) -> float:
        run()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
        return min(times)

    out = []
    generator = torch.Generator().manual_seed(0)
    for (k, n), linear in sorted(shapes.items()):
        x = torch.randn(rows, k, generator=generator)
        int8 = Int8Linear(linear, kernel=kernel)
        with torch.inference_mode():
            shifted = shifted_row_codes(x.clone(), steps=kernel.steps)[0].contiguous()
            fp32 = best(lambda: F.linear(x, linear.weight, linear.bias))  # noqa: B023 - called in this iteration
            product = best(lambda: int8._scaled_product(shifted))  # noqa: B023
            whole = best(lambda: int8(x))  # noqa: B023
        ops = 2.0 * rows * k * n
        # The best times as measured, so that every figure below can be recomputed from the JSON.
        out.append({"in": k, "out": n, "rows": rows, "fp32_seconds": fp32, "int8_product_seconds": product,
                    "int8_layer_seconds": whole, "fp32_gflops": _sig(ops / fp32 / 1e9),
                    "int8_product_gops": _sig(ops / product / 1e9), "int8_layer_gops": _sig(ops / whole / 1e9),
                    "product_x_fp32": round(fp32 / product, 2), "layer_x_fp32": round(fp32 / whole, 2)})
    return out


def _sig(value: float) -> float:
    """Three significant figures: a rate of a tiny shape on a loaded machine stays above zero."""
    return float(f"{value:.3g}")


def main(argv: list[str] | None = None) -> int:
    bench = Bench("bench_int8", __doc__, "threads")
    parser = bench.parser
    parser.add_argument("--preset", default="vit-b-32", choices=["vit-b-32", "vit-l-14", "tiny"])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--system-malloc", action="store_true", help="do not keep freed memory for reuse")
    parser.add_argument("--open-clip", action="store_true",
                        help="also open_clip's ViT-B-32 (random weights) in fp32 and per-row int8 (fp32 is its own reference)")
    parser.add_argument("--products", action="store_true",
                        help="also time each linear layer shape alone: fp32 product, int8 product, whole Int8Linear")
    args = bench.parse(argv)

    import contextlib

    from indexer.heap import retained_heap

    with contextlib.nullcontext(False) if args.system_malloc else retained_heap() as heap:
        return _run(bench, heap)


def _run(bench: Bench, heap: bool) -> int:
    import torch
    from transformers import CLIPVisionModelWithProjection

    from retrieval.encoders.base import quiet_transformers
    from retrieval.encoders.int8 import FULL_STEPS, REDUCED_STEPS, current_kernel, quantize_int8
    from retrieval.tools.random_model import make_random_clip

    args = bench.args
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    with bench.scratch() as tmp:
        model_dir = make_random_clip(tmp / "model", preset=args.preset, seed=0)
        with quiet_transformers():
            model = CLIPVisionModelWithProjection.from_pretrained(model_dir).eval()
        size = model.config.image_size
        x = np.random.default_rng(0).normal(size=(args.batch, 3, size, size)).astype(np.float32)

        def torch_runner(m) -> Callable[[np.ndarray], np.ndarray]:
            def run(a: np.ndarray) -> np.ndarray:
                with torch.inference_mode():
                    return m(pixel_values=torch.from_numpy(a)).image_embeds.numpy()
            return run

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch announces eager quantisation's move to torchao
            from torch.ao.quantization import quantize_dynamic

            per_batch = quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8)
        kernel = current_kernel()
        runners = {
            "fp32": torch_runner(model),
            "int8 per-batch (fbgemm)": torch_runner(per_batch),
            "int8 per-row (clipsearch)": torch_runner(quantize_int8(model, kernel)),
        }
        if kernel.steps == FULL_STEPS:
            # What a CPU without int8 dot products runs (7-bit codes), here with this CPU's kernels.
            runners["int8 per-row, 7-bit codes"] = torch_runner(quantize_int8(model, replace(kernel, steps=REDUCED_STEPS)))
        runners.update(_onnx_runners(model, x, tmp, threads))
        results = _measure(runners, x, args.reps)
        tokens = (size // model.config.patch_size) ** 2 + 1
        products = _product_rows(model, args.batch * tokens, args.reps, kernel) if args.products else []
        if args.open_clip:
            results.update(_open_clip_rows(x if size == 224 else np.random.default_rng(0).normal(
                size=(args.batch, 3, 224, 224)).astype(np.float32), args.reps))
    base = results["fp32"]["images_per_second"]
    for name, r in results.items():
        r["x_fp32"] = round(r["images_per_second"] / (results["open_clip fp32"]["images_per_second"]
                                                      if name.startswith("open_clip") else base), 2)
    table = [f"{'vision tower':<28}{'images/s':>10}{'x fp32':>8}{'mean cos':>10}{'min cos':>10}{'moves with batch':>18}"]
    table += [f"{name:<28}{r['images_per_second']:>10.1f}{r['x_fp32']:>8.2f}{r['mean_cosine']:>10.6f}"
              f"{r['min_cosine']:>10.6f}{r['batch_dependence']:>18.2e}" for name, r in results.items()]
    if products:
        table += ["", f"{'linear layer (rows x in -> out)':<34}{'fp32 GFLOP/s':>14}{'int8 product':>14}{'x fp32':>8}"
                      f"{'int8 layer':>12}{'x fp32':>8}"]
        table += [f"{p['rows']} x {p['in']} -> {p['out']:<20}{p['fp32_gflops']:>14.1f}{p['int8_product_gops']:>14.1f}"
                  f"{p['product_x_fp32']:>8.2f}{p['int8_layer_gops']:>12.1f}{p['layer_x_fp32']:>8.2f}" for p in products]
    table.append(f"({args.preset}, batch {args.batch} of random pixels, {threads} threads, best of {args.reps}, "
                 f"{'freed memory kept for reuse' if heap else 'glibc malloc defaults'}; clipsearch's int8: {kernel.steps} steps)")
    bench.report({"bench": "int8", "preset": args.preset, "batch": args.batch, "threads": threads, "retained_heap": heap,
                  "results": results, "products": products}, table)
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
