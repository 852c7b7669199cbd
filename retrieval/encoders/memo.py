"""A small JSON file of remembered outcomes, keyed by strings, in the user's cache directory.

What a process may learn once and reuse in the next: ``auto``'s text precision
(:mod:`.numpy_text.gate_cache`), the checks an image tower's runtime passed
(:mod:`.runtime.checks`). The file is derived data: written atomically (a temporary file
renamed), bounded (the oldest entries go first), and any failure to read or write it is ignored,
so the work it saves simply runs again.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def memo_file(env: str, default: Path) -> Path | None:
    """The file ``$env`` names (``off``: none), else ``default``."""
    explicit = os.environ.get(env, "").strip()
    if explicit.lower() == "off":
        return None
    return Path(explicit).expanduser() if explicit else default


def user_cache() -> Path:
    """clipsearch's folder in the user's cache: ``$XDG_CACHE_HOME/clipsearch``, else ``~/.cache/clipsearch``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "clipsearch"


class JsonMemo:
    """Entries (JSON objects) under string keys in the file ``locate()`` names (None: off).

    Args:
        locate: where the file is, read on every call (the environment may change it).
        max_entries: entries kept; the oldest written go first.
    """

    def __init__(self, locate: Callable[[], Path | None], max_entries: int = 64) -> None:
        self.locate = locate
        self.max_entries = max_entries

    def _read(self, path: Path) -> dict[str, Any]:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str) -> dict[str, Any] | None:
        """The entry under ``key``, or None (off, no file, no entry, or not an object)."""
        path = self.locate()
        if path is None:
            return None
        entry = self._read(path).get(key)
        return entry if isinstance(entry, dict) else None

    def put(self, key: str, entry: dict[str, Any]) -> None:
        """Keep ``entry`` under ``key``, atomically; a failure is ignored (the work runs next time)."""
        path = self.locate()
        if path is None:
            return
        try:
            data = self._read(path)
            data.pop(key, None)
            data[key] = entry
            while len(data) > self.max_entries:
                data.pop(next(iter(data)))
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(data, f, indent=1)
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError:
            return


__all__ = ["JsonMemo", "memo_file", "user_cache"]
