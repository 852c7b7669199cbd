"""Settings of a build (``BuildConfig``) and the defaults that depend on the device; what a run
did is :mod:`indexer.build_report`, the settings of watch mode :mod:`indexer.watch_config`.

One source of truth for the options: ``build_index(photos, index_dir, config, **overrides)``
and ``clipsearch index`` both end in a ``BuildConfig``, validated here once.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

from indexer.index_types import DEFAULT_MAX_MEMORY, DEFAULT_TARGET_RECALL, IndexOptions, parse_memory
from retrieval.checks import is_int, is_number, is_positive_int
from retrieval.encoders import DEFAULT_MODEL, Precision, parse_precision
from retrieval.errors import InvalidArgumentError, UnknownBuildOptionError
from retrieval.images import DEFAULT_MAX_PIXELS
from retrieval.options import option
from retrieval.shards import parse_storage_options

from .exclusions import check_patterns
from .video.video_config import SAMPLINGS, VideoOptions

# A new index: the fastest mode that passes the quality gate on the collection's own images.
# Every mode keeps a vector a function of its image alone (int8 quantises per row), so an update
# still equals a rebuild. An update without --precision keeps the index's recorded mode.
DEFAULT_PRECISION = "auto"

# How JPEGs are decoded (indexer.calibrate.resolve_decode): in full (the reference processor's
# pixels), in draft (a reduced DCT scale: faster, not the reference's pixels), or auto (draft
# only where a gate measured it harmless, never with precision fp32). Recorded in the index.
Decode = Literal["auto", "full", "draft"]
DECODES: tuple[Decode, ...] = get_args(Decode)
DEFAULT_DECODE: Decode = "auto"

# Where decoding and embedding run: this process, or a Ray Data actor pool (indexer.ray_engine).
ENGINES = ("local", "ray")
# Who writes a Ray build's Parquet parts (indexer.ray_parts): the actors where they reach the
# index directory (auto), the driver alone, or the actors, failing where one cannot.
RAY_WRITES = ("auto", "driver", "actors")



def default_workers(device_type: str = "cpu") -> int:
    """Decode worker processes: none on CPU, half the cores (at most 8) on GPU.

    On CPU the model's threads fill every core and wait for each other at every operation, so
    a worker decoding beside them stalls them all; each batch is decoded in this process, on all
    cores, between model batches (see benchmarks/README.md). On GPU the workers only read, hash
    and probe JPEGs (the GPU decodes them) and the one process feeding the GPU needs cores of
    its own, so more workers than half the cores slow it down.
    """
    cores = os.cpu_count() or 1
    if device_type == "cuda":
        return max(1, min(8, cores // 2))
    return 0


def default_batch_size(device_type: str = "cpu") -> int:
    """Images per model call: 64 on CPU (larger batches run no faster), 512 on GPU, where each
    model call costs a fixed Python overhead of launching kernels whatever the batch."""
    return 512 if device_type == "cuda" else 64


def default_threads(device_type: str = "cpu", workers: int = 1) -> int:
    """torch intra-op threads while embedding: every core on CPU (in-process decoding uses as
    many between batches); on GPU the model needs few CPU threads, so leave the cores to the
    decode workers."""
    cores = os.cpu_count() or 1
    if device_type == "cuda":
        return max(1, min(4, cores - workers))
    return cores


# The CLI lists the Ray options in a section of their own.
_RAY = "distributed (--engine ray, pip install 'clipsearch[ray]')"
_WALK = "what is indexed"
_SHARDS = "WebDataset shards (pip install 'clipsearch[shards]')"


@dataclass(frozen=True)
class BuildConfig:
    """Settings of one build or update.

    Each field's meaning, and the ``clipsearch index`` flag derived from it, is declared in its
    :func:`~retrieval.options.option` metadata; the docs' reference table is generated from it.
    """

    model: str | None = field(
        default=None,
        metadata=option(
            "Hugging Face hub id or local checkpoint directory, or an open_clip:... name; on an existing index, "
            "another model than its own needs --rebuild",
            default_text=f"the model the index records; {DEFAULT_MODEL} for a new index",
        ),
    )
    batch_size: int | None = field(
        default=None, metadata=option("images per model call", default_text="64 on CPU, 512 on GPU", minimum=1)
    )
    workers: int | None = field(
        default=None,
        metadata=option(
            "decode worker processes",
            default_text="0 on CPU = in-process, on --threads threads between batches; half the cores, at most 8, "
            "on GPU, which decodes the JPEGs",
            minimum=0,
        ),
    )
    device: str = field(default="auto", metadata=option("auto (CUDA when available), cpu or cuda"))
    max_pixels: int = field(
        default=DEFAULT_MAX_PIXELS, metadata=option("larger images are skipped as decompression bombs", cli=False, minimum=1)
    )
    decode: Decode | None = field(
        default=None,
        metadata=option(
            "how JPEGs are decoded, recorded in the index: full (the reference processor's pixels), draft (at a "
            "reduced DCT scale, faster, not exact) or auto (draft only where the quality gate measured it harmless "
            "on the first images; never with --precision fp32)",
            default_text="auto for a new index, the recorded choice on update",
            metavar="MODE",
            choices=DECODES,
        ),
    )
    draft: bool | None = field(
        default=None,
        metadata=option("deprecated: decode='draft' for True, decode='full' for False", default_text="", cli=False),
    )
    progress: bool = field(
        default=False,
        metadata=option("show a progress bar on stderr (the CLI does unless --no-progress)", flag="--no-progress", negate=True,
                        flag_help="no progress bar"),
    )
    rebuild: bool = field(
        default=False, metadata=option("re-index everything, also when the index was built with another model")
    )
    commit_every: int = field(
        default=4096, metadata=option("publish a searchable, resumable state every N images", metavar="N", minimum=1)
    )
    commit_seconds: float = field(
        default=300.0,
        metadata=option("publish one also after this many seconds, whichever comes first", cli=False, minimum=0, positive=True),
    )
    storage_options: str | None = field(
        default=None,
        metadata=option(
            "WebDataset shards on an object store: fsspec options as a JSON object, e.g. "
            '\'{"anon": true}\' or \'{"endpoint_url": "http://host:9000"}\' (S3 reads the AWS_* variables too)',
            default_text="none",
            metavar="JSON",
            group=_SHARDS,
        ),
    )
    precision: Precision | None = field(
        default=None,
        metadata=option(
            "image tower precision, recorded in the index: fp32 (exact), bf16, fp16, int8 (CPU) or auto "
            "(fastest passing the quality gate)",
            default_text="auto for a new index, the recorded mode on update",
            metavar="MODE",
        ),
    )
    threads: int | None = field(
        default=None, metadata=option("torch threads for the model", default_text="from the core count", metavar="N", minimum=1)
    )
    index_type: str | None = field(
        default=None,
        metadata=option(
            "auto, flat, hnsw, ivf-flat, ivf-sq8, ivf-pq, ivf-sq4-refine, ivf-pq-refine or a FAISS factory string",
            default_text="what the index recorded; auto for a new index",
            metavar="TYPE",
        ),
    )
    max_memory: int | None = field(
        default=None,
        metadata=option(
            "memory the FAISS index may keep resident, e.g. 4GB; the float16 vectors that the -refine types "
            "re-rank with are memory-mapped and not counted",
            default_text="4GB",
            metavar="SIZE",
            parse=parse_memory,
            text_type="size",
        ),
    )
    target_recall: float | None = field(
        default=None,
        metadata=option(
            "recall@10 against exact search that approximate indexes are tuned to reach", default_text="0.95", metavar="R"
        ),
    )
    image_size: int | None = field(
        default=None,
        metadata=option(
            "embed images at PX x PX, e.g. 336 for a model trained at 224 (Hugging Face ViT CLIP: position "
            "embeddings interpolated; a multiple of the patch size); another size than the recorded one needs rebuild",
            default_text="the size the index recorded, else the model's own",
            metavar="PX",
            minimum=1,
        ),
    )
    include_hidden: bool | None = field(
        default=None,
        metadata=option(
            "also index hidden files and folders (names starting with a dot) and thumbnail caches and recycle bins "
            "(@eaDir, #recycle, __MACOSX, ...); recorded in the index, --no-include-hidden leaves them out again",
            default_text="what the index recorded; off for a new index",
            group=_WALK,
        ),
    )
    exclude: tuple[str, ...] | None = field(
        default=None,
        metadata=option(
            "leave out paths matching this gitignore pattern, relative to PHOTOS_DIR (repeatable; PHOTOS_DIR/"
            ".clipsearchignore is read too); recorded in the index, given ones replace the recorded ones, "
            "--exclude '' clears them",
            default_text="the patterns the index recorded; none for a new index",
            metavar="GLOB",
            group=_WALK,
        ),
    )
    ocr: bool | None = field(
        default=None,
        metadata=option(
            "recognise text in the images (signs, screenshots, scans) for keyword search, with RapidOCR "
            "(pip install 'clipsearch[ocr]'); recorded in the index, --no-ocr turns it off again",
            default_text="what the index recorded; off for a new index",
            group=_WALK,
        ),
    )
    faces: bool | None = field(
        default=None,
        metadata=option(
            "find the faces in the images and group them into people, with dlib (pip install 'clipsearch[faces]'); "
            "added to an indexed collection without embedding it again; recorded in the index, --no-faces turns it off",
            default_text="what the index recorded; off for a new index",
            group=_WALK,
        ),
    )
    videos: bool | None = field(
        default=None,
        metadata=option(
            "index video files too (mp4, mov, mkv, webm, m4v, avi; a video by its content): a row per sampled frame, "
            "found at their moment (pip install 'clipsearch[video]'); recorded in the index, --no-videos leaves them out again",
            default_text="what the index recorded; off for a new index",
            group=_WALK,
        ),
    )
    video_sampling: str = field(
        default="keyframes",
        metadata=option(
            "which frames of a video are embedded: keyframes (their packets alone, gaps over 3 s filled, near "
            "duplicates dropped), rate (a full decode, --video-rate frames a second) or shots (a full decode, a frame a shot)",
            choices=SAMPLINGS,
            group=_WALK,
        ),
    )
    video_rate: float = field(default=1.0, metadata=option("frames a second with --video-sampling rate", metavar="FPS",
                                                           positive=True, group=_WALK))
    video_time_limit: float = field(default=300.0, metadata=option(
        "seconds one video may take to sample; a slower one is skipped with that reason", metavar="S", positive=True,
        group=_WALK))
    engine: str = field(
        default="local",
        metadata=option(
            "where decoding and embedding run: this process (local) or a Ray cluster's actors (ray); discovery, "
            "the update plan, ids and commits stay here",
            choices=ENGINES,
            group=_RAY,
        ),
    )
    ray_address: str | None = field(
        default=None,
        metadata=option(
            "Ray cluster: auto, HOST:PORT or ray://HOST:10001",
            default_text="$RAY_ADDRESS, else Ray started on this machine",
            metavar="ADDR",
            group=_RAY,
        ),
    )
    actors: int | None = field(
        default=None,
        metadata=option(
            "encoder actors, one model each",
            default_text="one per --gpus-per-actor GPUs, else per --cpus-per-actor CPUs",
            metavar="N",
            minimum=1,
            group=_RAY,
        ),
    )
    gpus_per_actor: float = field(
        default=0.0, metadata=option("GPUs per actor", default_text="0, CPU actors", metavar="G", minimum=0, group=_RAY)
    )
    cpus_per_actor: float | None = field(
        default=None,
        metadata=option(
            "CPUs per actor for decoding and torch threads",
            default_text="the cluster's CPUs shared among GPU actors, else up to 4",
            metavar="C",
            minimum=0,
            positive=True,
            group=_RAY,
        ),
    )
    ray_write: str = field(
        default="auto",
        metadata=option(
            "who writes the Parquet parts: the actors, into the index's staging folder, where they reach it "
            "(auto: else the driver); driver; actors (fail where one cannot)",
            choices=RAY_WRITES,
            group=_RAY,
        ),
    )

    def __post_init__(self) -> None:
        # Checked up front: a bad --index-type must fail before hours of embedding.
        IndexOptions(
            index_type=self.index_type or "auto",
            max_memory=self.max_memory if self.max_memory is not None else DEFAULT_MAX_MEMORY,
            target_recall=self.target_recall if self.target_recall is not None else DEFAULT_TARGET_RECALL,
        )
        if self.model is not None and (not isinstance(self.model, str) or not self.model.strip()):
            raise InvalidArgumentError(f"model must be a non-empty name or path, got {self.model!r}")
        if self.precision is not None:
            parse_precision(self.precision)
        self._check_decode()
        if self.threads is not None and not is_positive_int(self.threads):
            raise InvalidArgumentError(f"threads must be an integer >= 1, got {self.threads!r}")
        if self.batch_size is not None and not is_positive_int(self.batch_size):
            raise InvalidArgumentError(f"batch size must be an integer >= 1, got {self.batch_size!r}")
        if self.workers is not None and (not is_int(self.workers) or self.workers < 0):
            raise InvalidArgumentError(f"workers must be an integer >= 0, got {self.workers!r}")
        if isinstance(self.storage_options, Mapping):
            # A dict from Python: the frozen field holds its JSON text (hashable, recorded as given).
            object.__setattr__(self, "storage_options", json.dumps(dict(self.storage_options), sort_keys=True))
        if self.storage_options is not None:
            parse_storage_options(self.storage_options)
        if self.max_pixels < 1:
            raise InvalidArgumentError(f"max_pixels must be >= 1, got {self.max_pixels}")
        if not is_positive_int(self.commit_every):
            raise InvalidArgumentError(f"commit_every must be an integer >= 1, got {self.commit_every!r}")
        if self.image_size is not None and not is_positive_int(self.image_size):
            raise InvalidArgumentError(f"image size must be an integer >= 1, got {self.image_size!r}")
        if self.commit_seconds <= 0:
            raise InvalidArgumentError(f"commit_seconds must be > 0, got {self.commit_seconds}")
        if self.ocr not in (None, True, False):
            raise InvalidArgumentError(f"ocr must be True, False or None, got {self.ocr!r}")
        if self.faces not in (None, True, False):
            raise InvalidArgumentError(f"faces must be True, False or None, got {self.faces!r}")
        if self.videos not in (None, True, False):
            raise InvalidArgumentError(f"videos must be True, False or None, got {self.videos!r}")
        self.video_options()  # checked as VideoOptions checks them
        if self.include_hidden not in (None, True, False):
            raise InvalidArgumentError(f"include_hidden must be True, False or None, got {self.include_hidden!r}")
        if isinstance(self.exclude, (str, list)):
            # One pattern, or a list: the frozen field holds a tuple either way.
            object.__setattr__(self, "exclude", (self.exclude,) if isinstance(self.exclude, str) else tuple(self.exclude))
        if self.exclude is not None:
            if not isinstance(self.exclude, tuple):
                raise InvalidArgumentError(f"exclude must be a sequence of patterns, got {type(self.exclude).__name__}")
            check_patterns(self.exclude)
        self._check_engine()

    def _check_decode(self) -> None:
        if self.draft is not None:
            if self.draft not in (True, False):
                raise InvalidArgumentError(f"draft must be True or False, got {self.draft!r}")
            warnings.warn("draft= is deprecated; use decode='draft' or decode='full'", DeprecationWarning, stacklevel=4)
            implied: Decode = "draft" if self.draft else "full"
            if self.decode is None:
                object.__setattr__(self, "decode", implied)
            elif self.decode != implied:
                raise InvalidArgumentError(f"draft={self.draft} contradicts decode={self.decode!r}; give decode alone")
        if self.decode is not None and self.decode not in DECODES:
            raise InvalidArgumentError(f"unknown decode {self.decode!r}; use one of {', '.join(DECODES)}")

    def _check_engine(self) -> None:
        if self.engine not in ENGINES:
            raise InvalidArgumentError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.actors is not None and not is_positive_int(self.actors):
            raise InvalidArgumentError(f"actors must be an integer >= 1, got {self.actors!r}")
        if not is_number(self.gpus_per_actor) or self.gpus_per_actor < 0:
            raise InvalidArgumentError(f"gpus per actor must be a number >= 0, got {self.gpus_per_actor!r}")
        if self.cpus_per_actor is not None and (not is_number(self.cpus_per_actor) or self.cpus_per_actor <= 0):
            raise InvalidArgumentError(f"cpus per actor must be a number > 0, got {self.cpus_per_actor!r}")
        if self.ray_write not in RAY_WRITES:
            raise InvalidArgumentError(f"ray_write must be one of {', '.join(RAY_WRITES)}, got {self.ray_write!r}")
        if self.engine != "ray":
            given = [name for name, value, default in (
                ("ray_address", self.ray_address, None), ("actors", self.actors, None),
                ("gpus_per_actor", self.gpus_per_actor, 0.0), ("cpus_per_actor", self.cpus_per_actor, None),
                ("ray_write", self.ray_write, "auto"),
            ) if value != default]
            if given:
                raise InvalidArgumentError(f"{', '.join(given)} only apply to engine 'ray' (--engine ray)")

    def video_options(self) -> VideoOptions:
        """How this build samples videos (``--videos``).

        Raises:
            InvalidArgumentError: a sampling, rate or time limit VideoOptions refuses.
        """
        return VideoOptions(sampling=self.video_sampling, rate=self.video_rate, time_limit=self.video_time_limit)

    def replace(self, **changes: Any) -> BuildConfig:
        """A copy with ``changes`` (field names) applied and validated like a new config.

        Raises:
            UnknownBuildOptionError: a name that is not a field, naming the valid ones.
            InvalidArgumentError: a value the validation rejects.
        """
        fields = {f.name for f in dataclasses.fields(self)}
        for name in changes:
            if name not in fields:
                raise UnknownBuildOptionError(name, fields)
        return replace(self, **changes)


__all__ = [
    "DECODES",
    "DEFAULT_DECODE",
    "DEFAULT_PRECISION",
    "Decode",
    "ENGINES",
    "RAY_WRITES",
    "BuildConfig",
    "default_batch_size",
    "default_threads",
    "default_workers",
]
