"""The query half of the ``clipsearch`` command: ``search``, ``info``, ``verify`` and ``eval``.

The console script lives in :mod:`indexer.cli`, which adds ``index`` (the indexer may import
this package, never the reverse). Only CLI modules turn exceptions into messages and exit
codes: a user mistake prints one line on stderr and exits 1, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .errors import ClipSearchError, InvalidArgumentError

PROG = "clipsearch"
EXIT_ERROR = 1
EXIT_INTERRUPTED = 130

Registrar = Callable[[argparse._SubParsersAction], None]  # type: ignore[type-arg]


def int_at_least(minimum: int) -> Callable[[str], int]:
    """argparse type: an integer >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


positive_int = int_at_least(1)


def print_json(obj: Any) -> None:
    """One JSON object on stdout (non-ASCII kept, lone surrogates escaped)."""
    sys.stdout.write(json.dumps(obj, ensure_ascii=False).encode("utf-8", "backslashreplace").decode("utf-8") + "\n")
    sys.stdout.flush()


def add_device_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", help="auto (CUDA when available), cpu or cuda (default: auto)")


def add_precision_argument(parser: argparse.ArgumentParser, default: str | None, what: str, default_text: str = "") -> None:
    """``--precision``, checked by the handler (an unknown mode is a one-line error, exit 1)."""
    parser.add_argument(
        "--precision",
        default=default,
        metavar="MODE",
        help=f"{what}: fp32 (exact), bf16, fp16, int8 (CPU) or auto (fastest passing the quality gate) "
        f"(default: {default_text or default})",
    )


def add_filter_arguments(parser: argparse.ArgumentParser) -> None:
    """Metadata filters of ``search``: only images passing all of them are returned."""
    group = parser.add_argument_group("filters (all must hold; k results whenever k images match)")
    group.add_argument("--path-prefix", action="append", default=[], metavar="PREFIX", help="stored path starts with PREFIX (repeat for any of several)")
    group.add_argument("--path-glob", metavar="PATTERN", help="stored path matches this shell pattern, e.g. '*/2023-*.jpg'")
    group.add_argument("--min-width", type=int_at_least(0), metavar="PX")
    group.add_argument("--max-width", type=int_at_least(0), metavar="PX")
    group.add_argument("--min-height", type=int_at_least(0), metavar="PX")
    group.add_argument("--max-height", type=int_at_least(0), metavar="PX")
    group.add_argument("--modified-after", metavar="DATE", help="file modified at or after DATE (ISO 8601, UTC unless a zone is given)")
    group.add_argument("--modified-before", metavar="DATE", help="file modified before DATE")


def filter_from_args(args: argparse.Namespace) -> Any:
    from .filters import Filter, parse_time

    return Filter(
        path_prefix=tuple(args.path_prefix),
        path_glob=args.path_glob,
        min_width=args.min_width,
        max_width=args.max_width,
        min_height=args.min_height,
        max_height=args.max_height,
        modified_after=parse_time(args.modified_after) if args.modified_after else None,
        modified_before=parse_time(args.modified_before) if args.modified_before else None,
    )


def _cmd_search(args: argparse.Namespace) -> int:
    from .index import ImageIndex

    if args.query is None and args.image is None:
        raise InvalidArgumentError("give a text query or --image PATH")
    if args.query is not None and args.image is not None:
        raise InvalidArgumentError("give either a text query or --image, not both")
    if args.query is not None and not args.query.strip():
        raise InvalidArgumentError("the query is empty")
    where = filter_from_args(args)
    index = ImageIndex.open(args.index_dir, model=args.model, device=args.device, precision=args.precision)
    if args.image is None:
        hits = index.search(args.query, k=args.k, where=where)
    else:
        hits = index.search_image(args.image, k=args.k, where=where)
    if args.json:
        print_json({"results": [h.to_dict() for h in hits]})
    else:
        if not hits:
            print("no results (no image matches the filters)" if where.active else "no results (the index is empty)")
        for rank, hit in enumerate(hits, 1):
            print(f"{rank:>3}  {hit.score:.4f}  {hit.path}")
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    from .index import ImageIndex

    index = ImageIndex.open(args.index_dir)
    info = index.info()
    if args.json:
        print_json(info)
        return 0
    width = max(len(k) for k in info)
    for key, value in info.items():
        if key == "skipped_files":
            continue
        shown = json.dumps(value) if isinstance(value, (dict, list)) else value
        print(f"{key:<{width}}  {shown}")
    if info["skipped_files"]:
        print(f"\nskipped files ({len(info['skipped_files'])}):")
        for item in info["skipped_files"]:
            print(f"  {item['path']}: {item['reason']}")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from .verify import verify_index

    report = verify_index(args.index_dir)
    if args.json:
        print_json(report.to_dict())
    else:
        status = "ok" if report.ok else f"{len(report.problems)} damaged file(s)"
        if report.generation is None:
            print(f"{args.index_dir}: {status} (the manifest cannot be read: nothing else was checked)")
        else:
            what = "file checksums verified" if report.checksums else "no file checksums recorded"
            faiss = f", {report.faiss_sampled} FAISS vectors compared" if report.faiss_sampled else ""
            print(f"{args.index_dir}: {status} ({report.count} images, {len(report.files)} files, {what}{faiss})")
        for note in report.notes:
            print(f"note: {note}")
    # One line per damaged file on stderr, with the repair, whatever the output format.
    for problem in report.problems:
        print(f"{PROG}: error: {problem.message()}", file=sys.stderr)
    return 0 if report.ok else EXIT_ERROR


# At most this many skipped or incomplete queries are listed on stderr (the JSON has all).
_MAX_LISTED = 20


def _cmd_eval(args: argparse.Namespace) -> int:
    from .evaluate import evaluate, load_queries, parse_ks
    from .index import ImageIndex

    # Inputs are checked before the index and the model are loaded: mistakes fail fast.
    ks = parse_ks(args.k)
    queries = load_queries(args.queries)
    index = ImageIndex.open(args.index_dir, model=args.model, device=args.device, precision=args.precision)
    report = evaluate(index, queries, ks=ks, ann=args.ann, batch_size=args.batch_size, per_query_path=args.per_query)
    _warn_missing(report)
    if args.json:
        print_json(report.to_dict())
    else:
        _print_eval_table(report, args.per_query)
    return 0


def _warn_missing(report: Any) -> None:
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


def _print_eval_table(report: Any, per_query: str | None) -> None:
    ranking = "exact ranking" if report.ranking == "exact" else f"ANN ranking (top {report.cutoff})"
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


def register_query_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``search``, ``info``, ``verify`` and ``eval`` to a ``clipsearch`` sub-parser set."""
    p = sub.add_parser("search", help="search an index by text or by image", description="Search an index by text or by image.")
    p.add_argument("index_dir", metavar="INDEX_DIR")
    p.add_argument("query", metavar="QUERY", nargs="?", help="text query")
    p.add_argument("--image", metavar="PATH", help="search with this image instead of text")
    p.add_argument("-k", "--k", type=positive_int, default=10, help="number of results (default: 10)")
    p.add_argument("--model", help="query model (default: the one recorded in the index; must be the same weights)")
    add_device_arguments(p)
    add_precision_argument(p, "fp32", "text query tower precision (image queries use the index's mode)")
    add_filter_arguments(p)
    p.add_argument("--json", action="store_true", help='print {"results": [{"id", "path", "score"}, ...]}')
    p.set_defaults(handler=_cmd_search)

    p = sub.add_parser("info", help="describe an index", description="Describe an index: model, size, skipped files.")
    p.add_argument("index_dir", metavar="INDEX_DIR")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=_cmd_info)

    p = sub.add_parser(
        "verify",
        help="check every file of an index for damage",
        description=(
            "Read every file of INDEX_DIR and check it: file checksums, Parquet page checksums, ids 0..n-1, "
            "embedding norms, path files, the FAISS vector count and a sample of FAISS vectors against the "
            "stored ones. Exits 0 when the index is intact, 1 naming each damaged file and the command that "
            "repairs it."
        ),
    )
    p.add_argument("index_dir", metavar="INDEX_DIR")
    p.add_argument(
        "--json",
        action="store_true",
        help='print {"index_dir", "ok", "generation", "count", "checksums", "files", "faiss_sampled", "problems", "notes", "seconds"}',
    )
    p.set_defaults(handler=_cmd_verify)

    p = sub.add_parser(
        "eval",
        help="measure retrieval quality on labelled queries",
        description=(
            "Rank the index for every query of QUERIES.jsonl (lines like "
            '{"query": "a red bus", "relevant": ["town/bus.png"]} or {"image": "q.jpg", "relevant": [...]}; '
            "relevant paths as the index stores them, image paths relative to the queries file) and report "
            "MRR, Recall@K, nDCG@10 and the rank of the first relevant image, next to chance level."
        ),
    )
    p.add_argument("index_dir", metavar="INDEX_DIR")
    p.add_argument("queries", metavar="QUERIES.jsonl")
    p.add_argument("--k", default="1,5,10", help="Recall@K cut-offs, comma-separated (default: 1,5,10)")
    p.add_argument("--ann", action="store_true", help="rank with the FAISS index (top max(K, 10)) instead of exactly")
    p.add_argument("--per-query", metavar="OUT.jsonl", help="also write one JSON line per evaluated query")
    p.add_argument("--batch-size", type=positive_int, default=256, help="queries encoded and ranked together (default: 256)")
    p.add_argument("--model", help="query model (default: the one recorded in the index; must be the same weights)")
    add_device_arguments(p)
    add_precision_argument(p, "fp32", "text query tower precision (image queries use the index's mode)")
    p.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    p.set_defaults(handler=_cmd_eval)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, no usage dump
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(registrars: Sequence[Registrar] = ()) -> argparse.ArgumentParser:
    from .version import __version__

    parser = _Parser(prog=PROG, description="CLIP image search: index a folder of images, search it by text or image.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for register in registrars:
        register(sub)
    register_query_commands(sub)
    return parser


@contextlib.contextmanager
def _quiet_libraries() -> Iterator[None]:
    # Library warnings (deprecations, hub notices) are for developers, not for CLI users.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    # torch and faiss-cpu each load their own OpenMP runtime; with both spinning idle threads
    # (the default ACTIVE wait) they fight over few cores and a query can take 10-40x longer
    # (benchmarks/README.md). Must be set before either library is imported.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def main(argv: Sequence[str] | None = None, registrars: Sequence[Registrar] = ()) -> int:
    """Run the CLI; returns the exit code."""
    parser = build_parser(registrars)
    args = parser.parse_args(argv)
    try:
        with _quiet_libraries():
            return int(args.handler(args))
    except ClipSearchError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `clipsearch search ... | head` closed the pipe: not an error of ours.
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
