"""``clipsearch shard``, the command over :mod:`indexer.partition`: split an index into a shard
set, join separately built indexes into one, or add the images of another index to a set's
smallest shard."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from retrieval.errors import InvalidArgumentError

from ._common import print_json

if TYPE_CHECKING:
    from ._common import Subparsers


def run(args: argparse.Namespace) -> int:
    """Split (``INDEX_DIR OUT --shards N``), join (``--join INDEX_DIR... OUT``) or add
    (``SET --add NEW_INDEX``); print a summary line, or one JSON object with ``--json``."""
    from indexer.partition import add_to_partitions, join_indexes, split_index

    paths: list[str] = args.paths
    if sum((args.shards is not None, args.add is not None, args.join)) != 1:
        raise InvalidArgumentError(
            "give --shards N with INDEX_DIR OUT (split), --join INDEX_DIR... OUT (join), or SET --add NEW_INDEX (add)"
        )
    if args.join:
        if len(paths) < 2:
            raise InvalidArgumentError("give the indexes and where the set goes: clipsearch shard --join INDEX_DIR... OUT")
        report = join_indexes(paths[:-1], paths[-1])
        verb = "joined into"
    elif args.add is not None:
        if len(paths) != 1:
            raise InvalidArgumentError("--add takes the set alone: clipsearch shard SET --add NEW_INDEX")
        report = add_to_partitions(paths[0], args.add)
        verb = "added to"
    else:
        if len(paths) == 1:
            raise InvalidArgumentError("give where the set goes: clipsearch shard INDEX_DIR --shards N OUT")
        if len(paths) > 2:
            raise InvalidArgumentError("--shards splits one index: clipsearch shard INDEX_DIR --shards N OUT (or --join INDEX_DIR... OUT)")
        report = split_index(paths[0], args.shards, paths[1])
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
        help="split an index into shards (for serve --ray), join indexes into a shard set, or add images to one",
        description="Split INDEX_DIR into N shard indexes under OUT (each a normal index, with OUT/partitions.json "
        "naming them); or join separately built indexes (same model) into a set at OUT, each left where it is "
        "and named by OUT/partitions.json, its ids after those of the indexes before it; or add the images of "
        "NEW_INDEX (indexed with the set's model) to the set's smallest shard.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="INDEX_DIR OUT (--shards), INDEX_DIR... OUT (--join) or SET (--add)")
    p.add_argument("--shards", type=int, default=None, metavar="N", help="how many shards to split INDEX_DIR into")
    p.add_argument("--join", action="store_true", help="join the indexes INDEX_DIR... into a shard set at OUT (the last path)")
    p.add_argument("--add", default=None, metavar="NEW_INDEX", help="add the images of this index to the set SET")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(handler=run)
