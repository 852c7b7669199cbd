"""``build_index``: create or update an index, committing in chunks as it goes (``clipsearch index``: :mod:`clipsearch.cli.build`).

discover → plan (what is new, changed, gone) → decode (threads in this process on CPU,
DataLoader workers on GPU) → embed → append rows → commit a generation every ``commit_every``
images → finish with the FAISS index.

Running it again on the same INDEX_DIR updates the index in place: new files are embedded,
changed files re-embedded, deleted files removed, unchanged files neither read nor decoded. A
run that is killed leaves the last committed generation, which opens and searches; running the
same command again resumes from it without embedding any committed image twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from indexer.index_types import parse_memory
from retrieval.encoders import DEFAULT_MODEL, Encoder, cpu, load_encoder
from retrieval.errors import InvalidArgumentError, ModelLoadError, PhotosDirError, UnknownBuildOptionError
from retrieval.images import IMAGE_EXTENSIONS
from retrieval.layout import Manifest, SkipRecord, is_index_dir
from retrieval.shards import scheme_of

from . import calibrate, shards
from .build_base import model_load_error, open_base, preprocess_record, with_model
from .build_config import DEFAULT_PRECISION, BuildConfig, default_batch_size, default_threads, default_workers
from .build_report import BuildReport
from .chunk_commits import ChunkCommits
from .commit import GenerationWriter
from .dataset import content_hash
from .discover import Discovery, ImageFile, check_photos_dir, find_images
from .engine import Engine
from .engines import LOADS_ITS_OWN_MODEL, open_engine
from .exclusions import WalkOptions, load_exclusions, recorded_walk
from .heap import retained_heap
from .index_dir import check_index_dir, write_error
from .lock import IndexLock
from .plan import UpdatePlan, plan_update
from .shard_reader import ShardReader
from .shards import ShardSource, is_shard_spec
from .sides import registry as sides
from .sides.contract import SideRun, SideStats
from .stats import RunStats
from .video import video_rows
from .video.probe import VIDEO_EXTENSIONS


@dataclass(frozen=True)
class _Job:
    """One build's inputs and collaborators, settled before the index lock is taken.

    ``keep_precision``: no precision was asked for and the model is loaded here, so an update
    keeps the mode the index records. ``engine``: where the embedding runs, opened for this
    build (:mod:`indexer.engines`). ``stop``: see :func:`update_index`.
    """

    cfg: BuildConfig
    enc: Encoder
    fingerprint: str
    photos: Path
    out: Path
    found: Discovery
    start: float
    keep_precision: bool
    engine: Engine
    walk: WalkOptions
    stop: Callable[[], bool] | None = None
    # A build from WebDataset shards (indexer.shards): what they are, and what reads them.
    shards: ShardSource | None = None

    @property
    def images(self) -> Path | ShardReader:
        """Where the decoders read the images: the folder, or the shards."""
        return self.shards.reader() if self.shards is not None else self.photos

    @property
    def source_root(self) -> str:
        return self.shards.root if self.shards is not None else str(self.photos.resolve())



def build_index(
    photos_dir: str | os.PathLike[str],
    index_dir: str | os.PathLike[str],
    config: BuildConfig | str | None = None,
    *,
    encoder: Encoder | None = None,
    files: Sequence[str | bytes] | None = None,
    **overrides: Any,
) -> BuildReport:
    """Index every image under ``photos_dir`` into ``index_dir``, or bring that index up to date.

    The run's settings are one :class:`BuildConfig`, the single declaration of the build
    options and their meaning: ``config`` (default: ``BuildConfig()``) with ``overrides``
    applied, each a field name of :class:`BuildConfig`, e.g.
    ``build_index(photos, idx, model="...", batch_size=32, workers=0)`` or
    ``build_index(photos, idx, BuildConfig(model="..."), rebuild=True)``. A ``str`` third
    argument is the model (``build_index(photos, idx, "openai/clip-vit-base-patch32")``), and
    ``max_memory`` may be given as a size string (``"4GB"``).

    Args:
        photos_dir: the image collection (walked recursively).
        index_dir: a new or empty directory, or an existing index to update in place.
        config: the settings (see :class:`BuildConfig` for each one), or a model name.
        encoder: an already-loaded encoder (then ``model`` and ``device`` are not used; with
            ``precision`` None it keeps its own mode).
        files: index exactly these paths (relative to ``photos_dir``) instead of walking it
            (no exclusions apply); listed files that do not exist are recorded as skipped.
        overrides: :class:`BuildConfig` fields to change (see its attributes).

    Returns:
        A :class:`BuildReport` with counts and per-stage timings.

    Raises:
        UnknownBuildOptionError: an override that is not a :class:`BuildConfig` field.
        InvalidArgumentError: an option value that is out of range; an unreadable or malformed
            ``.clipsearchignore`` (:mod:`indexer.exclusions`).
        PhotosDirError: ``photos_dir`` is missing, not a directory, or holds no images.
        IndexDirError: ``index_dir`` is a file, a non-empty directory that is not an index, or
            cannot be written (full disk, permissions); the previous index is left intact.
        IndexLockedError: another process is writing the index.
        ModelMismatchError: the index was built with another model and ``rebuild`` is False.
        ModelLoadError: the model cannot be loaded.
    """
    return _start(build_config(config, overrides), os.fspath(photos_dir), Path(index_dir), encoder, files)


def update_index(
    photos_dir: str | os.PathLike[str],
    index_dir: str | os.PathLike[str],
    config: BuildConfig,
    encoder: Encoder,
    found: Discovery,
    stop: Callable[[], bool] | None = None,
) -> BuildReport:
    """One update of watch mode (:mod:`indexer.watch`): :func:`build_index` over ``found`` (the
    caller's walk) with an ``encoder`` from :func:`load_model` kept loaded between updates (the
    index's recorded precision is kept as when :func:`build_index` loads it). ``stop``, polled
    between batches, ends embedding early: what is embedded is committed. Raises as
    :func:`build_index` does."""
    return _start(config, os.fspath(photos_dir), Path(index_dir), encoder, None, found=found, own_encoder=True, stop=stop)


def load_model(config: BuildConfig, index_dir: str | os.PathLike[str] | None = None) -> Encoder:
    """The encoder :func:`build_index` loads for ``config`` (its model, device and precision).

    No model named: the one the index at ``index_dir`` records, else the default.

    Raises:
        ModelLoadError: the model cannot be loaded; for the index's own model, the message
            names the index and what to pass instead.
    """
    out = Path(index_dir) if index_dir is not None else None
    model = (with_model(config, out).model if out is not None else config.model) or DEFAULT_MODEL
    try:
        return load_encoder(model, device=config.device, precision=config.precision or DEFAULT_PRECISION)
    except ModelLoadError as exc:
        if out is None:
            raise
        raise model_load_error(exc, model, out) from exc


def _start(
    cfg: BuildConfig, source: str, out: Path, encoder: Encoder | None, files: Sequence[str | bytes] | None, *,
    found: Discovery | None = None, own_encoder: bool = False, stop: Callable[[], bool] | None = None,
) -> BuildReport:
    start = time.perf_counter()
    cpu.cpu_level()  # a bad CLIPSEARCH_CPU_CAP fails here, before any work
    # No model named: the index's own (every collaborator below, the Ray actors too, reads it here).
    cfg = with_model(cfg, out)
    if encoder is not None and cfg.engine in LOADS_ITS_OWN_MODEL:
        raise InvalidArgumentError(f"engine {cfg.engine!r} loads the model in every worker from model=; it cannot take a loaded encoder")
    shard_source = None
    # What the walk takes (videos too?): this run's options over what the index records.
    walk = recorded_walk(out, cfg.include_hidden, cfg.exclude, cfg.videos)
    if found is None and is_shard_spec(source):
        if files is not None:
            raise InvalidArgumentError("files= lists images of a folder; the images of shards are listed from the shards")
        check_index_dir(out, "index", rebuild=cfg.rebuild)
        # Listed before the model is loaded: a missing bucket or a damaged tar fails in seconds.
        shard_source = shards.resolve(source, cfg.storage_options)
        # Shards a completed run embedded whole and that did not change are not read again.
        known = {} if cfg.rebuild else shards.known_shards(out, walk.videos)
        found = shards.list_source(shard_source, known=known, videos=walk.videos)
        photos = Path(shard_source.root) if scheme_of(shard_source.root) is None else Path(".")
    else:
        photos = Path(source)
        check_photos_dir(photos)
    check_index_dir(out, "index", rebuild=cfg.rebuild)
    sides.check(cfg)  # a missing engine fails in one line, before any work
    if walk.videos:
        video_rows.check_engine()
    with contextlib.ExitStack() as stack:
        # Opened before the walk and the model: a cluster that does not answer fails in seconds.
        engine = stack.enter_context(open_engine(cfg))
        if found is None:
            extensions = IMAGE_EXTENSIONS | VIDEO_EXTENSIONS if walk.videos else IMAGE_EXTENSIONS
            found = find_images(photos, files, None if files is not None else load_exclusions(photos, walk), extensions)
        elif not found.files:
            raise PhotosDirError(f"no images found in {photos}")  # an emptied folder never empties the index
        enc = encoder if encoder is not None else load_model(cfg, out)
        if encoder is not None and cfg.precision is not None:
            calibrate.apply_precision(enc, cfg.precision)
        keep = cfg.precision is None and (encoder is None or own_encoder)
        # enc.fingerprint fails on missing weights before anything is written.
        return _build(_Job(cfg, enc, enc.fingerprint, photos, out, found, start, keep, engine, walk, stop, shard_source))


def _build(job: _Job) -> BuildReport:
    out = job.out
    created_dir = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        with IndexLock(out) as lock:
            return _run(job, interrupted_before=lock.previous_holder is not None)
    except BaseException as exc:
        if created_dir and not is_index_dir(out):
            shutil.rmtree(out, ignore_errors=True)
        error = write_error(exc, out, "; the last committed index, if any, is unchanged")
        if error is not None:
            raise error from exc
        raise


def build_config(config: BuildConfig | str | None, overrides: dict[str, Any]) -> BuildConfig:
    """The run's settings: ``config`` (or a model name given in its place) plus overrides."""
    if isinstance(config, str):
        if "model" in overrides:
            raise InvalidArgumentError("build_index got the model twice: as its third argument and as model=")
        overrides = {**overrides, "model": config}
        config = None
    elif config is not None and not isinstance(config, BuildConfig):
        raise InvalidArgumentError(f"config must be a BuildConfig or a model name, got {type(config).__name__}")
    if overrides.get("max_memory") is not None:
        # A size string ("4GB") is read here; an int goes through the same range check.
        overrides = {**overrides, "max_memory": parse_memory(overrides["max_memory"])}
    base = config if config is not None else BuildConfig()
    return base.replace(**overrides) if overrides else base




def _hash_or_none(root: bytes, rel: bytes) -> str | None:
    try:
        with open(os.path.join(root, rel), "rb") as fh:
            return content_hash(fh.read())
    except OSError:
        return None


def _run(job: _Job, *, interrupted_before: bool) -> BuildReport:
    """The build under the index lock: plan against the index, embed, finish, report."""
    base = open_base(job.cfg, job.enc, job.fingerprint, job.out, files=len(job.found.files), source_root=job.source_root,
                     walk=job.walk)
    previous, writer = base.previous, base.writer
    root = os.fsencode(job.photos)
    # A shard member whose shard changed is re-embedded: reading it to compare would cost as much.
    hash_of = (lambda rel: None) if job.shards is not None else (lambda rel: _hash_or_none(root, rel))
    plan = plan_update(writer.facts(), base.old_skips, job.found.files, hash_of)
    writer.record_skips(SkipRecord(rel, f"directory not readable: {why}") for rel, why in job.found.unreadable_dirs)
    writer.record_skips(SkipRecord(rel, why) for rel, why in job.found.missing)
    writer.record_skips(plan.carried_skips)
    # A video is sampled and its frames embedded apart from the images (indexer.video.video_rows).
    videos = video_rows.split_videos(plan) if job.walk.videos else []
    side_stats = {stage.name: SideStats() for stage in sides.SIDE_STAGES}
    stats, cpu_level, info = _embed(job, previous, plan, writer, side_stats)
    video_rows.count(_embed_videos(job, plan, writer, videos, info), stats)
    _run_sides(job, previous, writer, side_stats, before=False)
    up_to_date = (
        previous is not None
        and previous.complete
        and not base.options_changed
        and not plan.to_embed
        and not videos
        and not plan.changes_rows
        and dict(previous.discovery) == job.walk.to_dict()
        # A side stage turned on or off, or with rows still to read, gets a generation.
        and sides.complete(previous, writer.meta.sides)
        and sorted((s.path, s.reason) for s in writer.skipped) == sorted((s.path, s.reason) for s in base.old_skips)
    )
    t0 = time.perf_counter()
    if not up_to_date:
        writer.finish(progress=(lambda msg: print(f"clipsearch: {msg}", file=sys.stderr, flush=True)) if job.cfg.progress else None)
    stats.write_seconds += time.perf_counter() - t0
    resumed = interrupted_before or (previous is not None and not previous.complete)
    for name, counts in stats.sides.items():
        side_stats[name].add(counts)
    return _report(job, plan, writer, stats, side_stats, resumed=resumed, cpu_level=cpu_level)


def _run_sides(job: _Job, previous: Manifest | None, writer: GenerationWriter, side_stats: dict[str, SideStats], *,
               before: bool) -> None:
    """Each side stage reads the rows it has not read yet: ``before`` the embedding appends rows
    (after the plan's compaction), else once every row is embedded; timed into its stats."""
    for stage in sides.SIDE_STAGES:
        setting = writer.meta.sides.get(stage.name)
        run = SideRun(job.cfg, job.enc.preprocess, job.images, writer,
                      recorded=previous is not None and stage.complete(previous, setting), stop=job.stop)
        t0 = time.perf_counter()
        done = stage.before_embedding(run) if before else stage.after_embedding(run)
        side_stats[stage.name].add(done.counts)
        side_stats[stage.name].seconds += time.perf_counter() - t0




def _embed(job: _Job, previous: Manifest | None, plan: UpdatePlan, writer: GenerationWriter,
           side_stats: dict[str, SideStats]) -> tuple[RunStats, str, dict[str, Any]]:
    """Resolve the precision, apply the plan's row changes and embed its files with the
    run's engine; returns the stats, the CPU level the model ran at ("" on GPU) and the model
    info the engine embedded with (its videos are embedded with it too)."""
    cfg, enc, engine = job.cfg, job.enc, job.engine
    prev_info = previous.model_info if previous is not None else None
    images = job.images
    # Activations are freed and allocated again every layer: keep them in the heap (see heap),
    # for the calibration's model calls as for the build's.
    cpu_level = cpu.cpu_level() if enc.device.type == "cpu" else ""
    with retained_heap():
        # An engine on other machines (a cluster's workers) only takes the recorded mode here, if any; a
        # mode still to choose is calibrated on the kind of node it runs on (its CPU or GPU).
        here = engine.calibrates_here(enc)
        recorded = previous.preprocess if previous is not None else None
        requested = calibrate.decode_request(cfg.decode, recorded)
        sample = calibrate.resolve(
            enc, prev_info, images, plan.to_embed if here else [], max_pixels=cfg.max_pixels, keep_recorded=job.keep_precision,
        )
        info = enc.info
        if not here and enc.image_precision.mode is None and plan.to_embed:
            info = engine.resolve_elsewhere(enc, images, prev_info, plan.to_embed, job.keep_precision, requested, recorded)
            cpu_level = str(info.pop("_cpu_level", ""))
            decode = calibrate.DecodeChoice.from_record(info.pop("_decode", None)) or calibrate.DecodeChoice(requested, False)
        else:
            decode = calibrate.resolve_decode(
                enc, images, plan.to_embed, requested=requested, recorded=recorded, max_pixels=cfg.max_pixels, sample=sample,
            )
        if plan.to_embed or previous is None:
            # The decoding this run's vectors come from; with nothing embedded the recorded one stays.
            writer.meta = dataclasses.replace(writer.meta, preprocess=preprocess_record(job.enc, decode))
        writer.set_model_info(calibrate.model_info(info, prev_info, bool(plan.to_embed)))
        if plan.changes_rows:
            writer.compact(plan.keep_ids, plan.refreshed)
        # The side stages' rows not read yet (an index embedded without them), read here on any engine.
        _run_sides(job, previous, writer, side_stats, before=True)
        stats = engine.embed(enc, images, info, plan, writer, draft=decode.draft, stop=job.stop)
        return stats, cpu_level, dict(info)


def _embed_videos(job: _Job, plan: UpdatePlan, writer: GenerationWriter, videos: list[ImageFile],
                  info: dict[str, Any]) -> video_rows.VideoStats:
    """--videos: the planned videos sampled and embedded by the run's engine with the images'
    model ``info``, written here in order, a generation committed as images' are."""
    if not videos:
        return video_rows.VideoStats()
    commits = ChunkCommits(job.cfg, writer)
    sink = video_rows.VideoSink(writer.append, lambda skip: writer.record_skips([skip]), commits.after)
    return job.engine.embed_videos(job.enc, job.images, info, videos, job.cfg.video_options(), sink,
                                   updated=frozenset(plan.updated_paths), stop=job.stop)


def _report(
    job: _Job, plan: UpdatePlan, writer: GenerationWriter, stats: RunStats, side_stats: dict[str, SideStats], *,
    resumed: bool, cpu_level: str,
) -> BuildReport:
    seconds = time.perf_counter() - job.start
    facts = job.engine.facts(job.enc)
    return BuildReport(
        index_dir=str(job.out),
        model=job.enc.name,
        dim=job.enc.dim,
        added=stats.added,
        updated=stats.updated,
        removed=plan.removed + stats.lost,
        unchanged=plan.unchanged,
        skipped=len(writer.skipped),
        newly_skipped=stats.newly_skipped,
        total=writer.count,
        indexed=writer.count,
        embedded=stats.embedded,
        resumed=resumed,
        commits=writer.commits,
        seconds=round(seconds, 3),
        images_per_second=round(stats.embedded / seconds, 2) if seconds > 0 else 0.0,
        decode_seconds=round(stats.decode_seconds, 3),
        encode_seconds=round(stats.encode_seconds, 3),
        write_seconds=round(stats.write_seconds, 3),
        workers=stats.workers,
        batch_size=stats.batch_size,
        device=facts.device,
        threads=stats.threads,
        precision=str(writer.meta.model_info.get("precision", "fp32")),
        cpu_level=cpu_level if facts.device == "cpu" else "",
        engine=job.cfg.engine,
        actors=facts.actors,
        cluster_resources=dict(facts.resources),
        ray_write=stats.written_by,
        # Each side stage's fields (its counts and seconds).
        **{k: v for stage in sides.SIDE_STAGES for k, v in stage.report(side_stats[stage.name], writer.current).items()},
    )


__all__ = [
    "BuildConfig",
    "BuildReport",
    "UnknownBuildOptionError",
    "build_config",
    "build_index",
    "load_model",
    "update_index",
    "default_batch_size",
    "default_threads",
    "default_workers",
]
