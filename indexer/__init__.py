"""clipsearch indexer: walk an image collection, embed it with CLIP, write an index directory."""

from .build import BuildConfig, BuildReport, build_index
from .importer import ImportReport, import_embeddings
from .watch import WatchReport, watch_index
from .watch_config import WatchConfig

__all__ = [
    "BuildConfig", "BuildReport", "ImportReport", "WatchConfig", "WatchReport", "build_index", "import_embeddings", "watch_index",
]
