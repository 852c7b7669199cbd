"""``clipsearch verify``, the command over :mod:`retrieval.tools.verify`: every file read, each damaged one named with its repair."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from ._common import EXIT_ERROR, PROG, print_json

if TYPE_CHECKING:
    from ._common import Subparsers


def run(args: argparse.Namespace) -> int:
    """Verify the index; exit 0 when intact, 1 with one stderr line per damaged file."""
    from retrieval.tools.verify import verify_index

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


def register(subparsers: Subparsers) -> None:
    """Add ``verify`` to the ``clipsearch`` sub-parsers."""
    p = subparsers.add_parser(
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
    p.set_defaults(handler=run)
