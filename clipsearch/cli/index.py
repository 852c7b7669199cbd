"""``clipsearch index``: embed a folder of images into an index directory (new or updated).

Also the FAISS options (``--index-type``, ``--max-memory``, ``--target-recall``) and the
recall warning, which ``reindex`` shares.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from indexer.config import BuildConfig
from retrieval.errors import InvalidArgumentError

from ._common import PROG, print_json
from .options import add_options, values_from_args

if TYPE_CHECKING:
    from ._common import Subparsers


def _read_file_list(path: str) -> list[bytes]:
    """One relative path per line; blank lines and lines starting with '#' are ignored."""
    try:
        with open(path, "rb") as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read --files-from {path}: {exc.strerror}") from exc
    # Only line ends are stripped: file names may start or end with spaces.
    return [line.rstrip(b"\r") for line in lines if line.strip() and not line.lstrip().startswith(b"#")]


def run(args: argparse.Namespace) -> int:
    """Build or update the index; print the summary line, or one JSON object with ``--json``."""
    from indexer.build import build_index

    files = _read_file_list(args.files_from) if args.files_from else None
    config = BuildConfig(**values_from_args(BuildConfig, args))
    report = build_index(args.photos_dir, args.index_dir, config, files=files)
    if args.json:
        print_json(report.to_dict())
    else:
        warn_recall(args.index_dir)
        print(
            f"indexed {report.indexed} images, skipped {report.skipped} "
            f"(added {report.added}, updated {report.updated}, removed {report.removed}, unchanged {report.unchanged}), "
            f"in {report.seconds:.1f} s ({report.images_per_second:.1f} images/s) -> {report.index_dir}"
        )
    return 0


def register(subparsers: Subparsers) -> None:
    """Add ``index`` to the ``clipsearch`` sub-parsers."""
    p = subparsers.add_parser(
        "index",
        help="build an index of a folder of images",
        description="Embed every image under PHOTOS_DIR with CLIP and write an index to INDEX_DIR.",
    )
    p.add_argument("photos_dir", metavar="PHOTOS_DIR")
    p.add_argument("index_dir", metavar="INDEX_DIR")
    p.add_argument("--files-from", metavar="LIST", help="index only the paths listed in this file (one per line, relative to PHOTOS_DIR)")
    add_options(p, BuildConfig)
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(handler=run)


# The FAISS options that ``reindex`` and ``import`` share with ``index``.
INDEX_TYPE_OPTIONS = ("index_type", "max_memory", "target_recall")


def add_index_type_arguments(parser: argparse.ArgumentParser) -> None:
    """--index-type, --max-memory, --target-recall (None: keep what the index recorded)."""
    add_options(parser, BuildConfig, INDEX_TYPE_OPTIONS)


def warn_recall(index_dir: str) -> None:
    """One line on stderr when tuning could not reach the asked recall."""
    from retrieval.layout import read_manifest

    tuning = read_manifest(index_dir).index_tuning
    if tuning and tuning.get("reached") is False:
        print(
            f"{PROG}: warning: {read_manifest(index_dir).index_type} reaches recall@10 "
            f"{tuning.get('recall_at_10')} < target {tuning.get('target_recall')}; "
            "raise --max-memory or choose another --index-type",
            file=sys.stderr,
        )
