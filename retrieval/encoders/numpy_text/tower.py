"""The forward pass of ``CLIPTextModelWithProjection`` in numpy float32 (its matrix products pluggable)."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import numpy as np

from .tower_config import TextTowerConfig
from .weights import TEXT_PREFIX, DenseLinear, LayerWeights, SafetensorsReader, load_weights


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    # ``x.mean`` as its own sum and division (the same float32 figures without ``_methods._mean``'s
    # Python overhead), the rest in place: a query runs 25 of these on a few rows.
    width = np.float32(x.shape[-1])
    centred = x - np.add.reduce(x, axis=-1, keepdims=True) / width
    var = np.add.reduce(centred * centred, axis=-1, keepdims=True) / width
    var += np.float32(eps)
    centred /= np.sqrt(var, out=var)
    centred *= weight
    centred += bias
    return centred


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


def pooled_positions(cfg: TextTowerConfig, ids: np.ndarray) -> np.ndarray:
    """The token each row of a padded ``(n, L)`` id batch is pooled at, as transformers picks it."""
    if cfg.legacy_pooling:
        return ids.astype(np.int32).argmax(axis=1)
    return (ids == cfg.eos_token_id).astype(np.int32).argmax(axis=1)


class NumpyTextTower:
    """``CLIPTextModelWithProjection``'s forward pass for one checkpoint, in numpy float32.

    The blocks' matrix products are :class:`~.weights.Linear` objects: float32 ones as loaded,
    or others (:meth:`with_products`, e.g. the int8 ones of :mod:`.int8`); everything else
    (embeddings, LayerNorms, attention, activations) stays float32 numpy.
    """

    def __init__(self, cfg: TextTowerConfig, reader: SafetensorsReader) -> None:
        self.cfg = cfg
        self._reader = reader
        self._layers, rest = load_weights(reader, cfg)
        self._position = rest["position"]
        self._final_w, self._final_b = rest["final_w"], rest["final_b"]
        self._projection = rest["projection"]
        self._token_embedding = reader.raw(TEXT_PREFIX + "embeddings.token_embedding.weight")

    @property
    def uses_torch(self) -> bool:
        """Whether any product is not numpy float32 (the int8 ones run torch kernels)."""
        return not all(isinstance(p, DenseLinear) for layer in self._layers for p in (layer.qkv, layer.out, layer.fc1, layer.fc2))

    def with_products(self, convert: Callable[[LayerWeights], LayerWeights]) -> NumpyTextTower:
        """A tower sharing this one's embeddings and norms, each block passed through ``convert``."""
        other = copy.copy(self)
        other._layers = [convert(layer) for layer in self._layers]
        return other

    def forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Projected (not normalised) output at the last position of one sequence.

        Args:
            ids: ``(L,)`` token ids up to and including the pooled token.
            mask: ``(L,)`` the tokenizer's attention mask for them (0 for padding).
        """
        cfg = self.cfg
        n = len(ids)
        heads, hd = cfg.num_heads, cfg.head_dim
        x = self._reader.float32(TEXT_PREFIX + "embeddings.token_embedding.weight", rows=ids) + self._position[:n]
        allowed = np.tril(np.ones((n, n), dtype=bool)) & (mask[None, :] != 0)
        bias = np.where(allowed, np.float32(0.0), np.float32(-np.inf)).astype(np.float32)
        scale = np.float32(hd**-0.5)
        eps = cfg.layer_norm_eps
        last = len(self._layers) - 1
        for i, layer in enumerate(self._layers):
            h = _layer_norm(x, layer.ln1_w, layer.ln1_b, eps)
            # (3, heads, n, hd) views of q, k and v side by side; no copies.
            qh, kh, vh = layer.qkv(h).reshape(n, 3, heads, hd).transpose(1, 2, 0, 3)
            if i == last:
                # Only the pooled (last) position is read after the last block.
                qh, x, bias_rows = qh[:, -1:], x[-1:], bias[-1:]
            else:
                bias_rows = bias
            # Softmax in place, the max and sum as plain reductions (numpy's methods add Python
            # overhead that counts at these sizes); the same figures as the out-of-place form.
            scores = qh @ kh.transpose(0, 2, 1)
            scores *= scale
            scores += bias_rows
            scores -= np.maximum.reduce(scores, axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= np.add.reduce(scores, axis=-1, keepdims=True)
            attn = (scores @ vh).transpose(1, 0, 2).reshape(len(x), cfg.hidden_size)
            x += layer.out(attn)
            h = _layer_norm(x, layer.ln2_w, layer.ln2_b, eps)
            h = _activation(layer.fc1(h), cfg.hidden_act)
            x += layer.fc2(h)
        pooled = _layer_norm(x[-1], self._final_w, self._final_b, eps)
        return pooled @ self._projection
