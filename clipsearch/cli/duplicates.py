"""``clipsearch duplicates``, the command over :mod:`retrieval.duplicates`: near-duplicate groups and which one to keep."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ._common import add_filter_arguments, filter_from_args, print_json

if TYPE_CHECKING:
    from ._common import Subparsers


def run(args: argparse.Namespace) -> int:
    """Find the groups; print them, or ``{"threshold", "groups", "images_in_groups", "groups_count"}`` with ``--json``."""
    from retrieval.duplicates import check_threshold, find_duplicates
    from retrieval.index import ImageIndex

    threshold = check_threshold(args.threshold)
    where = filter_from_args(args)
    index = ImageIndex.open(args.index_dir)
    report = find_duplicates(index, threshold, where=where)
    if args.json:
        print_json(report.to_dict())
        return 0
    approx = "" if report.exact else "; approximate index: pairs may be missed (`clipsearch reindex --index-type flat` for all)"
    print(f"{len(report.groups)} groups, "
          f"{report.images_in_groups} images in groups (cosine >= {report.threshold}{approx})")
    for group in report.groups:
        print(f"keep    {group.keep.path}")
        for dup in group.duplicates:
            print(f"  {dup.score:.4f}  {dup.path}")
    return 0


def _threshold(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def register(subparsers: Subparsers) -> None:
    """Add ``duplicates`` to the ``clipsearch`` sub-parsers."""
    p = subparsers.add_parser(
        "duplicates",
        help="find groups of near-duplicate images",
        description="Groups of images whose embeddings have cosine >= THRESHOLD, linked transitively; in each "
        "group the image with the most pixels (then the largest file, then the first path) is the one to keep.",
    )
    p.add_argument("index_dir", metavar="INDEX_DIR")
    p.add_argument("--threshold", type=_threshold, default=0.95, metavar="COS", help="cosine similarity in (0, 1] (default: 0.95)")
    add_filter_arguments(p)
    p.add_argument("--json", action="store_true", help='print {"threshold", "groups": [{"keep", "duplicates"}], ...}')
    p.set_defaults(handler=run)
