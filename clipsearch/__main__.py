"""``python -m indexer``: the full ``clipsearch`` command."""

from .cli import main

raise SystemExit(main())
