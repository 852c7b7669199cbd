"""What the ``clipsearch`` commands share: the program name, exit codes, argparse value types,
JSON output and the argument groups used by more than one command.

Nothing here loads a model, an index or torch: ``clipsearch --help`` and ``info`` stay cheap.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from .options import int_at_least

PROG = "clipsearch"
EXIT_ERROR = 1
EXIT_INTERRUPTED = 130


class Parser(argparse.ArgumentParser):
    """The parser of ``clipsearch`` and of each command: a usage mistake is one line on stderr, exit 2."""

    def error(self, message: str) -> NoReturn:  # one line, no usage dump
        self.exit(2, f"{self.prog}: error: {message}\n")


if TYPE_CHECKING:
    from typing import TypeAlias

    from retrieval.filters import Filter
    from retrieval.index import ImageIndex
    from retrieval.partitions import PartitionedIndex

    # typeshed makes the sub-parser action generic; at runtime it is not subscriptable.
    Subparsers: TypeAlias = argparse._SubParsersAction[Parser]


class Command(Protocol):
    """A command module: ``register`` adds its sub-parser (whose ``handler`` is ``run``)."""

    def register(self, subparsers: Subparsers) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


positive_int = int_at_least(1)


def print_json(obj: Any) -> None:
    """One JSON object on stdout (non-ASCII kept, lone surrogates escaped)."""
    sys.stdout.write(json.dumps(obj, ensure_ascii=False).encode("utf-8", "backslashreplace").decode("utf-8") + "\n")
    sys.stdout.flush()


def open_searchable(directory: str, *, model: str | None, device: str, precision: str,
                    text_queries: int | None = None) -> ImageIndex | PartitionedIndex:
    """What ``search`` and ``info`` open at ``directory``: an index, or a shard set
    (``partitions.json``, :mod:`retrieval.partitions`) whose shards are searched in this process.
    The server's twin, which follows new generations, is :func:`clipsearch.server.shard_sets.open_served`."""
    from retrieval.index import ImageIndex
    from retrieval.partition_live import open_partitions
    from retrieval.partition_set import is_partition_set

    if is_partition_set(directory):
        return open_partitions(directory, model=model, device=device, precision=precision, text_queries=text_queries)
    return ImageIndex.open(directory, model=model, device=device, precision=precision, text_queries=text_queries)


def add_device_arguments(parser: argparse.ArgumentParser) -> None:
    """``--device`` of every command that runs a model."""
    parser.add_argument("--device", default="auto", help="auto (CUDA when available), cpu or cuda (default: auto)")


def add_precision_argument(parser: argparse.ArgumentParser, default: str | None, what: str, default_text: str = "") -> None:
    """``--precision``, checked by the handler (an unknown mode is a one-line error, exit 1)."""
    parser.add_argument(
        "--precision",
        default=default,
        metavar="MODE",
        help=f"{what}: fp32 (exact), bf16, fp16, int8 (CPU) or auto (fastest passing the quality gate) "
        f"(default: {default_text or default})",
    )


def add_query_lang_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """``--query-lang``: the language of ``what``, for a model whose tokenizer must be told it
    (the same words as ``search``'s flag, which comes from ``SearchParams``)."""
    parser.add_argument(
        "--query-lang",
        metavar="CODE",
        help=f"the language of {what} as a FLORES-200 code (eng_Latn, zho_Hans...), for a model whose tokenizer "
        "needs it (NLLB-CLIP); other models ignore it",
    )


def add_filter_arguments(parser: argparse.ArgumentParser) -> None:
    """Metadata filters of ``search``: only images passing all of them are returned (one flag per
    :class:`~retrieval.filters.Filter` field)."""
    from retrieval.filters import Filter

    from .options import add_options

    add_options(parser, Filter, group="filters (all must hold; k results whenever k images match)")


def filter_from_args(args: argparse.Namespace) -> Filter:
    """The :class:`~retrieval.filters.Filter` that :func:`add_filter_arguments`' flags describe.

    Raises:
        InvalidArgumentError: a date that does not read, or bounds that cannot match.
    """
    from retrieval.filters import Filter

    from .options import values_from_args

    return Filter(**values_from_args(Filter, args))
