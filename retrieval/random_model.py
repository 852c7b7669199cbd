"""Deprecated path of the random checkpoint writer: use :mod:`retrieval.tools.random_model`
(``python -m retrieval.tools.random_model``)."""

from __future__ import annotations

import warnings

from .tools.random_model import *  # noqa: F403
from .tools.random_model import __all__ as __all__

warnings.warn(
    "retrieval.random_model moved to retrieval.tools.random_model; import or run (python -m) that instead",
    DeprecationWarning,
    stacklevel=2,
)

if __name__ == "__main__":
    from .tools.random_model.cli import main

    raise SystemExit(main())
