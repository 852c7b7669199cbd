"""The text tower's weights, read from the checkpoint's safetensors files without torch."""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .tower_config import TextTowerConfig, UnsupportedTextTower

_SAFETENSORS_FILE = "model.safetensors"
_SAFETENSORS_INDEX = "model.safetensors.index.json"
_DTYPES: dict[str, str] = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "F64": "<f8"}
TEXT_PREFIX = "text_model."
_PROJECTION = "text_projection.weight"


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


class Linear(Protocol):
    """One of a block's matrix products: ``x @ W + b`` for a ``(rows, in)`` float32 ``x``."""

    def __call__(self, x: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class DenseLinear:
    """``x @ weight + bias`` in float32, ``weight`` laid out ``(in, out)``."""

    weight: np.ndarray
    bias: np.ndarray

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return x @ self.weight + self.bias


@dataclass(frozen=True)
class LayerWeights:
    """One transformer block's weights: LayerNorms in float32, the four products as :class:`Linear`.

    ``qkv`` computes q, k and v side by side (one product instead of three).
    """

    ln1_w: np.ndarray
    ln1_b: np.ndarray
    qkv: Linear
    out: Linear
    ln2_w: np.ndarray
    ln2_b: np.ndarray
    fc1: Linear
    fc2: Linear


def load_weights(reader: SafetensorsReader, cfg: TextTowerConfig) -> tuple[list[LayerWeights], dict[str, np.ndarray]]:
    """The text tower's blocks and its other tensors (position embedding, final LayerNorm, projection).

    Every shape is checked against ``cfg`` before anything is read, so that a checkpoint this
    does not compute falls back to torch cheaply. The token embedding is not loaded: the tower
    reads the rows a query uses.

    Raises:
        UnsupportedTextTower: a missing tensor, a shape ``cfg`` does not predict, or more layers.
    """
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
        name = TEXT_PREFIX + key
        if name not in reader:
            raise UnsupportedTextTower(f"the weights lack {name}")
        if reader.shape(name) != shape:
            raise UnsupportedTextTower(f"{name} has shape {reader.shape(name)}, expected {shape}")
    if _PROJECTION not in reader or reader.shape(_PROJECTION) != (cfg.projection_dim, h):
        raise UnsupportedTextTower(f"the weights lack {_PROJECTION} of shape {(cfg.projection_dim, h)}")
    if f"{TEXT_PREFIX}encoder.layers.{cfg.num_layers}.layer_norm1.weight" in reader:
        raise UnsupportedTextTower("the weights hold more text layers than the config says")

    def get(key: str) -> np.ndarray:
        return reader.float32(TEXT_PREFIX + key)

    layers = []
    for i in range(cfg.num_layers):
        p = f"encoder.layers.{i}."
        layers.append(
            LayerWeights(
                ln1_w=get(p + "layer_norm1.weight"),
                ln1_b=get(p + "layer_norm1.bias"),
                qkv=DenseLinear(
                    np.ascontiguousarray(np.concatenate([get(p + f"self_attn.{x}_proj.weight") for x in "qkv"], axis=0).T),
                    np.concatenate([get(p + f"self_attn.{x}_proj.bias") for x in "qkv"]),
                ),
                out=DenseLinear(get(p + "self_attn.out_proj.weight").T, get(p + "self_attn.out_proj.bias")),
                ln2_w=get(p + "layer_norm2.weight"),
                ln2_b=get(p + "layer_norm2.bias"),
                fc1=DenseLinear(get(p + "mlp.fc1.weight").T, get(p + "mlp.fc1.bias")),
                fc2=DenseLinear(get(p + "mlp.fc2.weight").T, get(p + "mlp.fc2.bias")),
            )
        )
    rest = {
        "position": get("embeddings.position_embedding.weight"),
        "final_w": get("final_layer_norm.weight"),
        "final_b": get("final_layer_norm.bias"),
        "projection": reader.float32(_PROJECTION).T,
    }
    return layers, rest
