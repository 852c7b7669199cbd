"""Keeping open_clip's logging and warnings off the user's terminal while it builds a model."""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator


class _OpenClipLogFilter(logging.Filter):
    """Drops records logged from inside the open_clip package (it logs on the root logger)."""

    def __init__(self, package_dir: str) -> None:
        super().__init__()
        self.package_dir = package_dir

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.pathname.startswith(self.package_dir)


@contextlib.contextmanager
def _quiet_open_clip() -> Iterator[None]:
    """Keep open_clip's progress chatter (and its 'initialized randomly' warning, which is
    about the step before our weights load) off the user's terminal and logging config."""
    import open_clip

    root = logging.getLogger()
    log_filter = _OpenClipLogFilter(os.path.dirname(open_clip.__file__))
    # logging.warning() on a root logger without handlers installs a stderr handler for good.
    guard = logging.NullHandler() if not root.handlers else None
    if guard is not None:
        root.addHandler(guard)
    root.addFilter(log_filter)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        root.removeFilter(log_filter)
        if guard is not None:
            root.removeHandler(guard)
