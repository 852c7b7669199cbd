"""``index --ocr`` on an index embedded without it: read the text of its images, keep their vectors.

Turning OCR on for a library that is already indexed must not cost embedding it again: OCR is
only text. :func:`read_missing_text` reads the text of every row not marked ``ocr_read``
through the decode path an ``--ocr`` embedding uses (:class:`~indexer.dataset.ImageDataset`
with ``ocr=True``, on the decode threads of this process), so the text is what embedding with
``--ocr`` would have stored, and rewrites those rows' parts with ``ocr_text`` and ``ocr_read``
set. Ids, vectors (byte for byte) and every other column stay: the FAISS file is kept, and the
next commit rebuilds the keyword side from the rows (:mod:`indexer.keywords`).

Crash safety and resume: the rewritten parts are files in a staging-named folder that the next
commit links into its generation, like any chunk commit (every ``commit_every`` images or
``commit_seconds``); a crash leaves the last generation, and the next writer removes the
folder. Until every row is read the generations record ``keywords.ocr`` False (the writer's
keyword side is ``pending``, :mod:`indexer.sides.keyword_stage`), and each row read carries
``ocr_read`` True: running the command again reads only the rows still unmarked. A part larger
than a commit is first split into pieces of at most ``commit_every`` rows (one copy), so that
each commit rewrites only the pieces it read.

With ``--engine ray`` the text is read here, on the driver, which reads the photos (or shards)
as it does to plan the update.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from retrieval import store
from retrieval.images import PreprocessConfig
from retrieval.layout import EMBEDDINGS_DIR, STAGING_PREFIX, PartRef, embeddings_schema, part_name
from retrieval.shards import SampleMeta

from .build_config import BuildConfig, default_threads
from .chunk_commits import ChunkCommits
from .commit import GenerationWriter
from .dataset import OCR_FAILED_NOTE, ImageDataset
from .discover import ImageFile
from .keywords import NAME, KeywordWriter
from .parts import write_part
from .shard_reader import ShardReader
from .writer import conform

# Images decoded and read per call on the decode threads (the progress bar moves between calls).
_BATCH = 32


@dataclass
class TextStats:
    """What reading the text of images already indexed did
    (:func:`indexer.backfill.read_missing_text`): images whose text was read (``read``), those
    with text found (``with_text``), those OCR or the file system could not read (``notes``,
    indexed without text)."""

    read: int = 0
    with_text: int = 0
    notes: int = 0


class _Scratch:
    """Parts written outside any generation, named so that ``remove_stale`` clears a crash's."""

    def __init__(self, index_dir: Path, dim: int) -> None:
        self.dir = index_dir
        self.dim = dim
        self.name = f"{STAGING_PREFIX}text-{uuid.uuid4().hex}"
        self.written = 0

    def write(self, first_id: int, tables: Iterable[pa.Table]) -> tuple[PartRef, Path]:
        rel = f"{self.name}/{EMBEDDINGS_DIR}/{part_name(self.written)}"
        self.written += 1
        path = self.dir / rel
        # Made again after each commit, whose remove_stale takes the folder once it is linked.
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_part(path, rel, self.dim, first_id, list(tables)), path


def unread_rows(path: Path) -> np.ndarray:
    """Which rows of the part at ``path`` OCR has not looked at (``ocr_read`` not True)."""
    pf = store.open_parquet(path)
    rows = pf.metadata.num_rows
    if "ocr_read" not in pf.schema_arrow.names:
        return np.ones(rows, dtype=bool)
    marked = store.read_column([pf], "ocr_read").fill_null(False).to_numpy()
    return ~marked.astype(bool)


def read_missing_text(
    cfg: BuildConfig,
    preprocess: PreprocessConfig,
    images: Path | ShardReader,
    writer: GenerationWriter,
    *,
    recorded: bool,
    stop: Callable[[], bool] | None = None,
) -> TextStats:
    """Read the text of the rows embedded without OCR, when this run recognises text.

    Call it after :meth:`~indexer.commit.GenerationWriter.compact` (deleted files are gone
    then) and before new rows are appended.

    Args:
        cfg: the run's settings (``commit_every``, ``commit_seconds``, ``threads``, decoding).
        preprocess: the model's preprocessing (the decode path's; its pixels are not used).
        images: the photos folder or the shard reader the rows' paths are relative to.
        writer: the writer over the index; its ``meta.sides["keywords"]`` says whether the run reads text.
        recorded: the index records that OCR read every row already (nothing to do).
        stop: asked between parts (watch mode's Ctrl-C); the rest is read by a later run.

    Returns:
        The counts; the writer's keyword side is no longer ``pending`` when every row has been read.
    """
    stats = TextStats()
    side = writer.side(NAME, KeywordWriter)
    if not writer.meta.sides.get(NAME) or recorded or not writer.count:
        return stats
    side.pending = True
    if writer.tail_pending:
        # Rows kept by compact() wait in memory as a table: published first, as a part like the rest.
        writer.commit(complete=False)
    total = int(sum(unread_rows(path).sum() for _, path in writer.parts))
    if total and cfg.progress:
        print(f"clipsearch: reading the text of {total} images embedded without --ocr (their vectors are kept)",
              file=sys.stderr, flush=True)
    chunk = min(cfg.commit_every, 16_384)
    scratch = _Scratch(writer.dir, writer.meta.dim)
    threads = cfg.threads or default_threads("cpu")
    commits = ChunkCommits(cfg, writer)
    from tqdm import tqdm

    bar = tqdm(total=total, unit="img", desc="reading text", disable=not cfg.progress or not total, dynamic_ncols=True)
    try:
        i = 0
        while i < len(writer.parts) and stats.read < total:
            ref, path = writer.parts[i]
            unread = unread_rows(path)
            if not unread.any():
                i += 1
                continue
            if ref.rows > chunk:
                # Split once, then each piece is read and committed on its own.
                writer.replace_parts(i, i + 1, _split(scratch, ref, path, chunk))
                continue
            if stop is not None and stop():
                return stats
            table = _with_text(_read_part(path), unread, images, preprocess, cfg, threads, stats, bar)
            writer.replace_parts(i, i + 1, [scratch.write(ref.first_id, [table])])
            i += 1
            if stats.read < total:  # the last chunk is the build's own final commit
                commits.after(int(unread.sum()))
    finally:
        bar.close()
    side.pending = False
    return stats


def _read_part(path: Path) -> pa.Table:
    pf = store.open_parquet(path)
    with store.reading(pf):
        return pf.read()


def _split(scratch: _Scratch, ref: PartRef, path: Path, rows: int) -> list[tuple[PartRef, Path]]:
    pieces: list[tuple[PartRef, Path]] = []
    first = ref.first_id
    pf = store.open_parquet(path)
    with store.reading(pf):
        for batch in pf.iter_batches(batch_size=rows):
            pieces.append(scratch.write(first, [pa.Table.from_batches([batch])]))
            first += batch.num_rows
    return pieces


def _image_files(table: pa.Table, rows: np.ndarray) -> list[ImageFile]:
    """The files of ``rows`` as the decoders take them (a shard member's with where it is)."""
    picked = table.take(pa.array(rows, pa.int64()))
    cols = {name: picked.column(name).to_pylist() for name in ("path_bytes", "size", "mtime_ns", "shard", "key", "member_offset")}
    files = []
    for j in range(len(rows)):
        sample = None
        if cols["shard"][j] is not None:
            sample = SampleMeta(cols["shard"][j], cols["key"][j] or "", int(cols["member_offset"][j] or 0))
        files.append(ImageFile(cols["path_bytes"][j], int(cols["size"][j]), int(cols["mtime_ns"][j]), sample))
    return files


def _with_text(
    table: pa.Table, unread: np.ndarray, images: Path | ShardReader, preprocess: PreprocessConfig, cfg: BuildConfig,
    threads: int, stats: TextStats, bar: Any,
) -> pa.Table:
    """``table`` (one part's rows) with ``ocr_text`` and ``ocr_read`` set for its ``unread`` rows."""
    # A part written before the text columns gains them (as nulls) here; its other columns stay.
    table = conform(table, embeddings_schema(int(table.schema.field("embedding").type.list_size)))
    rows = np.flatnonzero(unread)
    texts = table.column("ocr_text").to_pylist()
    marked = table.column("ocr_read").to_pylist()
    # Only the text is read here: the model's pixels are thrown away, so they are decoded the cheap
    # way (the image OCR reads is the same in either mode: indexer.dataset, load_photo's keep_edge).
    dataset = ImageDataset(images, _image_files(table, rows), preprocess, max_pixels=cfg.max_pixels, draft=True,
                           threads=threads, ocr=True)
    try:
        for start in range(0, len(rows), _BATCH):
            for it in dataset.__getitems__(range(start, min(start + _BATCH, len(rows)))):
                j = int(rows[it.index])
                # Marked also when it fails: an image OCR cannot read is indexed without text
                # and counted, as when embedding; a file gone since the walk loses its row in
                # the next update, as any deleted file.
                marked[j] = True
                stats.read += 1
                # Other notes (malformed XMP) are about text this pass does not read again.
                if it.error is not None or OCR_FAILED_NOTE in (it.meta.note or ""):
                    stats.notes += 1
                    continue
                texts[j] = it.meta.ocr_text
                stats.with_text += it.meta.ocr_text is not None
            bar.update(min(_BATCH, len(rows) - start))
    finally:
        dataset.close()
    table = table.set_column(table.schema.get_field_index("ocr_text"), "ocr_text", pa.array(texts, pa.string()))
    return table.set_column(table.schema.get_field_index("ocr_read"), "ocr_read", pa.array(marked, pa.bool_()))


__all__ = ["read_missing_text", "unread_rows"]
