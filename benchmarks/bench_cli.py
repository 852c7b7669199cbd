"""Cold-shell CLI latency: whole-process wall time and peak memory of ``clipsearch`` commands.

What a user sees from a shell: every measured command is a fresh Python process (the page
cache warm, as on a second call). For one index it runs, interleaved run by run (A B C D E,
A B C D E, ... after one warm-up round, so drift hits all commands alike):

* ``search``: ``clipsearch search INDEX QUERY`` (the default, ``auto``, which in a one-shot
  search is the fp32 numpy text path where the checkpoint allows it, see ``text_path``);
* ``search (int8)``: the same with ``--precision int8``: what a one-shot search would pay if
  ``auto`` took int8 products (importing torch, quantising the tower); its difference to
  ``search`` is the set-up that ``retrieval.encoders.text_choice.ONE_SHOT_TEXTS`` weighs;
* ``search (torch)``: the same with ``CLIPSEARCH_TEXT_RUNTIME=torch --precision fp32``, i.e. the
  transformers text tower every search used before;
* ``search --image``: an image query, on the tower the index recorded (OpenVINO, ONNX Runtime
  or torch), reopened without torch's model where this machine remembers its checks
  (``retrieval.encoders.recorded_tower``; the build that made the index remembered them);
* ``search --image (full)``: the same with ``CLIPSEARCH_RUNTIME_CHECKS=off``: the full encoder
  (transformers, torch's tower, the checks) before the tower runs, as before that;
* ``info``: ``clipsearch info INDEX``;
* ``hf script``: the minimal Hugging Face script for the same query (import transformers, load
  ``CLIPTextModelWithProjection`` and the tokenizer, encode the text), the baseline.

Wall time is ``time.perf_counter`` around each process; peak memory is that process's own
``ru_maxrss`` (``os.wait4``). Medians, minima and maxima over ``--runs``; the goal check is
``search`` within :data:`GOAL_SECONDS` for its preset and :data:`GOAL_FRACTION_OF_HF` of the
HF script's median.

Indexes: ``--preset demo`` indexes ``data/demo`` with the committed demo model
(``data/models/demo-clip``); ``tiny`` and ``vit-b-32`` write a random checkpoint of those shapes
(``retrieval.tools.random_model``) and index ``--images`` generated images in fp32. ``--index DIR``
measures an existing index instead (its recorded model). Prints one JSON line, then a table.

    python benchmarks/bench_cli.py [--preset demo|tiny|vit-b-32] [--runs 5] [--query "a banana"]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import ROOT
from _harness import Bench

from clipsearch.cli import int_at_least
from retrieval.encoders.memo import CHECKS_ENV

DEMO_MODEL = ROOT / "data" / "models" / "demo-clip"
DEMO_PHOTOS = ROOT / "data" / "demo"
# Wall-time goals for `search`, per preset, and the fraction of the HF script.
GOAL_SECONDS = {"demo": 1.0, "vit-b-32": 2.0}
GOAL_FRACTION_OF_HF = 0.25

HF_SCRIPT = """
import sys
import torch
from transformers import AutoTokenizer, CLIPTextModelWithProjection

model_dir, query = sys.argv[1], sys.argv[2]
tokenizer = AutoTokenizer.from_pretrained(model_dir)
model = CLIPTextModelWithProjection.from_pretrained(model_dir).eval()
with torch.inference_mode():
    emb = model(**tokenizer([query], padding=True, return_tensors="pt")).text_embeds
print(emb[0, :4].tolist())
"""


@dataclass(frozen=True)
class Command:
    """One measured command line and the environment changes it runs with."""

    name: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Run:
    wall_s: float
    peak_rss_mb: float
    returncode: int


# Forks and execs the command, waits for it and prints [wall seconds, its ru_maxrss in KiB, exit
# code]. The command is forked from this small process, not from the benchmark: Linux carries a
# forking process's resident size into the child's ru_maxrss (the copied address space is the
# child's until exec), so forking from a parent that built an index would inflate every peak.
_LAUNCHER = """
import json, os, sys, time
start = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        os.execv(sys.argv[1], sys.argv[1:])
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
print(json.dumps([time.perf_counter() - start, usage.ru_maxrss, os.waitstatus_to_exitcode(status)]))
"""


def run_once(cmd: Command) -> Run:
    """Run ``cmd`` to completion, output discarded; its wall time and its own peak RSS."""
    env = {**os.environ, **dict(cmd.env)}
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", _LAUNCHER, *cmd.argv], capture_output=True, env=env, check=False
    )
    try:
        wall, maxrss_kib, code = json.loads(proc.stdout)
    except ValueError:
        code = proc.returncode
    if proc.returncode != 0 or code != 0:
        raise RuntimeError(f"{cmd.name} failed ({code}): {proc.stderr.decode(errors='replace')[-500:]}")
    return Run(float(wall), maxrss_kib / 1024, code)


def measure(commands: list[Command], runs: int, warmup: int) -> dict[str, list[Run]]:
    """Interleaved rounds: every command once per round; the first ``warmup`` rounds are dropped."""
    results: dict[str, list[Run]] = {c.name: [] for c in commands}
    for round_ in range(warmup + runs):
        for cmd in commands:
            run = run_once(cmd)
            if round_ >= warmup:
                results[cmd.name].append(run)
    return results


def summarise(runs: list[Run]) -> dict[str, Any]:
    walls = [r.wall_s for r in runs]
    peaks = [r.peak_rss_mb for r in runs]
    return {
        "wall_s": {"median": round(statistics.median(walls), 3), "min": round(min(walls), 3), "max": round(max(walls), 3)},
        "peak_rss_mb": {"median": round(statistics.median(peaks), 1), "max": round(max(peaks), 1)},
        "runs": len(runs),
    }


def _write_images(folder: Path, count: int) -> None:
    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        small = (rng.random((24, 32, 3)) * 255).astype(np.uint8)
        Image.fromarray(small).resize((320, 240), Image.Resampling.BICUBIC).save(folder / f"{i:04d}.jpg", quality=85)


def prepare(preset: str, images: int, work: Path) -> tuple[Path, Path, Path]:
    """(index dir, model dir, a query image) for ``preset``, built under ``work``."""
    from indexer import build_index

    if preset == "demo":
        model, photos = DEMO_MODEL, DEMO_PHOTOS
        if not (model / "config.json").is_file():
            raise FileNotFoundError(f"the demo model is missing ({model})")
    else:
        from retrieval.tools.random_model import make_random_clip

        model = make_random_clip(work / "model", preset=preset, seed=0)
        photos = work / "photos"
        _write_images(photos, images)
    index = work / "bench.idx"
    build_index(photos, index, model=str(model), device="cpu", progress=False, precision="fp32" if preset != "demo" else None)
    query_image = next(p for p in sorted(photos.rglob("*")) if p.suffix.lower() in (".png", ".jpg"))
    return index, model, query_image


def commands_for(index: Path, model: Path, query: str, image: Path) -> list[Command]:
    cli = (sys.executable, "-m", "clipsearch")
    return [
        Command("search", (*cli, "search", str(index), query)),
        Command("search (int8)", (*cli, "search", str(index), query, "--precision", "int8")),
        Command("search (torch)", (*cli, "search", str(index), query, "--precision", "fp32"), (("CLIPSEARCH_TEXT_RUNTIME", "torch"),)),
        Command("search --image", (*cli, "search", str(index), "--image", str(image))),
        # The same query with the runtime's checks not remembered: the full encoder (transformers,
        # torch's tower, the checks) before the tower runs, as every image query did before.
        Command("search --image (full)", (*cli, "search", str(index), "--image", str(image)), ((CHECKS_ENV, "off"),)),
        Command("info", (*cli, "info", str(index))),
        Command("hf script", (sys.executable, "-c", HF_SCRIPT, str(model), query)),
    ]


def table(result: dict[str, Any]) -> list[str]:
    rows = result["commands"]
    hf = rows["hf script"]["wall_s"]["median"]
    lines = [
        f"{result['preset']} index ({result['count']} images, model {Path(result['model']).name}), "
        f"{result['runs']} runs after {result['warmup']} warm-up, query {result['query']!r}; "
        f"text path: {result['text_path']['path']}",
        f"{'command':<22} {'wall p50 s':>10} {'min':>7} {'max':>7} {'peak MB':>8} {'x HF script':>11}",
    ]
    for name, row in rows.items():
        w = row["wall_s"]
        lines.append(f"{name:<22} {w['median']:>10.3f} {w['min']:>7.3f} {w['max']:>7.3f} "
                     f"{row['peak_rss_mb']['median']:>8.0f} {w['median'] / hf:>11.2f}")
    goal = result["goal"]
    lines.append(f"int8 set-up a one-shot search would pay (search (int8) - search): {goal['int8_setup_s']:.3f} s")
    if goal["seconds"] is not None:
        lines.append(f"goal: search <= {goal['seconds']} s and <= {GOAL_FRACTION_OF_HF:.2f} x HF script: "
                     f"{'met' if goal['met'] else 'NOT met'} ({goal['search_s']:.3f} s, {goal['fraction_of_hf']:.3f} x)")
    return lines


def main(argv: list[str] | None = None) -> int:
    bench = Bench("bench_cli", __doc__, "work_dir")
    parser = bench.parser
    parser.add_argument("--preset", default="demo", choices=["demo", "tiny", "vit-b-32"])
    parser.add_argument("--index", help="measure this existing index instead (its recorded model; needs --image)")
    parser.add_argument("--image", help="the query image of `search --image` with --index")
    parser.add_argument("--images", type=int_at_least(1), default=32, help="generated images for random presets (default: 32)")
    parser.add_argument("--runs", type=int_at_least(1), default=5, help="measured runs per command (default: 5)")
    parser.add_argument("--warmup", type=int_at_least(0), default=1, help="unmeasured rounds first (default: 1)")
    parser.add_argument("--query", default="a banana")
    args = bench.parse(argv)
    if bool(args.index) != bool(args.image):
        parser.error("--index and --image go together")

    from retrieval import ImageIndex
    from retrieval.errors import ClipSearchError
    from retrieval.layout import read_manifest

    try:
        with bench.scratch() as work:
            if args.index:
                index, image = Path(args.index), Path(args.image)
                model = Path(read_manifest(index).model)
                preset = "demo" if model.resolve() == DEMO_MODEL.resolve() else "index"
            else:
                index, model, image = prepare(args.preset, args.images, work)
                preset = args.preset
            opened = ImageIndex.open(index, text_queries=1)  # as the CLI opens it for one search
            count, text_path = opened.count, opened.text_path().to_dict()
            del opened
            results = measure(commands_for(index, model, args.query, image), args.runs, args.warmup)
    except (ClipSearchError, OSError, RuntimeError) as exc:  # a benchmark's errors are one line, like the CLI's
        return bench.fail(exc)

    rows = {name: summarise(runs) for name, runs in results.items()}
    search_s = rows["search"]["wall_s"]["median"]
    hf_s = rows["hf script"]["wall_s"]["median"]
    goal_s = GOAL_SECONDS.get(preset)
    result = {
        "benchmark": "bench_cli", "preset": preset, "model": str(model), "count": count, "query": args.query,
        "runs": args.runs, "warmup": args.warmup, "text_path": text_path, "commands": rows,
        "goal": {
            "seconds": goal_s,
            "search_s": search_s,
            "fraction_of_hf": round(search_s / hf_s, 4),
            "speedup_vs_torch_search": round(rows["search (torch)"]["wall_s"]["median"] / search_s, 2),
            "int8_setup_s": round(rows["search (int8)"]["wall_s"]["median"] - search_s, 3),
            "met": goal_s is not None and search_s <= goal_s and search_s <= GOAL_FRACTION_OF_HF * hf_s,
        },
    }
    bench.report(result, table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
