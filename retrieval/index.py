"""``ImageIndex``: open an index directory and search it by text, image or vector."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .encoders import Encoder, TextEncoder
from .encoders.numpy_text import TextPath
from .encoders.precision import parse_precision
from .encoders.query import QueryEncoders
from .errors import InvalidArgumentError
from .filters import Filter
from .generation import MMAP_MIN_BYTES, Generation, open_generation
from .hits import Cut, Hit, check_cut, make_hits
from .hybrid import resolve_mode, text_search
from .images import PreprocessConfig
from .keywords import CosineScale, KeywordIndex, check_query_text
from .layout import read_manifest
from .query_cache import DEFAULT_CAPACITY, QueryVectorCache
from .query_terms import QueryTerm, as_term, embed_terms
from .rows import Rows, SkippedFile, check_id, source_path
from .shards import read_member


class ImageIndex:
    """A built index directory, ready to search.

    A facade over the opened generation (manifest, FAISS index, metadata rows: see
    :mod:`retrieval.generation` and :mod:`retrieval.rows`) and the query encoders
    (:class:`~retrieval.encoders.query.QueryEncoders`, which load the query model on the first
    text or image query). Opened with :meth:`open` (no encoder given), text queries on the CPU
    run on the numpy text tower of :mod:`retrieval.encoders.numpy_text` where the checkpoint
    allows it (in fp32 without importing torch; int8 products where ``auto`` gates them in);
    :meth:`text_path` says which path they take.
    Lazy loads happen under locks, so one index serves many threads; searches run unlocked.

    Args:
        generation: the opened generation it answers from.
        queries: the query encoders, made for ``generation.manifest``.
    """

    def __init__(self, generation: Generation, queries: QueryEncoders) -> None:
        self.directory = generation.directory
        self.manifest = generation.manifest
        self._generation = generation
        self._faiss = generation.faiss
        self._rows = generation.rows
        self._queries = queries

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        *,
        model: str | None = None,
        device: str = "auto",
        encoder: Encoder | None = None,
        mmap: bool | None = None,
        precision: str = "auto",
        query_cache: int = DEFAULT_CAPACITY,
        text_queries: int | None = None,
    ) -> ImageIndex:
        """Open an index directory.

        Args:
            directory: the INDEX_DIR written by ``build_index``.
            model: query with this checkpoint instead of the one recorded in the manifest; it
                must be the same weights (checked by fingerprint).
            device: where the query model runs (``auto``, ``cpu``, ``cuda``).
            encoder: an already-loaded encoder to use for queries (checked the same way).
            mmap: memory-map the FAISS index (True) or read it into RAM (False); None
                (default) follows the plan the index recorded: a re-ranked index's file, or one
                larger than its ``max_memory``, is mapped, so that opening stays within the
                budget it was built for (:mod:`retrieval.faiss_mapping`; ``info()`` says which
                and why).
            precision: text tower precision for queries (``fp32``, ``bf16``, ``fp16``,
                ``int8``, ``auto``; see ``retrieval.encoders.precision``). The default ``auto``
                takes the fastest reduced mode whose vectors pass the quality gate against
                fp32's (scores then within the gate's cosine of fp32's), else fp32; ``fp32``
                gives exact scores. Image queries use the mode the index's images were
                embedded in (fp32 where the device cannot).
            query_cache: how many distinct query texts keep their vectors (least recently
                used out first; 0: none), so that a repeated text skips the text tower
                (:mod:`retrieval.query_cache`; :meth:`query_cache_info` counts hits).
            text_queries: how many text queries this process will run, when it knows (a
                one-shot command); ``auto`` then keeps fp32 where int8's set-up would cost more
                than it saves on them (:func:`retrieval.encoders.chooser.one_shot_reason`).

        Raises:
            InvalidArgumentError: a bad precision or query cache size.
            NotAnIndexError: no index there.
            UnsupportedFormatError: the index is newer than this code reads.
            IndexCorruptError: a file missing, truncated, or inconsistent with the manifest
                (an :class:`IndexFormatError`); the message names it and the repair.
            IndexFormatError: the manifest is invalid.
        """
        requested = parse_precision(precision)
        cache = QueryVectorCache(query_cache)
        generation = open_generation(Path(directory), mmap)
        queries = QueryEncoders(
            generation.manifest, model=model, device=device, encoder=encoder, precision=requested, query_cache=cache,
            text_queries=text_queries,
        )
        return cls(generation, queries)

    def reopen(self) -> ImageIndex:
        """The newest published generation of this directory.

        Returns ``self`` when the directory still publishes the generation this index answers
        from; otherwise the new generation, opened with the same settings. Query models already
        loaded are shared with it when the new generation was embedded by the same weights in
        the same mode, so a long-lived server follows updates without loading a model again.
        This index keeps answering from the files it opened (a request in flight finishes on
        its generation).

        Raises:
            The errors of :meth:`open`.
        """
        if read_manifest(self.directory).generation == self.manifest.generation:
            return self
        generation = open_generation(self.directory, self._generation.mmap)
        return ImageIndex(generation, self._queries.following(generation.manifest))

    # -- properties ---------------------------------------------------------------------------

    @property
    def count(self) -> int:
        return self.manifest.count

    @property
    def dim(self) -> int:
        return self.manifest.dim

    @property
    def preprocess(self) -> PreprocessConfig:
        return PreprocessConfig.from_dict(self.manifest.preprocess)

    def __len__(self) -> int:
        return self.count

    # -- encoder --------------------------------------------------------------------------------

    @property
    def encoder(self) -> Encoder:
        """The query encoder, loaded on first use and checked against the manifest."""
        return self._queries.encoder

    @property
    def query_model(self) -> str:
        """The model queries are encoded with: ``--model`` when given, else the index's."""
        return self._queries.query_model

    def text_path(self) -> TextPath:
        """Which text tower a text query of this index would run on (``numpy`` or ``torch``), and why.

        Reads only the checkpoint's config and file headers; no model is loaded.
        """
        return self._queries.text_path()

    def image_path(self) -> dict[str, str | None]:
        """What ran this index's image queries, once one ran (``tower``, ``runtime``, ``reason``):
        see :meth:`~retrieval.encoders.query.QueryEncoders.image_path`."""
        return self._queries.image_path()

    @property
    def text_encoder(self) -> TextEncoder:
        """The encoder text queries run on: the numpy text tower where it applies, else :attr:`encoder`.

        Raises:
            ModelMismatchError: the query model is not the index's model.
            ModelLoadError: the query model cannot be loaded.
        """
        return self._queries.text_encoder

    # -- search ---------------------------------------------------------------------------------

    def search(self, query: str, k: int | None = None, where: Filter | None = None, *, min_score: float | None = None,
               sort: str = "score", mode: str | None = None, query_lang: str | None = None) -> list[Hit]:
        """Text-to-image search.

        Args:
            query: the text (never syntax: quotes, ``AND``, ``*`` are words or nothing).
            k: number of results (default 10; fewer only when the index or the filter has
                fewer images). With ``min_score``: at most this many (default: no cap).
            where: only return images that pass this :class:`~retrieval.filters.Filter`.
            min_score: only images scoring at least this (a cosine in [-1, 1]), however many
                that is: a range search, exact for flat indexes (see :meth:`search_range`).
            sort: ``score`` (best first) or ``taken`` (newest photo first, undated last; the
                selected hits reordered).
            mode: ``hybrid`` (the vector and keyword rankings fused), ``vector`` (the embedding
                alone) or ``keyword`` (only images whose words match); default ``hybrid`` where
                the index has a keyword side, else ``vector`` (:mod:`retrieval.hybrid`).
                ``min_score`` cuts the vector side; keyword matches join whatever their score.
            query_lang: the query's FLORES-200 code (``zho_Hans``) for a model whose tokenizer
                must be told it (NLLB-CLIP: :meth:`query_languages`); other models read any
                language as it is and ignore it.

        Raises:
            InvalidArgumentError: empty query, k < 1, min_score outside [-1, 1], a bad sort, a
                bad mode (or ``keyword`` without a keyword side), a query over
                :data:`~retrieval.keywords.MAX_QUERY_CHARS` characters in hybrid or keyword mode,
                a missing or unknown query language where the model needs one.
            ModelMismatchError: the query model is not the index's model.
        """
        return self.search_many([query], k, where=where, min_score=min_score, sort=sort, mode=mode,
                                query_lang=query_lang)[0]

    def search_many(self, queries: Sequence[str], k: int | None = None, where: Filter | None = None, *,
                    min_score: float | None = None, sort: str = "score", mode: str | None = None,
                    query_lang: str | None = None) -> list[list[Hit]]:
        """Search several texts at once (encoded and searched in batches); arguments as :meth:`search`."""
        check_cut(k, min_score, sort)
        run_mode = resolve_mode(mode, self.keywords)
        if isinstance(queries, str):
            raise InvalidArgumentError("search_many takes a list of queries, not a single string")
        for q in queries:
            if not isinstance(q, str) or not q.strip():
                raise InvalidArgumentError("query must be a non-empty text")
            if run_mode != "vector":
                check_query_text(q)
        if not queries:
            return []
        vectors = self.embed_texts(list(queries), query_lang)
        return self.search_embedded(list(queries), vectors, k, where, min_score=min_score, sort=sort, mode=run_mode)

    def search_embedded(self, queries: Sequence[str], vectors: np.ndarray, k: int | None = None, where: Filter | None = None,
                        *, min_score: float | None = None, sort: str = "score", mode: str | None = None) -> list[list[Hit]]:
        """:meth:`search_many` with the queries' vectors made already (by :meth:`embed_texts`,
        e.g. under a server's model lock); the keyword side reads ``queries``."""
        cut = check_cut(k, min_score, sort)
        run_mode = resolve_mode(mode, self.keywords)
        if run_mode != "vector":
            for q in queries:
                check_query_text(q)
        return text_search(self, list(queries), self._generation.query_vectors(np.asarray(vectors)), cut, where, run_mode)

    def cosine_scale(self, vector: np.ndarray) -> CosineScale:
        """The mean and standard deviation of ``vector``'s cosine over the collection, estimated
        on a fixed sample of its stored vectors (the scale hybrid ranking fuses on)."""
        moments = self._generation.cosine_moments
        if moments is None:
            return CosineScale(0.0, 1.0)
        mean, cov = moments
        q = np.asarray(vector, np.float64)
        # einsum, not BLAS: OpenBLAS's threads would spin on after the product, beside FAISS's.
        return CosineScale(float(np.einsum("i,i->", q, mean)), float(np.sqrt(max(np.einsum("i,ij,j->", q, cov, q), 0.0))))

    @property
    def keywords(self) -> KeywordIndex | None:
        """The keyword side (:class:`~retrieval.keywords.KeywordIndex`), None in an index built before it."""
        return self._generation.keywords

    @property
    def hit_source(self) -> Rows:
        """The rows hits are made from (:func:`retrieval.hits.make_hits`)."""
        return self._rows

    def embed_texts(self, texts: Sequence[str], query_lang: str | None = None) -> np.ndarray:
        """The query vectors of ``texts`` (``(n, dim)``, L2-normalised) as searches make them:
        on :attr:`text_encoder`, through the query cache; ``query_lang`` as :meth:`search`."""
        return self._queries.embed_texts(texts, query_lang)

    def embed_image(self, image: str | bytes | os.PathLike[str] | BinaryIO) -> np.ndarray:
        """The ``(1, dim)`` query vector of an image file as :meth:`search_image` makes it: in the
        mode and on the runtime the index's images were embedded with (:meth:`image_path`).

        Raises:
            ImageDecodeError: the image cannot be decoded.
        """
        return self._queries.embed_image(image)

    def query_languages(self) -> tuple[str, ...]:
        """The FLORES-200 codes a text query must name (NLLB-CLIP's tokenizer), or () for a model
        that reads any language as it is (CLIP, SigLIP 2, XLM-R)."""
        return self._queries.query_languages()

    def query_cache_info(self) -> dict[str, Any]:
        """The query cache's ``capacity``, ``size``, ``hits`` and ``misses``."""
        return self._queries.cache_info()

    def search_image(self, image: str | bytes | os.PathLike[str] | BinaryIO, k: int | None = None,
                     where: Filter | None = None, *, min_score: float | None = None, sort: str = "score") -> list[Hit]:
        """Image-to-image search with an image file (path or binary file object); the other
        arguments as :meth:`search`.

        Raises:
            ImageDecodeError: the query image cannot be decoded.
        """
        check_cut(k, min_score, sort)
        return self.search_vectors(self.embed_image(image), k, where=where, min_score=min_score, sort=sort)[0]

    def search_combined(
        self,
        add: Sequence[str | os.PathLike[str] | QueryTerm],
        subtract: Sequence[str | os.PathLike[str] | QueryTerm] = (),
        k: int | None = None,
        where: Filter | None = None, *, min_score: float | None = None, sort: str = "score",
        query_lang: str | None = None,
    ) -> list[Hit]:
        """Query arithmetic: search with ``normalise(sum(w * e(add)) - sum(w * e(subtract)))``.

        Each term is a text (``str``), an image file (a path object) or a
        :class:`~retrieval.query_terms.QueryTerm` with its own weight (``QueryTerm(3, "id")``:
        image 3 of the index, by its stored vector); every term's embedding
        is L2-normalised before weighting. ``index.search_combined(["a dog", "in the snow"],
        subtract=["grass"])``. ``k``, ``where``, ``min_score``, ``sort``, ``query_lang`` (of the
        text terms) as :meth:`search`.

        Raises:
            InvalidArgumentError: no terms, an empty term, terms that cancel out, k < 1.
            ImageDecodeError: an image term cannot be decoded.
        """
        check_cut(k, min_score, sort)
        if isinstance(add, (str, os.PathLike)) or isinstance(subtract, (str, os.PathLike)):
            raise InvalidArgumentError("add and subtract take lists of terms, not a single term")
        terms = [as_term(t) for t in add] + [as_term(t).negated() for t in subtract]
        for t in terms:
            if t.kind == "id":
                check_id(t.value, self.count)
        vector = embed_terms(
            terms,
            lambda texts: self.embed_texts(texts, query_lang),
            lambda image: self._queries.embed_image(_named_bytes(image) if isinstance(image, bytes) else image),
            self.vectors_of,
        )
        return self.search_vectors(vector[None], k, where=where, min_score=min_score, sort=sort)[0]

    def search_similar(self, id: int, k: int | None = None, where: Filter | None = None, *,
                       min_score: float | None = None, sort: str = "score") -> list[Hit]:
        """"More like this": search with the stored embedding of image ``id`` (itself ranks
        first, score 1.0, unless a filter excludes it). No image is decoded again. The other
        arguments as :meth:`search`.

        Raises:
            InvalidArgumentError: ``id`` is not an id of this index.
        """
        check_cut(k, min_score, sort)
        vectors = self.vectors_of([check_id(id, self.count)])
        return self.search_vectors(vectors, k, where=where, min_score=min_score, sort=sort)[0]

    def vectors_of(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """The stored embeddings of ``ids`` as an ``(n, dim)`` float32 array, in the given order."""
        return self._generation.vectors_of(ids)

    def source_file(self, id: int) -> Path:
        """The original image file the index recorded for ``id``: the indexed folder
        (``manifest.source_root``) joined with the stored relative path, byte for byte.

        Only ids name files: nothing outside the indexed folder can be returned. The file may
        have changed or gone since it was indexed; the caller opens it.

        Raises:
            InvalidArgumentError: ``id`` is not an id of this index.
            IndexCorruptError: the index records no folder, or a path that leaves it.
        """
        checked = check_id(id, self.count)
        raw = self.rows([checked], columns=("path_bytes",))[0]["path_bytes"]
        return source_path(self.directory, self.manifest, checked, raw)

    def source_bytes(self, id: int) -> bytes | None:
        """The bytes of image ``id`` read out of its WebDataset shard (under ``source_root``,
        local or on a store reached with the standard credentials), checked against the recorded
        content hash; None for an image of a folder (see :meth:`source_file`).

        Raises:
            InvalidArgumentError: ``id`` is not an id of this index.
            ShardSourceError: the shard cannot be read, or changed since it was indexed.
        """
        row = self.rows([check_id(id, self.count)], columns=("shard", "member_offset", "size", "content_hash"))[0]
        if row["shard"] is None or row["member_offset"] is None:
            return None
        return read_member(self.manifest.source_root, row["shard"], row["member_offset"], row["size"],
                           content_hash=row["content_hash"])

    def sample_meta(self, ids: Sequence[int] | np.ndarray) -> list[dict[str, Any]]:
        """``caption`` and ``url`` of ``ids`` (what came with images from shards), None where absent."""
        return self._rows.sample_meta(ids)

    def search_vectors(self, vectors: np.ndarray, k: int | None = None, where: Filter | None = None, *,
                       min_score: float | None = None, sort: str = "score") -> list[list[Hit]]:
        """Search with ready query vectors ``(n, dim)`` (normalised by the caller); the other
        arguments as :meth:`search`."""
        cut = check_cut(k, min_score, sort)
        return [make_hits(self._rows, ids, scores, cut) for ids, scores in self._select(vectors, where, cut)]

    def _select(self, vectors: np.ndarray, where: Filter | None, cut: Cut) -> list[tuple[np.ndarray, np.ndarray]]:
        # Per query (ids, scores), best first: the top k, or every image at or above min_score.
        vectors = np.asarray(vectors, dtype=np.float32)
        vectors = vectors[None] if vectors.ndim == 1 else vectors
        if cut.min_score is not None:
            return self.search_range(vectors, cut.min_score, where=where)
        scores, ids = self.search_ids(vectors, cut.top_k, where=where)
        return [(row_i[row_i >= 0], row_s[row_i >= 0]) for row_s, row_i in zip(scores, ids, strict=True)]

    def search_ids(self, vectors: np.ndarray, k: int = 10, where: Filter | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The FAISS stage alone: ``(scores, ids)`` of shape ``(n, min(k, matches))``."""
        check_cut(k, None, "score")
        vectors = np.asarray(vectors, dtype=np.float32)
        vectors = self._generation.query_vectors(vectors[None] if vectors.ndim == 1 else vectors)
        return self._generation.search(vectors, k, self._rows.allowed(where))

    @property
    def exact_scores(self) -> bool:
        """True when FAISS scores are exact inner products of the stored vectors (flat storage,
        searched exhaustively): range searches then miss nothing."""
        return self._generation.exact_scores

    def search_range(
        self, vectors: np.ndarray, min_score: float, where: Filter | None = None
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Every image scoring at least ``min_score`` with each query vector ``(n, dim)``: per
        query ``(ids, scores)`` by descending score (ties by id). Exact for flat indexes; an
        approximate index may miss images (see :func:`retrieval.faiss_index.range_search`).
        """
        vectors = self._generation.query_vectors(vectors)
        return self._generation.range_search(vectors, min_score, self._rows.allowed(where))

    # -- metadata ---------------------------------------------------------------------------------

    def mask(self, where: Filter) -> np.ndarray:
        """Boolean mask over ids of the images passing ``where`` (recent masks are cached)."""
        return self._rows.mask(where)

    def paths_of(self, ids: Sequence[int] | np.ndarray) -> list[str]:
        """Stored paths of ``ids``, reading only those rows (memory-mapped path files)."""
        return self._rows.paths_of(ids)

    def sizes_of(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """``(n, 2)`` int32 recorded ``(width, height)`` of ``ids``, from the two columns read
        once and kept (8 bytes per image): a result page's sizes without a Parquet read each."""
        return self._rows.sizes_of(ids)

    def paths(self) -> list[str]:
        """Every stored path in id order (read once, then cached)."""
        return self._rows.paths()

    def embeddings(self) -> np.ndarray:
        """All stored embeddings as an ``(count, dim)`` float32 array, in id order."""
        return self._rows.embeddings()

    def iter_embeddings(self, batch_rows: int = 65536) -> Iterator[tuple[int, np.ndarray]]:
        """Stream the stored embeddings as ``(first_id, (n, dim) float32)`` chunks, in id order."""
        return self._rows.iter_embeddings(batch_rows)

    def iter_vectors(self, where: Filter | None = None, batch_rows: int = 65536) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Stream ``(ids, vectors)`` of the images passing ``where`` (all without it), in id
        order, at most ``batch_rows`` stored rows read at a time; batches with no image passing
        are skipped."""
        return self._rows.iter_vectors(where, batch_rows)

    def rows(self, ids: Sequence[int] | np.ndarray, columns: Sequence[str] = ("id", "path")) -> list[dict[str, Any]]:
        """Metadata of the given ids (any order; returned in the same order).

        Reads only the row groups that hold the ids, and only the asked columns.
        """
        return self._rows.rows(ids, columns)

    def skipped(self) -> list[SkippedFile]:
        """Files that were found but could not be decoded, with the reason."""
        return self._rows.skipped()

    def warm(self, vectors: bool | None = None) -> int:
        """Ask the kernel to read a memory-mapped FAISS file in the background, so that a
        long-running reader's first queries do not each wait for the disk: what every query
        scans (the IVF lists and codes) and, with ``vectors``, a re-ranked index's float16
        vectors too (default: when the file takes at most half the available memory). Returns
        the bytes asked for: 0 when the FAISS index is in RAM. ``serve`` calls it on every
        generation it opens; a one-shot ``search`` does not (it would read more than it uses)."""
        return self._generation.warm(vectors)

    def info(self) -> dict[str, Any]:
        """The facts ``clipsearch info --json`` prints."""
        return self._generation.info(self.text_path().to_dict(), self._queries.text_precision())


def _named_bytes(data: bytes) -> io.BytesIO:
    buf = io.BytesIO(data)
    buf.name = "the query image"  # how a decoding error names it (instead of '<stream>')
    return buf


__all__ = ["MMAP_MIN_BYTES", "Hit", "ImageIndex", "SkippedFile"]
