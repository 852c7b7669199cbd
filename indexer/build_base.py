"""The index a build starts from, opened under the index lock by :mod:`indexer.build`.

The current generation read and checked against this run (its model, its files, the size its
images were embedded at), stale generations of a killed run removed, the FAISS options chosen
and checked, and the ``GenerationWriter`` opened over it with the run's ``IndexMeta``; over
nothing for a new index or a rebuild. What the build then does with the writer (plan, embed,
finish) is :mod:`indexer.build`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from indexer.index_types import IndexOptions
from retrieval import store
from retrieval.encoders import DEFAULT_MODEL, Encoder
from retrieval.errors import (
    IndexFormatError,
    InvalidArgumentError,
    ModelLoadError,
    ModelMismatchError,
    UnsupportedFormatError,
)
from retrieval.layout import Manifest, SkipRecord, is_index_dir, read_manifest

from . import ann, calibrate
from .build_config import BuildConfig
from .commit import GenerationWriter, IndexMeta
from .exclusions import WalkOptions
from .new_generation import remove_stale
from .sides import registry as sides


@dataclass(frozen=True)
class Base:
    """What the index being updated (if any) decides before the plan: the writer over it.

    ``previous``: its manifest (None for a new index or a rebuild); ``options_changed``: this
    run's FAISS options differ from its recorded ones (the writer then drops its FAISS file);
    ``old_skips``: its skip list.
    """

    previous: Manifest | None
    writer: GenerationWriter
    options_changed: bool
    old_skips: list[SkipRecord]


def with_model(cfg: BuildConfig, out: Path) -> BuildConfig:
    """``cfg`` with the model to embed with: the one it names, else the one the index at
    ``out`` records (its name carries the backend and any open_clip pretrained tag, as search
    takes it), else the default for a new index or one whose manifest cannot be read.

    Updating or rebuilding an index without ``--model`` keeps its model; the check against the
    index (:func:`open_base`) then applies only to a model named on purpose.

    Raises:
        UnsupportedFormatError: the index is newer than this code reads.
    """
    if cfg.model is not None:
        return cfg
    return cfg.replace(model=recorded_model(out) or DEFAULT_MODEL)


def recorded_model(out: Path) -> str | None:
    """The model the index at ``out`` records; None for a new directory or an unreadable manifest."""
    base = _readable_manifest(out)
    return base.model if base is not None else None


def model_load_error(exc: ModelLoadError, model: str, out: Path) -> ModelLoadError:
    """``exc``, or where ``model`` is the one the index at ``out`` records (by default or by
    name), an error that says so and how to go on: its checkpoint moved, or it is not cached
    offline."""
    if recorded_model(out) != model:
        return exc
    return ModelLoadError(
        f"{out} records the model {model}, which cannot be loaded: {exc}; pass --model naming where that "
        "model is now (or another model with --rebuild)"
    )


def open_base(cfg: BuildConfig, enc: Encoder, fingerprint: str, out: Path, *, files: int, source_root: str,
              walk: WalkOptions) -> Base:
    """Check the index to update against this run (model, files, index options) and open a
    writer over it, or over nothing for a new index or a rebuild.

    Args:
        cfg: the run's settings.
        enc: the run's encoder (its image size is set here to the one the index was embedded at).
        fingerprint: ``enc``'s weights fingerprint.
        out: INDEX_DIR, locked by the caller.
        files: how many files the run found (the FAISS options are checked for the larger of
            them and the index's rows).
        source_root, walk: what the new generations record of the source and its walk.

    Raises:
        ModelMismatchError: the index was built with another model and ``rebuild`` is False.
        InvalidArgumentError: an image size other than the index's without ``rebuild``; FAISS
            options FAISS rejects.
        UnsupportedFormatError: the index is newer than this code reads.
        IndexCorruptError: a file of the index missing or truncated (its repair named).
    """
    base = _readable_manifest(out)
    if base is not None and not cfg.rebuild:
        _check_model(base, enc, fingerprint, out)
    # Generations or staging left by a killed run are unreachable garbage now that we hold the lock.
    remove_stale(out, keep=base.generation if base is not None else None)
    previous = None if cfg.rebuild else base
    if previous is not None:
        # A missing or truncated file of the index fails here, naming it and the repair,
        # rather than somewhere in the update.
        store.check_files(out, previous)
    _apply_image_size(cfg, enc, previous, out)
    options = ann.choose_options(previous, index_type=cfg.index_type, max_memory=cfg.max_memory, target_recall=cfg.target_recall)
    # A factory string FAISS rejects fails here, before any image is embedded.
    ann.check_options(options, enc.dim, max(files, previous.count if previous is not None else 0))
    meta = _meta(cfg, enc, fingerprint, options, sides.settings(cfg, previous), previous, source_root=source_root, walk=walk)
    writer = GenerationWriter(out, meta, previous, sides.side_writers)
    options_changed = previous is not None and dict(previous.index_options) != options.to_dict()
    if options_changed:
        writer.drop_faiss(options.to_dict())
    old_skips = store.read_skipped(out / previous.skipped_file) if previous is not None else []
    return Base(previous, writer, options_changed, old_skips)


def preprocess_record(enc: Encoder, decode: calibrate.DecodeChoice) -> dict[str, Any]:
    """What a manifest records of how the images were preprocessed: ``enc``'s settings and the decoding."""
    return {**enc.preprocess.to_dict(), **decode.record()}


def _readable_manifest(out: Path) -> Manifest | None:
    # None for a new directory, or for a damaged index that --rebuild replaces (checked before).
    if not is_index_dir(out):
        return None
    try:
        return read_manifest(out)
    except UnsupportedFormatError:
        raise
    except IndexFormatError:
        return None


def _check_model(base: Manifest, enc: Encoder, fingerprint: str, out: Path) -> None:
    if base.backend == enc.backend and base.model_fingerprint == fingerprint and base.dim == enc.dim:
        return
    raise ModelMismatchError(
        f"{out} was built with {base.model} ({base.model_fingerprint[:19]}), but this run uses "
        f"{enc.name} ({fingerprint[:19]}); pass --rebuild to re-index everything with the new model"
    )


def _apply_image_size(cfg: BuildConfig, enc: Encoder, previous: Manifest | None, out: Path) -> None:
    """Embed at ``cfg.image_size``, else at the size the index was embedded at; an update
    must not mix two sizes in one index."""
    recorded = previous.model_info.get("embed_image_size") if previous is not None else None
    size = cfg.image_size if cfg.image_size is not None else recorded
    if previous is not None and cfg.image_size is not None:
        embedded_at = recorded if recorded is not None else previous.model_info.get("image_size")
        if embedded_at is not None and int(embedded_at) != cfg.image_size:
            raise InvalidArgumentError(
                f"{out} was embedded at {embedded_at} px; pass --rebuild to re-embed everything at {cfg.image_size} px"
            )
    if size is not None:
        enc.set_image_size(int(size))


def _recorded_decode(cfg: BuildConfig, previous: Manifest | None) -> calibrate.DecodeChoice:
    """The decoding the manifest says until the run decides its own (``indexer.build``'s
    embedding): the index's recorded one when this run asks for the same, else the request,
    not yet resolved."""
    recorded = previous.preprocess if previous is not None else None
    requested = calibrate.decode_request(cfg.decode, recorded)
    before = calibrate.DecodeChoice.from_record(recorded)
    if before is not None and before.requested == requested:
        return before
    if recorded is not None and before is None and requested != "auto":
        return calibrate.DecodeChoice(requested, bool(recorded.get("jpeg_draft", True)))
    return calibrate.DecodeChoice(requested, requested == "draft")


def _meta(cfg: BuildConfig, enc: Encoder, fingerprint: str, options: IndexOptions, side_settings: dict[str, Any],
          previous: Manifest | None, *, source_root: str, walk: WalkOptions) -> IndexMeta:
    return IndexMeta(
        model=enc.name,
        model_fingerprint=fingerprint,
        backend=enc.backend,
        dim=enc.dim,
        preprocess=preprocess_record(enc, _recorded_decode(cfg, previous)),
        source_root=source_root,
        model_info=dict(enc.info),
        index_options=options.to_dict(),
        discovery=walk.to_dict(),
        sides=side_settings,
    )


__all__ = ["Base", "model_load_error", "open_base", "preprocess_record", "recorded_model", "with_model"]
