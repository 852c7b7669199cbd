"""The text encoder: tokenizer and tower of one checkpoint behind the ``TextEncoder`` interface."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from ..base import l2_normalize
from ..hf import checkpoint_fingerprint
from .config import read_checkpoint_config
from .path import local_checkpoint
from .tokenizer import load_clip_tokenizer
from .tower import NumpyTextTower
from .weights import SafetensorsReader


class NumpyTextEncoder:
    """Text queries of a Hugging Face CLIP checkpoint without torch (see the package docstring).

    Use :meth:`load`. It is a :class:`~retrieval.encoders.TextEncoder` (the text half of
    :class:`~retrieval.encoders.Encoder`): ``name``, ``backend``, ``dim``, ``max_text_length``,
    ``fingerprint``, ``embed_texts``.
    """

    backend = "hf"
    text_path = "numpy"

    def __init__(
        self,
        name: str,
        directory: Path,
        tower: NumpyTextTower,
        tokenizer: Any,
        pad_id: int,
        fingerprint: Future[str] | None = None,
    ) -> None:
        self.name = name
        self.directory = directory
        self.dim = tower.cfg.projection_dim
        self.max_text_length = tower.cfg.max_positions
        self._tower = tower
        self._tokenizer = tokenizer
        self._pad_id = pad_id
        self._fingerprint: str | None = None
        self._fingerprint_future = fingerprint

    @classmethod
    def load(cls, model: str) -> NumpyTextEncoder:
        """Open the text tower of a Hugging Face CLIP checkpoint (hub id or directory).

        Args:
            model: what ``HFClipEncoder.load`` takes; a hub id must be in the local cache.

        Raises:
            UnsupportedTextTower: a checkpoint this does not compute (the torch path will).
            ModelLoadError: a local directory that is not a checkpoint.
        """
        name, directory = local_checkpoint(model)
        cfg = read_checkpoint_config(directory)
        reader = SafetensorsReader.for_checkpoint(directory)
        # Hashing the weights (0.5 s for ViT-B/32's 605 MB) releases the GIL: it runs beside
        # the tokenizer and weight loading instead of after them (once the cheap checks passed,
        # so that a fallback to torch does not hash twice).
        fingerprint: Future[str] = Future()
        threading.Thread(target=_resolve, args=(fingerprint, checkpoint_fingerprint, directory), daemon=True).start()
        tokenizer, settings = load_clip_tokenizer(directory, cfg.max_positions)
        tower = NumpyTextTower(cfg, reader)
        return cls(name, directory, tower, tokenizer, tokenizer.token_to_id(settings.pad_token), fingerprint)

    @property
    def fingerprint(self) -> str:
        """The same weight fingerprint ``HFClipEncoder`` computes."""
        if self._fingerprint is None:
            future, self._fingerprint_future = self._fingerprint_future, None
            self._fingerprint = future.result() if future is not None else checkpoint_fingerprint(self.directory)
        return self._fingerprint

    def tokenize(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(input_ids, attention_mask)`` as ``HFClipEncoder.tokenize`` makes them (padded to the longest)."""
        encodings = self._tokenizer.encode_batch(list(texts))
        width = max(len(e.ids) for e in encodings)
        ids = np.full((len(encodings), width), self._pad_id, dtype=np.int64)
        mask = np.zeros((len(encodings), width), dtype=np.int64)
        for row, enc in enumerate(encodings):
            ids[row, : len(enc.ids)] = enc.ids
            mask[row, : len(enc.ids)] = 1
        return ids, mask

    def embed_texts(self, texts: Sequence[str], batch_size: int = 256) -> np.ndarray:
        """Encode texts to L2-normalised float32 vectors of shape ``(len(texts), dim)``.

        Rows are padded in batches of ``batch_size`` as the torch path pads them, so the pooled
        token is the one transformers would pick; each row then runs at its own length.
        """
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), batch_size):
            ids, mask = self.tokenize(texts[start : start + batch_size])
            for row, pos in enumerate(self._tower.pooled_positions(ids)):
                end = int(pos) + 1
                out[start + row] = self._tower.forward(ids[row, :end], mask[row, :end])
        return l2_normalize(out)


def _resolve(future: Future[str], fn: Callable[[Path], str], arg: Path) -> None:
    try:
        future.set_result(fn(arg))
    except BaseException as exc:  # noqa: BLE001 - re-raised by future.result() in the caller
        future.set_exception(exc)
