"""The torch-free text encoder: the ``TextEncoder`` side of :mod:`retrieval.encoders.hf.encoder` without torch."""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from .. import memo
from ..base import l2_normalize
from ..chooser import auto_modes
from ..hf import checkpoint_fingerprint
from ..precision import PROBE_TEXTS, GateResult, Mode, choose, precision_record
from ..text_choice import TEXT_PRECISIONS, TextPath, TextRuntime, checked_checkpoint, choose_text_runtime, one_shot_reason
from .clip_tokenizer import load_clip_tokenizer
from .tower import NumpyTextTower, pooled_positions
from .tower_config import UnsupportedTextTower


class NumpyTextEncoder:
    """Text queries of a Hugging Face CLIP checkpoint without torch (see the package docstring):
    a :class:`~retrieval.encoders.TextEncoder`, made by :meth:`load`. :attr:`mode` says whether
    its products are float32 or int8 (:mod:`.int8`), :attr:`runtime` what runs the float32 tower,
    :meth:`precision_info` both and why."""

    backend = "hf"
    text_path = "numpy"
    family_name = "clip"  # the only family this tower computes
    query_languages: tuple[str, ...] = ()

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
        self.requested = "fp32"
        self.mode: Mode = "fp32"
        self.gate_results: list[GateResult] = []
        self.int8_note: str | None = None
        self.gate_cached = False
        self.runtime = TextRuntime()

    @classmethod
    def load(
        cls, model: str, precision: str = "fp32", text_queries: int | None = None, runtime: str | None = None
    ) -> NumpyTextEncoder:
        """Open the text tower of a Hugging Face CLIP checkpoint (hub id or directory).

        Args:
            model: what ``HFClipEncoder.load`` takes; a hub id must be in the local cache.
            precision: ``fp32`` (numpy only, no torch), ``int8`` (int8 products, :mod:`.int8`)
                or ``auto``: int8 where this CPU has a fast int8 kernel and the int8 vectors of
                :data:`~retrieval.encoders.precision.PROBE_TEXTS` pass the quality gate against
                fp32's (the image tower's gate), else fp32. The outcome is kept per weights and
                CPU setting (:mod:`..memo`), so later loads do not gate again.
            text_queries: how many texts this process will embed, when it knows (a one-shot
                command, :mod:`..text_choice`'s one-shot rule); None: a long-lived process.
            runtime: the runtime asked for the fp32 tower (``numpy``, ``onnxruntime``); None:
                the user's setting (:func:`~..chooser.requested_runtime`).

        Raises:
            UnsupportedTextTower: a checkpoint or precision this does not compute, or ``int8``
                where this machine has no int8 kernel for it (the torch path will run them).
            ModelLoadError: a local directory that is not a checkpoint.
            RuntimeUnavailable: ``onnxruntime`` asked for and ONNX Runtime cannot run the fp32
                tower here.
        """
        if precision not in TEXT_PRECISIONS:
            raise UnsupportedTextTower(f"text precision {precision} runs in torch")
        name, directory, cfg, reader = checked_checkpoint(model)
        # Hashing the weights is slow and releases the GIL: it runs beside the tokenizer and
        # weight loading instead of after them (once the cheap checks passed, so that a fallback
        # to torch does not hash twice).
        fingerprint: Future[str] = Future()
        threading.Thread(target=_resolve, args=(fingerprint, checkpoint_fingerprint, directory), daemon=True).start()
        tokenizer, settings = load_clip_tokenizer(directory, cfg.max_positions)
        tower = NumpyTextTower(cfg, reader)
        encoder = cls(name, directory, tower, tokenizer, tokenizer.token_to_id(settings.pad_token), fingerprint)
        one_shot = one_shot_reason(precision, text_queries)
        if one_shot is not None:
            encoder.requested, encoder.int8_note = precision, one_shot
        elif precision != "fp32":
            encoder._use_int8(precision)
        if encoder.mode == "fp32":
            encoder._use_runtime(text_queries, runtime)
        return encoder

    def _use_runtime(self, text_queries: int | None, requested: str | None) -> None:
        tower, self.runtime = choose_text_runtime(
            self.name, self.directory, lambda: self.fingerprint, self._tower, self._embed, text_queries, requested
        )
        if tower is not None:
            # The numpy tower's float32 products are dropped; ONNX Runtime
            # holds its own copy of the weights.
            self._tower, self.text_path = tower, "onnxruntime"

    def loaded_path(self) -> TextPath:
        """Which runtime runs this encoder's text queries, and why (what ``info`` reports once loaded)."""
        if self.text_path == "onnxruntime":
            parity = self.runtime.parity
            return TextPath(
                "onnxruntime",
                f"loaded, fp32 on ONNX Runtime {self.runtime.version} (min cosine {parity['min_cosine']:.7f} "
                f"to the numpy tower's on {parity['texts']} probe texts)",
            )
        notes = [n for n in (self.int8_note, self.runtime.note if self.mode == "fp32" else None) if n]
        why = f" ({'; '.join(notes)})" if notes else ""
        return TextPath("numpy", f"loaded, {self.mode} products{why}")

    def _use_int8(self, requested: str) -> None:
        from .int8 import activation_bits, int8_refusal, quantize_layer

        self.requested = requested
        key: str | None = None
        known: memo.GateOutcome | None = None
        if requested == "auto" and auto_modes("text", "cpu", "numpy"):
            key = memo.gate_key(self.fingerprint)
            known = memo.lookup_gate(key)
            if known is not None and known.mode == "fp32":
                # Decided before: fp32 products, and torch is not even imported.
                self.gate_results, self.int8_note, self.gate_cached = list(known.gate), known.note, True
                return
        refusal = int8_refusal()
        if refusal is not None:
            if requested == "int8":
                raise UnsupportedTextTower(refusal)
            self.int8_note = refusal
            return
        int8_tower = self._tower.with_products(functools.partial(quantize_layer, reduce_range=activation_bits() < 8))
        mode: Mode = "int8"
        if requested == "auto" and known is not None:
            self.gate_results, self.gate_cached = list(known.gate), True
        elif requested == "auto":
            towers = {"fp32": self._tower, "int8": int8_tower}
            seconds: dict[str, float] = {}

            def embed(m: Mode) -> np.ndarray:
                t0 = time.perf_counter()
                vectors = self._embed(towers[m], PROBE_TEXTS)
                seconds[m] = time.perf_counter() - t0
                return vectors

            gated, self.gate_results = choose(embed, ("int8",))
            if gated == "int8":
                # Each tower timed once more, warm: a first pass pays one-time costs (allocation,
                # kernel set-up) that differ between the two, so one cold pass each could keep
                # the slower tower, and differently from one process to the next.
                cold = dict(seconds)
                for m in ("fp32", "int8"):
                    embed(m)
                    seconds[m] = min(seconds[m], cold[m])
            mode, self.int8_note = keep_if_faster(gated, seconds)
            if key is not None:
                memo.record_gate(key, memo.GateOutcome(mode, tuple(self.gate_results), self.int8_note))
        if mode == "int8":
            # The float32 products are dropped, the int8 ones (a quarter of their size) kept.
            self._tower, self.mode = int8_tower, "int8"
            self.int8_note = f"{activation_bits()}-bit activations, torch fbgemm"

    def precision_info(self) -> dict[str, Any]:
        """JSON-able record: requested and chosen mode, the gate figures when ``auto`` ran (with
        ``gate_cached`` when they were read from :mod:`..memo`), and why int8 was not used
        or how it runs (``int8``)."""
        data = precision_record(self.requested, self.mode, self.gate_results)
        if self.int8_note:
            data["int8"] = self.int8_note
        if self.gate_cached:
            data["gate_cached"] = True
        if self.mode == "fp32":
            data.update(self.runtime.record())
        return data

    text_precision_info = precision_info  # the TextEncoder protocol's name

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
        return self._embed(self._tower, texts, batch_size)

    def _embed(self, tower: Any, texts: Sequence[str], batch_size: int = 256) -> np.ndarray:
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        with self._products_context(tower):
            for start in range(0, len(texts), batch_size):
                ids, mask = self.tokenize(texts[start : start + batch_size])
                for row, pos in enumerate(pooled_positions(tower.cfg, ids)):
                    end = int(pos) + 1
                    out[start + row] = tower.forward(ids[row, :end], mask[row, :end])
        return l2_normalize(out)

    @contextlib.contextmanager
    def _products_context(self, tower: Any) -> Iterator[None]:
        if tower.uses_torch:
            from .int8 import one_torch_thread

            with one_torch_thread():
                yield
        else:
            yield


def keep_if_faster(mode: Mode, seconds: dict[str, float]) -> tuple[Mode, str | None]:
    """``auto``'s last step: int8 that passed the gate stays only if it embedded the probe texts
    faster than fp32 (``seconds`` per mode); returns the mode and, when int8 lost, why.

    Small towers are bound by per-product overheads rather than by reading weights, and there
    numpy's fp32 products win.
    """
    if mode != "int8" or seconds["int8"] < seconds["fp32"]:
        return mode, None
    note = (
        f"int8 passed the gate but ran no faster ({seconds['int8'] * 1e3:.0f} ms against "
        f"{seconds['fp32'] * 1e3:.0f} ms for the {len(PROBE_TEXTS)} probe texts)"
    )
    return "fp32", note


def _resolve(future: Future[str], fn: Callable[[Path], str], arg: Path) -> None:
    try:
        future.set_result(fn(arg))
    except BaseException as exc:  # noqa: BLE001 - re-raised by future.result() in the caller
        future.set_exception(exc)
