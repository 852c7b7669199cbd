"""``python -m clipsearch``: the same program as the ``clipsearch`` console script."""

from clipsearch.cli import main

raise SystemExit(main())
