"""``import_embeddings``: an index from image embeddings computed elsewhere ("bring your own").

SOURCE is a clip-retrieval inference output folder or Parquet (the layouts, and how they are
read and checked: :mod:`indexer.import_sources`). Nothing is written before the whole source has
passed both checking passes (headers, then values). Then a third pass normalises each batch (L2,
float32) and appends it to a :class:`~indexer.commit.GenerationWriter` with ids 0..n-1 in source
order, committing a generation every ``commit_every`` rows; ``finish`` builds FAISS from the
stored parts, with the options ``clipsearch index`` takes. Memory holds one batch and one
commit's rows, whatever the source's size: vectors are never concatenated beyond a commit.

The rows have no image files: width and height 0, size -1, mtime 0 and an empty content hash;
``source_root`` is ``""`` (so ``serve`` refuses to serve originals and thumbnails by id); the
manifest's ``model_info`` records ``imported_from`` (the layout) and ``imported_source``.
``clipsearch index`` refuses to update such an index (see :mod:`indexer.index_dir`).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from indexer.index_types import IndexOptions
from retrieval.checks import is_positive_int
from retrieval.encoders import load_encoder
from retrieval.errors import ImportSourceError, InvalidArgumentError
from retrieval.layout import MANIFEST_FILE, is_index_dir
from retrieval.shards import parse_storage_options

from . import ann
from .commit import GenerationWriter, IndexMeta
from .import_remote import is_remote, staged
from .import_sources import LAYOUTS, Source, check_values, inspect_source, read_batches, unit_vectors
from .index_dir import check_index_dir, write_error
from .lock import IndexLock
from .new_generation import remove_stale
from .sides.registry import side_writers
from .writer import FileRecord

# Rows per committed generation: one commit's vectors (and records) are what the writer holds.
DEFAULT_COMMIT_EVERY = 65_536


@dataclass(frozen=True)
class ImportReport:
    """What an import did; ``to_dict`` is what ``clipsearch import --json`` prints.

    ``index_type`` is the option the FAISS index was chosen with (``auto``, ``hnsw``, ...),
    ``factory`` the FAISS factory string it built; ``check_seconds`` is the validation passes'
    share of ``seconds``.
    """

    index_dir: str
    source: str
    source_format: str
    model: str
    dim: int
    imported: int
    commits: int
    index_type: str
    factory: str
    search_params: dict[str, int]
    seconds: float
    check_seconds: float
    rows_per_second: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def import_embeddings(
    source: str | os.PathLike[str],
    index_dir: str | os.PathLike[str],
    *,
    model: str,
    index_type: str | None = None,
    max_memory: int | str | None = None,
    target_recall: float | None = None,
    progress: bool = False,
    commit_every: int = DEFAULT_COMMIT_EVERY,
    storage_options: str | Mapping[str, Any] | None = None,
) -> ImportReport:
    """Write a new index at ``index_dir`` from the embeddings in ``source``.

    Args:
        source: a clip-retrieval inference output folder, a Parquet file or a folder of them
            (see :mod:`indexer.import_sources`).
        index_dir: a new or empty directory (or an import that was killed, which starts over).
        model: the model the vectors came from (hub id, checkpoint directory, ``open_clip:``
            name); text and image queries are embedded with it. Its weights are not loaded.
        index_type, max_memory, target_recall: the FAISS index choice, as ``clipsearch index``
            takes it (None: the defaults).
        progress: progress bars and FAISS steps on stderr.
        commit_every: rows per committed generation (memory holds one commit's rows).
        storage_options: fsspec options (a JSON object or a mapping) for a ``source`` that is a
            URL (``s3://bucket/clip-output/``), copied beside ``index_dir`` while it is imported
            (:mod:`indexer.import_remote`).

    Returns:
        An :class:`ImportReport`.

    Raises:
        ImportSourceError: SOURCE is missing or of neither layout, a column is missing or of the
            wrong type, row counts or dimensions disagree, or a row holds NaN/inf, a zero vector,
            a missing or repeated path; the message names the file and row. Nothing is written.
        IndexDirError: ``index_dir`` is a file, holds an index, is not empty, or cannot be written.
        IndexLockedError: another process is writing ``index_dir``.
        ModelLoadError: the model cannot be found.
        InvalidArgumentError: a bad index option or ``commit_every``.
    """
    start = time.perf_counter()
    if not is_positive_int(commit_every):
        raise InvalidArgumentError(f"commit_every must be an integer >= 1, got {commit_every!r}")
    options = ann.choose_options(None, index_type=index_type, max_memory=max_memory, target_recall=target_recall)
    text = os.fspath(source)
    if is_remote(text):
        check_index_dir(Path(index_dir), "import")  # before anything is copied
        with staged(text, Path(index_dir).absolute(), parse_storage_options(storage_options)) as local:
            return _import(local, text, Path(index_dir), model, options, progress, commit_every, start)
    return _import(Path(source), None, Path(index_dir), model, options, progress, commit_every, start)


def _import(src: Path, url: str | None, out: Path, model: str, options: IndexOptions, progress: bool, commit_every: int,
            start: float) -> ImportReport:
    # ``url``: where a staged copy (``src``) came from, recorded as the source instead of the copy.
    if not src.exists():
        raise ImportSourceError(src, f"no such file or directory; {LAYOUTS}")
    check_index_dir(out, "import")
    enc = load_encoder(model, device="cpu", precision="fp32")
    fingerprint = enc.fingerprint  # a missing checkpoint fails here, before the source is read
    found = inspect_source(src, enc.dim, enc.name)
    ann.check_options(options, enc.dim, found.rows)
    check_values(found, enc.dim, progress=progress)
    check_seconds = time.perf_counter() - start
    meta = IndexMeta(
        model=enc.name,
        model_fingerprint=fingerprint,
        backend=enc.backend,
        dim=enc.dim,
        preprocess=enc.preprocess.to_dict(),
        # No folder of originals: ImageIndex.source_file (and serve) refuse every id.
        source_root="",
        model_info={**enc.info, "imported_from": found.format, "imported_source": url or str(src.resolve())},
        index_options=options.to_dict(),
    )
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        with IndexLock(out):
            check_index_dir(out, "import")  # again, now that no other writer can change it
            if is_index_dir(out):
                (out / MANIFEST_FILE).unlink()  # an interrupted import: started over
            remove_stale(out, keep=None)
            writer = GenerationWriter(out, meta, None, side_writers)
            _write(found, enc.dim, writer, commit_every, progress)
            say = (lambda msg: print(f"clipsearch: {msg}", file=sys.stderr, flush=True)) if progress else None
            manifest = writer.finish(progress=say)
    except BaseException as exc:
        if created:
            # An import cannot be resumed: a half-written INDEX_DIR would only be in the way.
            shutil.rmtree(out, ignore_errors=True)
        error = write_error(exc, out)
        if error is not None:
            raise error from exc
        raise
    seconds = time.perf_counter() - start
    return ImportReport(
        index_dir=str(out),
        source=url or str(src),
        source_format=found.format,
        model=enc.name,
        dim=enc.dim,
        imported=manifest.count,
        commits=writer.commits,
        index_type=options.index_type,
        factory=manifest.index_type,
        search_params=dict(manifest.search_params),
        seconds=round(seconds, 3),
        check_seconds=round(check_seconds, 3),
        rows_per_second=round(manifest.count / seconds, 1) if seconds > 0 else 0.0,
    )


# -- pass 3: writing -------------------------------------------------------------------------


def _write(source: Source, dim: int, writer: GenerationWriter, commit_every: int, progress: bool) -> None:
    from tqdm import tqdm

    with tqdm(total=source.rows, unit="vec", desc="importing", disable=not progress, dynamic_ncols=True) as bar:
        for batch in read_batches(source, dim):
            assert batch.vectors is not None
            unit = unit_vectors(batch.vectors, batch.shard.vectors, batch.first)
            paths = batch.paths.to_pylist()
            # No file behind a row: no size, mtime or hash to record (see the module docstring).
            writer.append([FileRecord(p.encode("utf-8"), 0, 0, -1, 0, "") for p in paths], unit)
            if writer.pending >= commit_every:
                writer.commit(complete=False)
            bar.update(len(paths))


__all__ = ["DEFAULT_COMMIT_EVERY", "ImportReport", "import_embeddings"]
