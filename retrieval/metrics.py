"""The documented import path (docs/evaluation.md: ``retrieval.metrics``) of :mod:`retrieval.tools.evaluation.metrics`.

The functions live in :mod:`retrieval.tools.evaluation.metrics`; this module only re-exports them so
that scripts written against those docs keep working. Its ``__all__`` is that module's, so the
two cannot drift apart.
"""

from __future__ import annotations

from .tools.evaluation import metrics as _metrics
from .tools.evaluation.metrics import *  # noqa: F403 - the whole public API, by its own __all__

__all__ = list(_metrics.__all__)
