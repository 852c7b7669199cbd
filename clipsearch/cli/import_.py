"""``clipsearch import``: an index from embeddings computed elsewhere (clip-retrieval output or Parquet)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ._common import positive_int, print_json
from .build import add_index_type_arguments, warn_recall

if TYPE_CHECKING:
    from ._common import Subparsers


def run(args: argparse.Namespace) -> int:
    """Import the embeddings; print the summary line, or one JSON object with ``--json``."""
    from indexer.importer import import_embeddings

    extra = {"commit_every": args.commit_every} if args.commit_every is not None else {}
    report = import_embeddings(
        args.source,
        args.index_dir,
        model=args.model,
        index_type=args.index_type,
        max_memory=args.max_memory,
        target_recall=args.target_recall,
        progress=not args.no_progress,
        storage_options=args.storage_options,
        **extra,
    )
    if args.json:
        print_json(report.to_dict())
        return 0
    warn_recall(args.index_dir)
    print(
        f"imported {report.imported} vectors ({report.source_format}) as {report.factory}, "
        f"in {report.seconds:.1f} s ({report.rows_per_second:.0f} vectors/s) -> {report.index_dir}"
    )
    return 0


def register(subparsers: Subparsers) -> None:
    """Add ``import`` to the ``clipsearch`` sub-parsers."""
    p = subparsers.add_parser(
        "import",
        help="make an index from embeddings computed elsewhere",
        description="Make a new index at INDEX_DIR from image embeddings computed elsewhere. SOURCE is a clip-retrieval "
        "inference output folder (img_emb/img_emb_N.npy with metadata/metadata_N.parquet, whose image_path becomes the "
        "path) or Parquet (a file, or a folder of *.parquet) with a path column and an embedding column (list of floats). "
        "Every row is checked before anything is written; vectors are L2-normalised and keep the source order (ids "
        "0..n-1). INDEX_DIR must be new or empty: an existing index is never overwritten. The index has no image files "
        "behind it: `clipsearch index` refuses to update it (--rebuild replaces it) and serve does not serve originals.",
    )
    p.add_argument("source", metavar="SOURCE", help="a folder or file, or a URL of an object store (s3://bucket/prefix/)")
    p.add_argument("index_dir", metavar="INDEX_DIR", help="a new or empty directory")
    p.add_argument(
        "--model", required=True,
        help="the model the vectors came from (hub id, local checkpoint directory or open_clip: name); queries are "
        "embedded with it",
    )
    add_index_type_arguments(p)
    p.add_argument(
        "--commit-every", type=positive_int, default=None, metavar="N",
        help="rows per committed generation: memory holds one commit's vectors (default: 65536)",
    )
    p.add_argument(
        "--storage-options", metavar="JSON",
        help="for a SOURCE URL: fsspec options as a JSON object (S3 reads the AWS_* variables too)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(handler=run)
