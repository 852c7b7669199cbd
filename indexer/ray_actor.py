"""What runs on a Ray worker of an ``--engine ray`` build (:mod:`indexer.ray_engine` drives it).

An :class:`EmbedActor` loads the model once (:func:`load_actor_encoder`, as an
:class:`ActorSpec` says), then reads, decodes, preprocesses and embeds each batch of files with
the local engine's own :class:`~indexer.dataset.ImageDataset` and encoder; its answer travels
back as Arrow-friendly columns (:func:`to_columns`, :func:`from_columns`).
:func:`calibrate_remote` resolves an ``auto`` precision on a node of the kind that embeds.
Nothing here imports ray: Ray calls these objects, they do not call Ray.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from retrieval.encoders import Encoder, cpu, load_encoder
from retrieval.errors import EngineError
from retrieval.images import PhotoMeta
from retrieval.shards import MEMBER_SEP, SampleMeta

from . import calibrate
from .build_config import Decode
from .dataset import ImageDataset, Item, collate
from .discover import ImageFile
from .embed import EmbeddedBatch, embed_batch, file_record
from .heap import retained_heap
from .ray_parts import UNREACHED_COLUMN, StageRef, part_columns, part_of, write_part
from .shard_reader import ShardReader


@dataclass(frozen=True)
class ActorSpec:
    """What an actor needs to embed exactly like the driver's plan says."""

    model: str
    device: str
    precision: str
    image_size: int | None
    int8_activation_bits: int | None
    root: bytes
    max_pixels: int
    draft: bool
    threads: int
    ocr: bool = False
    # WebDataset shards: the actor reads each member straight from the store (no shared disk).
    shards: ShardReader | None = None
    # Where the actor writes its batches' rows as parts (indexer.ray_parts), when it reaches it;
    # None: the rows travel back to the driver, which writes them.
    stage: StageRef | None = None
    # Images per model call when a batch is larger (an actor-written part spans several calls).
    model_batch: int = 0
    # The runtime the run's fp32 or int8 vectors come from (retrieval.encoders.runtime): asked for first,
    # so that every node embeds as the driver's choice says and the index stays uniform.
    image_runtime: str | None = None

    @property
    def images(self) -> str | ShardReader:
        return self.shards if self.shards is not None else os.fsdecode(self.root)


def load_actor_encoder(spec: ActorSpec) -> Encoder:
    """The encoder of one actor (or of the calibration task), as the spec says.

    Raises:
        EngineError: an int8 run whose node quantises activations differently from the mode
            the index records (a cluster of mixed CPUs): its vectors would not match.
    """
    import torch

    torch.set_num_threads(spec.threads)
    enc = load_encoder(spec.model, device=spec.device, precision=spec.precision)
    if spec.image_size is not None:
        enc.set_image_size(spec.image_size)
    if spec.image_runtime:
        enc.follow_image_runtime(spec.image_runtime, spec.precision)
    bits = enc.info.get("int8_activation_bits")
    if spec.int8_activation_bits is not None and bits is not None and int(bits) != spec.int8_activation_bits:
        raise EngineError(
            f"node {socket.gethostname()} runs int8 with {bits}-bit activations, the index records "
            f"{spec.int8_activation_bits}-bit ones (CPUs of another kind); use --precision fp32 or one kind of node"
        )
    return enc


class EmbedActor:
    """One model on one Ray worker: decodes, preprocesses and embeds batches of files."""

    def __init__(self, spec: ActorSpec) -> None:
        self.spec = spec
        # As in a local build: activations stay in the heap instead of fresh pages every layer
        # (see indexer/heap.py). The actor's process exists to embed, so the setting lasts its life.
        self._heap = retained_heap()
        self._heap.__enter__()
        self.enc = load_actor_encoder(spec)
        self._dataset = ImageDataset(spec.images, [], self.enc.preprocess, max_pixels=spec.max_pixels,
                                     draft=spec.draft, threads=spec.threads, ocr=spec.ocr)
        # Whether its node sees the index's staging folder (the same file system as the driver).
        self.writes = spec.stage is not None and spec.stage.reachable()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        files = [_file(bytes(rel), batch, j, self.spec.shards is not None) for j, rel in enumerate(batch["rel"])]
        step = self.spec.model_batch or len(files) or 1
        done = concat([self._embed(files[i: i + step]) for i in range(0, len(files), step)])
        if self.spec.stage is None:
            return to_columns(batch["index"], done, self.enc.dim)
        if not self.writes:
            # The driver writes these rows as a part (or fails the run: --ray-write actors).
            return {**to_columns(batch["index"], done, self.enc.dim), UNREACHED_COLUMN: np.full(len(files), socket.gethostname(), object)}
        part = None
        if done.vectors is not None and len(done.vectors):
            records = [file_record(f, it) for f, it in zip(files, done.items, strict=True) if it.error is None]
            part = write_part(self.spec.stage.path, records, done.vectors, self.enc.dim, self.spec.ocr)
        # Only the files' facts travel back, and the part's name: the vectors stay in the part.
        return {**to_columns(batch["index"], done, self.enc.dim, vectors=False), **part_columns(part, len(files))}

    def _embed(self, files: list[ImageFile]) -> EmbeddedBatch:
        import torch

        # One dataset (and decode thread pool) for the actor's life, its files set per batch.
        self._dataset.files = files
        items = self._dataset.__getitems__(range(len(files)))
        # The decode threads set torch to one thread each (dataset._one_torch_thread), which
        # would leave this thread's model calls on fewer cores: the count is set again here.
        torch.set_num_threads(self.spec.threads)
        return embed_batch(self.enc, collate(items))


def concat(batches: Sequence[EmbeddedBatch]) -> EmbeddedBatch:
    """One batch of several model calls' (items in order, vectors of the good ones in order)."""
    if len(batches) == 1:
        return batches[0]
    vectors = [b.vectors for b in batches if b.vectors is not None]
    return EmbeddedBatch([it for b in batches for it in b.items], np.concatenate(vectors) if vectors else None,
                         sum(b.decode_seconds for b in batches), sum(b.encode_seconds for b in batches))


def _file(rel: bytes, batch: dict[str, np.ndarray], j: int, shard: bool) -> ImageFile:
    # A folder's file is read and stat'ed by the actor; a shard member is where its listing says
    # (with all it came with, where the actor writes the part: "sample", as JSON).
    if not shard or "offset" not in batch:
        return ImageFile(rel, -1, -1)
    if "sample" in batch and str(batch["sample"][j]):
        sample = SampleMeta(**json.loads(str(batch["sample"][j])))
    else:
        name = rel.partition(MEMBER_SEP.encode())[0].decode("utf-8", "surrogateescape")
        sample = SampleMeta(name, "", int(batch["offset"][j]))
    return ImageFile(rel, int(batch["size"][j]), int(batch["mtime"][j]), sample)


def to_columns(indices: np.ndarray, done: EmbeddedBatch, dim: int, vectors: bool = True) -> dict[str, np.ndarray]:
    """An embedded batch as Arrow-friendly columns; failed rows carry a zero vector, dropped
    by the driver (:func:`from_columns`); without ``vectors`` (written to a part), no vectors."""
    n = len(done.items)
    ok = np.array([it.error is None for it in done.items], dtype=bool)
    per_file_encode = done.encode_seconds / n if n else 0.0
    cols = {
        "index": np.asarray(indices, np.int64),
        "ok": ok,
        "width": np.array([it.width for it in done.items], np.int32),
        "height": np.array([it.height for it in done.items], np.int32),
        "size": np.array([it.size for it in done.items], np.int64),
        "mtime_ns": np.array([it.mtime_ns for it in done.items], np.int64),
        "content_hash": np.array([it.content_hash for it in done.items], dtype=object),
        "error": np.array([it.error or "" for it in done.items], dtype=object),
        # The photo's EXIF facts as JSON text (one Arrow string column, whatever fields it has).
        "meta": np.array([json.dumps(dataclasses.asdict(it.meta)) for it in done.items], dtype=object),
        "decode_s": np.array([it.seconds for it in done.items], np.float64),
        "encode_s": np.full(n, per_file_encode, np.float64),
    }
    if vectors:
        cols["embedding"] = np.zeros((n, dim), np.float32)
        if done.vectors is not None:
            cols["embedding"][ok] = done.vectors
    return cols


def from_columns(cols: Mapping[str, np.ndarray]) -> EmbeddedBatch:
    """An actor's answer (:func:`to_columns`) as the batch the driver's writer takes."""
    ok = np.asarray(cols["ok"], bool)
    items = [
        Item(int(i), None, int(w), int(h), None if good else str(err), float(d), int(size), int(mtime), str(digest))
        for i, good, w, h, err, d, size, mtime, digest in zip(
            cols["index"], ok, cols["width"], cols["height"], cols["error"], cols["decode_s"], cols["size"],
            cols["mtime_ns"], cols["content_hash"], strict=True,
        )
    ]
    if "meta" in cols:
        for it, text in zip(items, cols["meta"], strict=True):
            it.meta = PhotoMeta(**json.loads(str(text)))
    vectors = np.asarray(cols["embedding"], np.float32)[ok] if ok.any() and "embedding" in cols else None
    return EmbeddedBatch(items, vectors, float(np.sum(cols["decode_s"])), float(np.sum(cols["encode_s"])), part=part_of(cols))


def calibrate_remote(spec: ActorSpec, previous_info: Mapping[str, Any] | None, files: Sequence[ImageFile],
                     keep_recorded: bool, decode: Decode = "auto", recorded_decode: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The encoder info after ``auto`` is calibrated, plus ``_cpu_level`` and ``_decode`` (the JPEG
    decoding, :meth:`indexer.calibrate.DecodeChoice.record`); run as a Ray task with an actor's
    resources, so the mode is chosen on the kind of node (CPU features, GPU) that embeds, with
    the local engine's own calibration."""
    enc = load_actor_encoder(spec)
    with retained_heap():
        sample = calibrate.resolve(enc, previous_info, spec.images, files, max_pixels=spec.max_pixels, keep_recorded=keep_recorded)
        choice = calibrate.resolve_decode(enc, spec.images, files, requested=decode, recorded=recorded_decode,
                                          max_pixels=spec.max_pixels, sample=sample)
    info = dict(enc.info)
    info["_cpu_level"] = cpu.cpu_level() if enc.device.type == "cpu" else ""
    info["_decode"] = choice.record()
    return info


__all__ = ["ActorSpec", "EmbedActor", "calibrate_remote", "concat", "from_columns", "load_actor_encoder", "to_columns"]
