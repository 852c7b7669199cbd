"""``clipsearch shard``, the command over :mod:`indexer.partition`: split an index into a shard
set, or add the images of another index to a set's smallest shard."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from retrieval.errors import InvalidArgumentError

from ._common import print_json

if TYPE_CHECKING:
    from ._common import Subparsers


def run(args: argparse.Namespace) -> int:
    """Split (``--shards N OUT``) or add (``--add NEW_INDEX``); print a summary line, or one JSON object with ``--json``."""
    from indexer.partition import add_to_partitions, split_index

    if (args.shards is None) == (args.add is None):
        raise InvalidArgumentError("give --shards N with OUT (split INDEX_DIR), or --add NEW_INDEX (add to the set SET)")
    if args.add is not None:
        if args.out is not None:
            raise InvalidArgumentError("--add takes the set alone: clipsearch shard SET --add NEW_INDEX")
        report = add_to_partitions(args.source, args.add)
        verb = "added to"
    else:
        if args.out is None:
            raise InvalidArgumentError("give where the set goes: clipsearch shard INDEX_DIR --shards N OUT")
        report = split_index(args.source, args.shards, args.out)
        verb = "split into"
    if args.json:
        print_json(report.to_dict())
        return 0
    shards = ", ".join(f"{name} {count}" for name, count in report.shards.items())
    print(f"{report.count} images {verb} {len(report.shards)} shards ({shards}) -> {report.out}")
    return 0


def register(subparsers: Subparsers) -> None:
    """Add ``shard`` to the ``clipsearch`` sub-parsers."""
    p = subparsers.add_parser(
        "shard",
        help="split an index into shards (for serve --ray), or add images to a shard set",
        description="Split INDEX_DIR into N shard indexes under OUT (each a normal index, with OUT/partitions.json "
        "naming them), or add the images of NEW_INDEX (indexed with the set's model) to the set's smallest shard.",
    )
    p.add_argument("source", metavar="INDEX_DIR|SET")
    p.add_argument("out", metavar="OUT", nargs="?", default=None)
    p.add_argument("--shards", type=int, default=None, metavar="N", help="how many shards to split INDEX_DIR into")
    p.add_argument("--add", default=None, metavar="NEW_INDEX", help="add the images of this index to the set SET")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(handler=run)
