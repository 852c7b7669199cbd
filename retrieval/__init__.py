"""clipsearch query layer: open an index, encode queries with CLIP, rank with FAISS.

Importing this package does no work: models load on first query, FAISS on first open.
"""

from .errors import (
    ClipSearchError,
    ImageDecodeError,
    ImportSourceError,
    IndexCorruptError,
    IndexDirError,
    IndexFormatError,
    IndexLockedError,
    InvalidArgumentError,
    ModelLoadError,
    ModelMismatchError,
    NotAnIndexError,
    PhotosDirError,
    UnsupportedFormatError,
)
from .images import preprocess_tensor
from .index import Hit, ImageIndex, SkippedFile
from .tools.verify import VerifyReport, verify_index
from .version import __version__

__all__ = [
    "ClipSearchError",
    "Hit",
    "ImageDecodeError",
    "ImageIndex",
    "ImportSourceError",
    "IndexCorruptError",
    "IndexDirError",
    "IndexFormatError",
    "IndexLockedError",
    "InvalidArgumentError",
    "ModelLoadError",
    "ModelMismatchError",
    "NotAnIndexError",
    "PhotosDirError",
    "SkippedFile",
    "UnsupportedFormatError",
    "VerifyReport",
    "__version__",
    "preprocess_tensor",
    "verify_index",
]
