"""``clipsearch reindex``, the command over :mod:`indexer.reindex`: rebuild only the FAISS index (no image is read)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ._common import print_json
from .build import add_index_type_arguments, warn_recall

if TYPE_CHECKING:
    from ._common import Subparsers


def run(args: argparse.Namespace) -> int:
    """Rebuild the FAISS index; print the summary line, or one JSON object with ``--json``."""
    from indexer.reindex import reindex

    report = reindex(
        args.index_dir,
        index_type=args.index_type,
        max_memory=args.max_memory,
        target_recall=args.target_recall,
        progress=not args.no_progress,
    )
    if args.json:
        print_json(report.to_dict())
        return 0
    warn_recall(args.index_dir)
    tuning = report.index_tuning
    recall = f", recall@10 {tuning['recall_at_10']:.3f}" if "recall_at_10" in tuning else ""
    params = ", ".join(f"{k}={v}" for k, v in report.search_params.items())
    print(
        f"reindexed {report.count} vectors as {report.index_type}"
        f"{f' ({params})' if params else ''}{recall}, {report.faiss_bytes / 2**20:.1f} MB, "
        f"in {report.seconds:.1f} s -> {report.index_dir}"
    )
    return 0


def register(subparsers: Subparsers) -> None:
    """Add ``reindex`` to the ``clipsearch`` sub-parsers."""
    p = subparsers.add_parser(
        "reindex",
        help="rebuild the FAISS index from the stored embeddings",
        description="Rebuild only the FAISS index of INDEX_DIR from its stored embeddings (no image is read), "
        "e.g. to switch --index-type or --max-memory.",
    )
    p.add_argument("index_dir", metavar="INDEX_DIR")
    add_index_type_arguments(p)
    p.add_argument("--no-progress", action="store_true", help="no progress messages")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(handler=run)
