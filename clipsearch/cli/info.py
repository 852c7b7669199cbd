"""``clipsearch info``: what an index holds (model, size, FAISS type, skipped files)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from ._common import open_searchable, print_json

if TYPE_CHECKING:
    from ._common import Subparsers


def run(args: argparse.Namespace) -> int:
    """Print the index's (or shard set's) description: ``key  value`` lines, or one JSON object
    with ``--json``."""
    index = open_searchable(args.index_dir, model=None, device="auto", precision="auto")
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
    if info.get("skipped_files"):
        print(f"\nskipped files ({len(info['skipped_files'])}):")
        for item in info["skipped_files"]:
            print(f"  {item['path']}: {item['reason']}")
    return 0


def register(subparsers: Subparsers) -> None:
    """Add ``info`` to the ``clipsearch`` sub-parsers."""
    p = subparsers.add_parser("info", help="describe an index or a shard set",
                              description="Describe an index: model, size, skipped files (a shard set: its shards).")
    p.add_argument("index_dir", metavar="INDEX_DIR")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)
