"""clipsearch indexer: walk an image collection, embed it with CLIP, write an index directory."""

from .build import BuildConfig, BuildReport, build_index

__all__ = ["BuildConfig", "BuildReport", "build_index"]
