"""A query-only CLIP text tower in plain numpy: text queries without importing torch.

``clipsearch search INDEX "a banana"`` used to spend seconds importing torch and transformers
to run a text tower that takes milliseconds. This module runs the same tower from the
checkpoint's own files and needs neither:

- the tokenizer is the checkpoint's ``tokenizer.json`` through the ``tokenizers`` library, set
  up the way transformers 5's ``CLIPTokenizer`` sets it up (its normaliser, pre-tokeniser and
  BOS/EOS post-processor over the file's vocabulary and merges), truncated to the context length;
- the weights are read from ``model.safetensors`` (or its shards), memory-mapped: only the text
  tower's tensors, and of the token embedding only the rows a query uses;
- the forward pass is ``CLIPTextModelWithProjection``'s in float32: token + position
  embeddings, pre-LN blocks with causal self-attention (the tokenizer's mask on the keys),
  final LayerNorm, the pooled token (the first EOS, or transformers' legacy argmax for
  ``eos_token_id == 2``), projection. Each text runs at its own length up to the pooled token:
  the causal mask makes later positions irrelevant to it.

Only checkpoints whose configuration this fully understands take this path (see
:func:`check_text_config`); everything else keeps the torch path, and :func:`text_path` says
which one a query would take and why. Vectors agree with the torch fp32 path to ~1e-6.
"""

from __future__ import annotations

import json
import math
import os
import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ModelLoadError
from ..base import l2_normalize
from ..hf import checkpoint_fingerprint

# The activations of transformers' ACT2FN this tower computes (the ones CLIP checkpoints use).
ACTIVATIONS: tuple[str, ...] = ("quick_gelu", "gelu")
# Tokenizer classes whose pipeline :func:`load_clip_tokenizer` reproduces.
TOKENIZER_CLASSES: tuple[str, ...] = ("CLIPTokenizer", "CLIPTokenizerFast")
# transformers' pooling switch: with this eos_token_id it pools at the argmax of the ids.
LEGACY_EOS_TOKEN_ID = 2
# Set to "torch" to send text queries to the torch path (e.g. to compare the two).
TEXT_PATH_ENV = "CLIPSEARCH_TEXT_PATH"

_SAFETENSORS_FILE = "model.safetensors"
_SAFETENSORS_INDEX = "model.safetensors.index.json"
_DTYPES: dict[str, str] = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "F64": "<f8"}
_TEXT_PREFIX = "text_model."
_PROJECTION = "text_projection.weight"


class UnsupportedTextTower(Exception):
    """The checkpoint's text tower is not one this module computes; the message says why.

    Not a :class:`~retrieval.errors.ClipSearchError`: callers fall back to the torch path.
    """


@dataclass(frozen=True)
class TextTowerConfig:
    """The shapes and conventions of a Hugging Face CLIP text tower (``text_config``).

    Attributes:
        hidden_size: width of the residual stream.
        num_heads: attention heads.
        num_layers: transformer blocks.
        intermediate_size: width of the MLP.
        hidden_act: the MLP's activation, one of :data:`ACTIVATIONS`.
        layer_norm_eps: LayerNorm epsilon.
        max_positions: the context length (``max_position_embeddings``).
        vocab_size: rows of the token embedding.
        eos_token_id: the id the pooled token is found by (2: transformers' legacy argmax).
        projection_dim: width of the output vector.
    """

    hidden_size: int
    num_heads: int
    num_layers: int
    intermediate_size: int
    hidden_act: str
    layer_norm_eps: float
    max_positions: int
    vocab_size: int
    eos_token_id: int
    projection_dim: int

    def __post_init__(self) -> None:
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"activation {self.hidden_act!r} (handled: {', '.join(ACTIVATIONS)})")
        if self.num_heads < 1 or self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by {self.num_heads} heads")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def legacy_pooling(self) -> bool:
        """Whether transformers pools at the argmax of the ids (``eos_token_id == 2``)."""
        return self.eos_token_id == LEGACY_EOS_TOKEN_ID


def check_text_config(config: Mapping[str, Any]) -> TextTowerConfig:
    """Read a checkpoint's ``config.json`` into a :class:`TextTowerConfig`.

    transformers' ``CLIPTextConfig`` defaults fill absent keys, as ``from_pretrained`` does.

    Raises:
        UnsupportedTextTower: not a CLIP checkpoint, or a text tower this module does not compute.
    """
    if config.get("model_type") != "clip":
        raise UnsupportedTextTower(f"model_type {config.get('model_type')!r} is not 'clip'")
    text = config.get("text_config") or {}
    if not isinstance(text, Mapping):
        raise UnsupportedTextTower("text_config is not an object")
    if text.get("model_type", "clip_text_model") != "clip_text_model":
        raise UnsupportedTextTower(f"text model_type {text.get('model_type')!r}")
    projection = config.get("projection_dim", 512)
    if int(text.get("projection_dim", projection)) != int(projection):
        # CLIPModel and CLIPTextModelWithProjection would disagree on the projection's width.
        raise UnsupportedTextTower("text_config.projection_dim differs from projection_dim")
    try:
        return TextTowerConfig(
            hidden_size=int(text.get("hidden_size", 512)),
            num_heads=int(text.get("num_attention_heads", 8)),
            num_layers=int(text.get("num_hidden_layers", 12)),
            intermediate_size=int(text.get("intermediate_size", 2048)),
            hidden_act=str(text.get("hidden_act", "quick_gelu")),
            layer_norm_eps=float(text.get("layer_norm_eps", 1e-5)),
            max_positions=int(text.get("max_position_embeddings", 77)),
            vocab_size=int(text.get("vocab_size", 49408)),
            eos_token_id=int(text.get("eos_token_id", 49407)),
            projection_dim=int(projection),
        )
    except (TypeError, ValueError) as exc:
        raise UnsupportedTextTower(f"text_config: {exc}") from exc


# -- weights ------------------------------------------------------------------------------------


class SafetensorsReader:
    """Tensors of one or more ``.safetensors`` files, memory-mapped (nothing is read up front)."""

    def __init__(self, files: Sequence[Path]) -> None:
        self._where: dict[str, tuple[np.memmap | None, dict[str, Any]]] = {}
        for path in files:
            with open(path, "rb") as fh:
                (size,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(size))
            data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + size) if path.stat().st_size > 8 + size else None
            for name, entry in header.items():
                if name != "__metadata__":
                    self._where[name] = (data, entry)

    @classmethod
    def for_checkpoint(cls, directory: Path) -> SafetensorsReader:
        """The checkpoint's ``model.safetensors``, or the shards its index file lists.

        Raises:
            UnsupportedTextTower: no safetensors weights (e.g. only ``pytorch_model.bin``).
        """
        single = directory / _SAFETENSORS_FILE
        if single.is_file():
            return cls([single])
        index = directory / _SAFETENSORS_INDEX
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text("utf-8"))["weight_map"].values()))
            return cls([directory / s for s in shards])
        raise UnsupportedTextTower("no model.safetensors (torch .bin weights need torch to read)")

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._where[name][1]["shape"])

    def raw(self, name: str) -> np.ndarray:
        """The tensor as stored (memory-mapped, read-only)."""
        data, entry = self._where[name]
        dtype = _DTYPES.get(entry["dtype"])
        if dtype is None:
            raise UnsupportedTextTower(f"{name} is stored as {entry['dtype']}")
        start, end = entry["data_offsets"]
        shape = tuple(entry["shape"])
        if data is None or end == start:
            return np.zeros(shape, dtype=dtype)
        return data[start:end].view(dtype).reshape(shape)

    def float32(self, name: str, rows: np.ndarray | None = None) -> np.ndarray:
        """The tensor (or some of its rows) in float32, as ``from_pretrained(dtype=float32)`` loads it."""
        data, entry = self._where[name]
        array = self.raw(name)
        if rows is not None:
            array = array[rows]
        if entry["dtype"] == "BF16":
            return (array.astype(np.uint32) << 16).view(np.float32)
        if array.dtype == np.float32:
            return array
        return array.astype(np.float32)


@dataclass(frozen=True)
class _Layer:
    ln1_w: np.ndarray
    ln1_b: np.ndarray
    qkv_w: np.ndarray  # (hidden, 3 * hidden): q, k, v side by side, transposed for x @ w
    qkv_b: np.ndarray
    out_w: np.ndarray
    out_b: np.ndarray
    ln2_w: np.ndarray
    ln2_b: np.ndarray
    fc1_w: np.ndarray
    fc1_b: np.ndarray
    fc2_w: np.ndarray
    fc2_b: np.ndarray


def _load_weights(reader: SafetensorsReader, cfg: TextTowerConfig) -> tuple[list[_Layer], dict[str, np.ndarray]]:
    h, inter = cfg.hidden_size, cfg.intermediate_size
    expected: dict[str, tuple[int, ...]] = {
        "embeddings.token_embedding.weight": (cfg.vocab_size, h),
        "embeddings.position_embedding.weight": (cfg.max_positions, h),
        "final_layer_norm.weight": (h,),
        "final_layer_norm.bias": (h,),
    }
    block = {
        "layer_norm1.weight": (h,), "layer_norm1.bias": (h,), "layer_norm2.weight": (h,), "layer_norm2.bias": (h,),
        "self_attn.q_proj.weight": (h, h), "self_attn.q_proj.bias": (h,),
        "self_attn.k_proj.weight": (h, h), "self_attn.k_proj.bias": (h,),
        "self_attn.v_proj.weight": (h, h), "self_attn.v_proj.bias": (h,),
        "self_attn.out_proj.weight": (h, h), "self_attn.out_proj.bias": (h,),
        "mlp.fc1.weight": (inter, h), "mlp.fc1.bias": (inter,),
        "mlp.fc2.weight": (h, inter), "mlp.fc2.bias": (h,),
    }  # fmt: skip
    for i in range(cfg.num_layers):
        expected.update({f"encoder.layers.{i}.{k}": v for k, v in block.items()})
    for key, shape in expected.items():
        name = _TEXT_PREFIX + key
        if name not in reader:
            raise UnsupportedTextTower(f"the weights lack {name}")
        if reader.shape(name) != shape:
            raise UnsupportedTextTower(f"{name} has shape {reader.shape(name)}, expected {shape}")
    if _PROJECTION not in reader or reader.shape(_PROJECTION) != (cfg.projection_dim, h):
        raise UnsupportedTextTower(f"the weights lack {_PROJECTION} of shape {(cfg.projection_dim, h)}")
    if f"{_TEXT_PREFIX}encoder.layers.{cfg.num_layers}.layer_norm1.weight" in reader:
        raise UnsupportedTextTower("the weights hold more text layers than the config says")

    def get(key: str) -> np.ndarray:
        return reader.float32(_TEXT_PREFIX + key)

    layers = []
    for i in range(cfg.num_layers):
        p = f"encoder.layers.{i}."
        layers.append(
            _Layer(
                ln1_w=get(p + "layer_norm1.weight"),
                ln1_b=get(p + "layer_norm1.bias"),
                qkv_w=np.ascontiguousarray(
                    np.concatenate([get(p + f"self_attn.{x}_proj.weight") for x in "qkv"], axis=0).T
                ),
                qkv_b=np.concatenate([get(p + f"self_attn.{x}_proj.bias") for x in "qkv"]),
                out_w=get(p + "self_attn.out_proj.weight").T,
                out_b=get(p + "self_attn.out_proj.bias"),
                ln2_w=get(p + "layer_norm2.weight"),
                ln2_b=get(p + "layer_norm2.bias"),
                fc1_w=get(p + "mlp.fc1.weight").T,
                fc1_b=get(p + "mlp.fc1.bias"),
                fc2_w=get(p + "mlp.fc2.weight").T,
                fc2_b=get(p + "mlp.fc2.bias"),
            )
        )
    rest = {
        "position": get("embeddings.position_embedding.weight"),
        "final_w": get("final_layer_norm.weight"),
        "final_b": get("final_layer_norm.bias"),
        "projection": reader.float32(_PROJECTION).T,
    }
    return layers, rest


# -- tokenizer ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenizerSettings:
    """What ``tokenizer_config.json`` says, as far as the query ids depend on it."""

    bos_token: str = "<|startoftext|>"
    eos_token: str = "<|endoftext|>"
    pad_token: str = "<|endoftext|>"
    unk_token: str = "<|endoftext|>"

    @classmethod
    def read(cls, directory: Path) -> TokenizerSettings:
        """Read and check the settings.

        Raises:
            UnsupportedTextTower: another tokenizer class, left padding or truncation, or
                special tokens given as something else than strings.
        """
        path = directory / "tokenizer_config.json"
        if not path.is_file():
            raise UnsupportedTextTower("no tokenizer_config.json")
        data = json.loads(path.read_text("utf-8"))
        if data.get("tokenizer_class") not in TOKENIZER_CLASSES:
            raise UnsupportedTextTower(f"tokenizer class {data.get('tokenizer_class')!r}")
        for side in ("padding_side", "truncation_side"):
            if data.get(side, "right") != "right":
                raise UnsupportedTextTower(f"{side} {data.get(side)!r}")
        for flag in ("add_bos_token", "add_eos_token"):
            if data.get(flag, True) is not True:
                # transformers would rebuild the post-processor without that token.
                raise UnsupportedTextTower(f"tokenizer_config {flag} is {data.get(flag)!r}")
        values: dict[str, str] = {}
        for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
            value = data.get(name, getattr(cls, name))
            if isinstance(value, Mapping):
                value = value.get("content")
            if not isinstance(value, str):
                raise UnsupportedTextTower(f"tokenizer_config {name} is {value!r}")
            values[name] = value
        return cls(**values)


def load_clip_tokenizer(directory: Path, max_length: int) -> tuple[Any, TokenizerSettings]:
    """The checkpoint's tokenizer as transformers 5's ``CLIPTokenizer`` builds it, truncating.

    The vocabulary, merges and added tokens come from ``tokenizer.json``; normaliser,
    pre-tokeniser and post-processor are the ones ``CLIPTokenizer.__init__`` installs (as
    transformers does, whatever the file says).

    Raises:
        UnsupportedTextTower: no ``tokenizer.json``, or one this cannot reproduce.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, normalizers, pre_tokenizers, processors

    settings = TokenizerSettings.read(directory)
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise UnsupportedTextTower("no tokenizer.json")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - the tokenizers library raises plain Exceptions
        raise UnsupportedTextTower(f"unreadable tokenizer.json: {exc}") from exc
    bpe = tok.model
    if (
        type(bpe).__name__ != "BPE"
        or bpe.end_of_word_suffix != "</w>"
        or bpe.continuing_subword_prefix not in (None, "")
        or bpe.dropout not in (None, 0.0)
    ):
        raise UnsupportedTextTower("tokenizer.json is not CLIP's byte-level BPE")
    specials = [settings.bos_token, settings.eos_token, settings.pad_token, settings.unk_token]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in dict.fromkeys(specials)])
    found = {t: tok.token_to_id(t) for t in specials}
    ids = {t: i for t, i in found.items() if i is not None}
    if len(ids) != len(found):
        raise UnsupportedTextTower("a special token of tokenizer_config.json is not in the vocabulary")
    # The pipeline of transformers' CLIPTokenizer.__init__ (models/clip/tokenization_clip.py).
    tok.normalizer = normalizers.Sequence(
        [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()]
    )
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(
                Regex(r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""),
                behavior="removed",
                invert=True,
            ),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tok.post_processor = processors.RobertaProcessing(
        (settings.eos_token, ids[settings.eos_token]), (settings.bos_token, ids[settings.bos_token]), False, False
    )
    tok.no_padding()
    tok.enable_truncation(max_length=max_length)
    return tok, settings


# -- the tower ----------------------------------------------------------------------------------


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = (centred * centred).mean(axis=-1, keepdims=True)
    return (centred / np.sqrt(var + np.float32(eps))) * weight + bias


def _erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz & Stegun 7.1.26 in float64: |error| < 1.5e-7, below float32's resolution here.
    t = 1.0 / (1.0 + 0.3275911 * np.abs(x))
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return np.sign(x) * (1.0 - poly * np.exp(-x * x))


def _activation(x: np.ndarray, name: str) -> np.ndarray:
    if name == "quick_gelu":
        with np.errstate(over="ignore"):  # exp overflows to inf for very negative x: the result is -0
            return x / (1.0 + np.exp(np.float32(-1.702) * x))
    x64 = x.astype(np.float64)
    return (0.5 * x64 * (1.0 + _erf(x64 / math.sqrt(2.0)))).astype(np.float32)


class NumpyTextTower:
    """``CLIPTextModelWithProjection``'s forward pass for one checkpoint, in numpy float32."""

    def __init__(self, cfg: TextTowerConfig, reader: SafetensorsReader) -> None:
        self.cfg = cfg
        self._reader = reader
        self._layers, rest = _load_weights(reader, cfg)
        self._position = rest["position"]
        self._final_w, self._final_b = rest["final_w"], rest["final_b"]
        self._projection = rest["projection"]
        self._token_embedding = reader.raw(_TEXT_PREFIX + "embeddings.token_embedding.weight")

    def pooled_positions(self, ids: np.ndarray) -> np.ndarray:
        """The token each row of a padded ``(n, L)`` id batch is pooled at, as transformers picks it."""
        if self.cfg.legacy_pooling:
            return ids.astype(np.int32).argmax(axis=1)
        return (ids == self.cfg.eos_token_id).astype(np.int32).argmax(axis=1)

    def forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Projected (not normalised) output at the last position of one sequence.

        Args:
            ids: ``(L,)`` token ids up to and including the pooled token.
            mask: ``(L,)`` the tokenizer's attention mask for them (0 for padding).
        """
        cfg = self.cfg
        n = len(ids)
        heads, hd = cfg.num_heads, cfg.head_dim
        x = self._reader.float32(_TEXT_PREFIX + "embeddings.token_embedding.weight", rows=ids) + self._position[:n]
        allowed = np.tril(np.ones((n, n), dtype=bool)) & (mask[None, :] != 0)
        bias = np.where(allowed, np.float32(0.0), np.float32(-np.inf)).astype(np.float32)
        scale = np.float32(hd**-0.5)
        eps = cfg.layer_norm_eps
        last = len(self._layers) - 1
        for i, layer in enumerate(self._layers):
            h = _layer_norm(x, layer.ln1_w, layer.ln1_b, eps)
            qkv = h @ layer.qkv_w + layer.qkv_b
            q, k, v = (qkv[:, j * cfg.hidden_size : (j + 1) * cfg.hidden_size] for j in range(3))
            if i == last:
                # Only the pooled (last) position is read after the last block.
                q, x, bias_rows = q[-1:], x[-1:], bias[-1:]
            else:
                bias_rows = bias
            qh = q.reshape(len(q), heads, hd).transpose(1, 0, 2)
            kh = k.reshape(n, heads, hd).transpose(1, 0, 2)
            vh = v.reshape(n, heads, hd).transpose(1, 0, 2)
            scores = (qh @ kh.transpose(0, 2, 1)) * scale + bias_rows
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            probs = scores / scores.sum(axis=-1, keepdims=True)
            attn = (probs @ vh).transpose(1, 0, 2).reshape(len(q), cfg.hidden_size)
            x = x + (attn @ layer.out_w + layer.out_b)
            h = _layer_norm(x, layer.ln2_w, layer.ln2_b, eps)
            h = _activation(h @ layer.fc1_w + layer.fc1_b, cfg.hidden_act)
            x = x + (h @ layer.fc2_w + layer.fc2_b)
        pooled = _layer_norm(x[-1], self._final_w, self._final_b, eps)
        return pooled @ self._projection


class NumpyTextEncoder:
    """Text queries of a Hugging Face CLIP checkpoint without torch (see the module docstring).

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


# -- which path ---------------------------------------------------------------------------------


def local_checkpoint(model: str) -> tuple[str, Path]:
    """``(name, directory)`` of a Hugging Face checkpoint without any network access.

    Raises:
        UnsupportedTextTower: a hub id that is not in the local cache.
        ModelLoadError: a path that is not a checkpoint directory.
    """
    from ..hf import _looks_like_path, resolve_checkpoint

    local = Path(model).expanduser()
    if local.is_dir() or _looks_like_path(model):
        return resolve_checkpoint(model)
    try:
        from huggingface_hub import snapshot_download

        directory = Path(snapshot_download(model, allow_patterns=["*.json", "*.txt", "*.safetensors"], local_files_only=True))
    except Exception as exc:  # noqa: BLE001 - hub errors come in many types
        raise UnsupportedTextTower(f"{model} is not in the local Hugging Face cache") from exc
    if not (directory / "config.json").is_file():
        raise UnsupportedTextTower(f"{model} is not in the local Hugging Face cache")
    return model, directory


def read_checkpoint_config(directory: Path) -> TextTowerConfig:
    """:func:`check_text_config` of ``directory/config.json``.

    Raises:
        UnsupportedTextTower: unreadable config or an unsupported text tower.
    """
    try:
        config = json.loads((directory / "config.json").read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise UnsupportedTextTower(f"unreadable config.json: {exc}") from exc
    if not isinstance(config, dict):
        raise UnsupportedTextTower("config.json is not an object")
    return check_text_config(config)


@dataclass(frozen=True)
class TextPath:
    """Which text tower a text query would run on, and why.

    Attributes:
        path: ``numpy`` (this module, no torch) or ``torch`` (the backend's own encoder).
        reason: why, in a few words.
    """

    path: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "reason": self.reason}


def fast_path_refusal(backend: str, model: str, precision: str, device: str) -> str | None:
    """Why a query with these settings cannot take the numpy path (None: it may, checkpoint allowing).

    ``CLIPSEARCH_TEXT_PATH=torch`` in the environment sends every text query to torch.
    """
    if os.environ.get(TEXT_PATH_ENV, "").strip().lower() == "torch":
        return f"{TEXT_PATH_ENV}=torch"
    if backend != "hf" or model.startswith("open_clip:"):
        return f"{backend} models use their own text tower"
    if precision != "fp32":
        return f"text precision {precision} runs in torch"
    if device not in ("auto", "cpu"):
        return f"--device {device} runs in torch"
    return None


def text_path(model: str, backend: str = "hf", precision: str = "fp32", device: str = "auto") -> TextPath:
    """Which path :class:`~retrieval.index.ImageIndex` would take for a text query (cheap: no weights read).

    Args:
        model: the query model (the index's, unless ``--model`` names another).
        backend: the index's backend (``hf``, ``open_clip``).
        precision: the text precision asked for.
        device: the device asked for.
    """
    refusal = fast_path_refusal(backend, model, precision, device)
    if refusal is not None:
        return TextPath("torch", refusal)
    try:
        _, directory = local_checkpoint(model)
        cfg = read_checkpoint_config(directory)
        TokenizerSettings.read(directory)
        if not (directory / "tokenizer.json").is_file():
            raise UnsupportedTextTower("no tokenizer.json")
        SafetensorsReader.for_checkpoint(directory)
    except (UnsupportedTextTower, ModelLoadError) as exc:
        return TextPath("torch", str(exc))
    return TextPath("numpy", f"CLIP text tower ({cfg.num_layers} layers, {cfg.hidden_act}) in numpy, fp32, no torch")


__all__ = [
    "ACTIVATIONS",
    "NumpyTextEncoder",
    "NumpyTextTower",
    "SafetensorsReader",
    "TEXT_PATH_ENV",
    "TextPath",
    "TextTowerConfig",
    "UnsupportedTextTower",
    "check_text_config",
    "fast_path_refusal",
    "load_clip_tokenizer",
    "local_checkpoint",
    "text_path",
]
