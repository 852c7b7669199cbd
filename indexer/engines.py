"""Which engines a build can run on, by name (``BuildConfig.engine``): ``local`` runs in this
process (:mod:`indexer.embed`); ``ray`` on a Ray Data actor pool (:mod:`indexer.ray_engine`,
imported only when a build asks for it). A new engine is one more entry in :data:`ENGINES`,
implementing :class:`~indexer.engine.Engine`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager

from .build_config import BuildConfig
from .engine import Engine, LocalEngine


def _local(cfg: BuildConfig) -> AbstractContextManager[Engine]:
    return contextlib.nullcontext(LocalEngine(cfg))


def _ray(cfg: BuildConfig) -> AbstractContextManager[Engine]:
    from .ray_engine import ray_run  # Ray is imported only by a build that runs on it

    return ray_run(cfg)


# The engines by name (BuildConfig.engine): each opens for one build and closes after it.
# (indexer.build_config.ENGINES lists the same names for the option's check, before anything is opened.)
ENGINES: dict[str, Callable[[BuildConfig], AbstractContextManager[Engine]]] = {"local": _local, "ray": _ray}


# Engines whose workers load the model themselves, from the build's model name: a build on one
# cannot take an encoder loaded by the caller.
LOADS_ITS_OWN_MODEL = frozenset({"ray"})


def open_engine(cfg: BuildConfig) -> AbstractContextManager[Engine]:
    """The engine ``cfg.engine`` names, opened for one build (a cluster is connected here, so one
    that does not answer fails before the walk and the model load)."""
    return ENGINES[cfg.engine](cfg)


__all__ = ["ENGINES", "LOADS_ITS_OWN_MODEL", "open_engine"]
