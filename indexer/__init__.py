"""clipsearch indexer: walk an image collection, embed it with CLIP, write an index directory."""

from .build import BuildConfig, BuildReport, build_index
from .importer import ImportReport, import_embeddings

__all__ = ["BuildConfig", "BuildReport", "ImportReport", "build_index", "import_embeddings"]
