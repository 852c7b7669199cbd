"""The keyword side of an index: words from paths, photo metadata, captions and OCR, matched
by SQLite FTS5 and fused with the vector ranking.

- :mod:`.text`: folding, splitting runs, the words of a query (never syntax);
- :mod:`.fts`: the FTS5 file, written per generation and read by :class:`KeywordIndex`;
- :mod:`.fusion`: the fused score of an image's cosine and keyword coverage.
"""

from __future__ import annotations

from .fts import KEYWORDS_FORMAT, NO_MATCHES, KeywordIndex, Matches, check_engine, extend_keywords, write_keywords
from .fusion import KEYWORD_WEIGHT, MODES, Z_FLOOR, CosineScale, check_mode, fuse, fused_scores
from .text import (
    EDGE_CREDIT,
    INSIDE_CREDIT,
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
    word_credit,
    words_of,
)

__all__ = [
    "EDGE_CREDIT",
    "INSIDE_CREDIT",
    "KEYWORDS_FORMAT",
    "KEYWORD_WEIGHT",
    "MAX_QUERY_CHARS",
    "MODES",
    "NO_MATCHES",
    "SOURCES",
    "SUBSTRING_MIN",
    "Z_FLOOR",
    "CosineScale",
    "KeywordIndex",
    "Matches",
    "Terms",
    "check_engine",
    "check_mode",
    "check_query_text",
    "extend_keywords",
    "fold",
    "fuse",
    "fused_scores",
    "joined",
    "matched_words",
    "path_text",
    "query_terms",
    "word_credit",
    "words_of",
    "write_keywords",
]
