"""One published generation of an index directory, opened for reading, and its FAISS side.

:func:`open_generation` reads the manifest, checks every recorded file's size, opens the
Parquet parts, the skip list, the path side files and the FAISS index of the generation it
names, and checks that they agree with it (file ids, row counts, id ranges, ``ntotal == rows``,
dim). A writer that replaces the generation meanwhile makes it open the new one.
:class:`Generation` holds what it opened and answers the questions put to its FAISS index.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from . import faiss_index, store
from .errors import InvalidArgumentError
from .faiss_mapping import MMAP_MIN_BYTES, FaissMapping, plan_mapping
from .keywords import KeywordIndex
from .layout import Manifest, read_manifest
from .rows import Rows, id_array

# More than one retry needs a writer committing faster than an index opens.
_OPEN_ATTEMPTS = 5
# Stored vectors a query's cosine distribution is estimated on (hybrid ranking's scale).
SCALE_SAMPLE = 2048


@dataclass(frozen=True)
class Generation:
    """One generation opened for reading: its files stay open, so a reader keeps answering from
    them after a writer has replaced the generation.

    Attributes:
        directory: the index directory.
        manifest: the generation's manifest.
        faiss: its FAISS index, complete (rows the file lacks added from the parts).
        rows: its metadata rows.
        mmap: ``mmap`` as the reader asked for it (None: by the plan), kept for the next generation.
        mapping: how the FAISS file was opened, and why (:mod:`retrieval.faiss_mapping`).
        keywords: its keyword side (:class:`~retrieval.keywords.KeywordIndex`), None in an
            index built before it.
    """

    directory: Path
    manifest: Manifest
    faiss: Any
    rows: Rows
    mmap: bool | None
    mapping: FaissMapping
    keywords: KeywordIndex | None = None

    @property
    def faiss_mmap(self) -> bool:
        """Whether the FAISS file is memory-mapped (the IVF lists, or a re-ranked index's
        float16 vectors) rather than read into RAM."""
        return self.mapping.mmap

    @property
    def exact_scores(self) -> bool:
        """True when FAISS scores are exact inner products of the stored vectors (flat storage,
        searched exhaustively): range searches then miss nothing."""
        if faiss_index.kind_of(self.faiss) != "flat":
            return False  # and no IVF direct map is built just to ask
        stored = faiss_index.stored_vectors(self.faiss, np.empty(0, np.int64))
        return stored is not None and stored[1]

    def query_vectors(self, vectors: np.ndarray) -> np.ndarray:
        """``vectors`` as a float32 array, checked to be ``(n, dim)``.

        Raises:
            InvalidArgumentError: another shape.
        """
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.manifest.dim:
            raise InvalidArgumentError(f"query vectors must have shape (n, {self.manifest.dim}), got {vectors.shape}")
        return vectors

    def search(self, vectors: np.ndarray, k: int, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(scores, ids)`` of the ``k`` nearest images to each of ``vectors`` (as
        :meth:`query_vectors` returns them), among the ids ``allowed`` is true for, when given."""
        if allowed is None:
            return faiss_index.search(self.faiss, vectors, k)
        return faiss_index.search(self.faiss, vectors, k, allowed=allowed)

    def range_search(
        self, vectors: np.ndarray, min_score: float, allowed: np.ndarray | None = None
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per query vector (as :meth:`query_vectors` returns them), ``(ids, scores)`` of every
        image scoring at least ``min_score`` (and ``allowed``, when given), by descending score,
        ties by id."""
        lims, scores, ids = faiss_index.range_search(self.faiss, vectors, min_score)
        out = []
        for q in range(len(vectors)):
            s, i = scores[lims[q] : lims[q + 1]], ids[lims[q] : lims[q + 1]]
            if allowed is not None:
                s, i = s[allowed[i]], i[allowed[i]]
            order = np.lexsort((i, -s))
            out.append((i[order].astype(np.int64), s[order]))
        return out

    def vectors_of(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """The stored embeddings of ``ids``, ``(n, dim)`` float32, in the given order."""
        if self.exact_scores:
            # A flat FAISS index holds the stored vectors as they are: copying one out is cheaper
            # than decoding the Parquet row group around it.
            stored = faiss_index.stored_vectors(self.faiss, id_array(ids, self.manifest.count))
            if stored is not None:
                return stored[0]
        return self.rows.vectors_of(ids)

    @cached_property
    def cosine_moments(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The mean ``(dim,)`` and covariance ``(dim, dim)`` of up to :data:`SCALE_SAMPLE` stored
        vectors evenly spaced by id, read once (None for an empty index): a query ``q``'s cosines
        with the collection have mean ``q @ mean`` and variance ``q @ cov @ q``."""
        count = self.manifest.count
        if not count:
            return None
        ids = np.unique(np.linspace(0, count - 1, min(count, SCALE_SAMPLE)).astype(np.int64))
        sample = self.vectors_of(ids).astype(np.float64)
        mean = sample.mean(axis=0)
        centred = sample - mean
        return mean, (centred.T @ centred) / len(sample)

    def warm(self, vectors: bool | None = None) -> int:
        """Ask the kernel to read the memory-mapped FAISS file ahead (see ``ImageIndex.warm``);
        the bytes asked for, 0 when the FAISS index is in RAM."""
        ref = self.manifest.faiss
        if ref is None or not self.faiss_mmap:
            return 0
        return faiss_index.warm(self.faiss, self.directory / ref.path, vectors)

    def info(self, text_path: dict[str, str], text_precision: dict[str, Any] | None = None) -> dict[str, Any]:
        """The facts ``clipsearch info --json`` prints, with ``text_path`` and ``text_precision``
        for the query side."""
        m = self.manifest
        return {
            "model": m.model,
            "model_fingerprint": m.model_fingerprint,
            "backend": m.backend,
            "dim": m.dim,
            "count": m.count,
            "skipped": m.skipped,
            "format_version": m.format_version,
            "complete": m.complete,
            "generation": m.generation,
            "parts": [p.path for p in m.parts],
            "index_type": m.index_type,
            "index_options": dict(m.index_options),
            "search_params": dict(m.search_params),
            "index_tuning": dict(m.index_tuning),
            "discovery": dict(m.discovery),
            "faiss_bytes": (self.directory / m.faiss.path).stat().st_size if m.faiss is not None else 0,
            "faiss_mmap": self.faiss_mmap,
            "faiss_mmap_reason": self.mapping.reason,
            "metric": m.metric,
            "preprocess": dict(m.preprocess),
            "model_info": dict(m.model_info),
            "text_path": text_path,
            "text_precision": dict(text_precision or {}),
            "source_root": m.source_root,
            # An index made by `clipsearch import` (no image files behind it): from what, and where.
            **(
                {"imported_from": m.model_info["imported_from"], "imported_source": m.model_info.get("imported_source", "")}
                if m.model_info.get("imported_from")
                else {}
            ),
            "created": m.created,
            "tool_version": m.tool_version,
            "skipped_files": [{"path": s.path, "reason": s.reason} for s in self.rows.skipped()],
            "keywords": self._keywords_info(),
        }

    def _keywords_info(self) -> dict[str, Any] | None:
        ref = self.manifest.keywords
        if ref is None or self.keywords is None:
            return None
        counts = self.keywords.counts()
        return {
            "sources": list(ref.sources),
            "with_text": ref.with_text,
            "by_source": {s: counts[s] for s in ref.sources},
            "ocr": ref.ocr,
            "bytes": ref.checksum.size,
        }


def open_generation(directory: Path, mmap: bool | None = None) -> Generation:
    """The generation ``directory`` publishes now, opened and checked.

    Args:
        directory: the index directory.
        mmap: memory-map the FAISS file, or read it into RAM; None follows the index's plan
            (:func:`retrieval.faiss_mapping.plan_mapping`).

    Raises:
        NotAnIndexError: no index there.
        UnsupportedFormatError: the index is newer than this code reads.
        IndexCorruptError: a file missing, truncated, or inconsistent with the manifest.
        IndexFormatError: the manifest is invalid.
    """
    for attempt in range(1, _OPEN_ATTEMPTS + 1):
        manifest = read_manifest(directory)
        try:
            # Opening stays O(files): sizes and footers here, whole-file digests in `verify`;
            # pages are checked against their CRC whenever they are read.
            store.check_files(directory, manifest)
            return _open_files(directory, manifest, mmap)
        except Exception:
            # A writer may have published a new generation and removed this one between our
            # reading the manifest and opening its files: then open the one it names now.
            # An unchanged manifest means the files really are missing or damaged.
            if attempt == _OPEN_ATTEMPTS or read_manifest(directory).generation == manifest.generation:
                raise
    raise AssertionError("unreachable")


def _open_files(directory: Path, manifest: Manifest, mmap: bool | None) -> Generation:
    parts = store.open_parts(directory, manifest)
    skipped = store.open_parquet(directory / manifest.skipped_file, store.rebuild_hint(directory, manifest))
    mapping = mapping_of(directory, manifest, mmap)
    faiss = store.load_faiss(directory, manifest, parts, mmap=mapping.mmap)
    keywords = None
    if manifest.keywords is not None:
        keywords = KeywordIndex(directory / manifest.keywords.path, manifest.count, store.rebuild_hint(directory, manifest))
    return Generation(directory, manifest, faiss, Rows.open(directory, manifest, parts, skipped), mmap, mapping, keywords)


def mapping_of(directory: Path, manifest: Manifest, mmap: bool | None = None) -> FaissMapping:
    """How the FAISS file of ``manifest`` in ``directory`` is opened (``mmap`` as a reader asks)."""
    faiss_file = directory / manifest.faiss.path if manifest.faiss is not None else None
    size = faiss_file.stat().st_size if faiss_file is not None and faiss_file.is_file() else 0
    return plan_mapping(manifest, size, mmap)


__all__ = ["MMAP_MIN_BYTES", "Generation", "mapping_of", "open_generation"]
