"""``reindex``: rebuild only the FAISS index of an index directory from its stored embeddings (:mod:`clipsearch.cli.reindex`).

No image is read and no model is loaded: the vectors come from the Parquet parts (streamed in
chunks). The new FAISS file is published as a new generation (parts hard-linked), so readers
keep answering from the old one until the manifest switches.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from indexer.index_types import parse_memory
from retrieval import store
from retrieval.errors import IndexFormatError
from retrieval.generation import mapping_of
from retrieval.layout import Manifest, read_manifest

from . import ann
from .build_config import BuildConfig
from .commit import GenerationWriter, IndexMeta
from .lock import IndexLock
from .new_generation import remove_stale
from .sides.registry import settings as side_settings
from .sides.registry import side_writers


@dataclass(frozen=True)
class ReindexReport:
    """What ``clipsearch reindex --json`` prints; ``faiss_mmap`` and ``faiss_mmap_reason``: how
    readers will open the new FAISS file by its plan (:mod:`retrieval.faiss_mapping`)."""

    index_dir: str
    count: int
    index_type: str
    index_options: dict[str, Any]
    search_params: dict[str, int]
    index_tuning: dict[str, Any]
    faiss_bytes: int
    seconds: float
    faiss_mmap: bool = False
    faiss_mmap_reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def recorded_meta(base: Manifest, **changes: Any) -> IndexMeta:
    """What the next generation of an index repeats when no build runs (``reindex``, ``people
    recluster``): the manifest ``base``'s, the side stages' recorded settings included (without
    them the commit would drop the keyword side's OCR flag and the faces side), with ``changes``."""
    meta = IndexMeta(
        model=base.model, model_fingerprint=base.model_fingerprint, backend=base.backend, dim=base.dim,
        preprocess=dict(base.preprocess), source_root=base.source_root, model_info=dict(base.model_info),
        index_options=dict(base.index_options), discovery=dict(base.discovery),
        sides=side_settings(BuildConfig(), base),
    )
    return dataclasses.replace(meta, **changes)


def reindex(
    index_dir: str | os.PathLike[str],
    *,
    index_type: str | None = None,
    max_memory: int | str | None = None,
    target_recall: float | None = None,
    progress: bool = False,
) -> ReindexReport:
    """Replace the FAISS index of ``index_dir`` with one built from the stored embeddings.

    Options left as None keep what the index recorded.

    Raises:
        NotAnIndexError, IndexFormatError, UnsupportedFormatError: no readable index there,
            or its build was interrupted (finish it with ``clipsearch index`` first).
        IndexLockedError: another process is writing the index.
        InvalidArgumentError: bad options, or nothing fits in ``max_memory``.
    """
    start = time.perf_counter()
    out = Path(index_dir)
    read_manifest(out)  # a clear error before taking the lock
    memory = parse_memory(max_memory) if max_memory is not None else None  # a bad size fails before the lock
    with IndexLock(out):
        base = read_manifest(out)
        if not base.complete:
            raise IndexFormatError(
                f"{out} holds an interrupted build; finish it first by running the same `clipsearch index` command again"
            )
        # Every file but the FAISS file, which this replaces (repairing it is one use of reindex).
        store.check_files(out, base, faiss=False)
        options = ann.choose_options(base, index_type=index_type, max_memory=memory, target_recall=target_recall)
        ann.check_options(options, base.dim, base.count)
        remove_stale(out, keep=base.generation)
        writer = GenerationWriter(out, recorded_meta(base, index_options=options.to_dict()), base, side_writers)
        writer.record_skips(store.read_skipped(out / base.skipped_file))
        writer.drop_faiss(options.to_dict())
        say = (lambda msg: print(f"clipsearch: {msg}", file=sys.stderr, flush=True)) if progress else None
        manifest = writer.finish(progress=say)
    faiss_path = out / manifest.faiss.path if manifest.faiss is not None else None
    mapping = mapping_of(out, manifest)
    return ReindexReport(
        index_dir=str(out),
        count=manifest.count,
        index_type=manifest.index_type,
        index_options=dict(manifest.index_options),
        search_params=dict(manifest.search_params),
        index_tuning=dict(manifest.index_tuning),
        faiss_bytes=faiss_path.stat().st_size if faiss_path is not None else 0,
        seconds=round(time.perf_counter() - start, 3),
        faiss_mmap=mapping.mmap,
        faiss_mmap_reason=mapping.reason,
    )


__all__ = ["ReindexReport", "recorded_meta", "reindex"]
