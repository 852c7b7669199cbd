"""``python -m retrieval.tools.random_model OUT_DIR [--preset tiny|vit-b-32|vit-l-14] [--seed 0]``."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
