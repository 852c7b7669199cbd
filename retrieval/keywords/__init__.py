"""The keyword side of an index: words from paths, photo metadata, captions and OCR, matched
by SQLite FTS5 and fused with the vector ranking.

- :mod:`.text`: folding, splitting runs, the words of a query (never syntax);
- :mod:`.fts`: the FTS5 file, written per generation and read by :class:`KeywordIndex`;
- :mod:`.fusion`: reciprocal rank fusion of the keyword and vector rankings.
"""

from __future__ import annotations

from .fts import KEYWORDS_FORMAT, NO_MATCHES, KeywordIndex, Matches, check_engine, extend_keywords, write_keywords
from .fusion import MODES, RRF_K, check_mode, fuse
from .text import (
    MAX_QUERY_CHARS,
    SOURCES,
    SUBSTRING_MIN,
    Terms,
    check_query_text,
    fold,
    joined,
    matched_words,
    path_text,
    query_terms,
    words_of,
)

__all__ = [
    "KEYWORDS_FORMAT",
    "MAX_QUERY_CHARS",
    "MODES",
    "NO_MATCHES",
    "RRF_K",
    "SOURCES",
    "SUBSTRING_MIN",
    "KeywordIndex",
    "Matches",
    "Terms",
    "check_engine",
    "check_mode",
    "check_query_text",
    "extend_keywords",
    "fold",
    "fuse",
    "joined",
    "matched_words",
    "path_text",
    "query_terms",
    "words_of",
    "write_keywords",
]
