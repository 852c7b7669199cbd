"""``ImageIndex``: open an index directory and search it by text, image or vector."""

from __future__ import annotations

import dataclasses
import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .encoders import Encoder
from .encoders.precision import parse_precision
from .encoders.query import QueryEncoders
from .errors import InvalidArgumentError
from .faces.current import CurrentPeople
from .filters import Filter
from .former_names import FormerNamesMeta, former_attribute
from .generation import MMAP_MIN_BYTES, Generation, open_generation
from .hits import Hit, browse, check_cut
from .hybrid import resolve_mode, text_search
from .keywords import KeywordIndex, check_query_text
from .layout import read_manifest
from .query_cache import DEFAULT_CAPACITY, QueryVectorCache
from .query_terms import embed_terms
from .request import ImageInput, SearchRequest
from .rows import Rows, SkippedFile, check_id
from .source_files import SourceFiles
from .vector_search import VectorSearch
from .video_hits import VideoFrames, as_video_hits, video_search


class ImageIndex(metaclass=FormerNamesMeta):
    """A built index directory, ready to search.

    A small facade: open it, search it (:meth:`search` with a text or a
    :class:`~retrieval.request.SearchRequest`, :meth:`search_image`, :meth:`search_vectors`),
    read its :meth:`rows` and :meth:`info`. The rest it hands out to collaborators:
    ``index.encoders`` (the query side, :class:`~retrieval.encoders.query.QueryEncoders`, which
    loads the query model on the first text or image query), ``index.vectors`` (the stored
    vectors and the FAISS stage, :class:`~retrieval.vector_search.VectorSearch`),
    ``index.metadata`` (the rows, :class:`~retrieval.rows.Rows`), ``index.files`` (the originals
    by id, :class:`~retrieval.source_files.SourceFiles`) and ``index.keywords`` (the keyword
    side). The names it had before (``index.embed_texts``, ``index.search_similar``...) still
    answer, with a ``DeprecationWarning`` that names what to use.

    Opened with :meth:`open` (no encoder given), text queries on the CPU run on the numpy text
    tower of :mod:`retrieval.encoders.numpy_text` where the checkpoint allows it (in fp32
    without importing torch; int8 products where ``auto`` gates them in);
    ``index.encoders.text_path()`` says which path they take.
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
        self._vectors = VectorSearch(generation)
        self._files = SourceFiles(generation.directory, generation.manifest, generation.rows)
        self._video_frames = VideoFrames(generation.rows)

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
                (:mod:`retrieval.query_cache`; ``index.encoders.cache_info()`` counts hits).
            text_queries: how many text queries this process will run, when it knows (a
                one-shot command); ``auto`` then keeps fp32 where int8's set-up would cost more
                than it saves on them (:func:`retrieval.encoders.text_choice.one_shot_reason`).

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

    # -- what it is -----------------------------------------------------------------------------

    @property
    def count(self) -> int:
        return self.manifest.count

    @property
    def dim(self) -> int:
        return self.manifest.dim

    def __len__(self) -> int:
        return self.count

    # -- the collaborators it hands out ----------------------------------------------------------

    @property
    def encoders(self) -> QueryEncoders:
        """The query side (:class:`~retrieval.encoders.query.QueryEncoders`): ``embed_texts``,
        ``embed_image``, ``text_path``, ``image_path``, ``query_languages``, ``cache_info``,
        ``encoder``, ``text_encoder``, ``query_model``."""
        return self._queries

    @property
    def vectors(self) -> VectorSearch:
        """The vector side (:class:`~retrieval.vector_search.VectorSearch`): the stored vectors
        (``vectors_of``, ``embeddings``, ``iter_embeddings``, ``iter_vectors``), the FAISS stage
        alone (``search_ids``, ``search_range``, ``exact_scores``) and ``warm``."""
        return self._vectors

    @property
    def metadata(self) -> Rows:
        """The rows (:class:`~retrieval.rows.Rows`): ``paths``, ``paths_of``, ``sizes_of``,
        ``sample_meta``, ``skipped``, ``mask``."""
        return self._rows

    @property
    def people(self) -> CurrentPeople:
        """The people of the faces side (:class:`~retrieval.faces.current.CurrentPeople`):
        ``has_faces``, ``people()`` (as the user's edits stand now), ``mask``, ``in_images``."""
        assert self._rows.people is not None  # an opened index's rows know their directory
        return self._rows.people

    @property
    def files(self) -> SourceFiles:
        """The originals by id (:class:`~retrieval.source_files.SourceFiles`): ``path``,
        ``shard_bytes``, ``shard_member``."""
        return self._files

    @property
    def keywords(self) -> KeywordIndex | None:
        """The keyword side (:class:`~retrieval.keywords.KeywordIndex`), None in an index built before it."""
        return self._generation.keywords

    # -- search ---------------------------------------------------------------------------------

    def search(self, query: str | SearchRequest, k: int | None = None, where: Filter | None = None, *,
               min_score: float | None = None, sort: str = "score", mode: str | None = None,
               query_lang: str | None = None) -> list[Hit]:
        """Search with a text, or with any :class:`~retrieval.request.SearchRequest` (an image,
        a vector, an indexed image's id, query arithmetic).

        ``index.search("a cat", k=5)`` is ``index.search(SearchRequest(text="a cat", k=5))``;
        with a request, give the other arguments in it.

        Args:
            query: the text (never syntax: quotes, ``AND``, ``*`` are words or nothing), or a
                checked :class:`~retrieval.request.SearchRequest`.
            k: number of results (default 10; fewer only when the index or the filter has
                fewer images). With ``min_score``: at most this many (default: no cap).
            where: only return images that pass this :class:`~retrieval.filters.Filter`.
            min_score: only images scoring at least this (a cosine in [-1, 1]), however many
                that is: a range search, exact for flat indexes
                (see :meth:`VectorSearch.search_range <retrieval.vector_search.VectorSearch.search_range>`).
            sort: ``score`` (best first) or ``taken`` (newest photo first, undated last; the
                selected hits reordered).
            mode: ``hybrid`` (the vector and keyword rankings fused), ``vector`` (the embedding
                alone) or ``keyword`` (only images whose words match); default ``hybrid`` where
                the index has a keyword side, else ``vector`` (:mod:`retrieval.hybrid`).
                ``min_score`` cuts the vector side; keyword matches join whatever their score.
            query_lang: the query's FLORES-200 code (``zho_Hans``) for a model whose tokenizer
                must be told it (NLLB-CLIP: ``index.encoders.query_languages()``); other models
                read any language as it is and ignore it.

        Returns:
            The hits, best first (or as ``sort`` orders them).

        Raises:
            InvalidArgumentError: what :class:`~retrieval.request.SearchRequest` refuses (an
                empty query, k < 1, min_score outside [-1, 1], a bad sort or mode); a request
                given with other arguments; ``keyword`` mode without a keyword side, a query
                over :data:`~retrieval.keywords.MAX_QUERY_CHARS` characters in hybrid or keyword
                mode, a missing or unknown query language where the model needs one, a vector
                of another dimension, an id not in the index, terms that cancel out.
            ImageDecodeError: an image query or term cannot be decoded.
            ModelMismatchError: the query model is not the index's model.
        """
        if isinstance(query, SearchRequest):
            if (k, where, min_score, sort, mode, query_lang) != (None, None, None, "score", None, None):
                raise InvalidArgumentError("give a SearchRequest's k, where, min_score, sort, mode and query_lang in it")
            return self._answer(query)
        return self._answer(SearchRequest(text=query, k=k, where=where, min_score=min_score, sort=sort, mode=mode,
                                          query_lang=query_lang))

    def search_image(self, image: ImageInput, k: int | None = None, where: Filter | None = None, *,
                     min_score: float | None = None, sort: str = "score") -> list[Hit]:
        """Image-to-image search with an image file (path, bytes or binary file object); the
        other arguments as :meth:`search`.

        Raises:
            InvalidArgumentError: as :meth:`search`.
            ImageDecodeError: the query image cannot be decoded.
        """
        return self._answer(SearchRequest(image=image, k=k, where=where, min_score=min_score, sort=sort))

    def search_vectors(self, vectors: np.ndarray, k: int | None = None, where: Filter | None = None, *,
                       min_score: float | None = None, sort: str = "score") -> list[list[Hit]]:
        """Search with ready query vectors ``(n, dim)`` (normalised by the caller): the hits of
        each; the other arguments as :meth:`search`.

        Raises:
            InvalidArgumentError: as :meth:`search`; vectors not ``(n, dim)``.
        """
        cut = check_cut(k, min_score, sort)
        if self._rows.has_videos:  # a video once per list, at its moment (retrieval.video_hits)
            return [self._answer(SearchRequest(vector=v, k=k, where=where, min_score=min_score, sort=sort)) for v in vectors]
        return self._vectors.hits(vectors, cut, where)

    def _answer(self, req: SearchRequest) -> list[Hit]:
        # The one path every search takes below its edge: ``req`` is checked; only what depends
        # on this index (its keyword side, its ids, its dim) is checked here.
        if req.kind == "terms":
            for t in req.terms:
                if t.kind == "id":
                    check_id(t.value, self.count)
            vector = embed_terms(
                req.terms,
                lambda texts: self._queries.embed_texts(texts, req.query_lang),
                lambda image: self._queries.embed_image(_named_bytes(image) if isinstance(image, bytes) else image),
                self._vectors.vectors_of,
            )[None]
        elif req.kind == "text":
            assert req.text is not None
            vector = np.asarray(req.vector)[None] if req.vector is not None else self._queries.embed_texts([req.text], req.query_lang)
        elif req.kind == "image":
            assert req.image is not None
            image = req.image
            vector = self._queries.embed_image(_named_bytes(image) if isinstance(image, bytes) else image)
        elif req.kind == "similar":
            vector = self._vectors.vectors_of([check_id(req.similar_to, self.count)])
        elif req.kind == "browse":
            assert req.where is not None
            allowed = self._rows.mask(req.where)
            if not self._rows.has_videos:
                return browse(self._rows, allowed, req.cut)
            # A video once, as its first frame the filter keeps (no query: no moment to find).
            return as_video_hits(browse(self._rows, self._video_frames.first_frames(allowed), req.cut), self._video_frames)
        else:
            vector = np.asarray(req.vector)[None]

        def run(ask: SearchRequest) -> list[Hit]:
            if ask.kind == "text":
                assert ask.text is not None
                return self._texts([ask.text], vector, ask)[0]
            return self._vectors.hits(vector, ask.cut, ask.where)[0]

        if not self._rows.has_videos:
            return run(req)
        # A video is many frame rows: one hit per file, with its moments (retrieval.video_hits).
        return video_search(lambda k: run(dataclasses.replace(req, k=k if k is not None else req.k, sort="score")), req.cut,
                            self.count, self._video_frames, self._generation.query_vectors(vector)[0], self._vectors.vectors_of)

    def _texts(self, texts: list[str], vectors: np.ndarray | None, req: SearchRequest) -> list[list[Hit]]:
        # Text queries in the request's mode, resolved for this index (and their length checked
        # for the keyword side); embedded here unless their vectors are given.
        mode = resolve_mode(req.mode, self.keywords)
        if mode != "vector":
            for text in texts:
                check_query_text(text)
        if vectors is None:
            vectors = self._queries.embed_texts(texts, req.query_lang)
        return text_search(self._vectors, texts, self._generation.query_vectors(np.asarray(vectors)), req.cut, req.where, mode)

    # -- rows and facts ---------------------------------------------------------------------------

    def rows(self, ids: Sequence[int] | np.ndarray, columns: Sequence[str] = ("id", "path")) -> list[dict[str, Any]]:
        """Metadata of the given ids (any order; returned in the same order).

        Reads only the row groups that hold the ids, and only the asked columns.
        """
        return self._rows.rows(ids, columns)

    def info(self) -> dict[str, Any]:
        """The facts ``clipsearch info --json`` prints."""
        return self._generation.info(self._queries.text_path().to_dict(), self._queries.text_precision())

    def __getattr__(self, name: str) -> Any:
        # The wide surface of before (retrieval.former_names), each name with a DeprecationWarning.
        return former_attribute(self, name)


def _named_bytes(data: bytes) -> io.BytesIO:
    buf = io.BytesIO(data)
    buf.name = "the query image"  # how a decoding error names it (instead of '<stream>')
    return buf


__all__ = ["MMAP_MIN_BYTES", "Hit", "ImageIndex", "SearchRequest", "SkippedFile"]
