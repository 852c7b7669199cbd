"""``clipsearch index``, the command over :mod:`indexer.build`: a folder embedded into an index directory.

New or updated; with ``--watch``, kept up to date as the folder changes (:mod:`indexer.watch`).

Also the FAISS options (``--index-type``, ``--max-memory``, ``--target-recall``) and the
recall warning, which ``reindex`` shares.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from indexer.build_config import BuildConfig
from indexer.build_report import BuildReport
from indexer.watch_config import WatchConfig
from retrieval.encoders import DEFAULT_MODEL
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

    config = BuildConfig(**values_from_args(BuildConfig, args))
    if args.watch:
        return _watch(args, config)
    files = _read_file_list(args.files_from) if args.files_from else None
    report = build_index(args.photos_dir, args.index_dir, config, files=files)
    _print_report(args, report)
    return 0


def _print_report(args: argparse.Namespace, report: BuildReport) -> None:
    if args.json:
        print_json(report.to_dict())
        return
    warn_recall(args.index_dir)
    if args.model is None and report.model != DEFAULT_MODEL:
        # Without --model an existing index keeps its own model: say which one that is.
        print(f"{PROG}: model: {report.model}, the one the index records (--model names another)", file=sys.stderr, flush=True)
    print(
        f"indexed {report.indexed} images, skipped {report.skipped} "
        f"(added {report.added}, updated {report.updated}, removed {report.removed}, unchanged {report.unchanged}), "
        f"in {report.seconds:.1f} s ({report.images_per_second:.1f} images/s) -> {report.index_dir}",
        flush=True,
    )
    if report.text_read:
        print(f"{PROG}: text read for {report.text_read} images without re-embedding in {report.text_seconds:.1f} s",
              file=sys.stderr, flush=True)
    if report.faces_read or report.faces_notes:
        print(f"{PROG}: faces: {report.faces_found} found in {report.faces_read} images read this run "
              f"in {report.faces_seconds:.1f} s, "
              f"{report.faces} in the index forming {report.people} people"
              + (f"; {report.faces_notes} images could not be read for faces" if report.faces_notes else ""),
              file=sys.stderr, flush=True)
    if report.text_notes:
        print(f"{PROG}: {report.text_notes} images indexed without some of their text (metadata ignored as malformed "
              "or too large, or OCR could not read the image)", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """An event set by the first Ctrl-C or SIGTERM (the watch then commits and returns); a
    second one interrupts at once (exit 130, the index resumable as after any crash)."""
    stop = threading.Event()

    def handler(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        print(f"{PROG}: stopping: committing what is done (again to stop at once)", file=sys.stderr, flush=True)
        stop.set()

    before = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, old in before.items():
            signal.signal(sig, old)


def _watch(args: argparse.Namespace, config: BuildConfig) -> int:
    """``--watch``: one summary per committed update (a JSON object per line with ``--json``)."""
    from indexer.watch import watch_index

    if args.files_from:
        raise InvalidArgumentError("--watch watches the whole PHOTOS_DIR; it does not take --files-from")
    from indexer.shards import is_shard_spec

    if is_shard_spec(args.photos_dir):
        raise InvalidArgumentError("--watch follows a folder's file events; re-run clipsearch index to add new shards")
    watch = WatchConfig(**values_from_args(WatchConfig, args))
    with _stop_on_signals() as stop:
        done = watch_index(
            args.photos_dir, args.index_dir, config, watch, stop=stop, on_update=lambda report: _print_report(args, report),
            log=lambda msg: print(f"{PROG}: {msg}", file=sys.stderr, flush=True),
        )
    print(f"{PROG}: stopped watching {args.photos_dir} after {done.updates} updates; the index is committed",
          file=sys.stderr, flush=True)
    return 0


def register(subparsers: Subparsers) -> None:
    """Add ``index`` to the ``clipsearch`` sub-parsers."""
    p = subparsers.add_parser(
        "index",
        help="build an index of a folder of images or of WebDataset shards",
        description="Embed every image under PHOTOS_DIR with CLIP and write an index to INDEX_DIR. PHOTOS_DIR may "
        "also be WebDataset shards: a .tar, a folder of them, a brace pattern (shards/{00000..00099}.tar), local or "
        "on an object store (s3://bucket/prefix/; see docs/shards.md).",
    )
    p.add_argument("photos_dir", metavar="PHOTOS_DIR", help="a folder of images, or shards (.tar, folder, {A..B} pattern, URL)")
    p.add_argument("index_dir", metavar="INDEX_DIR")
    p.add_argument("--files-from", metavar="LIST", help="index only the paths listed in this file (one per line, relative to PHOTOS_DIR)")
    add_options(p, BuildConfig)
    watching = p.add_argument_group(
        "watch mode", "index, then keep the index up to date as files are added, changed, moved or deleted, until "
        "Ctrl-C or SIGTERM (which commit what is done and exit 0)"
    )
    watching.add_argument("--watch", action="store_true", help="keep running and index changes within seconds")
    add_options(watching, WatchConfig)
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object (with --watch: one per update)")
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
