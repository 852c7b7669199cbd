"""``clipsearch index``: embed a folder of images into an index directory (new or updated).

Also the FAISS options (``--index-type``, ``--max-memory``, ``--target-recall``) and the
recall warning, which ``reindex`` shares.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from retrieval.encoders import DEFAULT_MODEL
from retrieval.errors import InvalidArgumentError

from ._common import PROG, add_device_arguments, add_precision_argument, int_at_least, positive_int, print_json

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
    report = build_index(
        args.photos_dir,
        args.index_dir,
        model=args.model,
        batch_size=args.batch_size,
        workers=args.workers,
        device=args.device,
        progress=not args.no_progress,
        files=files,
        rebuild=args.rebuild,
        commit_every=args.commit_every,
        precision=args.precision,
        threads=args.threads,
        index_type=args.index_type,
        max_memory=args.max_memory,
        target_recall=args.target_recall,
        image_size=args.image_size,
        engine=args.engine,
        ray_address=args.ray_address,
        actors=args.actors,
        gpus_per_actor=args.gpus_per_actor,
        cpus_per_actor=args.cpus_per_actor,
    )
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
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"Hugging Face hub id or local checkpoint directory (default: {DEFAULT_MODEL})")
    p.add_argument("--batch-size", type=positive_int, default=None, help="images per model call (default: 64 on CPU, 512 on GPU)")
    p.add_argument(
        "--workers", type=int_at_least(0), default=None,
        help="decode worker processes (default: 0 on CPU = in-process, on --threads threads between batches; half the cores, at most 8, "
        "on GPU, which decodes the JPEGs)",
    )
    add_device_arguments(p)
    p.add_argument("--files-from", metavar="LIST", help="index only the paths listed in this file (one per line, relative to PHOTOS_DIR)")
    p.add_argument("--rebuild", action="store_true", help="re-index everything, also when the index was built with another model")
    p.add_argument(
        "--commit-every", type=positive_int, default=4096, metavar="N",
        help="publish a searchable, resumable state every N images (default: 4096)",
    )
    add_precision_argument(
        p, None, "image tower precision, recorded in the index", "auto for a new index, the recorded mode on update"
    )
    p.add_argument(
        "--threads", type=positive_int, default=None, metavar="N",
        help="torch threads for the model (default: from the core count)",
    )
    p.add_argument(
        "--image-size", type=positive_int, default=None, metavar="PX",
        help="embed images at PX x PX, e.g. 336 for a model trained at 224 (Hugging Face ViT CLIP: position embeddings "
        "interpolated; a multiple of the patch size); default: the size the index recorded, else the model's own",
    )
    add_index_type_arguments(p)
    add_engine_arguments(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(handler=run)


def _non_negative_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def _positive_number(text: str) -> float:
    value = _non_negative_number(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """--engine and the Ray options (the ``ray`` extra; nothing imports ray unless --engine ray)."""
    group = parser.add_argument_group("distributed (--engine ray, pip install 'clipsearch[ray]')")
    group.add_argument(
        "--engine", choices=("local", "ray"), default="local",
        help="where decoding and embedding run: this process (local, the default) or a Ray cluster's actors (ray)",
    )
    group.add_argument(
        "--ray-address", metavar="ADDR", default=None,
        help="Ray cluster: auto, HOST:PORT or ray://HOST:10001 (default: $RAY_ADDRESS, else Ray started on this machine)",
    )
    group.add_argument("--actors", type=positive_int, default=None, metavar="N",
                       help="encoder actors, one model each (default: one per --gpus-per-actor GPUs, else per --cpus-per-actor CPUs)")
    group.add_argument("--gpus-per-actor", type=_non_negative_number, default=0.0, metavar="G",
                       help="GPUs per actor (default: 0, CPU actors)")
    group.add_argument("--cpus-per-actor", type=_positive_number, default=None, metavar="C",
                       help="CPUs per actor for decoding and torch threads (default: the cluster's CPUs shared among GPU actors, "
                       "else up to 4)")


def add_index_type_arguments(parser: argparse.ArgumentParser) -> None:
    """--index-type, --max-memory, --target-recall (None: keep what the index recorded)."""
    parser.add_argument(
        "--index-type",
        metavar="TYPE",
        help="auto, flat, hnsw, ivf-flat, ivf-sq8, ivf-pq, ivf-sq4-refine, ivf-pq-refine or a FAISS factory string "
        "(default: what the index recorded; auto for a new index)",
    )
    parser.add_argument(
        "--max-memory",
        metavar="SIZE",
        help="memory the FAISS index may keep resident, e.g. 4GB (default: 4GB); the float16 vectors "
        "that the -refine types re-rank with are memory-mapped and not counted",
    )
    parser.add_argument(
        "--target-recall",
        type=float,
        metavar="R",
        help="recall@10 against exact search that approximate indexes are tuned to reach (default: 0.95)",
    )


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
