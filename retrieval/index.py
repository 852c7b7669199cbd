"""``ImageIndex``: open an index directory and search it by text, image or vector."""

from __future__ import annotations

import bisect
import io
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from . import faiss_index, store
from .checks import is_positive_int
from .encoders import Encoder, TextEncoder, load_encoder
from .encoders.numpy_text import NumpyTextEncoder, TextPath, UnsupportedTextTower, fast_path_refusal, text_path
from .encoders.precision import Precision, parse_mode, parse_precision
from .errors import IndexCorruptError, InvalidArgumentError, ModelLoadError, ModelMismatchError
from .filters import Filter
from .images import DEFAULT_MAX_PIXELS, PreprocessConfig, load_pixels
from .layout import Manifest, display_path, read_manifest
from .query_cache import DEFAULT_CAPACITY, QueryVectorCache
from .query_terms import QueryTerm, as_term, embed_terms


@dataclass(frozen=True)
class Hit:
    """One search result: ``score`` is the cosine similarity (higher is better)."""

    id: int
    path: str
    score: float

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "path": self.path, "score": self.score}


@dataclass(frozen=True)
class SkippedFile:
    """A file the indexer found but could not decode."""

    path: str
    reason: str


EncoderFactory = Callable[[str, str], Encoder]

# FAISS files at least this big are memory-mapped by default: opening costs no RAM and no
# read of the whole file; the OS pages in what searches touch.
MMAP_MIN_BYTES = 1 << 30
# Masks of recent filters, per opened index (a filter is evaluated over whole columns).
_MASK_CACHE_SIZE = 8
# Opening retries when a writer replaced the generation under it (see ImageIndex.open); more
# than one retry needs a writer committing faster than an index opens.
_OPEN_ATTEMPTS = 5


class ImageIndex:
    """A built index directory, ready to search.

    Opening reads the manifest and the FAISS index and checks that they agree with the Parquet
    file; the query model is loaded on the first text or image query. With ``fast_text`` (what
    :meth:`open` sets when no encoder is given), text queries in fp32 on the CPU run on the
    numpy text tower of :mod:`retrieval.encoders.numpy_text` where the checkpoint allows it,
    without importing torch; :meth:`text_path` says which path they take.
    """

    def __init__(
        self,
        directory: Path,
        manifest: Manifest,
        faiss: Any,
        parts: Sequence[pq.ParquetFile],
        skipped: pq.ParquetFile,
        *,
        model: str | None = None,
        device: str = "auto",
        encoder: Encoder | None = None,
        encoder_factory: EncoderFactory | None = None,
        precision: Precision = "fp32",
        fast_text: bool = False,
        query_cache: QueryVectorCache | None = None,
    ) -> None:
        self.directory = directory
        self.manifest = manifest
        self._faiss = faiss
        self._parts = list(parts)
        self._skipped = skipped
        self._model = model
        self._device = device
        self._encoder = encoder
        self._encoder_factory = encoder_factory or (lambda name, dev: load_encoder(name, device=dev))
        self._encoder_checked = False
        self._precision = precision
        self._fast_text = fast_text and encoder is None
        self._text_encoder: TextEncoder | None = None
        self._paths: list[str] | None = None
        fix = store.rebuild_hint(directory, manifest)
        self._path_tables = [store.open_paths(directory, ref, fix) for ref in manifest.parts]
        self._first_ids = [ref.first_id for ref in manifest.parts]
        self._columns: dict[str, pa.ChunkedArray] = {}
        self._masks: OrderedDict[Filter, np.ndarray] = OrderedDict()
        self._given_encoder = encoder
        self._query_cache = query_cache if query_cache is not None else QueryVectorCache(DEFAULT_CAPACITY)
        self._mmap: bool | None = None
        # Lazy loads (query models, columns, filter masks) happen under this lock, so one index
        # can serve many threads (an HTTP server's pool); searches themselves run unlocked.
        self._lock = threading.RLock()

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        *,
        model: str | None = None,
        device: str = "auto",
        encoder: Encoder | None = None,
        mmap: bool | None = None,
        precision: str = "fp32",
        query_cache: int = DEFAULT_CAPACITY,
    ) -> ImageIndex:
        """Open an index directory.

        Args:
            directory: the INDEX_DIR written by ``build_index``.
            model: query with this checkpoint instead of the one recorded in the manifest; it
                must be the same weights (checked by fingerprint).
            device: where the query model runs (``auto``, ``cpu``, ``cuda``).
            encoder: an already-loaded encoder to use for queries (checked the same way).
            mmap: memory-map the FAISS index instead of reading it into RAM; None (default)
                maps FAISS files of 1 GB and more.
            precision: text tower precision for queries (``fp32``, ``bf16``, ``fp16``,
                ``int8``, ``auto``; see ``retrieval.encoders.precision``). Image queries use
                the mode the index's images were embedded in (fp32 where the device cannot).
            query_cache: how many distinct query texts keep their vectors (least recently
                used out first; 0: none), so that a repeated text skips the text tower
                (:mod:`retrieval.query_cache`; :meth:`query_cache_info` counts hits).

        Raises:
            InvalidArgumentError: a bad precision or query cache size.
            NotAnIndexError: no index there.
            UnsupportedFormatError: the index is newer than this code reads.
            IndexCorruptError: a file missing, truncated, or inconsistent with the manifest
                (an :class:`IndexFormatError`); the message names it and the repair.
            IndexFormatError: the manifest is invalid.
        """
        path = Path(directory)
        requested = parse_precision(precision)
        cache = QueryVectorCache(query_cache)
        for attempt in range(1, _OPEN_ATTEMPTS + 1):
            manifest = read_manifest(path)
            try:
                # Opening stays O(files): sizes and footers here, whole-file digests in `verify`;
                # pages are checked against their CRC whenever they are read.
                store.check_files(path, manifest)
                return cls._open_generation(
                    path, manifest, mmap, model=model, device=device, encoder=encoder, precision=requested, query_cache=cache
                )
            except Exception:
                # A writer may have published a new generation and removed this one between our
                # reading the manifest and opening its files: then open the one it names now.
                # An unchanged manifest means the files really are missing or damaged.
                if attempt == _OPEN_ATTEMPTS or read_manifest(path).generation == manifest.generation:
                    raise
        raise AssertionError("unreachable")

    @classmethod
    def _open_generation(
        cls,
        path: Path,
        manifest: Manifest,
        mmap: bool | None,
        *,
        model: str | None,
        device: str,
        encoder: Encoder | None,
        precision: Precision,
        query_cache: QueryVectorCache,
    ) -> ImageIndex:
        # The Parquet files stay open: if a later generation replaces this one, this reader
        # keeps answering from the files it opened.
        parts = store.open_parts(path, manifest)
        skipped = store.open_parquet(path / manifest.skipped_file, store.rebuild_hint(path, manifest))
        if mmap is None:
            faiss_file = path / manifest.faiss.path if manifest.faiss is not None else None
            mmap = faiss_file is not None and faiss_file.is_file() and faiss_file.stat().st_size >= MMAP_MIN_BYTES
        index = store.load_faiss(path, manifest, parts, mmap=mmap)
        opened = cls(
            path,
            manifest,
            index,
            parts,
            skipped,
            model=model,
            device=device,
            encoder=encoder,
            encoder_factory=lambda name, dev: load_encoder(name, device=dev, precision=precision),
            precision=precision,
            fast_text=encoder is None,
            query_cache=query_cache,
        )
        opened._mmap = mmap
        return opened

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
        fresh = ImageIndex.open(
            self.directory,
            model=self._model,
            device=self._device,
            encoder=self._given_encoder,
            mmap=self._mmap,
            precision=self._precision,
            query_cache=self._query_cache.capacity,
        )
        old, new = self.manifest, fresh.manifest
        same_weights = (old.backend, old.model_fingerprint, old.dim) == (new.backend, new.model_fingerprint, new.dim)
        if same_weights and fresh._given_encoder is None:
            with self._lock:
                fresh._text_encoder = self._text_encoder
                fresh._query_cache = self._query_cache  # its vectors are this encoder's
                if old.model_info.get("precision") == new.model_info.get("precision"):
                    fresh._encoder = self._encoder
        return fresh

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
        with self._lock:
            if self._encoder is None:
                encoder = self._encoder_factory(self._model or self.manifest.model, self._device)
                self._match_image_precision(encoder)
                size = self.manifest.model_info.get("embed_image_size")
                if size is not None:
                    encoder.set_image_size(int(size))  # image queries at the index's size
                self._encoder = encoder
            if not self._encoder_checked:
                self._check_encoder(self._encoder)
                self._encoder_checked = True
            return self._encoder

    @property
    def query_model(self) -> str:
        """The model queries are encoded with: ``--model`` when given, else the index's."""
        return self._model or self.manifest.model

    def text_path(self) -> TextPath:
        """Which text tower a text query of this index would run on (``numpy`` or ``torch``), and why.

        Reads only the checkpoint's config and file headers; no model is loaded.
        """
        if not self._fast_text:
            return TextPath("torch", "the index was opened with an encoder")
        if isinstance(self._text_encoder, NumpyTextEncoder):
            loaded = self._text_encoder
            why = f" ({loaded.int8_note})" if loaded.int8_note else ""
            return TextPath("numpy", f"loaded, {loaded.mode} products{why}")
        planned = text_path(self.query_model, self.manifest.backend, self._precision, self._device)
        if self._text_encoder is not None and planned.path == "numpy":
            return TextPath("torch", "the numpy text tower could not load this checkpoint")
        return planned

    @property
    def text_encoder(self) -> TextEncoder:
        """The encoder text queries run on: the numpy text tower where it applies, else :attr:`encoder`.

        Raises:
            ModelMismatchError: the query model is not the index's model.
            ModelLoadError: the query model cannot be loaded.
        """
        with self._lock:
            if self._text_encoder is None:
                self._text_encoder = self._load_text_encoder()
            return self._text_encoder

    def _load_text_encoder(self) -> TextEncoder:
        # Decided by the settings alone, not by whether an image query loaded torch first: a
        # long-lived index answers a text the same way whatever came before it.
        if not self._fast_text:
            return self.encoder
        if fast_path_refusal(self.manifest.backend, self.query_model, self._precision, self._device) is not None:
            return self.encoder
        try:
            fast = NumpyTextEncoder.load(self.query_model, precision=self._precision)
        except (UnsupportedTextTower, ModelLoadError):
            # The torch path loads (or fails to load, with its own message) what this cannot.
            return self.encoder
        self._check_encoder(fast)
        return fast

    def _match_image_precision(self, encoder: Encoder) -> None:
        # Image queries are embedded in the mode the index's images were, so an indexed image
        # finds itself with score 1.0; fp32 where this device cannot run that mode.
        try:
            mode = parse_mode(self.manifest.model_info.get("precision", "fp32"))
        except InvalidArgumentError:
            return  # auto, or a mode this code does not know: leave the encoder's own
        try:
            encoder.image_precision.set(mode)
        except InvalidArgumentError:
            encoder.image_precision.set("fp32")

    def _check_encoder(self, encoder: TextEncoder) -> None:
        built = f"{self.manifest.model} ({self.manifest.model_fingerprint[:19]})"
        if encoder.dim != self.manifest.dim:
            raise ModelMismatchError(
                f"model mismatch: the index was built with {built}, dim {self.manifest.dim}; "
                f"the query model {encoder.name} has dim {encoder.dim}"
            )
        if encoder.backend != self.manifest.backend or encoder.fingerprint != self.manifest.model_fingerprint:
            raise ModelMismatchError(
                f"model mismatch: the index was built with {built} but the query model is "
                f"{encoder.name} ({encoder.fingerprint[:19]}); query with the same model or rebuild the index"
            )

    # -- search ---------------------------------------------------------------------------------

    def search(self, query: str, k: int = 10, where: Filter | None = None) -> list[Hit]:
        """Text-to-image search.

        Args:
            query: the text.
            k: number of results (fewer only when the index or the filter has fewer images).
            where: only return images that pass this :class:`~retrieval.filters.Filter`.

        Raises:
            InvalidArgumentError: empty query or k < 1.
            ModelMismatchError: the query model is not the index's model.
        """
        return self.search_many([query], k, where=where)[0]

    def search_many(self, queries: Sequence[str], k: int = 10, where: Filter | None = None) -> list[list[Hit]]:
        """Search several texts at once (encoded and searched in batches)."""
        _check_k(k)
        if isinstance(queries, str):
            raise InvalidArgumentError("search_many takes a list of queries, not a single string")
        for q in queries:
            if not isinstance(q, str) or not q.strip():
                raise InvalidArgumentError("query must be a non-empty text")
        if not queries:
            return []
        vectors = self.embed_texts(list(queries))
        return self.search_vectors(vectors, k, where=where)

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        """The query vectors of ``texts`` (``(n, dim)``, L2-normalised) as searches make them:
        on :attr:`text_encoder`, through the query cache."""
        return self._query_cache.embed(texts, self.text_encoder.embed_texts)

    def query_cache_info(self) -> dict[str, Any]:
        """The query cache's ``capacity``, ``size``, ``hits`` and ``misses``."""
        return self._query_cache.info()

    def search_image(
        self, image: str | bytes | os.PathLike[str] | BinaryIO, k: int = 10, where: Filter | None = None
    ) -> list[Hit]:
        """Image-to-image search with an image file (path or binary file object).

        Raises:
            ImageDecodeError: the query image cannot be decoded.
        """
        _check_k(k)
        return self.search_vectors(self._embed_image(image), k, where=where)[0]

    def _embed_image(self, image: str | bytes | os.PathLike[str] | BinaryIO) -> np.ndarray:
        encoder = self.encoder
        pixels, _, _ = load_pixels(image, self.preprocess, max_pixels=DEFAULT_MAX_PIXELS)
        return encoder.embed_pixels(pixels[None])

    def search_combined(
        self,
        add: Sequence[str | os.PathLike[str] | QueryTerm],
        subtract: Sequence[str | os.PathLike[str] | QueryTerm] = (),
        k: int = 10,
        where: Filter | None = None,
    ) -> list[Hit]:
        """Query arithmetic: search with ``normalise(sum(w * e(add)) - sum(w * e(subtract)))``.

        Each term is a text (``str``), an image file (a path object) or a
        :class:`~retrieval.query_terms.QueryTerm` with its own weight (``QueryTerm(3, "id")``:
        image 3 of the index, by its stored vector); every term's embedding
        is L2-normalised before weighting. ``index.search_combined(["a dog", "in the snow"],
        subtract=["grass"])``.

        Raises:
            InvalidArgumentError: no terms, an empty term, terms that cancel out, k < 1.
            ImageDecodeError: an image term cannot be decoded.
        """
        _check_k(k)
        if isinstance(add, (str, os.PathLike)) or isinstance(subtract, (str, os.PathLike)):
            raise InvalidArgumentError("add and subtract take lists of terms, not a single term")
        terms = [as_term(t) for t in add] + [as_term(t).negated() for t in subtract]
        for t in terms:
            if t.kind == "id":
                _check_id(t.value, self.count)
        vector = embed_terms(
            terms,
            lambda texts: self.embed_texts(texts),
            lambda image: self._embed_image(_named_bytes(image) if isinstance(image, bytes) else image),
            self.vectors_of,
        )
        return self.search_vectors(vector[None], k, where=where)[0]

    def search_similar(self, id: int, k: int = 10, where: Filter | None = None) -> list[Hit]:
        """"More like this": search with the stored embedding of image ``id`` (itself ranks
        first, score 1.0, unless a filter excludes it). No image is decoded again.

        Raises:
            InvalidArgumentError: ``id`` is not an id of this index.
        """
        _check_k(k)
        return self.search_vectors(self.vectors_of([_check_id(id, self.count)]), k, where=where)[0]

    def vectors_of(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """The stored embeddings of ``ids`` as an ``(n, dim)`` float32 array, in the given order."""
        if self.exact_scores:
            # A flat FAISS index holds the stored vectors as they are: copying one out is cheaper
            # than decoding the Parquet row group around it (~8 ms per id at 512-d).
            stored = faiss_index.stored_vectors(self._faiss, _id_array(ids, self.count))
            if stored is not None:
                return stored[0]
        rows = self.rows(ids, columns=("embedding",))
        if not rows:
            return np.empty((0, self.dim), np.float32)
        return np.asarray([r["embedding"] for r in rows], dtype=np.float32).reshape(len(rows), self.dim)

    def source_file(self, id: int) -> Path:
        """The original image file the index recorded for ``id``: the indexed folder
        (``manifest.source_root``) joined with the stored relative path, byte for byte.

        Only ids name files: nothing outside the indexed folder can be returned. The file may
        have changed or gone since it was indexed; the caller opens it.

        Raises:
            InvalidArgumentError: ``id`` is not an id of this index.
            IndexCorruptError: the index records no folder, or a path that leaves it.
        """
        raw = self.rows([_check_id(id, self.count)], columns=("path_bytes",))[0]["path_bytes"]
        relative = os.fsdecode(raw)
        parts = relative.split("/")
        root = self.manifest.source_root
        if not root or not os.path.isabs(root) or relative.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise IndexCorruptError(
                str(self.directory / "manifest.json"),
                f"image {id} is recorded as {display_path(raw)!r} under {root!r}, not a file inside the indexed folder",
                store.rebuild_hint(self.directory, self.manifest),
            )
        return Path(root, *parts)

    def search_vectors(self, vectors: np.ndarray, k: int = 10, where: Filter | None = None) -> list[list[Hit]]:
        """Search with ready query vectors ``(n, dim)`` (normalised by the caller)."""
        scores, ids = self.search_ids(vectors, k, where=where)
        found = ids[ids >= 0]
        paths = dict(zip(found.tolist(), self.paths_of(found), strict=True))
        return [
            [Hit(int(i), paths[int(i)], float(s)) for s, i in zip(row_s, row_i, strict=True) if i >= 0]
            for row_s, row_i in zip(scores, ids, strict=True)
        ]

    def search_ids(self, vectors: np.ndarray, k: int = 10, where: Filter | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The FAISS stage alone: ``(scores, ids)`` of shape ``(n, min(k, matches))``."""
        _check_k(k)
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim == 1:
            vectors = vectors[None]
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise InvalidArgumentError(f"query vectors must have shape (n, {self.dim}), got {vectors.shape}")
        if where is None or not where.active:
            return faiss_index.search(self._faiss, vectors, k)
        return faiss_index.search(self._faiss, vectors, k, allowed=self.mask(where))

    @property
    def exact_scores(self) -> bool:
        """True when FAISS scores are exact inner products of the stored vectors (flat storage,
        searched exhaustively): range searches then miss nothing."""
        if faiss_index.kind_of(self._faiss) != "flat":
            return False  # and no IVF direct map is built just to ask
        stored = faiss_index.stored_vectors(self._faiss, np.empty(0, np.int64))
        return stored is not None and stored[1]

    def search_range(
        self, vectors: np.ndarray, min_score: float, where: Filter | None = None
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Every image scoring at least ``min_score`` with each query vector ``(n, dim)``: per
        query ``(ids, scores)`` by descending score (ties by id). Exact for flat indexes; an
        approximate index may miss images (see :func:`retrieval.faiss_index.range_search`).
        """
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise InvalidArgumentError(f"query vectors must have shape (n, {self.dim}), got {vectors.shape}")
        lims, scores, ids = faiss_index.range_search(self._faiss, vectors, min_score)
        allowed = self.mask(where) if where is not None and where.active else None
        out = []
        for q in range(len(vectors)):
            s, i = scores[lims[q] : lims[q + 1]], ids[lims[q] : lims[q + 1]]
            if allowed is not None:
                s, i = s[allowed[i]], i[allowed[i]]
            order = np.lexsort((i, -s))
            out.append((i[order].astype(np.int64), s[order]))
        return out

    def mask(self, where: Filter) -> np.ndarray:
        """Boolean mask over ids of the images passing ``where`` (recent masks are cached)."""
        if not isinstance(where, Filter):
            raise InvalidArgumentError(f"where must be a retrieval.filters.Filter, got {type(where).__name__}")
        with self._lock:
            mask = self._masks.get(where)
            if mask is None:
                mask = self._masks[where] = where.mask(self._column, self.count)
                if len(self._masks) > _MASK_CACHE_SIZE:
                    self._masks.popitem(last=False)
            else:
                self._masks.move_to_end(where)
            return mask

    def _column(self, name: str) -> pa.ChunkedArray:
        with self._lock:
            if name not in self._columns:
                self._columns[name] = store.read_column(self._parts, name)
            return self._columns[name]

    def paths_of(self, ids: Sequence[int] | np.ndarray) -> list[str]:
        """Stored paths of ``ids``, reading only those rows (memory-mapped path files)."""
        out: list[str] = []
        missing: list[int] = []
        for i in (int(x) for x in ids):
            if not 0 <= i < self.count:
                raise InvalidArgumentError(f"ids must be in 0..{self.count - 1}")
            part = bisect.bisect_right(self._first_ids, i) - 1
            table = self._path_tables[part]
            if table is None:
                missing.append(len(out))
                out.append("")
            else:
                out.append(table[i - self._first_ids[part]])
        if missing:
            # A version-1 index has no path files: read the rows' row groups instead.
            rows = self.rows([int(ids[j]) for j in missing], columns=("path",))
            for j, row in zip(missing, rows, strict=True):
                out[j] = row["path"]
        return out

    def sizes_of(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """``(n, 2)`` int32 recorded ``(width, height)`` of ``ids``, from the two columns read
        once and kept (8 bytes per image): a result page's sizes without a Parquet read each."""
        wanted = _id_array(ids, self.count)
        if not len(wanted):
            return np.empty((0, 2), np.int32)
        indices = pa.array(wanted)
        return np.stack(
            [self._column(name).take(indices).to_numpy().astype(np.int32, copy=False) for name in ("width", "height")], axis=1
        )

    def paths(self) -> list[str]:
        """Every stored path in id order (read once, then cached)."""
        if self._paths is None:
            self._paths = store.read_column(self._parts, "path").to_pylist()
        return self._paths

    # -- metadata ---------------------------------------------------------------------------------

    def embeddings(self) -> np.ndarray:
        """All stored embeddings as an ``(count, dim)`` float32 array, in id order."""
        return (
            store.vectors_of(store.read_column(self._parts, "embedding"), self.dim) if self._parts else np.empty((0, self.dim), np.float32)
        )

    def iter_embeddings(self, batch_rows: int = 65536) -> Iterator[tuple[int, np.ndarray]]:
        """Stream the stored embeddings as ``(first_id, (n, dim) float32)`` chunks, in id order."""
        return store.iter_vectors(self._parts, self.dim, batch_rows=batch_rows)

    def iter_vectors(self, where: Filter | None = None, batch_rows: int = 65536) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Stream ``(ids, vectors)`` of the images passing ``where`` (all without it), in id
        order, at most ``batch_rows`` stored rows read at a time; batches with no image passing
        are skipped."""
        mask = self.mask(where) if where is not None and where.active else None
        for first, vectors in self.iter_embeddings(batch_rows=batch_rows):
            ids = np.arange(first, first + len(vectors))
            if mask is not None:
                keep = mask[first : first + len(vectors)]
                ids, vectors = ids[keep], vectors[keep]
            if len(ids):
                yield ids, vectors

    def rows(self, ids: Sequence[int] | np.ndarray, columns: Sequence[str] = ("id", "path")) -> list[dict[str, Any]]:
        """Metadata of the given ids (any order; returned in the same order).

        Reads only the row groups that hold the ids, and only the asked columns.
        """
        wanted = _id_array(ids, self.count)
        cols = list(dict.fromkeys(["id", *columns]))
        out: dict[int, dict[str, Any]] = {}
        for ref, pf in zip(self.manifest.parts, self._parts, strict=True):
            local = np.unique(wanted[(wanted >= ref.first_id) & (wanted < ref.first_id + ref.rows)] - ref.first_id)
            if not len(local):
                continue
            starts = np.cumsum([0] + [pf.metadata.row_group(g).num_rows for g in range(pf.metadata.num_row_groups)])
            groups = np.searchsorted(starts, local, side="right") - 1
            for g in np.unique(groups):
                # A ParquetFile's reader is not documented as thread-safe: one read at a time.
                with self._lock, store.reading(pf):
                    table = pf.read_row_group(int(g), columns=cols)
                for row in table.take(pa.array(local[groups == g] - starts[g])).to_pylist():
                    out[int(row["id"])] = {k: row[k] for k in columns}
        return [out[int(i)] for i in wanted]

    def skipped(self) -> list[SkippedFile]:
        """Files that were found but could not be decoded, with the reason."""
        return [SkippedFile(display_path(rec.path), rec.reason) for rec in store.read_skipped(self._skipped)]

    def warm(self, vectors: bool | None = None) -> int:
        """Ask the kernel to read a memory-mapped FAISS file in the background, so that a
        long-running reader's first queries do not each wait for the disk: what every query
        scans (the IVF lists and codes) and, with ``vectors``, a re-ranked index's float16
        vectors too (default: when the file takes at most half the available memory). Returns
        the bytes asked for: 0 when the FAISS index is in RAM. ``serve`` calls it on every
        generation it opens; a one-shot ``search`` does not (it would read more than it uses)."""
        m = self.manifest
        if m.faiss is None or not store.maps_faiss(m, bool(self._mmap)):
            return 0
        return faiss_index.warm(self._faiss, self.directory / m.faiss.path, vectors)

    def info(self) -> dict[str, Any]:
        """The facts ``clipsearch info --json`` prints."""
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
            "faiss_bytes": (self.directory / m.faiss.path).stat().st_size if m.faiss is not None else 0,
            # Whether this reader memory-mapped the FAISS file (the IVF lists, or a re-ranked
            # index's float16 vectors) rather than reading it into RAM.
            "faiss_mmap": store.maps_faiss(m, bool(self._mmap)),
            "metric": m.metric,
            "preprocess": dict(m.preprocess),
            "model_info": dict(m.model_info),
            "text_path": self.text_path().to_dict(),
            "source_root": m.source_root,
            # An index made by `clipsearch import` (no image files behind it): from what, and where.
            **(
                {"imported_from": m.model_info["imported_from"], "imported_source": m.model_info.get("imported_source", "")}
                if m.model_info.get("imported_from")
                else {}
            ),
            "created": m.created,
            "tool_version": m.tool_version,
            "skipped_files": [{"path": s.path, "reason": s.reason} for s in self.skipped()],
        }


def _named_bytes(data: bytes) -> io.BytesIO:
    buf = io.BytesIO(data)
    buf.name = "the query image"  # how a decoding error names it (instead of '<stream>')
    return buf


def _id_array(ids: Sequence[int] | np.ndarray, count: int) -> np.ndarray:
    wanted = np.asarray(ids, dtype=np.int64)
    if len(wanted) and (wanted.min() < 0 or wanted.max() >= count):
        raise InvalidArgumentError(f"ids must be in 0..{count - 1}")
    return wanted


def _check_id(id: object, count: int) -> int:
    if not isinstance(id, (int, np.integer)) or isinstance(id, bool) or not 0 <= int(id) < count:
        ids = f"ids are 0..{count - 1}" if count else "the index is empty"
        raise InvalidArgumentError(f"no image with id {id!r} ({ids})")
    return int(id)


def _check_k(k: int) -> None:
    if not is_positive_int(k):
        raise InvalidArgumentError(f"k must be an integer >= 1, got {k!r}")


__all__ = ["Hit", "ImageIndex", "SkippedFile"]
