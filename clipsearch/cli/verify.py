"""``clipsearch verify``, the command over :mod:`retrieval.tools.verify`: every file read, each damaged one named with its repair."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ._common import EXIT_ERROR, PROG, print_json

if TYPE_CHECKING:
    from retrieval.tools.verify import VerifyReport

    from ._common import Subparsers


def run(args: argparse.Namespace) -> int:
    """Verify the index (a shard set: each of its shards); exit 0 when intact, 1 with one stderr
    line per damaged file."""
    from retrieval.partition_set import check_shards, is_partition_set, read_partition_set
    from retrieval.tools.verify import verify_index

    if not is_partition_set(args.index_dir):
        return _report([(args.index_dir, verify_index(args.index_dir))], args.json)
    # A set: its shards checked against it (missing, another model, another count: one line),
    # then each shard's files read as one index's.
    root = Path(args.index_dir)
    parts = read_partition_set(root)
    check_shards(root, parts)
    reports = [(os.path.normpath(root / s.path), verify_index(root / s.path)) for s in parts.shards]
    return _report(reports, args.json, [s.name for s in parts.shards])


def _report(reports: list[tuple[str, VerifyReport]], as_json: bool, shards: list[str] | None = None) -> int:
    if as_json:
        dicts = [report.to_dict() for _, report in reports]
        if shards is None:
            print_json(dicts[0])
        else:
            print_json({"ok": all(r.ok for _, r in reports), "shards": dict(zip(shards, dicts, strict=True))})
    for where, report in reports:
        if not as_json:
            _print(where, report)
        # One line per damaged file on stderr, with the repair, whatever the output format.
        for problem in report.problems:
            print(f"{PROG}: error: {problem.message()}", file=sys.stderr)
    return 0 if all(r.ok for _, r in reports) else EXIT_ERROR


def _print(where: str, report: VerifyReport) -> None:
    status = "ok" if report.ok else f"{len(report.problems)} damaged file(s)"
    if report.generation is None:
        print(f"{where}: {status} (the manifest cannot be read: nothing else was checked)")
    else:
        what = "file checksums verified" if report.checksums else "no file checksums recorded"
        faiss = f", {report.faiss_sampled} FAISS vectors compared" if report.faiss_sampled else ""
        print(f"{where}: {status} ({report.count} images, {len(report.files)} files, {what}{faiss})")
    for note in report.notes:
        print(f"note: {note}")


def register(subparsers: Subparsers) -> None:
    """Add ``verify`` to the ``clipsearch`` sub-parsers."""
    p = subparsers.add_parser(
        "verify",
        help="check every file of an index for damage",
        description=(
            "Read every file of INDEX_DIR (a shard set: of each shard) and check it: file checksums, Parquet page checksums, ids 0..n-1, "
            "embedding norms, path files, the FAISS vector count and a sample of FAISS vectors against the "
            "stored ones. Exits 0 when the index is intact, 1 naming each damaged file and the command that "
            "repairs it."
        ),
    )
    p.add_argument("index_dir", metavar="INDEX_DIR")
    p.add_argument(
        "--json",
        action="store_true",
        help='print {"index_dir", "ok", "generation", "count", "checksums", "files", "faiss_sampled", "problems", "notes", "seconds"} '
        '(a shard set: {"ok", "shards": {NAME: that object}})',
    )
    p.set_defaults(handler=run)
