"""``clipsearch serve``: the HTTP API and the web UI over one or more index directories.

A thin layer over :mod:`retrieval`: requests are parsed and validated here, answered by the same
``ImageIndex`` calls the CLI makes, and serialised. Importing this package imports FastAPI (the
``server`` extra); the ``clipsearch`` command imports it only when ``serve`` runs.
"""

from __future__ import annotations

from .app import create_app
from .config import ServerConfig

__all__ = ["ServerConfig", "create_app"]
