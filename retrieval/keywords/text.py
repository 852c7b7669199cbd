"""How words are matched: the folding, splitting and query terms of the keyword side.

Text is *folded* (NFKD, accents dropped, case-folded) before it is indexed and before it is
looked up, so ``Café`` and ``CAFE`` are one word. Each run of letters and digits is also split
where OCR and file names glue words together (``TokyoMarathon2026`` -> ``tokyo marathon 2026``,
``INVOICE4711`` -> ``invoice 4711``, ``venice_gondola`` -> ``venice gondola``), so those parts
are words of their own. A query is plain text, never syntax: it is cut into its words the same
way; one-letter words and stop words are dropped.

A word matches an image's text with a *credit* (:func:`word_credit`): a whole word or a part of
a split run counts fully; a word that ends a run counts :data:`EDGE_CREDIT` (``cat`` in
``blackcat``: compounds put their head last); a word of at least :data:`SUBSTRING_MIN`
characters that starts a run counts :data:`EDGE_CREDIT` too (``guinea`` in ``guineafowl``), and
one inside a run :data:`INSIDE_CREDIT` (``marathon`` in ``TOKYOMARATHONRUN``); a plural
(``cats`` for ``cat``) counts as an edge. A short word
never matches at the start or in the middle of a run, so ``cat`` matches neither
``concatenate`` nor ``cathedral``. The credits were chosen by measurement
(``benchmarks/bench_relevance.py``).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import InvalidArgumentError

# A query longer than this is refused (a paste of a whole document is not a search).
MAX_QUERY_CHARS = 1000
# A query word this long or longer also matches at the start of, or inside, longer runs.
SUBSTRING_MIN = 4
# A query word this long or longer matches at the end of a longer run (the trigram table's minimum).
EDGE_MIN = 3
# What a partial match counts for against a whole word's 1.
EDGE_CREDIT = 0.75
INSIDE_CREDIT = 0.5
# A short word followed by these is its plural (``cat`` in ``cats``), which counts as an edge.
_PLURAL = ("s", "es")
# The sources of an image's words, in the order results list them.
SOURCES: tuple[str, ...] = ("path", "embedded", "caption", "ocr")

# Runs of letters and digits (``_`` separates words, as in file names).
_RUN = re.compile(r"[^\W_]+")
# Where a run is split: lower->upper (camelCase), letter<->digit.
_SPLIT = re.compile(r"(?<=[^\W\d_])(?=\d)|(?<=\d)(?=[^\W\d_])|(?<=[a-z])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")

# English words too common to mean anything alone (a small fixed list: query words only).
STOP_WORDS: frozenset[str] = frozenset(
    """a about an and are as at be but by for from has have in into is it its of on or that the
    their there these this to was were will with without not no photo photos picture pictures image
    images img dsc jpg jpeg png""".split()
)


def plain(text: str) -> str:
    """``text`` without accents, case-folded (``"Ça Va"`` -> ``"ca va"``)."""
    if text.isascii():
        return text.lower()  # the common case, without decomposing
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(c for c in decomposed if not unicodedata.combining(c)).casefold()


def fold(text: str) -> str:
    """:func:`plain`, with the digit 0 read as the letter o, in text and queries alike: OCR
    reads one for the other (``INV0ICE``), and a number keeps matching itself (``2o19``)."""
    return plain(text).replace("0", "o")


def words_of(text: str) -> list[str]:
    """The folded words of ``text``: each run, and its parts where it splits (see the module)."""
    out: list[str] = []
    for run in _RUN.findall(text):
        parts = [p for p in _SPLIT.split(run) if p]
        out.append(fold(run))
        if len(parts) > 1:
            out.extend(fold(p) for p in parts)
    return out


def path_text(path: str) -> str:
    """The words of a stored relative path: its folders and its file name without extension."""
    stem, dot, ext = path.rpartition(".")
    return (stem if dot and "/" not in ext else path).replace("/", " ")


@dataclass(frozen=True)
class Terms:
    """The words of a query that the keyword side looks up (folded, de-duplicated, in order),
    and each one as results show it (``shown``: without the 0-as-o folding)."""

    words: tuple[str, ...]
    shown: tuple[str, ...] = ()

    def display(self, word: str) -> str:
        """How ``word`` (one of :attr:`words`) is shown."""
        return self.shown[self.words.index(word)] if self.shown else word

    def __bool__(self) -> bool:
        return bool(self.words)


def check_query_text(query: str) -> None:
    """Raises InvalidArgumentError for a query the keyword side will not take (too long)."""
    if len(query) > MAX_QUERY_CHARS:
        raise InvalidArgumentError(f"the query is {len(query)} characters long; at most {MAX_QUERY_CHARS} are searched")


def query_terms(query: str) -> Terms:
    """The words of ``query`` worth looking up: no one-letter words, no stop words.

    Raises:
        InvalidArgumentError: the query is longer than :data:`MAX_QUERY_CHARS`.
    """
    check_query_text(query)
    seen: dict[str, str] = {}
    for run in _RUN.findall(query):
        for word in (run, *[p for p in _SPLIT.split(run) if p and p != run]):
            folded = fold(word)
            if len(folded) > 1 and folded not in STOP_WORDS:
                seen.setdefault(folded, plain(word))
    return Terms(tuple(seen), tuple(seen.values()))


def word_credit(word: str, text: str | None) -> float:
    """How well the folded query ``word`` matches ``text`` (0 to 1, see the module): 1 for a
    whole word or part, :data:`EDGE_CREDIT` at the end of a run (or at its start, for words of
    :data:`SUBSTRING_MIN` characters and more), :data:`INSIDE_CREDIT` inside one, else 0."""
    if not text:
        return 0.0
    folded = fold(text)
    return _credit(word, folded, set(words_of(text))) if word in folded else 0.0


def _credit(word: str, folded: str, words: set[str]) -> float:
    # word_credit on a text already folded and cut into its words, so that several query words
    # are graded against one text without folding it again for each.
    if word in words:
        return 1.0
    best = 0.0
    for run in _RUN.findall(folded):
        if word not in run:
            continue
        if len(word) >= EDGE_MIN and (run.endswith(word) or run[len(word):] in _PLURAL and run.startswith(word)):
            return EDGE_CREDIT
        if len(word) >= SUBSTRING_MIN:
            best = max(best, EDGE_CREDIT if run.startswith(word) else INSIDE_CREDIT)
    return best


def matched_words(terms: Terms, text: str | None) -> list[str]:
    """The words of ``terms`` that ``text`` matches, by the same rules as the index
    (:func:`word_credit` above 0)."""
    if not text or not terms:
        return []
    folded = fold(text)
    # Every word of the text is a part of its folded form: most texts are ruled out here.
    candidates = [t for t in terms.words if t in folded]
    if not candidates:
        return []
    words = set(words_of(text))
    return [terms.display(t) for t in candidates if _credit(t, folded, words) > 0]


def joined(values: Iterable[str | None], sep: str = "\n") -> str | None:
    """Non-empty ``values`` joined, None when there are none."""
    kept = [v for v in values if v]
    return sep.join(kept) if kept else None


__all__ = [
    "EDGE_CREDIT",
    "EDGE_MIN",
    "INSIDE_CREDIT",
    "MAX_QUERY_CHARS",
    "SOURCES",
    "STOP_WORDS",
    "SUBSTRING_MIN",
    "Terms",
    "check_query_text",
    "fold",
    "joined",
    "matched_words",
    "path_text",
    "plain",
    "query_terms",
    "word_credit",
    "words_of",
]
