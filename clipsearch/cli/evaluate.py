"""``clipsearch eval``, the command over :mod:`retrieval.evaluate`: MRR, Recall@K, nDCG@10 on labelled queries, next to chance."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from retrieval.errors import InvalidArgumentError

from ._common import PROG, add_device_arguments, add_precision_argument, add_query_lang_argument, positive_int, print_json

if TYPE_CHECKING:
    from retrieval.tools.evaluation import EvalReport

    from ._common import Subparsers

# At most this many skipped or incomplete queries are listed on stderr (the JSON has all).
_MAX_LISTED = 20


def run(args: argparse.Namespace) -> int:
    """Evaluate the index on the queries file (or on its stored captions); print a metrics
    table, or one JSON object with ``--json``."""
    from retrieval.errors import InvalidArgumentError
    from retrieval.index import ImageIndex
    from retrieval.tools.evaluation import caption_queries, evaluate, load_queries, parse_ks

    # Inputs are checked before the index and the model are loaded: mistakes fail fast.
    ks = parse_ks(args.k)
    if args.queries is not None and args.limit is not None:
        raise InvalidArgumentError("--limit draws from the index's stored captions; it does not apply to a QUERIES.jsonl")
    modes = _modes(args.mode)
    queries = load_queries(args.queries) if args.queries is not None else None
    index = ImageIndex.open(
        args.index_dir, model=args.model, device=args.device, precision=args.precision,
        text_queries=len(queries) if queries is not None else args.limit or 1,
    )
    if queries is None:
        queries = caption_queries(index, args.limit, args.seed)
    reports = {
        mode: evaluate(index, queries, ks=ks, ann=args.ann, batch_size=args.batch_size, mode=mode, query_lang=args.query_lang,
                       per_query_path=args.per_query if len(modes) == 1 else None)
        for mode in modes
    }
    _warn_missing(next(iter(reports.values())))
    if args.json:
        print_json(reports[modes[0]].to_dict() if len(modes) == 1 else {"modes": {m: r.to_dict() for m, r in reports.items()}})
    else:
        for mode, report in reports.items():
            if len(modes) > 1:
                print(f"\n== mode {mode} ==")
            _print_eval_table(report, args.per_query if len(modes) == 1 else None)
    return 0


def _modes(text: str) -> list[str]:
    """``--mode``'s comma-separated modes, checked (one report each)."""
    from retrieval.keywords import check_mode

    modes = [check_mode(m.strip()) for m in text.split(",") if m.strip()]
    if not modes:
        raise InvalidArgumentError("--mode needs a mode: vector, hybrid or keyword")
    return list(dict.fromkeys(modes))


def _warn_missing(report: EvalReport) -> None:
    """List on stderr the queries whose relevant paths are not (all) in the index."""
    groups = (
        (report.skipped, "skipped {n} of {total} queries: none of their relevant images is in the index"),
        (report.partially_missing, "{n} evaluated queries have relevant images that are not in the index"),
    )
    total = report.queries + len(report.skipped)
    for items, headline in groups:
        if not items:
            continue
        print(f"{PROG}: warning: " + headline.format(n=len(items), total=total), file=sys.stderr)
        for item in items[:_MAX_LISTED]:
            where = f"line {item.query.line}" if item.query.line is not None else json.dumps(item.query.describe())
            print(f"  {where}: {', '.join(item.missing)}", file=sys.stderr)
        if len(items) > _MAX_LISTED:
            print(f"  ... and {len(items) - _MAX_LISTED} more (all are listed by --json)", file=sys.stderr)


def _print_eval_table(report: EvalReport, per_query: str | None) -> None:
    ranking = {"exact": "exact ranking", "ann": f"ANN ranking (top {report.cutoff})"}.get(
        report.ranking, f"{report.ranking} ranking (top {report.cutoff})"
    )
    print(
        f"{report.queries} queries, {ranking} of {report.index_size} images "
        f"({report.index_type} index), {report.seconds:.1f} s"
    )
    rows: list[tuple[str, str, str]] = [
        ("MRR" if report.cutoff is None else f"MRR@{report.cutoff}", f"{report.mrr:.4f}", f"{report.chance_mrr:.4f}")
    ]
    rows += [(f"Recall@{k}", f"{v:.4f}", f"{report.chance_recall[k]:.4f}") for k, v in report.recall.items()]
    rows.append(("nDCG@10", f"{report.ndcg:.4f}", ""))
    if report.mean_rank is not None:
        rows.append(("mean rank", f"{report.mean_rank:.1f}", f"{report.chance_mean_rank:.1f}"))
        rows.append(("median rank", f"{report.median_rank:.1f}", ""))
    width = max(len(name) for name, _, _ in rows)
    print(f"\n{'metric':<{width}}  {'value':>9}  {'chance':>9}")
    for name, value, chance in rows:
        print(f"{name:<{width}}  {value:>9}  {chance:>9}".rstrip())
    if report.skipped or report.partially_missing:
        print(
            f"\nskipped queries: {len(report.skipped)}; relevant paths not in the index: "
            f"{report.missing_relevant} (listed on stderr)"
        )
    if per_query:
        print(f"\nper-query results -> {per_query}")


def register(subparsers: Subparsers) -> None:
    """Add ``eval`` to the ``clipsearch`` sub-parsers."""
    p = subparsers.add_parser(
        "eval",
        help="measure retrieval quality on labelled queries",
        description=(
            "Rank the index for every query of QUERIES.jsonl (lines like "
            '{"query": "a red bus", "relevant": ["town/bus.png"]} or {"image": "q.jpg", "relevant": [...]}; '
            "relevant paths as the index stores them, image paths relative to the queries file) and report "
            "MRR, Recall@K, nDCG@10 and the rank of the first relevant image, next to chance level. Without "
            "QUERIES.jsonl, the captions stored with the images (WebDataset shards' .txt) are the queries, each "
            "relevant to its own image."
        ),
    )
    p.add_argument("index_dir", metavar="INDEX_DIR")
    p.add_argument("queries", metavar="QUERIES.jsonl", nargs="?", help="labelled queries (default: the stored captions)")
    p.add_argument("--limit", type=positive_int, metavar="N", help="draw N of the stored captions (default: all)")
    p.add_argument("--seed", type=int, default=0, help="the seed of --limit's draw (default: 0, the same queries every run)")
    p.add_argument("--k", default="1,5,10", help="Recall@K cut-offs, comma-separated (default: 1,5,10)")
    p.add_argument("--ann", action="store_true", help="rank with the FAISS index (top max(K, 10)) instead of exactly")
    p.add_argument(
        "--mode", default="vector", metavar="MODES",
        help="how text queries rank: vector (the papers' ranking), hybrid or keyword, or several comma-separated to "
        "compare them side by side (hybrid and keyword rank the top max(K, 10), like --ann) (default: vector)",
    )
    p.add_argument("--per-query", metavar="OUT.jsonl", help="also write one JSON line per evaluated query")
    p.add_argument("--batch-size", type=positive_int, default=256, help="queries encoded and ranked together (default: 256)")
    add_query_lang_argument(p, "the text queries")
    p.add_argument("--model", help="query model (default: the one recorded in the index; must be the same weights)")
    add_device_arguments(p)
    add_precision_argument(p, "auto", "text query tower precision (image queries use the index's mode)")
    p.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    p.set_defaults(handler=run)
