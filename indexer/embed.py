"""The embedding stage of a build: decode the planned files, run the image tower, append rows.

On CPU each batch is decoded in this process between model batches; on CUDA, DataLoader
workers read and hash JPEGs and a helper thread (:mod:`indexer.ahead`) decodes and resizes
them on the GPU while this thread runs the model. Files that fail become skip records.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retrieval.encoders import Encoder
from retrieval.faults import crash_point
from retrieval.layout import SkipRecord

from .ahead import Ahead
from .build_config import BuildConfig, default_threads, default_workers
from .chunk_commits import ChunkCommits
from .commit import GenerationWriter
from .dataset import Batch, ImageDataset, Item, collate, finish_on_device
from .discover import ImageFile
from .parts import WrittenPart
from .plan import UpdatePlan
from .shard_reader import ShardReader
from .sides.registry import count_embedded, decode_options
from .stats import RunStats
from .writer import FileRecord


def _file_facts(item: Item) -> tuple[int | None, int | None, str | None]:
    # A file that could not even be read has no facts to compare against later.
    if item.size < 0:
        return None, None, None
    return item.size, item.mtime_ns, item.content_hash


@dataclass
class EmbeddedBatch:
    """One batch as the writer takes it: every file's facts, and the vectors of the good ones."""

    items: list[Item]  # every file of the batch, in order, without pixels
    vectors: np.ndarray | None  # (n_good, dim), rows in the order of the items without an error
    decode_seconds: float
    encode_seconds: float
    # The good rows already written as a part of the run's stage (an engine that writes where it
    # embeds, such as Ray's actors): its name there.
    part: WrittenPart | None = None
    # The good rows are already linked into the writer as a part (vectors is then None).
    linked: bool = False

    @property
    def good(self) -> list[Item]:
        return [it for it in self.items if it.error is None]


def file_record(file: ImageFile, item: Item) -> FileRecord:
    """The row a decoded ``item`` of ``file`` becomes (its facts as read when it was decoded)."""
    return FileRecord(file.rel, item.width, item.height, item.size, item.mtime_ns, item.content_hash, item.meta, file.sample)


def write_batches(cfg: BuildConfig, plan: UpdatePlan, writer: GenerationWriter, batches: Iterable[EmbeddedBatch],
                  stats: RunStats) -> None:
    """Append embedded batches (in the order of ``plan.to_embed``) to ``writer``: rows for the
    good files, skip records for the rest, a generation committed every ``cfg.commit_every``
    images or ``cfg.commit_seconds``. Every engine ends here, so their indexes are alike."""
    from tqdm import tqdm

    files = plan.to_embed
    commits = ChunkCommits(cfg, writer)
    bar = tqdm(total=len(files), unit="img", desc="indexing", disable=not cfg.progress, dynamic_ncols=True)
    try:
        for batch in batches:
            stats.decode_seconds += batch.decode_seconds
            stats.encode_seconds += batch.encode_seconds
            for it in batch.items:
                if it.error is None:
                    continue
                rel = files[it.index].rel
                writer.record_skips([SkipRecord(rel, it.error, *_file_facts(it))])
                stats.newly_skipped += 1
                # A changed file that no longer decodes loses its row.
                stats.lost += rel in plan.updated_paths
            good = batch.good
            if good and (batch.vectors is not None or batch.linked):
                records = [file_record(files[it.index], it) for it in good]
                if batch.vectors is not None:
                    writer.append(records, batch.vectors)
                stats.count_sides(count_embedded(good))
                updated = sum(rec.path in plan.updated_paths for rec in records)
                stats.updated += updated
                stats.added += len(records) - updated
            bar.update(len(batch.items))
            bar.set_postfix(skipped=stats.newly_skipped, refresh=False)
            stats.write_seconds += commits.after(len(batch.items))
    finally:
        bar.close()


def embed_planned(cfg: BuildConfig, enc: Encoder, photos: Path | ShardReader, plan: UpdatePlan, writer: GenerationWriter,
                  stop: Callable[[], bool] | None = None, *, draft: bool = False) -> RunStats:
    """Decode and embed ``plan.to_embed`` into ``writer``, committing a generation every
    ``cfg.commit_every`` images or ``cfg.commit_seconds``; returns the run's counters and timings.
    ``stop`` (watch mode's Ctrl-C) is asked before each batch: when True the rest is left.
    ``draft``: decode JPEGs in draft mode (the run's resolved ``decode``, :mod:`indexer.calibrate`)."""
    import torch
    from torch.utils.data import DataLoader

    device_type = enc.device.type
    stats = RunStats.start(cfg, device_type)
    files = plan.to_embed
    if not files:
        return stats
    n_workers = cfg.workers if cfg.workers is not None else default_workers(device_type)
    stats.workers = n_workers
    stats.threads = cfg.threads if cfg.threads is not None else default_threads(device_type, n_workers)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(stats.threads)
    # On CUDA, workers only read and hash JPEGs; they are decoded and preprocessed on the GPU.
    on_gpu = decodes_on_device(device_type)
    # In-process decoding runs between batches, on as many threads as the model (see default_workers).
    dataset = ImageDataset(photos, files, enc.preprocess, max_pixels=cfg.max_pixels, draft=draft,
                           device_decode=on_gpu, threads=stats.threads if n_workers == 0 else 1,
                           **decode_options(writer.meta.sides))
    # ImageDataset is map-style without torch's Dataset base class (indexer.dataset does not
    # import torch), which DataLoader accepts at run time but its stubs do not.
    loader: DataLoader[Item] = DataLoader(
        dataset,  # type: ignore[arg-type]  # duck-typed map-style dataset, see above
        batch_size=stats.batch_size,
        shuffle=False,
        num_workers=n_workers,
        collate_fn=collate,
        pin_memory=device_type == "cuda",
        prefetch_factor=4 if n_workers > 0 else None,
    )
    batches: Iterable[Batch] = loader
    if on_gpu:
        # The next batches are received, decoded and resized in a helper thread while this
        # one runs the model and writes (see indexer/ahead.py).
        def finish(batch: Batch) -> Batch:
            return finish_on_device(batch, enc.preprocess, enc.device, max_pixels=cfg.max_pixels, draft=draft)

        batches = Ahead(loader, finish, depth=2, name="clipsearch-device-decode")
    try:
        write_batches(cfg, plan, writer, (embed_batch(enc, batch) for batch in _until(stop, batches)), stats)
    finally:
        if isinstance(batches, Ahead):
            batches.close()
        dataset.close()
        torch.set_num_threads(threads_before)
    return stats


def _until(stop: Callable[[], bool] | None, batches: Iterable[Batch]) -> Iterator[Batch]:
    for batch in batches:
        if stop is not None and stop():
            return
        yield batch


def embed_batch(enc: Encoder, batch: Batch) -> EmbeddedBatch:
    """Run the image tower on a decoded batch (the ``embed`` fault point is just before it)."""
    if batch.pixels is None:
        return EmbeddedBatch(batch.items, None, batch.decode_seconds, 0.0)
    crash_point("embed")
    t0 = time.perf_counter()
    vectors = enc.embed_pixels(batch.pixels)
    return EmbeddedBatch(batch.items, vectors, batch.decode_seconds, time.perf_counter() - t0)


def decodes_on_device(device_type: str) -> bool:
    """Whether JPEGs are decoded and preprocessed on the model's device (CUDA: nvJPEG)."""
    return device_type == "cuda"


__all__ = ["EmbeddedBatch", "decodes_on_device", "embed_batch", "embed_planned", "write_batches"]
