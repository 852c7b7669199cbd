"""Decode and preprocess images in DataLoader workers; failures become skip records.

A worker never raises for a bad file: the item carries the reason instead, and
:func:`collate` separates good images (stacked into one tensor) from failures, so one broken
file cannot end a long run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from PIL import Image

from retrieval.errors import EngineError, ImageDecodeError
from retrieval.faults import crash_point
from retrieval.images import (
    DEFAULT_MAX_PIXELS,
    NO_META,
    PhotoMeta,
    PreprocessConfig,
    decode_jpegs_on_device,
    is_jpeg,
    jpeg_has_end,
    load_photo,
    load_pixels,
    preprocess_on_device,
    probe_photo,
)
from retrieval.layout import display_path

from . import ocr
from .discover import ImageFile
from .shard_reader import ShardReader

if TYPE_CHECKING:
    import torch


@dataclass
class Item:
    """One decoded file (``pixels`` set) or one failure (``error`` set).

    ``size``, ``mtime_ns`` and ``content_hash`` describe the bytes that were decoded (read
    once, hashed and decoded from memory), so a later update can tell changed files apart.
    """

    index: int
    pixels: torch.Tensor | None
    width: int
    height: int
    error: str | None
    seconds: float
    size: int = -1
    mtime_ns: int = -1
    content_hash: str = ""
    # A JPEG left for the device to decode (``ImageDataset(device_decode=True)``): its bytes.
    data: bytes | None = None
    # When and with what the photo was taken (EXIF), and a RAW file's embedded image.
    meta: PhotoMeta = NO_META


@dataclass
class Batch:
    """A collated batch: the good images stacked in order, and every file's facts."""

    pixels: torch.Tensor | None  # (n_good, 3, h, w), rows in the order of ``good``
    items: list[Item]  # every file of the batch, in order, without pixels
    decode_seconds: float
    # Items still to decode on the device (then ``pixels`` is None): see :func:`finish_on_device`.
    pending: list[Item] | None = None

    def pin_memory(self) -> Batch:
        """The batch with its pixel tensors in page-locked memory (the DataLoader's pin-memory
        thread calls this), so copies to the GPU are asynchronous."""
        pixels = self.pixels.pin_memory() if self.pixels is not None else None
        pending = self.pending
        if pending is not None:
            pending = [dataclasses.replace(it, pixels=it.pixels.pin_memory()) if it.pixels is not None else it for it in pending]
        return dataclasses.replace(self, pixels=pixels, pending=pending)

    @property
    def good(self) -> list[Item]:
        return [it for it in self.items if it.error is None]

    @property
    def failed(self) -> list[Item]:
        return [it for it in self.items if it.error is not None]


class ImageDataset:
    """Map-style dataset over discovered files: item ``i`` is file ``i`` decoded and preprocessed.

    ``root`` is the collection's folder, or a :class:`~indexer.shard_reader.ShardReader` when the
    files are members of WebDataset shards (read out of their tar, locally or from a store)."""

    def __init__(
        self,
        root: str | os.PathLike[str] | ShardReader,
        files: Sequence[ImageFile],
        preprocess: PreprocessConfig,
        *,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        draft: bool = True,
        device_decode: bool = False,
        threads: int = 1,
        ocr: bool = False,
    ) -> None:
        # With OCR every image is decoded here (OCR reads the decoded pixels on the CPU).
        self.device_decode = device_decode and not ocr
        self.ocr = ocr
        # Threads decoding one batch in this process (PIL and torch release the GIL); a
        # DataLoader worker process uses one.
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self.shards = root if isinstance(root, ShardReader) else None
        self.root = b"" if isinstance(root, ShardReader) else os.fsencode(root)
        self.files = list(files)
        self.preprocess = preprocess
        self.max_pixels = max_pixels
        self.draft = draft

    def __len__(self) -> int:
        return len(self.files)

    def __getitems__(self, indices: Sequence[int]) -> list[Item]:
        """A batch of items (DataLoader's batched fetch), decoded ``threads`` at a time."""
        if self.threads <= 1 or len(indices) < 2:
            return [self[i] for i in indices]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="clipsearch-decode", initializer=_one_torch_thread)
        return list(self._pool.map(self.__getitem__, indices))

    def close(self) -> None:
        """Stop the decode threads (if any were started)."""
        if self.shards is not None:
            self.shards.close()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def __getstate__(self) -> dict[str, object]:
        # Worker processes get the dataset without the thread pool (not copyable, not wanted).
        return {**self.__dict__, "_pool": None}

    def __getitem__(self, index: int) -> Item:
        file = self.files[index]
        rel = file.rel
        crash_point("decode")
        start = time.perf_counter()
        try:
            if self.shards is not None:
                # A shard member's facts are its listing's: its size and the shard's version.
                data, size, mtime_ns = self.shards.read(file), file.size, file.mtime_ns
            else:
                data, size, mtime_ns = _read_file(os.path.join(self.root, rel))
        except OSError as exc:
            return Item(index, None, 0, 0, _read_error(exc), time.perf_counter() - start)
        digest = content_hash(data)
        if self.device_decode and is_jpeg(data) and jpeg_has_end(data):
            # Only the header here (size, EXIF, bomb check); the pixels are decoded on the GPU.
            try:
                width, height, meta = probe_photo(data, max_pixels=self.max_pixels, name=display_path(rel))
            except ImageDecodeError as exc:
                return Item(index, None, 0, 0, exc.reason, time.perf_counter() - start, size, mtime_ns, digest)
            return Item(index, None, width, height, None, time.perf_counter() - start, size, mtime_ns, digest, data, meta)
        try:
            pixels, decoded = load_photo(
                io.BytesIO(data),
                self.preprocess,
                max_pixels=self.max_pixels,
                draft=self.draft,
                name=display_path(rel),
                keep_edge=ocr.OCR_MIN_EDGE if self.ocr else None,
            )
        except ImageDecodeError as exc:
            error = exc.reason
        except Exception as exc:  # noqa: BLE001 - a decoder bug on one file must not end the run
            error = f"decode failed: {type(exc).__name__}: {exc}"
        else:
            meta = _with_ocr(decoded.image, decoded.meta) if self.ocr else decoded.meta
            return Item(index, pixels, decoded.width, decoded.height, None, time.perf_counter() - start, size, mtime_ns,
                        digest, meta=meta)
        return Item(index, None, 0, 0, error, time.perf_counter() - start, size, mtime_ns, digest)


# How an image's note starts when OCR could not read it (indexer.backfill counts these).
OCR_FAILED_NOTE = "OCR failed"


def _with_ocr(image: Image.Image, meta: PhotoMeta) -> PhotoMeta:
    """``meta`` with the text OCR reads in ``image``; an image it cannot read keeps no text and
    says so in its note (counted by the run), never fails."""
    try:
        return dataclasses.replace(meta, ocr_text=ocr.recognise(image))
    except EngineError:
        raise
    except Exception as exc:  # noqa: BLE001 - one image the engine cannot read must not end the run
        note = f"{OCR_FAILED_NOTE}: {type(exc).__name__}"
        return dataclasses.replace(meta, note=f"{meta.note}; {note}" if meta.note else note)


def _one_torch_thread() -> None:
    # A decode thread's torch operations (resize, normalise) run on that thread alone; without
    # this each pool thread opened an OpenMP team of its own on the same cores. It sets the
    # calling thread's count (and the default for threads started later), not the model's.
    import torch

    torch.set_num_threads(1)


def content_hash(data: bytes) -> str:
    """Hex BLAKE2b-128 of a file's bytes: tells a touched-but-identical file from a changed one."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _read_file(path: bytes) -> tuple[bytes, int, int]:
    # One read serves the hash and the decoder; fstat describes exactly the bytes read.
    with open(path, "rb") as fh:
        st = os.fstat(fh.fileno())
        return fh.read(), st.st_size, st.st_mtime_ns


def _read_error(exc: OSError) -> str:
    if isinstance(exc, FileNotFoundError):
        return "file not found"
    if isinstance(exc, PermissionError):
        return "permission denied"
    if isinstance(exc, IsADirectoryError):
        return "is a directory"
    return f"unreadable: {exc.strerror or str(exc) or type(exc).__name__}"


def collate(items: Sequence[Item]) -> Batch:
    """Stack the good items of a batch and list the failures."""
    import torch

    if any(it.data is not None for it in items):
        return Batch(None, [dataclasses.replace(it, pixels=None, data=None) for it in items],
                     sum(it.seconds for it in items), pending=list(items))
    good = [it.pixels for it in items if it.pixels is not None]
    return Batch(
        pixels=torch.stack(good) if good else None,
        # Per-file facts without the pixels, which travel once, stacked.
        items=[dataclasses.replace(it, pixels=None) for it in items],
        decode_seconds=sum(it.seconds for it in items),
    )


# Decoded images of one size preprocessed per call on the device (bounds its float copies).
DEVICE_CHUNK = 128


def finish_on_device(
    batch: Batch,
    preprocess: PreprocessConfig,
    device: torch.device,
    *,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    draft: bool = True,
) -> Batch:
    """Decode a batch's pending JPEGs on ``device`` and stack every good image there.

    A JPEG the device decoder cannot handle is decoded on the CPU with PIL instead; a file
    neither can decode becomes a failure with its reason, like in the workers.
    """
    import torch

    if batch.pending is None:
        return batch
    start = time.perf_counter()
    raw = [it for it in batch.pending if it.data is not None]
    decoded = dict(
        zip(
            (it.index for it in raw),
            decode_jpegs_on_device([it.data for it in raw], device),  # type: ignore[misc]  # raw keeps only items with data
            strict=True,
        )
    )
    items: list[Item] = []
    # Good images' pixels in batch order; decoded images of one size wait in ``same_size`` and are
    # preprocessed as one stacked tensor (a photo collection has few distinct sizes, and one
    # resize call for 256 images costs what one call for a single image costs in launches).
    rows: list[torch.Tensor | None] = []
    same_size: dict[tuple[int, ...], list[tuple[int, torch.Tensor]]] = {}
    for it in batch.pending:
        if it.data is None:
            if it.pixels is not None:
                rows.append(it.pixels.to(device, non_blocking=True))
            items.append(dataclasses.replace(it, pixels=None))
            continue
        image = decoded.get(it.index)
        if image is not None and tuple(image.shape[-2:]) == (it.height, it.width):
            same_size.setdefault(tuple(image.shape), []).append((len(rows), image))
            rows.append(None)
            items.append(dataclasses.replace(it, pixels=None, data=None))
            continue
        try:
            pixels, _, _ = load_pixels(io.BytesIO(it.data), preprocess, max_pixels=max_pixels, draft=draft)
        except ImageDecodeError as exc:
            items.append(dataclasses.replace(it, pixels=None, data=None, width=0, height=0, error=exc.reason))
            continue
        except Exception as exc:  # noqa: BLE001 - one file must not end the run
            error = f"decode failed: {type(exc).__name__}: {exc}"
            items.append(dataclasses.replace(it, pixels=None, data=None, width=0, height=0, error=error))
            continue
        rows.append(pixels.to(device, non_blocking=True))
        items.append(dataclasses.replace(it, pixels=None, data=None))
    for group in same_size.values():
        # In chunks: the float copy of full-size images is large (128 at 640x480: 472 MB).
        parts = [
            preprocess_on_device(torch.stack([image for _, image in group[i : i + DEVICE_CHUNK]]), preprocess)
            for i in range(0, len(group), DEVICE_CHUNK)
        ]
        stacked = parts[0] if len(parts) == 1 else torch.cat(parts)
        if len(group) == len(rows):
            # One size and nothing else: already the batch, in order (no split and re-stack).
            return Batch(stacked, items, batch.decode_seconds + time.perf_counter() - start)
        for (row, _), pixels in zip(group, stacked, strict=True):
            rows[row] = pixels
    seconds = batch.decode_seconds + time.perf_counter() - start
    return Batch(torch.stack(rows) if rows else None, items, seconds)  # type: ignore[arg-type]  # None slots were filled from same_size
