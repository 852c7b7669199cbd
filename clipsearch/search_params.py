"""The search parameters beside the query, declared once: how many results, from which rank, in
which served index, the relevance cut-off, the order, the ranking mode, the text's language, and
the terms of query arithmetic.

:class:`SearchParams`' fields are the flags of ``clipsearch search`` (where it has them), the
fields of the search API's GET query, JSON body and multipart form, and the docs' ``search``
table (``clipsearch.cli.options``, ``clipsearch.server.fields``, ``clipsearch.reference``). A
parameter added here shows up in all of them; the code that answers a search then uses it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from retrieval.hits import SORTS
from retrieval.keywords import MODES
from retrieval.options import option

# Search depth: offset + k may not exceed this (a page past it would make FAISS rank a large
# share of the index for one request).
MAX_DEPTH = 10_000
MAX_K = 1000
# Query arithmetic: at most this many add / subtract terms per request (each is a model call).
MAX_TERMS = 16
# The CLI help section of the query arithmetic flags.
ARITHMETIC = "query arithmetic (the query is the normalised weighted sum of its terms' normalised embeddings)"


@dataclass(frozen=True)
class SearchParams:
    """What a search asks for besides its query (the text, image or vector).

    The server bounds what one request may ask (``k``, ``offset + k``, the number of terms); the
    CLI ranks as deep as it is asked. A term is text with an optional ``N:`` weight before it; on
    the CLI it may also be an image file, in a JSON body an ``{"image_id", "weight"}`` object.
    """

    k: int = field(
        default=10,
        metadata=option(
            "number of results (with --min-score: at most this many; default there: every hit)",
            short="-k",
            minimum=1,
            http_max=MAX_K,
            http=True,
        ),
    )
    offset: int = field(
        default=0,
        metadata=option(
            f"results to skip: the page starts at this rank (offset + k at most {MAX_DEPTH})",
            cli=False,
            minimum=0,
            http_max=MAX_DEPTH,
            http=True,
        ),
    )
    index: str | None = field(default=None, metadata=option("index name (default: the first served)", cli=False, http=True))
    min_score: float | None = field(
        default=None,
        metadata=option(
            "only results scoring at least S (a cosine in [-1, 1]), however many that is",
            metavar="S",
            http=True,
        ),
    )
    sort: str = field(
        default="score",
        metadata=option(
            "order of the results: score (best first) or taken (newest photo first, undated last)",
            choices=SORTS,
            http=True,
        ),
    )
    mode: str | None = field(
        default=None,
        metadata=option(
            "how a text query ranks: hybrid (its words in file names, photo keywords, captions and OCR text fused "
            "with the vector ranking), vector (the embedding alone) or keyword (only images whose words match); "
            "image queries and query arithmetic are vector-only",
            default_text="hybrid where the index has a keyword side, else vector",
            choices=MODES,
            http=True,
        ),
    )
    query_lang: str | None = field(
        default=None,
        metadata=option(
            "the text's language as a FLORES-200 code (eng_Latn, zho_Hans, rus_Cyrl...), for a model whose "
            "tokenizer needs it (NLLB-CLIP); other models read any language as it is and ignore it",
            metavar="CODE",
            http=True,
        ),
    )
    add: tuple[str, ...] = field(
        default=(), metadata=option("add this term (repeatable)", metavar="TERM", group=ARITHMETIC, http_max=MAX_TERMS, http=True)
    )
    subtract: tuple[str, ...] = field(
        default=(),
        metadata=option("subtract this term (repeatable)", metavar="TERM", group=ARITHMETIC, http_max=MAX_TERMS, http=True),
    )


__all__ = ["ARITHMETIC", "MAX_DEPTH", "MAX_K", "MAX_TERMS", "SearchParams"]
