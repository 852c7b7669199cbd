"""The harness a benchmark runs in: the options they share, the record, the report, the error line.

A benchmark script keeps only what it measures; its ``main`` reads::

    bench = Bench("bench_x", __doc__, "seed", "work_dir")   # shared options it takes
    bench.parser.add_argument("--rows", type=int, default=100)  # its own
    args = bench.parse(argv)
    with bench.scratch() as work:                             # under --work-dir, removed after
        rows = measure(work, args.rows, args.seed)
    if not rows:
        return bench.fail("nothing measured")                  # "bench_x: error: ..." on stderr, 1
    bench.report({"bench": "x", "rows": rows}, ["a readable table", ...])
    return 0

:meth:`Bench.report` prints the record as one JSON line first (the line tests and scripts
read), with the date, the command line and :func:`_common.machine_facts` under ``machine``;
then, where a benchmark's rows are read one by one, a JSON line per row; then the table,
ending with the machine in words; and writes the record to ``--json-out`` when given.
``_common.machine_facts`` stays the one description of the machine.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _common import machine_facts

# Options several benchmarks take with one meaning, declared once; a script names those it uses.
SHARED: dict[str, tuple[str, dict[str, Any]]] = {
    "seed": ("--seed", {"type": int, "default": 0, "help": "seed of the generated data (default: 0)"}),
    "work_dir": ("--work-dir", {"type": Path, "metavar": "DIR",
                                "help": "where scratch files go: a temporary directory made under DIR, removed after "
                                        "(default: the system's temporary directory)"}),
    "threads": ("--threads", {"type": int, "default": None, "help": "torch threads (default: torch's choice, every core)"}),
}


def parser(prog: str, doc: str | None, *shared: str) -> argparse.ArgumentParser:
    """An argument parser for benchmark ``prog``: its description the first paragraph of ``doc``,
    ``--json-out`` for every benchmark, and the :data:`SHARED` options named in ``shared``.

    Raises:
        KeyError: a name in ``shared`` that :data:`SHARED` does not declare.
    """
    description = " ".join((doc or "").strip().split("\n\n")[0].split())
    p = argparse.ArgumentParser(prog=prog, description=description or None)
    for name in shared:
        flag, kwargs = SHARED[name]
        p.add_argument(flag, **kwargs)
    p.add_argument("--json-out", type=Path, metavar="PATH", help="also write the JSON record here (indented)")
    return p


def note(message: str) -> None:
    """A progress line while a benchmark runs, ``# message`` on stderr (stdout is the report's)."""
    print(f"# {message}", file=sys.stderr, flush=True)


def listed(kind: Callable[[str], Any] = str, choices: Sequence[str] | None = None) -> Callable[[str], list[Any]]:
    """An argparse type for a comma-separated list (``--sizes 10_000,100_000``): each item through
    ``kind`` (``int``: a count, at least 1), one of ``choices`` where given; an empty list is wrong."""

    def parse(text: str) -> list[Any]:
        items = [s.strip() for s in text.split(",") if s.strip()]
        if not items:
            raise argparse.ArgumentTypeError("expected a comma-separated list")
        if choices is not None and any(i not in choices for i in items):
            raise argparse.ArgumentTypeError(f"choose from {','.join(choices)}, got {text!r}")
        try:
            values = [kind(i) for i in items]
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad list {text!r}") from None
        if kind is int and any(v < 1 for v in values):
            raise argparse.ArgumentTypeError(f"values must be >= 1, got {text!r}")
        return values

    return parse


def machine_line(machine: dict[str, Any]) -> str:
    """The machine in words, the table's last line: CPU, cores, the level clipsearch acts on, GPU."""
    line = f"CPU: {machine['cpu']}, {machine['cores']} cores"
    level = machine.get("cpu_level") or {}
    if level.get("level"):
        line += f", level {level['level']}" + (f" (detected {level['detected']})" if level.get("detected") != level["level"] else "")
    return f"{line}; GPU: {machine['cuda']}" if machine.get("cuda") else line


class Bench:
    """One run of a benchmark: its parser, scratch directory, error line and report."""

    def __init__(self, prog: str, doc: str | None, *shared: str) -> None:
        self.prog = prog
        self.parser = parser(prog, doc, *shared)
        self.argv: list[str] = []
        self.args = argparse.Namespace()

    def parse(self, argv: Sequence[str] | None) -> argparse.Namespace:
        """The parsed options (``sys.argv[1:]`` when ``argv`` is None), kept for the record."""
        self.argv = list(sys.argv[1:] if argv is None else argv)
        self.args = self.parser.parse_args(self.argv)
        return self.args

    @property
    def command(self) -> str:
        return shlex.join(["python", f"benchmarks/{self.prog}.py", *self.argv])

    @contextmanager
    def scratch(self) -> Iterator[Path]:
        """A temporary directory (under ``--work-dir`` where the benchmark takes it), removed after."""
        with tempfile.TemporaryDirectory(prefix=f"{self.prog}-", dir=getattr(self.args, "work_dir", None)) as tmp:
            yield Path(tmp)

    def fail(self, message: object, status: int = 1) -> int:
        """The benchmark's failure as one line on stderr, ``PROG: error: message``; returns ``status``
        for ``main`` (1; 2, argparse's, for options found wrong after parsing)."""
        print(f"{self.prog}: error: {message}", file=sys.stderr, flush=True)
        return status

    def report(self, fields: dict[str, Any], table: Iterable[str], rows: Iterable[dict[str, Any]] = ()) -> dict[str, Any]:
        """Print the record as one JSON line, then each of ``rows`` as a JSON line of its own (with
        the record's ``date`` and ``machine``: a line a script can read alone), then ``table`` and
        the machine line; write the record to ``--json-out`` if given. Returns the record:
        ``fields`` with ``date`` (unless given), ``command`` and ``machine`` added."""
        record = {**fields, "date": fields.get("date", time.strftime("%Y-%m-%d")), "command": self.command,
                  "machine": machine_facts()}
        print(json.dumps(record, ensure_ascii=False), flush=True)
        for row in rows:
            print(json.dumps({**row, "date": record["date"], "machine": record["machine"]}, ensure_ascii=False))
        json_out = getattr(self.args, "json_out", None)
        if json_out is not None:
            json_out.parent.mkdir(parents=True, exist_ok=True)
            json_out.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
        print()
        for line in table:
            print(line)
        print()
        print(machine_line(record["machine"]), flush=True)
        return record
