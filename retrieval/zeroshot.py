"""Deprecated import path of zero-shot classification: use :mod:`retrieval.tools.zeroshot`."""

from __future__ import annotations

import warnings

from .tools.zeroshot import *  # noqa: F403
from .tools.zeroshot import __all__ as __all__

warnings.warn("retrieval.zeroshot moved to retrieval.tools.zeroshot; import from there", DeprecationWarning, stacklevel=2)
