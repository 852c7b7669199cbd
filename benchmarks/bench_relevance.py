"""Ranking quality of the three text modes side by side: vector, hybrid and keyword MRR@10 (and
Recall@1/10) on labelled queries, so a change to ranking is measured, not guessed.

Without arguments it indexes the demo collection with the demo model (``data/demo``,
``data/models/demo-clip``; the indexes are kept in ``~/.cache/clipsearch/relevance/``) and runs
the query sets built from files in the repository:

- ``heldout``: ``data/demo/queries.jsonl``, the 136 captions of test-split stamps the tiny
  model never saw: the names are strong, the model weak;
- ``trained``: 150 of the captions the model was trained on (``data/demo/captions.jsonl``
  restricted to ``data/demo/splits/train.txt``), each relevant to every training image that
  carries it, drawn with a fixed seed: the model is strong;
- ``words``: words in pictures: 40 photo-like JPEGs named like a phone's (``IMG_0000.jpg``), 20
  of them with a sign rendered on them (DejaVu Sans Bold), indexed with ``--ocr``; each sign's
  words are a query relevant to its photo: only the text in the pixels names them
  (``--no-words`` leaves this set out; it needs the ``ocr`` extra).

    python benchmarks/bench_relevance.py
    python benchmarks/bench_relevance.py --index photos.idx --queries mine.jsonl --queries other.jsonl

Prints one JSON line, then a readable table with, per set, the best of vector and keyword and
hybrid's margin over it.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

from _common import ROOT
from _harness import Bench

MODES = ("vector", "hybrid", "keyword")
DEMO = ROOT / "data" / "demo"
DEMO_MODEL = ROOT / "data" / "models" / "demo-clip"
TRAINED_QUERIES = 150
SEED = 0


def trained_queries(out: Path, count: int = TRAINED_QUERIES, seed: int = SEED) -> Path:
    """``count`` distinct training captions of the demo, each with every training image that
    carries it, as a queries file at ``out``."""
    train = set((DEMO / "splits" / "train.txt").read_text().split())
    by_caption: dict[str, list[str]] = {}
    for line in (DEMO / "captions.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["path"] in train:
            by_caption.setdefault(row["caption"], []).append(row["path"])
    captions = sorted(by_caption)
    random.Random(seed).shuffle(captions)
    out.write_text("".join(json.dumps({"query": c, "relevant": by_caption[c]}) + "\n" for c in captions[:count]))
    return out


SIGNS = ("BAKERY 4711", "MUSEUM OPEN", "PLATFORM 9", "HOTEL ASTORIA", "PHARMACY", "INVOICE 0042", "EXIT ONLY",
         "CAFE ROMA", "TAXI RANK", "GATE B12", "BOOKSHOP", "NO PARKING", "POST OFFICE", "CINEMA PARADISO",
         "FLOWER MARKET", "CITY LIBRARY", "BUS STOP 24", "FISH AND CHIPS", "HARBOUR VIEW", "TICKET OFFICE")
WORD_PHOTOS = 40


def words_in_pictures(cache: Path) -> tuple[Path, Path]:
    """The words-in-pictures set: photos named like a phone's, half with a sign, indexed with
    OCR; returns the index and its queries file."""
    import numpy as np
    from PIL import Image, ImageDraw, ImageFont

    from indexer import build_index

    photos, queries = cache / "words" / "photos", cache / "words" / "queries.jsonl"
    photos.mkdir(parents=True, exist_ok=True)
    font = ImageFont.truetype("DejaVuSans-Bold.ttf", 40)
    labelled = []
    for i in range(WORD_PHOTOS):
        rng = np.random.default_rng(i)
        blotches = np.clip(rng.integers(60, 160, 3) + rng.integers(-40, 40, (60, 80, 3)), 0, 255).astype(np.uint8)
        img = Image.fromarray(blotches).resize((640, 480), Image.Resampling.BILINEAR)
        name = f"IMG_{i:04d}.jpg"
        if i < len(SIGNS):
            draw = ImageDraw.Draw(img)
            box = draw.textbbox((32, 200), SIGNS[i], font=font)
            draw.rectangle([box[0] - 10, box[1] - 10, box[2] + 10, box[3] + 10], fill=(240, 238, 228))
            draw.text((32, 200), SIGNS[i], font=font, fill=(20, 20, 20))
            labelled.append({"query": SIGNS[i].lower(), "relevant": [name]})
        img.save(photos / name, quality=90)
    queries.write_text("".join(json.dumps(q) + "\n" for q in labelled))
    out = cache / "words" / "words.idx"
    build_index(photos, out, model=str(DEMO_MODEL), device="cpu", ocr=True)
    return out, queries


def demo_index(cache: Path) -> Path:
    """The demo collection indexed with the demo model (brought up to date in place)."""
    from indexer import build_index

    out = cache / "demo.idx"
    build_index(DEMO, out, model=str(DEMO_MODEL), device="cpu")
    return out


def measure(index_dir: Path, queries: Path) -> dict[str, dict[str, float]]:
    """MRR@10, Recall@1 and Recall@10 of each mode on ``queries``."""
    from retrieval import ImageIndex
    from retrieval.tools.evaluation import evaluate, load_queries

    index = ImageIndex.open(index_dir, device="cpu")
    labelled = load_queries(queries)
    out = {}
    for mode in MODES:
        # Every mode cut at 10, so the three MRRs compare like with like.
        report = evaluate(index, labelled, mode=mode, ks=(1, 10), ann=True)
        out[mode] = {"mrr@10": round(report.mrr, 4), "recall@1": round(report.recall[1], 4), "recall@10": round(report.recall[10], 4)}
    return out


def table(results: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    lines = ["| queries | vector MRR@10 | keyword MRR@10 | hybrid MRR@10 | hybrid - best side |", "|---|---:|---:|---:|---:|"]
    for name, modes in results.items():
        best = max(modes["vector"]["mrr@10"], modes["keyword"]["mrr@10"])
        lines.append(
            f"| {name} | {modes['vector']['mrr@10']:.3f} | {modes['keyword']['mrr@10']:.3f} | "
            f"{modes['hybrid']['mrr@10']:.3f} | {modes['hybrid']['mrr@10'] - best:+.3f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    bench = Bench("bench_relevance", __doc__)
    p = bench.parser
    p.add_argument("--index", type=Path, help="an index to measure (default: the demo, indexed here)")
    p.add_argument("--queries", type=Path, action="append", help="a labelled queries file (repeatable; default: the demo's two sets)")
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "clipsearch" / "relevance")
    p.add_argument("--no-words", action="store_true", help="leave the words-in-pictures set out (it needs the ocr extra)")
    args = bench.parse(argv)
    if args.queries and not args.index:
        bench.parser.error("--queries needs --index (the demo sets go with the demo index)")
    args.cache.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        if args.index is None:
            index_dir = demo_index(args.cache)
            sets = {"heldout": (index_dir, DEMO / "queries.jsonl"), "trained": (index_dir, trained_queries(args.cache / "trained.jsonl"))}
            if not args.no_words:
                sets["words"] = words_in_pictures(args.cache)
        else:
            index_dir = args.index
            sets = {q.stem: (index_dir, q) for q in args.queries or []}
            if not sets:
                bench.parser.error("give --queries with --index")
        results = {name: measure(where, path) for name, (where, path) in sets.items()}
    except Exception as exc:  # a benchmark's errors are one line, like the CLI's
        return bench.fail(exc)
    bench.report({"benchmark": "relevance", "index": str(index_dir), "results": results,
                  "seconds": round(time.perf_counter() - started, 1)}, table(results))
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
