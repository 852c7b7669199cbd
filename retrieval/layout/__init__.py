"""The on-disk contract of an index directory, gathered in one namespace.

An index directory holds::

    manifest.json                 the current generation: format version, model, the files below
    lock                          locked (POSIX lockf) by the one process writing the index
    gen-<generation>/
        embeddings/part-00000.parquet ...
                                  rows id, path, path_bytes, width, height, size, mtime_ns,
                                  content_hash, the nullable photo and text columns, embedding;
                                  ids run 0..count-1 across the parts
        paths/part-00000.paths ...
                                  (format 2) each part's ``path`` column as offsets + UTF-8
                                  bytes and a CRC-32 per path, memory-mapped so that a search
                                  reads (and checks) the paths of its hits only
        index.faiss               FAISS index whose row i is id i, over the first ``faiss.rows``
                                  ids (readers add the vectors of later rows on open)
        skipped.parquet           files that could not be decoded: path, path_bytes, reason, ...
        keywords.sqlite           the keyword side (SQLite FTS5, :mod:`retrieval.keywords`) over
                                  every id: the path's words, the photo's embedded description and
                                  keywords, captions, OCR text; named with its checksum under the
                                  manifest's ``keywords`` (absent in indexes built before it)

A generation never changes once its manifest is written. A writer builds the next generation in
``.staging-<generation>/`` (hard-linking the parts and FAISS file it keeps from the previous
one, so a commit costs only the new rows), renames it to ``gen-<generation>/``, atomically
replaces ``manifest.json`` and then removes the superseded generation. A crash at any point
leaves a manifest whose files all exist; a reader that opened an older generation keeps its
open files. Readers refuse a manifest whose ``format_version`` is newer than
:data:`FORMAT_VERSION`.

Each part of the contract lives in the module that implements it; every name is re-exported
here, so callers import the contract from one place:

- :mod:`retrieval.layout.filenames`: file and directory names, generation folders;
- :mod:`retrieval.layout.schemas`: the Parquet schemas and the skip list's rows;
- :mod:`retrieval.layout.paths_file`: the ``.paths`` side file;
- :mod:`retrieval.layout.checksums`: content checksums of the data files;
- :mod:`retrieval.layout.manifest`: the manifest, its format versions and its digest;
- :mod:`retrieval.layout.file_refs`: what the manifest records of each file (parts, FAISS, the sides);
- :mod:`retrieval.layout.durable`: atomic, flushed writes and the publishing of a generation.
"""

from __future__ import annotations

from .checksums import CHECKSUM_ALGORITHM, FileChecksum, checksum_file
from .durable import atomic_write, fsync_tree, publish_generation
from .file_refs import FacesRef, FaissRef, KeywordsRef, PartRef
from .filenames import (
    EMBEDDINGS_DIR,
    FACES_FILE,
    FACES_READ_FILE,
    FAISS_FILE,
    GENERATION_PREFIX,
    KEYWORDS_FILE,
    LOCK_FILE,
    MANIFEST_FILE,
    PATHS_DIR,
    PATHS_SUFFIX,
    SKIPPED_FILE,
    STAGING_PREFIX,
    generation_dir,
    holds_only_writer_leftovers,
    is_index_dir,
    part_name,
)
from .manifest import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST_DIGEST_KEY,
    Manifest,
    format_version_for,
    manifest_digest,
    read_manifest,
    write_manifest,
)
from .paths_file import PATHS_CRC_MAGIC, PATHS_HEADER, PATHS_MAGIC, paths_file_of, write_paths_file
from .schemas import (
    FACE_DESCRIPTOR_DIM,
    FACES_READ_SCHEMA,
    FACES_SCHEMA,
    FILE_ID_KEY,
    PHOTO_COLUMNS,
    SAMPLE_COLUMNS,
    SKIPPED_SCHEMA,
    TEXT_COLUMNS,
    VIDEO_COLUMNS,
    SkipRecord,
    display_path,
    embeddings_schema,
)

__all__ = [
    "CHECKSUM_ALGORITHM",
    "EMBEDDINGS_DIR",
    "FACE_DESCRIPTOR_DIM",
    "FACES_FILE",
    "FACES_READ_FILE",
    "FACES_READ_SCHEMA",
    "FACES_SCHEMA",
    "FacesRef",
    "FAISS_FILE",
    "KEYWORDS_FILE",
    "FILE_ID_KEY",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "GENERATION_PREFIX",
    "LOCK_FILE",
    "MANIFEST_DIGEST_KEY",
    "MANIFEST_FILE",
    "PATHS_CRC_MAGIC",
    "PATHS_DIR",
    "PATHS_HEADER",
    "PATHS_MAGIC",
    "PATHS_SUFFIX",
    "PHOTO_COLUMNS",
    "SAMPLE_COLUMNS",
    "VIDEO_COLUMNS",
    "TEXT_COLUMNS",
    "SKIPPED_FILE",
    "SKIPPED_SCHEMA",
    "STAGING_PREFIX",
    "FaissRef",
    "FileChecksum",
    "KeywordsRef",
    "Manifest",
    "PartRef",
    "SkipRecord",
    "atomic_write",
    "checksum_file",
    "display_path",
    "embeddings_schema",
    "format_version_for",
    "fsync_tree",
    "generation_dir",
    "holds_only_writer_leftovers",
    "is_index_dir",
    "manifest_digest",
    "part_name",
    "paths_file_of",
    "publish_generation",
    "read_manifest",
    "write_manifest",
    "write_paths_file",
]
