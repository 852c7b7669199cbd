"""``python -m retrieval``: the query commands only (``search``, ``info``)."""

from .cli import main

raise SystemExit(main())
