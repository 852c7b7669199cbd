"""Line-oriented JSON input files (queries, training pairs, caption files): reading and records.

The ``{"path": ..., "caption": ...}`` record is read by one parser, :func:`parse_caption_line`,
for both fine-tuning pairs files and caption datasets
(``retrieval.tools.evaluation.dataset_readers``), so a file one accepts the other accepts too.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .errors import InvalidArgumentError

#: Keys accepted for the image path and the caption of a caption record, in order of preference
#: (CSV caption files use the same names for their header columns).
PATH_KEYS: tuple[str, ...] = ("path", "filepath", "image", "image_path")
CAPTION_KEYS: tuple[str, ...] = ("caption", "text")


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


def parse_caption_line(obj: Any) -> tuple[str, str]:
    """The ``(image path, caption)`` of one decoded caption-file line.

    The path is returned as written (callers resolve or normalise it); the caption stripped of
    surrounding white space. Other keys (``category``, ...) are ignored.

    Args:
        obj: the line's decoded JSON value.

    Raises:
        InvalidArgumentError: not an object, no path key (:data:`PATH_KEYS`) or no caption key
            (:data:`CAPTION_KEYS`), or a value that :func:`caption_pair` rejects. The message
            names the problem only; callers add the file and line.
    """
    if not isinstance(obj, dict):
        raise InvalidArgumentError(f"expected a JSON object, got {type(obj).__name__}")
    path_key = next((k for k in PATH_KEYS if k in obj), None)
    if path_key is None:
        raise InvalidArgumentError(f"no image path key (one of: {', '.join(PATH_KEYS)})")
    caption_key = next((k for k in CAPTION_KEYS if k in obj), None)
    if caption_key is None:
        raise InvalidArgumentError(f"no caption key (one of: {', '.join(CAPTION_KEYS)})")
    return caption_pair(obj[path_key], obj[caption_key], caption_key)


def caption_pair(path: object, caption: object, caption_key: str = "caption") -> tuple[str, str]:
    """Check one caption record's values: a non-blank path string and a non-blank caption.

    Args:
        path: the image path value.
        caption: the caption value.
        caption_key: the key or column the caption came from, named in the message.

    Returns:
        ``(path as given, caption stripped)``.

    Raises:
        InvalidArgumentError: a path that is not a string or is blank, a caption that is
            missing (null), not a string or blank.
    """
    if not isinstance(path, str):
        raise InvalidArgumentError(f"image path must be a string, got {path!r}")
    if not path.strip():
        raise InvalidArgumentError(f"image path must be a non-empty string, got {path!r}")
    if not isinstance(caption, str) or not caption.strip():
        # Both phrasings are matched on: the datasets' "empty caption for image" and the
        # training warnings' 'empty or missing "caption"'.
        raise InvalidArgumentError(f'empty caption for image {path!r} (empty or missing "{caption_key}")')
    return path, caption.strip()


__all__ = ["CAPTION_KEYS", "PATH_KEYS", "caption_pair", "parse_caption_line", "read_lines"]
