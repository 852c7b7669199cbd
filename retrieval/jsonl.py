"""Reading line-oriented JSON input files (queries, training pairs) with typed errors."""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterator
from pathlib import Path


def read_lines(path: str, what: str, error: Callable[[str, str], Exception]) -> Iterator[tuple[int, bytes]]:
    """Yield ``(line number, raw bytes)`` for every non-blank line of a JSONL file.

    A UTF-8 byte-order mark and CRLF line ends are accepted. The whole file is read first, so a
    missing or unreadable file fails before any line is handed out.

    Args:
        path: the file.
        what: how messages name it, e.g. ``"queries file"``.
        error: builds the exception to raise from ``(message, path)``.

    Raises:
        The exception ``error`` builds: the file is missing, a directory or unreadable.
    """
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise error(f"{what} not found", path) from None
    except IsADirectoryError:
        raise error(f"is a directory, not a {what}", path) from None
    except OSError as exc:
        raise error(f"cannot read the {what}: {exc.strerror}", path) from exc
    return _lines(data)


def _lines(data: bytes) -> Iterator[tuple[int, bytes]]:
    # Split on "\n" only: JSON strings may hold U+2028 and friends, which str.splitlines cuts.
    for number, raw in enumerate(data.split(b"\n"), 1):
        if number == 1 and raw.startswith(codecs.BOM_UTF8):
            raw = raw[len(codecs.BOM_UTF8) :]
        raw = raw.rstrip(b"\r")
        if raw.strip():
            yield number, raw
