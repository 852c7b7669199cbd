"""Model-only rows of ``bench_index.py --peers``: every pipeline on the same pixel batches.

The files are decoded and preprocessed once by our own pipeline (``load_pixels``, JPEG draft as
a build does) into batches of the build's size; then each pipeline embeds all of them, after
one untimed batch (sessions, arenas, ``auto``'s calibration, exports: steady state). Rounds
are interleaved (every pipeline once per round), so a burst of load from other processes
falls on all of them alike; a row's figure is its best round, every round is recorded.
Vectors are compared with the naive loop's (Hugging Face ``get_image_features`` in fp32) on
the same images: mean and min cosine; and each pipeline's own vector of an image embedded alone
with the one it gave in its batch (``batch_dependence``, max absolute difference).

Ours: ``default`` (``precision="auto"``, the mode its gate picks on the first batch, and the
runtime that runs it), ``fp32`` (``precision="fp32"``: OpenVINO or ONNX Runtime where
installed, see ``retrieval.encoders.runtime``), ``fp32-torch``, ``bf16-torch`` and ``int8-torch``
(those modes on torch, ``CLIPSEARCH_IMAGE_RUNTIME=torch``; ``bf16-torch`` is what ``auto`` ran with
AMX before the bf16 tower on OpenVINO), ``naive``.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
from _peers import Embed, _normalise, describe, export_vision, vision_pipelines

from retrieval.encoders.base import first_line


def env(name: str, value: str) -> contextlib.AbstractContextManager[Any]:
    """``name=value`` in this process's environment for the block, the environment as it was after."""
    return mock.patch.dict(os.environ, {name: value})


def decode_batches(files: list[Path], model_dir: Path, batch_size: int) -> list[np.ndarray]:
    """The files through our decode and preprocessing, stacked in batches."""
    import torch

    from retrieval.encoders import HFClipEncoder
    from retrieval.images import load_pixels

    cfg = HFClipEncoder.load(str(model_dir), device="cpu").preprocess
    pixels = [load_pixels(f, cfg)[0] for f in files]
    return [torch.stack(pixels[i : i + batch_size]).numpy() for i in range(0, len(pixels), batch_size)]


def ours(model_dir: Path, first: np.ndarray) -> dict[str, Embed]:
    """Our pipelines and the naive one, each ready (loaded, calibrated, exported) on ``first``."""
    import torch
    from transformers import AutoModel

    from retrieval.encoders import load_encoder
    from retrieval.encoders.chooser import RUNTIME_ENV

    hf = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()

    def naive(x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            out = hf.get_image_features(pixel_values=torch.from_numpy(x))
        return _normalise((out.pooler_output if hasattr(out, "pooler_output") else out).numpy())

    out: dict[str, Embed] = {"naive": naive}
    pipelines = (
        ("default", "auto", "auto"), ("fp32", "fp32", "auto"), ("fp32-torch", "fp32", "torch"), ("bf16-torch", "bf16", "torch"),
        ("int8-torch", "int8", "torch"),
    )
    for name, precision, runtime in pipelines:
        enc = load_encoder(str(model_dir), device="cpu", precision=precision)
        with env(RUNTIME_ENV, runtime):
            enc.embed_pixels(torch.from_numpy(first))  # calibrates auto, chooses the runtime
        out[name] = (lambda e: lambda x: e.embed_pixels(torch.from_numpy(x)))(enc)
        out[name].encoder = enc  # type: ignore[attr-defined]
    return out


def model_only(model_dir: Path, files: list[Path], batch_size: int, threads: int, peers: list[str], rounds: int) -> dict[str, Any]:
    """Rows for every pipeline (ours, naive, the peers'), and the facts of the run."""
    import torch

    torch.set_num_threads(threads)
    batches = decode_batches(files, model_dir, batch_size)
    pipes: dict[str, Embed | str] = dict(ours(model_dir, batches[0]))
    skipped: dict[str, str] = {}
    peer_pipes = vision_pipelines(peers, export_vision(model_dir), threads) if peers else {}
    pipes.update(peer_pipes)
    runnable: dict[str, Embed] = {}
    for name, p in pipes.items():
        if isinstance(p, str):
            skipped[name] = p
            continue
        try:
            p(batches[0])  # steady state: the first call pays set-up
        except Exception as exc:  # noqa: BLE001  (a peer's runtime raises its own errors)
            if name not in peer_pipes:
                raise  # ours failing is a bug to see, not a row to skip
            skipped[name] = f"failed on the first batch here: {first_line(exc)}"
            continue
        runnable[name] = p
    times: dict[str, list[float]] = {name: [] for name in runnable}
    faults: dict[str, list[int]] = {name: [] for name in runnable}
    vectors: dict[str, np.ndarray] = {}
    for _ in range(rounds):
        for name, embed in runnable.items():
            f0 = minor_faults()
            t0 = time.perf_counter()
            got = [embed(b) for b in batches]
            times[name].append(time.perf_counter() - t0)
            faults[name].append(minor_faults() - f0)
            vectors[name] = np.concatenate(got)
    # An update equals a rebuild only if an image's vector does not depend on the images batched
    # with it: the first two images embedded alone against their rows in the full first batch.
    alone = {name: np.concatenate([embed(batches[0][i : i + 1]) for i in range(min(2, len(batches[0])))])
             for name, embed in runnable.items()}
    n = sum(len(b) for b in batches)
    ref = vectors["naive"]
    naive_ips = n / min(times["naive"])
    rows = []
    for name, ts in times.items():
        ips = n / min(ts)
        cos = np.sum(vectors[name].astype(np.float64) * ref, axis=1)
        row: dict[str, Any] = {
            "pipeline": name, "images_per_second": round(ips, 2), "x_naive": round(ips / naive_ips, 3),
            "mean_cosine": round(float(cos.mean()), 6), "min_cosine": round(float(cos.min()), 6),
            "rounds_images_per_second": [round(n / t, 2) for t in ts],
            "batch_dependence": float(np.abs(alone[name] - vectors[name][: len(alone[name])]).max()),
            # Fresh pages the kernel zeroed for it, per image (fewest of the rounds): a count, so it
            # does not move with the load from other processes as times do.
            "page_faults_per_image": round(min(faults[name]) / n, 1),
        }
        enc = getattr(runnable[name], "encoder", None)
        if enc is not None:
            info = enc.info
            row["precision"] = info.get("precision")
            row["image_runtime"] = info.get("image_runtime", "torch")
        rows.append(row)
    rows += [{"pipeline": name, "skipped": why, "images_per_second": None, "mean_cosine": None} for name, why in skipped.items()]
    return {"images": n, "batch_size": batch_size, "threads": threads, "rounds": rounds, "rows": rows, "peers": describe(peers)}


def minor_faults() -> int:
    """Minor page faults of this process so far (every thread's): pages the kernel mapped
    and zeroed on first touch."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def table(result: dict[str, Any]) -> list[str]:
    lines = [f"model only, steady state ({result['images']} images, batch {result['batch_size']}, {result['threads']} threads, "
             f"best of {result['rounds']} interleaved rounds); cosine to the naive loop's HF fp32 vectors",
             f"{'pipeline':<20}{'images/s':>10}{'x naive':>9}{'mean cos':>11}{'min cos':>11}{'batch dep':>11}{'faults/img':>11}"
             "  rounds / notes"]
    for r in result["rows"]:
        if r.get("skipped"):
            lines.append(f"{r['pipeline']:<20}{'skipped':>10}  {r['skipped']}")
            continue
        note = " ".join(f"{x:.1f}" for x in r["rounds_images_per_second"])
        if r.get("precision"):
            note += f"  ({r['precision']} on {r['image_runtime']})"
        lines.append(f"{r['pipeline']:<20}{r['images_per_second']:>10.2f}{r['x_naive']:>8.2f}x"
                     f"{r['mean_cosine']:>11.6f}{r['min_cosine']:>11.6f}{r['batch_dependence']:>11.1e}"
                     f"{r['page_faults_per_image']:>11.1f}  {note}")
    lines.append("batch dep: max |difference| of an image's normalised vector embedded alone and in its batch (0: an update "
                 "equals a rebuild); faults/img: minor page faults per image (fresh pages zeroed by the kernel)")
    return lines


def onnx_cache(path: Path) -> contextlib.AbstractContextManager[Any]:
    """ONNX exports of this run in its work directory, not the user's cache."""
    from retrieval.encoders.runtime.export import ONNX_CACHE_ENV

    return env(ONNX_CACHE_ENV, str(path))


def pre_export(model_dir: Path) -> None:
    """Our fp32 path's ONNX export, made before anything is timed (once per model, like a download)."""
    import importlib.util

    if importlib.util.find_spec("onnx") is None:
        return
    from retrieval.errors import ModelLoadError

    try:
        export_vision(model_dir)
    except ModelLoadError:
        # A tower the runtime does not take (SigLIP 2 NaFlex: its forward needs the patch mask
        # and shapes): the builds run it on torch, as they would for a user.
        return

