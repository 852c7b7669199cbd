"""``build_index``: discover → decode (workers) → embed → write Parquet → FAISS → manifest.

Every file of the new index is written into a staging directory inside INDEX_DIR and moved
into place only once all of them are complete, the manifest last; a failure or interrupt at
any point removes the staging directory and leaves a previous index in INDEX_DIR untouched.
"""

from __future__ import annotations

import datetime as dt
import errno
import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from retrieval import faiss_index
from retrieval.encoders import DEFAULT_MODEL, Encoder, load_encoder
from retrieval.errors import ClipSearchError, IndexDirError, InvalidArgumentError, PhotosDirError
from retrieval.images import DEFAULT_MAX_PIXELS, IMAGE_EXTENSIONS
from retrieval.layout import (
    EMBEDDINGS_FILE,
    FAISS_FILE,
    GENERATION_PREFIX,
    SKIPPED_FILE,
    STAGING_PREFIX,
    Manifest,
    generation_dir,
    is_index_dir,
    publish_generation,
    read_manifest,
    write_manifest,
)
from retrieval.version import __version__

from .dataset import Batch, ImageDataset, Item, collate
from .discover import Discovery, discover, from_list
from .writer import EmbeddingWriter, FileRecord, SkipRecord, write_skipped


# Errors of the index directory itself (not of an image): reported as one line, not a traceback.
_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST})


def default_workers(device_type: str = "cpu") -> int:
    """Decode workers: leave one core to the model on CPU; more on GPU, which waits on decode."""
    cores = os.cpu_count() or 1
    if device_type == "cuda":
        return max(1, min(16, cores - 1))
    return max(1, min(4, cores - 1))


@dataclass(frozen=True)
class BuildConfig:
    """Settings of one build.

    Attributes:
        model: hub id or local checkpoint directory.
        batch_size: images per model call.
        workers: decode worker processes; None picks from the core count, 0 decodes in-process.
        device: ``auto``, ``cpu`` or ``cuda[:N]``.
        max_pixels: larger images are skipped as decompression bombs.
        draft: decode JPEGs at a reduced DCT scale when the model needs fewer pixels.
        progress: show a progress bar on stderr.
    """

    model: str = DEFAULT_MODEL
    batch_size: int = 64
    workers: int | None = None
    device: str = "auto"
    max_pixels: int = DEFAULT_MAX_PIXELS
    draft: bool = True
    progress: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise InvalidArgumentError(f"batch size must be an integer >= 1, got {self.batch_size!r}")
        if self.workers is not None and (not isinstance(self.workers, int) or self.workers < 0):
            raise InvalidArgumentError(f"workers must be an integer >= 0, got {self.workers!r}")
        if self.max_pixels < 1:
            raise InvalidArgumentError(f"max_pixels must be >= 1, got {self.max_pixels}")


@dataclass(frozen=True)
class BuildReport:
    """What a build did; ``to_dict`` is what ``clipsearch index --json`` prints."""

    index_dir: str
    model: str
    dim: int
    indexed: int
    skipped: int
    seconds: float
    images_per_second: float
    decode_seconds: float
    encode_seconds: float
    write_seconds: float
    workers: int
    batch_size: int
    device: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check_photos_dir(photos_dir: Path) -> None:
    if not photos_dir.exists():
        raise PhotosDirError(f"photos directory {photos_dir} does not exist")
    if not photos_dir.is_dir():
        raise PhotosDirError(f"{photos_dir} is not a directory")


def _check_index_dir(index_dir: Path) -> None:
    if not index_dir.exists():
        return
    if not index_dir.is_dir():
        raise IndexDirError(f"{index_dir} exists and is not a directory; choose a new INDEX_DIR")
    if is_index_dir(index_dir):
        read_manifest(index_dir)  # refuses an index newer than we can write over safely
        return
    if any(index_dir.iterdir()):
        raise IndexDirError(
            f"{index_dir} exists, is not empty and is not a clipsearch index; refusing to write into it. "
            "Choose a new or empty INDEX_DIR"
        )


def build_index(
    photos_dir: str | os.PathLike[str],
    index_dir: str | os.PathLike[str],
    model: str = DEFAULT_MODEL,
    *,
    batch_size: int = 64,
    workers: int | None = None,
    device: str = "auto",
    progress: bool = False,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    encoder: Encoder | None = None,
    files: Sequence[str | bytes] | None = None,
) -> BuildReport:
    """Index every image under ``photos_dir`` into ``index_dir``.

    Args:
        photos_dir: the image collection (walked recursively).
        index_dir: where the index is written; a new or empty directory, or an existing
            index, which is replaced as a whole once the new one is complete.
        model: Hugging Face hub id or local checkpoint directory.
        batch_size: images per model call.
        workers: decode worker processes (None: chosen from the core count).
        device: ``auto``, ``cpu`` or ``cuda``.
        progress: show a tqdm bar on stderr.
        max_pixels: images above this many pixels are skipped as decompression bombs.
        encoder: an already-loaded encoder (then ``model`` and ``device`` are not used).
        files: index exactly these paths (relative to ``photos_dir``) instead of walking it;
            listed files that do not exist are recorded as skipped.

    Returns:
        A :class:`BuildReport` with counts and per-stage timings.

    Raises:
        PhotosDirError: ``photos_dir`` is missing, not a directory, or holds no images.
        IndexDirError: ``index_dir`` is a file or a non-empty directory that is not an index.
        ModelLoadError: the model cannot be loaded.
    """
    cfg = BuildConfig(
        model=model,
        batch_size=batch_size,
        workers=workers,
        device=device,
        max_pixels=max_pixels,
        progress=progress,
    )
    start = time.perf_counter()
    photos = Path(photos_dir)
    out = Path(index_dir)
    _check_photos_dir(photos)
    _check_index_dir(out)
    if files is None:
        found = discover(photos)
        if not found.files:
            exts = ", ".join(sorted(IMAGE_EXTENSIONS))
            raise PhotosDirError(f"no images found in {photos} (looked for {exts})")
    else:
        found = from_list(photos, files)
        if not found.files:
            raise PhotosDirError(f"none of the {len(found.missing)} listed files exist in {photos}")

    enc = encoder if encoder is not None else load_encoder(cfg.model, device=cfg.device)
    fingerprint = enc.fingerprint  # fails on missing weights before anything is written
    device_type = getattr(getattr(enc, "device", None), "type", "cpu")
    n_workers = cfg.workers if cfg.workers is not None else default_workers(device_type)

    created_dir = not out.exists()
    generation = uuid.uuid4().hex
    staging = out / f"{STAGING_PREFIX}{generation}"
    try:
        out.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
        report = _run(cfg, enc, photos, out, staging, found, generation, fingerprint, n_workers, start)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        _remove_unpublished(out, generation)
        if created_dir:
            shutil.rmtree(out, ignore_errors=True)
        if isinstance(exc, OSError) and exc.errno in _WRITE_ERRNOS:
            raise IndexDirError(
                f"cannot write the index to {out}: {exc.strerror}; the previous index, if any, is unchanged"
            ) from exc
        raise
    shutil.rmtree(staging, ignore_errors=True)
    return report


def _file_facts(item: Item) -> tuple[int | None, int | None, str | None]:
    # A file that could not even be read has no facts to compare against later.
    if item.size < 0:
        return None, None, None
    return item.size, item.mtime_ns, item.content_hash


def _remove_unpublished(out: Path, generation: str) -> None:
    # A generation renamed into place whose manifest was never written is garbage.
    try:
        current = read_manifest(out).generation
    except ClipSearchError:
        current = None
    if current != generation:
        shutil.rmtree(out / generation_dir(generation), ignore_errors=True)


def _remove_superseded(out: Path, keep: str) -> None:
    # Readers that opened an old generation keep their open file handles; new readers
    # follow the manifest, which no longer names it.
    for path in out.iterdir():
        if path.is_dir() and path.name.startswith(GENERATION_PREFIX) and path.name != GENERATION_PREFIX + keep:
            shutil.rmtree(path, ignore_errors=True)


def _run(
    cfg: BuildConfig,
    enc: Encoder,
    photos: Path,
    out: Path,
    staging: Path,
    found: Discovery,
    generation: str,
    fingerprint: str,
    n_workers: int,
    start: float,
) -> BuildReport:
    from torch.utils.data import DataLoader
    from tqdm import tqdm

    files = found.files
    dataset = ImageDataset(photos, files, enc.preprocess, max_pixels=cfg.max_pixels)
    device_type = getattr(getattr(enc, "device", None), "type", "cpu")
    loader = DataLoader(
        dataset,
        batch_size=cfg.batch_size,
        shuffle=False,
        num_workers=n_workers,
        collate_fn=collate,
        pin_memory=device_type == "cuda",
        prefetch_factor=4 if n_workers > 0 else None,
    )
    writer = EmbeddingWriter(staging / EMBEDDINGS_FILE, enc.dim, generation)
    vectors: list[np.ndarray] = []
    skipped = [SkipRecord(rel, f"directory not readable: {why}") for rel, why in found.unreadable_dirs]
    skipped.extend(SkipRecord(rel, why) for rel, why in found.missing)
    decode_s = encode_s = write_s = 0.0
    bar = tqdm(total=len(files), unit="img", desc="indexing", disable=not cfg.progress, dynamic_ncols=True)
    try:
        batch: Batch
        for batch in loader:
            decode_s += batch.decode_seconds
            skipped.extend(SkipRecord(files[it.index].rel, it.error or "", *_file_facts(it)) for it in batch.failed)
            if batch.pixels is not None:
                t0 = time.perf_counter()
                emb = enc.embed_pixels(batch.pixels)
                t1 = time.perf_counter()
                records = [
                    FileRecord(files[it.index].rel, it.width, it.height, it.size, it.mtime_ns, it.content_hash)
                    for it in batch.good
                ]
                writer.add(records, emb)
                vectors.append(emb)
                write_s += time.perf_counter() - t1
                encode_s += t1 - t0
            bar.update(len(batch.items))
            bar.set_postfix(skipped=len(skipped), refresh=False)
    finally:
        bar.close()
    t0 = time.perf_counter()
    count = writer.close()
    all_vectors = np.concatenate(vectors) if vectors else np.empty((0, enc.dim), np.float32)
    index = faiss_index.build(all_vectors, faiss_index.DEFAULT_INDEX_TYPE)
    faiss_index.write(index, staging / FAISS_FILE)
    write_skipped(staging / SKIPPED_FILE, skipped, generation)
    manifest = Manifest(
        model=enc.name,
        model_fingerprint=fingerprint,
        backend=enc.backend,
        dim=enc.dim,
        count=count,
        skipped=len(skipped),
        preprocess={**enc.preprocess.to_dict(), "jpeg_draft": cfg.draft},
        index_type=faiss_index.DEFAULT_INDEX_TYPE,
        generation=generation,
        source_root=str(photos.resolve()),
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        tool_version=__version__,
    )
    # Data files first, manifest last: a reader never sees a manifest naming missing files.
    publish_generation(out, staging, generation)
    write_manifest(out, manifest)
    _remove_superseded(out, keep=generation)
    write_s += time.perf_counter() - t0
    seconds = time.perf_counter() - start
    return BuildReport(
        index_dir=str(out),
        model=enc.name,
        dim=enc.dim,
        indexed=count,
        skipped=len(skipped),
        seconds=round(seconds, 3),
        images_per_second=round(count / seconds, 2) if seconds > 0 else 0.0,
        decode_seconds=round(decode_s, 3),
        encode_seconds=round(encode_s, 3),
        write_seconds=round(write_s, 3),
        workers=n_workers,
        batch_size=cfg.batch_size,
        device=str(getattr(enc, "device", "cpu")),
    )


__all__ = ["BuildConfig", "BuildReport", "build_index", "default_workers"]
