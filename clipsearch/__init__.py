"""clipsearch: CLIP image search over your own photos.

``retrieval`` opens indexes and answers queries, ``indexer`` builds them, and
:mod:`clipsearch.cli` is the one command line over both (``clipsearch`` or
``python -m clipsearch``). Importing this package does no work.
"""

from retrieval.version import __version__

__all__ = ["__version__"]
