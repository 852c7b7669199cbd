"""Text-to-image retrieval quality on a captioned dataset, in one command.

Indexes the images of a split with clipsearch's own indexer, turns every caption into a query
whose relevant image is the one it describes, searches with the same model and reports
Recall@K, MRR, nDCG and ranks. On the Karpathy COCO 5k / Flickr30k 1k test splits Recall@K is
the "image retrieval" recall that open_clip publishes (from CLIP_benchmark), so with the
OpenAI ViT-B/32 weights the result is printed next to the published figures.

    python benchmarks/eval_retrieval.py --karpathy dataset_coco.json --images /data/coco \\
        --model openai/clip-vit-base-patch32
    python benchmarks/eval_retrieval.py --karpathy dataset_flickr30k.json --images /data \\
        --image-prefix flickr30k-images --model open_clip:ViT-B-32/openai
    python benchmarks/eval_retrieval.py --captions data/demo/captions.jsonl --images data/demo \\
        --split-file data/demo/splits/test.txt --model models/tiny-random-clip

The index is kept (default: ``~/.cache/clipsearch/eval/<dataset>-<split>-<model>.idx``) and
brought up to date in place on the next run with the same model and images folder (nothing is
re-embedded when nothing changed); another model or folder rebuilds it. The queries file is
written next to it. Prints one JSON line, then a readable table.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _harness import Bench, listed, note

from clipsearch.cli import int_at_least

# Published text-to-image ("image retrieval") recall of open_clip's ViT-B-32 with the OpenAI
# weights, on the Karpathy test splits: the "MSCOCO/Flickr image retr. R@K" columns of open_clip's
# docs/openclip_retrieval_results.csv (produced with CLIP_benchmark), whose ViT-B-32 and
# ViT-B-32-quickgelu rows agree. Fractions, like the metrics evaluate() reports.
REFERENCE_SOURCE = "open_clip ViT-B-32 'openai' weights, CLIP_benchmark image retrieval (open_clip docs/openclip_retrieval_results.csv)"
REFERENCES: dict[tuple[str, str], dict[str, float]] = {
    ("coco", "test"): {"recall@1": 0.3044, "recall@5": 0.5594, "recall@10": 0.6687},
    ("flickr30k", "test"): {"recall@1": 0.5878, "recall@5": 0.8356, "recall@10": 0.9002},
}
# Names under which the OpenAI ViT-B/32 weights are loaded (HF hub id, open_clip backend,
# a local copy of the hub checkpoint, the hub cache's folder name).
_REFERENCE_MODEL_NAMES = frozenset(
    {
        "openai/clip-vit-base-patch32",
        "open_clip:vit-b-32/openai",
        "open_clip:vit-b-32-quickgelu/openai",
    }
)
_REFERENCE_MODEL_DIRS = frozenset({"clip-vit-base-patch32", "models--openai--clip-vit-base-patch32"})


def reference_for(dataset: str, split: str | None, model: str) -> dict[str, Any] | None:
    """The published figures for this dataset, split and model, or None when there are none."""
    figures = REFERENCES.get((dataset.lower(), (split or "").lower()))
    if figures is None:
        return None
    name = model.strip().lower().rstrip("/")
    parts = set(Path(name).parts)
    if name not in _REFERENCE_MODEL_NAMES and not parts & _REFERENCE_MODEL_DIRS:
        return None
    return {"source": REFERENCE_SOURCE, "direction": "text-to-image", **figures}


def default_index_dir(dataset: str, split: str | None, model: str) -> Path:
    """``$XDG_CACHE_HOME/clipsearch/eval/<dataset>-<split>-<model slug>.idx``."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", model).strip("_")[-80:] or "model"
    return cache / "clipsearch" / "eval" / f"{dataset}-{split or 'all'}-{slug}.idx"


def queries_path(index_dir: Path) -> Path:
    """Where the queries file goes: next to the index, not inside it (the indexer owns that)."""
    return index_dir.with_name(index_dir.name + ".queries.jsonl")


def needs_rebuild(index_dir: Path, encoder: Any, images_root: Path) -> str | None:
    """Why ``index_dir`` cannot be brought up to date in place (None when it can).

    ``build_index`` updates an existing index incrementally (adds, re-embeds changed files,
    drops files not in the list), but refuses another model, and a different images folder
    could hold different pictures under the same names: both call for a full rebuild.
    """
    from retrieval.errors import ClipSearchError
    from retrieval.layout import is_index_dir, read_manifest

    if not is_index_dir(index_dir):
        return None
    try:
        manifest = read_manifest(index_dir)
    except ClipSearchError as exc:
        return f"unreadable index ({exc})"
    if manifest.backend != encoder.backend or manifest.model_fingerprint != encoder.fingerprint:
        return f"it was built with another model ({manifest.model})"
    if manifest.source_root != str(images_root.resolve()):
        return f"it was built from another folder ({manifest.source_root})"
    return None


_nonnegative = int_at_least(0)


def add_options(p: argparse.ArgumentParser) -> None:
    from retrieval.encoders import DEFAULT_MODEL

    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--karpathy", metavar="JSON", help="Karpathy split file (dataset_coco.json, dataset_flickr30k.json)")
    src.add_argument("--captions", metavar="FILE", help="caption file: .jsonl ({path, caption}) or .csv/.tsv with a header")
    p.add_argument("--images", required=True, metavar="DIR", help="images root; dataset paths are relative to it")
    p.add_argument("--image-prefix", default="", metavar="PREFIX", help="folder of the images inside DIR (e.g. flickr30k-images)")
    p.add_argument("--split", default=None, help="Karpathy split(s), comma-separated (default: test)")
    p.add_argument("--split-file", metavar="LIST", help="keep only the images listed here (one path per line)")
    p.add_argument(
        "--max-captions",
        type=_nonnegative,
        default=None,
        help="captions kept per image, 0 = all (default: 5 for Karpathy files, all for caption files)",
    )
    p.add_argument(
        "--merge-duplicate-captions",
        action="store_true",
        help="identical captions become one query relevant to all their images (default: one query per caption)",
    )
    p.add_argument("--name", help="dataset name in the report (default: the Karpathy file's \"dataset\", else the images folder's name)")
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"model id or checkpoint directory (default: {DEFAULT_MODEL})")
    p.add_argument("--index-dir", metavar="DIR", help="where the index is kept (default: under ~/.cache/clipsearch/eval)")
    p.add_argument("--rebuild", action="store_true", help="re-embed every image even if the index is up to date")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda (default: auto)")
    p.add_argument("--batch-size", type=int, default=64, help="images per model call when indexing (default: 64)")
    p.add_argument("--query-batch-size", type=int, default=256, help="queries per model call (default: 256)")
    p.add_argument("--workers", type=_nonnegative, default=None, help="decode workers (default: from the core count)")
    p.add_argument("--k", type=listed(int), default=[1, 5, 10], help="recall cut-offs, comma-separated (default: 1,5,10)")
    p.add_argument("--ann", action="store_true", help="rank with the index's FAISS search (top K) instead of exactly")
    p.add_argument("--no-progress", action="store_true", help="no progress bar while indexing")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Load the dataset, build or update the index, evaluate; return the report dict.

    Raises:
        ClipSearchError: bad dataset, model, images folder or index directory, or no query
            with its image in the index.
    """
    from indexer import build_index
    from retrieval import ImageIndex
    from retrieval.encoders import load_encoder
    from retrieval.tools.evaluation import evaluate, load_queries  # imported late: optional for --help
    from retrieval.tools.evaluation.dataset_readers import (
        KARPATHY_CAPTIONS_PER_IMAGE,
        load_captions_csv,
        load_captions_jsonl,
        load_karpathy,
    )
    from retrieval.tools.evaluation.dataset_writers import write_queries
    from retrieval.tools.evaluation.split_files import apply_split_file

    if args.karpathy:
        cap = KARPATHY_CAPTIONS_PER_IMAGE if args.max_captions is None else (args.max_captions or None)
        dataset = load_karpathy(args.karpathy, args.split or "test", image_prefix=args.image_prefix, max_captions=cap)
    else:
        cap = args.max_captions or None
        loader = load_captions_csv if Path(args.captions).suffix.lower() in (".csv", ".tsv") else load_captions_jsonl
        dataset = loader(args.captions, image_prefix=args.image_prefix, max_captions=cap, name=Path(args.images).resolve().name)
    if args.split_file:
        dataset = apply_split_file(dataset, args.split_file, image_prefix=args.image_prefix)
    name = args.name or dataset.name

    images_root = Path(args.images)
    index_dir = Path(args.index_dir) if args.index_dir else default_index_dir(name, dataset.split, args.model)
    encoder = load_encoder(args.model, device=args.device)
    why = "--rebuild" if args.rebuild else needs_rebuild(index_dir, encoder, images_root)
    action = f"rebuilding ({why})" if why else ("updating" if index_dir.exists() else "building")
    note(f"{action} {index_dir}: {dataset.n_images} images of {name}/{dataset.split or 'all'}, model {encoder.name}")
    index_dir.parent.mkdir(parents=True, exist_ok=True)
    # An existing index of the same model is brought up to date in place: unchanged images
    # are neither read nor embedded again, images not in this split are dropped.
    build = build_index(
        images_root,
        index_dir,
        model=args.model,
        encoder=encoder,
        files=list(dataset.images),
        batch_size=args.batch_size,
        workers=args.workers,
        device=args.device,
        progress=not args.no_progress and sys.stderr.isatty(),
        rebuild=why is not None,
    )

    index = ImageIndex.open(index_dir, encoder=encoder)
    missing = sorted({s.path for s in index.skipped()} & set(dataset.images))
    if missing:
        # evaluate() skips the captions of these images and counts them in skipped_queries.
        note(
            f"warning: {len(missing)} of {dataset.n_images} images could not be indexed (e.g. {missing[0]}); "
            "the published protocol needs all of them"
        )
    queries_file = queries_path(index_dir)
    n_queries = write_queries(dataset, queries_file, merge_duplicates=args.merge_duplicate_captions)

    t0 = time.perf_counter()
    queries = load_queries(queries_file)
    report = evaluate(index, queries, ks=args.k, ann=args.ann, batch_size=args.query_batch_size)
    eval_s = time.perf_counter() - t0
    metrics = report.to_dict()
    # The per-query lists can hold thousands of entries; their counts stay in the summary.
    for key in ("skipped", "partially_missing"):
        metrics.pop(key, None)
    return {
        "bench": "eval_retrieval",
        "dataset": name,
        "split": dataset.split,
        "model": encoder.name,
        "index_dir": str(index_dir),
        "queries_file": str(queries_file),
        "n_images": dataset.n_images,
        "n_images_missing": len(missing),
        "n_queries": n_queries,
        "captions_per_image": cap,
        "merge_duplicate_captions": args.merge_duplicate_captions,
        "index": {
            key: getattr(build, key)
            for key in (
                "total", "embedded", "added", "updated", "removed", "unchanged", "skipped", "seconds", "images_per_second", "device"
            )
        },
        "index_rebuilt": why is not None,
        "eval_seconds": round(eval_s, 3),
        "metrics": metrics,
        "reference": reference_for(name, dataset.split, args.model),
    }


_RATES = ("recall@", "mrr", "ndcg@", "chance_mrr", "chance_recall@")
_TABLE_KEYS = ("recall@", "mrr", "ndcg@", "mean_rank", "median_rank", "chance_")


def _fmt(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key.startswith(_RATES):
        return f"{100 * value:.2f}"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def table(result: dict[str, Any]) -> list[str]:
    """The report as a readable table (recall, MRR and nDCG in percent)."""
    metrics = result["metrics"]
    ref = result["reference"] or {}
    head = f"{'metric':<20}{'clipsearch':>12}" + (f"{'published':>12}" if ref else "")
    lines = [
        f"{result['dataset']} / {result['split'] or 'all'}: {result['n_images']} images, "
        f"{metrics['queries']} queries evaluated of {result['n_queries']}, model {result['model']}",
        head,
        "-" * len(head),
    ]
    for key, value in metrics.items():
        if key.startswith(_TABLE_KEYS):
            lines.append(f"{key:<20}{_fmt(key, value):>12}" + (f"{_fmt(key, ref[key]) if key in ref else '':>12}" if ref else ""))
    lines.append("recall, mrr, ndcg in %; ranks are 1-based positions of the first relevant image; chance_* = random ranking")
    if ref:
        lines.append(f"published: {ref['source']}")
    idx = result["index"]
    lines.append(f"index: {idx['total']} images ({idx['embedded']} embedded by this run) in {idx['seconds']:.1f} s; "
                 f"evaluated in {result['eval_seconds']:.1f} s")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    bench = Bench("eval_retrieval", __doc__)
    add_options(bench.parser)
    args = bench.parse(argv)
    args.k = tuple(sorted(set(args.k)))
    if args.captions and args.split is not None:
        bench.parser.error("--split selects a Karpathy split; for a caption file use --split-file LIST")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from retrieval.errors import ClipSearchError

    try:
        result = run(args)
    except ClipSearchError as exc:
        return bench.fail(exc)
    bench.report(result, table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
