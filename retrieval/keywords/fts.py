"""The keyword side's file: an SQLite FTS5 database (stdlib ``sqlite3``) beside the vectors.

Two full-text tables index the same text of each image, by id (= rowid), one column per source
(:data:`~retrieval.keywords.text.SOURCES`):

- ``words`` (FTS5 ``unicode61``) holds the folded words and the parts of split runs
  (:func:`~retrieval.keywords.text.words_of`): whole-word matches;
- ``grams`` (FTS5 ``trigram``) holds the folded text itself: the candidates for matches at the
  edge of or inside runs, graded by :func:`~retrieval.keywords.text.word_credit`.

Both are contentless (the text lives in the Parquet rows and, for the hits' matched words, in the
plain ``texts`` table). Writers build the file once per generation (:func:`write_keywords`), or
copy the previous one and append the new ids (:func:`extend_keywords`); readers open it
read-only and immutable (:class:`KeywordIndex`). A query word that matches more than
:data:`NOISE_FRACTION` of the images whole says nothing about which one is meant and is dropped.
"""

from __future__ import annotations

import math
import shutil
import sqlite3
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import IndexCorruptError, IndexFormatError
from .text import EDGE_MIN, SOURCES, Terms, fold, word_credit, words_of

KEYWORDS_FORMAT = "clipsearch-keywords-1"
# A word matching more than this share of the images (and more than NOISE_MIN_ROWS of them) is noise.
NOISE_FRACTION = 0.2
NOISE_MIN_ROWS = 50
# A word found inside more runs than this is graded by its whole matches alone (grading reads
# each candidate's text).
PARTIAL_MAX = 20_000
_BATCH = 2048


def _schema() -> list[str]:
    cols = ", ".join(SOURCES)
    return [
        "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT) WITHOUT ROWID",
        f"CREATE TABLE texts(id INTEGER PRIMARY KEY, {', '.join(f'{s} TEXT' for s in SOURCES)})",
        f"CREATE VIRTUAL TABLE words USING fts5({cols}, content='', columnsize=0, tokenize='unicode61 remove_diacritics 2')",
        f"CREATE VIRTUAL TABLE grams USING fts5({cols}, content='', columnsize=0, tokenize='trigram')",
    ]


def check_engine() -> None:
    """Raises IndexFormatError when this Python's SQLite lacks FTS5's trigram tokenizer (3.34+)."""
    try:
        with sqlite3.connect(":memory:") as con:
            con.execute("CREATE VIRTUAL TABLE t USING fts5(x, tokenize='trigram')")
    except sqlite3.Error as exc:
        raise IndexFormatError(
            f"this Python's SQLite {sqlite3.sqlite_version} has no FTS5 trigram tokenizer ({exc}); "
            "the keyword side needs SQLite 3.34 or newer"
        ) from None


def _insert(con: sqlite3.Connection, docs: Iterable[tuple[int, Mapping[str, str | None]]]) -> None:
    names = ", ".join(SOURCES)
    marks = ", ".join("?" * (len(SOURCES) + 1))
    batch: list[tuple[int, Mapping[str, str | None]]] = []

    def flush() -> None:
        con.executemany(f"INSERT INTO texts(id, {names}) VALUES ({marks})", [(i, *(d.get(s) for s in SOURCES)) for i, d in batch])
        con.executemany(
            f"INSERT INTO words(rowid, {names}) VALUES ({marks})",
            [(i, *(" ".join(words_of(t)) if (t := d.get(s)) else None for s in SOURCES)) for i, d in batch],
        )
        con.executemany(
            f"INSERT INTO grams(rowid, {names}) VALUES ({marks})",
            [(i, *(fold(t) if (t := d.get(s)) else None for s in SOURCES)) for i, d in batch],
        )
        batch.clear()

    for doc in docs:
        batch.append(doc)
        if len(batch) >= _BATCH:
            flush()
    if batch:
        flush()


def write_keywords(path: Path, docs: Iterable[tuple[int, Mapping[str, str | None]]]) -> None:
    """Write a new keyword file at ``path`` from ``(id, {source: text})`` in id order."""
    check_engine()
    if path.exists():
        path.unlink()
    con = sqlite3.connect(path)
    try:
        con.execute("PRAGMA journal_mode=OFF")
        con.execute("PRAGMA synchronous=OFF")
        for statement in _schema():
            con.execute(statement)
        con.execute("INSERT INTO meta VALUES ('format', ?)", (KEYWORDS_FORMAT,))
        _finish(con, docs)
    finally:
        con.close()


def extend_keywords(previous: Path, path: Path, keep_rows: int, docs: Iterable[tuple[int, Mapping[str, str | None]]]) -> None:
    """A copy of ``previous`` (whose first ``keep_rows`` ids are still right) at ``path``, with
    ``docs`` (ids from ``keep_rows`` on) added; callers rebuild instead when ids changed."""
    shutil.copyfile(previous, path)
    con = sqlite3.connect(path)
    try:
        con.execute("PRAGMA journal_mode=OFF")
        con.execute("PRAGMA synchronous=OFF")
        rows = con.execute("SELECT count(*) FROM texts").fetchone()[0]
        if rows != keep_rows:
            raise ValueError(f"{previous} holds {rows} images, expected {keep_rows}")
        _finish(con, docs)
    finally:
        con.close()


def _finish(con: sqlite3.Connection, docs: Iterable[tuple[int, Mapping[str, str | None]]]) -> None:
    with con:
        _insert(con, docs)
    with con:
        # One b-tree segment per table: the fastest file to query.
        con.execute("INSERT INTO words(words) VALUES ('optimize')")
        con.execute("INSERT INTO grams(grams) VALUES ('optimize')")
    con.execute("VACUUM")  # (the generation's files are flushed when it is published)


@dataclass(frozen=True)
class Matches:
    """The images a query's words match, best first: ``ids``, their ``scores`` (the share of
    the query's words each matches, each word weighted by its rarity and counted with its
    match credit, :func:`~retrieval.keywords.text.word_credit`: 1 when an image matches every
    word whole) and ``ranks`` (equal scores share a rank, from 1), and ``words``, the query
    words that matched at least one image (noise dropped)."""

    ids: np.ndarray
    scores: np.ndarray
    ranks: np.ndarray
    words: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.ids)


NO_MATCHES = Matches(np.empty(0, np.int64), np.empty(0, np.float64), np.empty(0, np.int64), ())


class KeywordIndex:
    """A generation's keyword file opened read-only (one connection, one query at a time).

    Raises:
        IndexCorruptError: the file is missing or not a keyword file.
    """

    def __init__(self, path: Path, count: int, fix: str) -> None:
        self.path = path
        self.count = count
        if not path.is_file():
            raise IndexCorruptError(path, "missing", fix)
        try:
            self._con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True, check_same_thread=False)
            row = self._con.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()
        except sqlite3.Error as exc:
            raise IndexCorruptError(path, f"not a keyword file: {exc}", fix) from None
        if row is None or row[0] != KEYWORDS_FORMAT:
            raise IndexCorruptError(path, f"unknown keyword file format {row[0] if row else None!r}", fix)
        self._lock = threading.Lock()

    def close(self) -> None:
        self._con.close()

    def _ids(self, table: str, word: str, cap: int) -> np.ndarray:
        # The word is letters and digits only (query_terms), quoted: never FTS5 syntax.
        rows = self._con.execute(f"SELECT rowid FROM {table} WHERE {table} MATCH ? LIMIT ?", (f'"{word}"', cap)).fetchall()
        return np.fromiter((r[0] for r in rows), np.int64, len(rows))

    def match(self, terms: Terms, allowed: np.ndarray | None = None) -> Matches:
        """The images matching any of ``terms`` (and ``allowed``, a mask over ids, when given),
        scored by the share of the query they match (:class:`Matches`)."""
        if not terms or not self.count:
            return NO_MATCHES
        noise = max(NOISE_MIN_ROWS, int(NOISE_FRACTION * self.count))
        found: list[np.ndarray] = []
        weights: list[np.ndarray] = []
        used: list[str] = []
        total = 0.0
        with self._lock:
            for word in terms.words:
                ids, credits = self._credits(word, noise)
                if ids is None:
                    continue  # noise: it weighs nothing, matched or not
                # Rarer words weigh more (an IDF): a match on "4711" beats one on "invoice". A
                # word no image has is as rare as a word can be: the images that match the
                # rest match less of the query.
                weight = math.log(1 + self.count / max(len(ids), 1))
                total += weight
                if len(ids):
                    used.append(word)
                    found.append(ids)
                    weights.append(credits * weight)
        if not found:
            return Matches(NO_MATCHES.ids, NO_MATCHES.scores, NO_MATCHES.ranks, tuple(used))
        # Work in proportion to the matches, not to the index.
        unique, inverse = np.unique(np.concatenate(found), return_inverse=True)
        summed = np.bincount(inverse, weights=np.concatenate(weights)) / total
        if allowed is not None:
            keep = allowed[unique]
            unique, summed = unique[keep], summed[keep]
        if not len(unique):
            return Matches(NO_MATCHES.ids, NO_MATCHES.scores, NO_MATCHES.ranks, tuple(used))
        order = np.lexsort((unique, -summed))
        ids = unique[order]
        best = summed[order]
        # Competition ranks: images that match equally well share one.
        first = np.r_[True, best[1:] != best[:-1]]
        ranks = np.maximum.accumulate(np.where(first, np.arange(1, len(ids) + 1), 0))
        return Matches(ids, best, ranks, tuple(used))

    def _credits(self, word: str, noise: int) -> tuple[np.ndarray | None, np.ndarray]:
        """The ids ``word`` matches and each match's credit; None when the word is noise (it
        matches more than ``noise`` images whole)."""
        whole = self._ids("words", word, noise + 1)
        if len(whole) > noise:
            return None, np.empty(0)
        ones = np.ones(len(whole))
        if len(word) < EDGE_MIN:
            return whole, ones
        # Every whole word is also a part of its text: the trigram table's answer holds the
        # word table's. A word found inside more runs than PARTIAL_MAX says nothing about
        # which image is meant there: only its whole matches count.
        inside = np.setdiff1d(self._ids("grams", word, PARTIAL_MAX + 1), whole)
        if not len(inside) or len(inside) > PARTIAL_MAX:
            return whole, ones
        texts = self._texts_locked(inside)
        credit = np.array([max(word_credit(word, t[s]) for s in SOURCES) for t in texts])
        keep = credit > 0
        return np.concatenate([whole, inside[keep]]), np.concatenate([ones, credit[keep]])

    def texts(self, ids: Sequence[int] | np.ndarray) -> list[dict[str, str | None]]:
        """Each source's text of ``ids`` (None where it has none), in the given order."""
        with self._lock:
            return self._texts_locked(ids)

    def _texts_locked(self, ids: Sequence[int] | np.ndarray) -> list[dict[str, str | None]]:
        wanted = [int(i) for i in ids]
        found: dict[int, dict[str, str | None]] = {}
        for at in range(0, len(wanted), _BATCH):
            chunk = wanted[at : at + _BATCH]
            rows = self._con.execute(
                f"SELECT id, {', '.join(SOURCES)} FROM texts WHERE id IN ({', '.join('?' * len(chunk))})", chunk
            ).fetchall()
            found.update((r[0], dict(zip(SOURCES, r[1:], strict=True))) for r in rows)
        return [found.get(i, dict.fromkeys(SOURCES)) for i in wanted]

    def counts(self) -> dict[str, int]:
        """How many images have text from each source, and ``any`` (besides their path)."""
        with self._lock:
            cols = ", ".join(f"count({s})" for s in SOURCES)
            row = self._con.execute(f"SELECT {cols}, count(coalesce({', '.join(s for s in SOURCES if s != 'path')})) FROM texts").fetchone()
        return {**dict(zip(SOURCES, row[:-1], strict=True)), "any": row[-1]}


__all__ = [
    "KEYWORDS_FORMAT",
    "NOISE_FRACTION",
    "NOISE_MIN_ROWS",
    "NO_MATCHES",
    "PARTIAL_MAX",
    "KeywordIndex",
    "Matches",
    "check_engine",
    "extend_keywords",
    "write_keywords",
]
