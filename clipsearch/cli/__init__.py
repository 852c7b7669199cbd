"""The ``clipsearch`` command: one parser, one module per command, one ``main``.

The console script (``clipsearch``) and ``python -m clipsearch`` both run :func:`main`. A new
command is a module here with ``register(subparsers)`` and ``run(args) -> int``, listed in
:data:`COMMANDS`. This package is the only one that imports both ``retrieval`` and ``indexer``.
Only CLI modules turn exceptions into messages and exit codes: a user mistake prints one line
on stderr and exits 1, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import warnings
from collections.abc import Iterator, Sequence

from retrieval.errors import ClipSearchError

from . import build, classify, duplicates, eval_zeroshot, evaluate, finetune, import_, info, people, reindex, search, serve, shard, verify
from ._common import EXIT_ERROR, EXIT_INTERRUPTED, PROG, Command, Parser, int_at_least, positive_int, print_json

__all__ = ["COMMANDS", "PROG", "build_parser", "int_at_least", "main", "positive_int", "print_json"]

# In the order ``clipsearch --help`` lists them: building first, then querying.
COMMANDS: tuple[Command, ...] = (
    build, reindex, shard, import_, finetune, search, classify, duplicates, people, info, verify, evaluate, eval_zeroshot, serve,
)


def build_parser() -> argparse.ArgumentParser:
    """The ``clipsearch`` parser with every command of :data:`COMMANDS`; no model or index is loaded."""
    from retrieval.version import __version__

    parser = Parser(prog=PROG, description="CLIP image search: index a folder of images, search it by text or image.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for command in COMMANDS:
        command.register(sub)
    return parser


@contextlib.contextmanager
def _quiet_libraries() -> Iterator[None]:
    # Library warnings (deprecations, hub notices) are for developers, not for CLI users.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    # torch and faiss-cpu each load their own OpenMP runtime; with both spinning idle threads
    # (the default ACTIVE wait) they fight over few cores and a query takes many times longer
    # (measured in benchmarks/README.md). Must be set before either library is imported.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``clipsearch`` command on ``argv`` (default: ``sys.argv[1:]``); returns the exit code.

    0 on success, 1 for a :class:`~retrieval.errors.ClipSearchError` (one line on stderr), 2 for
    malformed arguments (argparse exits), 130 when interrupted.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with _quiet_libraries():
            return int(args.handler(args))
    except ClipSearchError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `clipsearch search ... | head` closed the pipe: not an error of ours.
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return 0
