"""The query side of an index's model: which encoder a text or image query runs on.

:class:`QueryEncoders` chooses and loads, on first use, the encoders that turn queries into
vectors for one opened index, checks them against what the index was built with, and keeps the
query vector cache that belongs to its text encoder.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from ..errors import InvalidArgumentError, ModelLoadError, ModelMismatchError
from ..images import PreprocessConfig
from ..query_cache import DEFAULT_CAPACITY, QueryVectorCache
from . import load_encoder
from .base import Encoder, TextEncoder
from .languages import language_embedder
from .numpy_text import NumpyTextEncoder, UnsupportedTextTower
from .precision import Precision, parse_mode
from .recorded_tower import RecordedTower, open_recorded
from .runtime import RuntimeUnavailable
from .text_choice import TextPath, fast_path_refusal, text_path

if TYPE_CHECKING:
    from ..layout import Manifest

EncoderFactory = Callable[[str, str], Encoder]
# What makes two generations' image towers the same one.
_TOWER_KEYS = ("precision", "image_runtime", "embed_image_size")


class QueryEncoders:
    """The query encoders of one opened index, loaded on first use and checked against its manifest.

    Without a given ``encoder``, text queries in fp32 on the CPU run on the numpy text tower of
    :mod:`retrieval.encoders.numpy_text` where the checkpoint allows it, without importing torch;
    :meth:`text_path` says which path they take. Thread-safe: models load under a lock.

    Args:
        manifest: the manifest of the index queried.
        model: query with this checkpoint instead of the manifest's (same weights, checked).
        device: where the query model runs (``auto``, ``cpu``, ``cuda``).
        encoder: an already-loaded encoder for every query (checked the same way).
        precision: text tower precision for queries.
        text_queries: how many text queries the process will run, when it knows (a one-shot
            command: ``auto`` then weighs int8's set-up against them); None: long-lived.
        query_cache: the vectors of recent query texts (a new one of the default size if None).
        encoder_factory: loads the torch encoder from ``(model, device)``; default
            :func:`retrieval.encoders.load_encoder` in ``precision``.
    """

    def __init__(
        self,
        manifest: Manifest,
        *,
        model: str | None = None,
        device: str = "auto",
        encoder: Encoder | None = None,
        precision: Precision = "fp32",
        text_queries: int | None = None,
        query_cache: QueryVectorCache | None = None,
        encoder_factory: EncoderFactory | None = None,
    ) -> None:
        self.manifest = manifest
        self.model = model
        self.device = device
        self.precision: Precision = precision
        self.text_queries = text_queries
        self.given = encoder
        self.cache = query_cache if query_cache is not None else QueryVectorCache(DEFAULT_CAPACITY)
        self._factory = encoder_factory or (lambda name, dev: load_encoder(name, device=dev, precision=precision))
        self._encoder = encoder
        self._encoder_checked = False
        self._text_encoder: TextEncoder | None = None
        self._image_encoder: Encoder | RecordedTower | None = None
        self._image_note: str | None = None
        self._lock = threading.RLock()

    @property
    def query_model(self) -> str:
        """The model queries are encoded with: ``model`` when given, else the index's."""
        return self.model or self.manifest.model

    @property
    def loaded_encoder(self) -> Encoder | None:
        """The torch encoder if one is loaded (or given), without loading it."""
        return self._encoder

    @property
    def encoder(self) -> Encoder:
        """The query encoder, loaded on first use and checked against the manifest.

        Raises:
            ModelMismatchError: the query model is not the index's model.
            ModelLoadError: the query model cannot be loaded.
        """
        with self._lock:
            if self._encoder is None:
                encoder = self._factory(self.query_model, self.device)
                self._match_image_precision(encoder)
                size = self.manifest.model_info.get("embed_image_size")
                if size is not None:
                    encoder.set_image_size(int(size))  # image queries at the index's size
                self._match_image_runtime(encoder)
                self._encoder = encoder
            if not self._encoder_checked:
                self._check(self._encoder)
                self._encoder_checked = True
            return self._encoder

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

    def text_path(self) -> TextPath:
        """Which text tower a text query would run on (``numpy``, ``onnxruntime`` or ``torch``), and why.

        Reads only the checkpoint's config and file headers; no model is loaded.
        """
        if self.given is not None:
            return TextPath("torch", "the index was opened with an encoder")
        loaded = self._text_encoder
        path = loaded.loaded_path() if loaded is not None else None
        if path is not None:
            return path
        planned = text_path(self.query_model, self.manifest.backend, self.precision, self.device, self.text_queries)
        if loaded is not None and planned.path != "torch":
            return TextPath("torch", "the numpy text tower could not load this checkpoint")
        return planned

    def text_precision(self) -> dict[str, Any]:
        """The text tower's precision: ``requested``, and once the text encoder has run, the
        ``mode`` it chose with the gate's figures (``gate_cached`` when they were remembered from
        an earlier run) and, for int8, how it runs or why it is not used. No model is loaded."""
        loaded = self._text_encoder
        if loaded is not None:
            return dict(loaded.text_precision_info())
        return {"requested": self.precision, "mode": None if self.precision == "auto" else self.precision}

    def embed_texts(self, texts: Sequence[str], query_lang: str | None = None) -> np.ndarray:
        """The query vectors of ``texts`` (``(n, dim)``, L2-normalised), through the cache.

        ``query_lang``: the texts' FLORES-200 code, for a model whose tokenizer must be told
        the language (NLLB-CLIP); other models read any language as it is and ignore it.

        Raises:
            InvalidArgumentError: the model needs a language and none (or an unknown one) was given.
        """
        language, embed = language_embedder(self.text_encoder, query_lang)
        return self.cache.embed(texts, embed, namespace=language or "")

    def query_languages(self) -> tuple[str, ...]:
        """The FLORES-200 codes text queries must name (NLLB-CLIP), or () when any text is read as it is.

        Loads the tokenizer of an open_clip model (not its weights); a model with the numpy
        text tower or a Hugging Face one takes none.
        """
        if self.manifest.backend != "open_clip" and self.given is None:
            return ()
        return tuple(self.text_encoder.query_languages)

    def embed_image(self, image: str | bytes | os.PathLike[str] | BinaryIO) -> np.ndarray:
        """The ``(1, dim)`` query vector of an image file, preprocessed as the index's images were.

        Raises:
            ModelMismatchError, ModelLoadError: see :attr:`encoder`.
            ImageDecodeError: the image cannot be decoded.
        """
        encoder = self.image_encoder
        cfg = PreprocessConfig.from_dict(self.manifest.preprocess)
        # JPEGs decoded as the index's were (an index from before the choice drafted them).
        draft = bool(self.manifest.preprocess.get("jpeg_draft", True))
        # The recorded tower preprocesses in numpy where that is torch's result: no torch.
        return encoder.embed_image(image, cfg, draft)

    @property
    def image_encoder(self) -> Encoder | RecordedTower:
        """What image queries run on: the index's recorded tower reopened on its runtime
        without torch's model (:mod:`.recorded_tower`) where this machine remembers its checks,
        else :attr:`encoder`. Both give the same vectors, bit for bit.

        Raises:
            ModelMismatchError, ModelLoadError: see :attr:`encoder`.
        """
        with self._lock:
            if self._image_encoder is None:
                self._image_encoder = self._load_image_encoder()
            return self._image_encoder

    def image_path(self) -> dict[str, str | None]:
        """What ran image queries, once one ran: ``tower`` (``recorded``: the index's tower
        reopened without torch's model; ``encoder``: the full encoder), ``runtime`` (``openvino``,
        ``onnxruntime`` or ``torch``) and ``reason`` (why the recorded tower was not reopened).
        All None before the first image query."""
        loaded = self._image_encoder
        if loaded is None:
            return {"tower": None, "runtime": None, "reason": None}
        path = loaded.image_query_path()
        if path["reason"] is None:
            path["reason"] = self._image_note  # why the recorded tower was not reopened
        return path

    def cache_info(self) -> dict[str, Any]:
        """The query cache's ``capacity``, ``size``, ``hits`` and ``misses``."""
        return self.cache.info()

    def following(self, manifest: Manifest) -> QueryEncoders:
        """The query encoders of a later generation with ``manifest``, with the same settings.

        The models already loaded here are shared with it when both generations were embedded by
        the same weights (with the cache, whose vectors are the text encoder's); the image
        encoder only when their images were embedded in the same mode too. A given encoder is
        used as it is.
        """
        fresh = QueryEncoders(
            manifest,
            model=self.model,
            device=self.device,
            encoder=self.given,
            precision=self.precision,
            text_queries=self.text_queries,
            query_cache=QueryVectorCache(self.cache.capacity),
        )
        old = self.manifest
        same_weights = (old.backend, old.model_fingerprint, old.dim) == (manifest.backend, manifest.model_fingerprint, manifest.dim)
        if same_weights and self.given is None:
            with self._lock:
                fresh._text_encoder = self._text_encoder
                fresh.cache = self.cache
                if old.model_info.get("precision") == manifest.model_info.get("precision"):
                    fresh._encoder = self._encoder
                same_tower = all(old.model_info.get(k) == manifest.model_info.get(k) for k in _TOWER_KEYS)
                # A tower of its own (the recorded one); the full encoder goes with _encoder above.
                own_tower = self._image_encoder is not None and self._image_encoder is not self._encoder
                if own_tower and same_tower:
                    fresh._image_encoder = self._image_encoder
        return fresh

    def _load_image_encoder(self) -> Encoder | RecordedTower:
        # Decided by the settings and this machine's remembered checks, not by what loaded
        # before: both paths run the same tower, so a query's vector does not depend on it.
        if self.given is not None:
            return self.encoder
        opened = open_recorded(self.manifest, self.query_model, self.device)
        if isinstance(opened, str):
            self._image_note = opened
            return self.encoder
        self._check(opened)
        return opened

    def _load_text_encoder(self) -> TextEncoder:
        # Decided by the settings alone, not by whether an image query loaded torch first: a
        # long-lived index answers a text the same way whatever came before it.
        if self.given is not None:
            return self.encoder
        if fast_path_refusal(self.manifest.backend, self.query_model, self.precision, self.device) is not None:
            return self.encoder
        try:
            fast = NumpyTextEncoder.load(self.query_model, precision=self.precision, text_queries=self.text_queries)
        except RuntimeUnavailable:
            raise  # CLIPSEARCH_TEXT_RUNTIME=onnxruntime asked for this tower: torch is no answer
        except (UnsupportedTextTower, ModelLoadError):
            # The torch path loads (or fails to load, with its own message) what this cannot.
            return self.encoder
        self._check(fast)
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

    def _match_image_runtime(self, encoder: Encoder) -> None:
        # The runtime of the image tower too (retrieval.encoders.runtime): the one the index's
        # vectors came from (torch before runtimes were recorded), so an indexed image finds
        # itself bit for bit.
        info = self.manifest.model_info
        encoder.follow_image_runtime(str(info.get("image_runtime") or "torch"), str(info["precision"]) if info.get("precision") else None)

    def _check(self, encoder: TextEncoder | RecordedTower) -> None:
        built = f"{self.manifest.model} ({self.manifest.model_fingerprint[:19]})"
        # A model of another family (CLIP against SigLIP) is refused by name, before the weights.
        # The numpy text tower computes CLIP checkpoints only.
        theirs = encoder.family_name
        family = self.manifest.model_info.get("model_type")
        if self.manifest.backend == "hf" and family and theirs is not None and theirs != family:
            raise ModelMismatchError(
                f"model family mismatch: the index was built with a {family} model, {built}; the query model "
                f"{encoder.name} is a {theirs} model; query with the index's model or rebuild the index"
            )
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


__all__ = ["EncoderFactory", "QueryEncoders"]
