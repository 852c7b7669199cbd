"""Settings of a build (``BuildConfig``), what it reports (``BuildReport``) and the defaults
that depend on the device.

One source of truth for the options: ``build_index(photos, index_dir, config, **overrides)``
and ``clipsearch index`` both end in a ``BuildConfig``, validated here once.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from retrieval.checks import is_int, is_positive_int
from retrieval.encoders import DEFAULT_MODEL, Precision, parse_precision
from retrieval.errors import InvalidArgumentError, UnknownBuildOptionError
from retrieval.images import DEFAULT_MAX_PIXELS
from retrieval.index_types import DEFAULT_MAX_MEMORY, DEFAULT_TARGET_RECALL, IndexOptions

# A new index: the fastest mode that passes the quality gate on the collection's own images.
# Every mode keeps a vector a function of its image alone (int8 quantises per row), so an update
# still equals a rebuild. An update without --precision keeps the index's recorded mode.
DEFAULT_PRECISION = "auto"

# Where decoding and embedding run: this process, or a Ray Data actor pool (indexer.ray_engine).
ENGINES = ("local", "ray")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and abs(value) != float("inf")



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


@dataclass(frozen=True)
class BuildConfig:
    """Settings of one build or update.

    Attributes:
        model: hub id or local checkpoint directory.
        batch_size: images per model call; None: 64 on CPU, 512 on GPU.
        workers: decode worker processes; None: 0 on CPU (decoded in-process between batches, on
            ``threads`` threads), from the core count on GPU.
        device: ``auto``, ``cpu`` or ``cuda[:N]``.
        max_pixels: larger images are skipped as decompression bombs.
        draft: decode JPEGs at a reduced DCT scale when the model needs fewer pixels.
        progress: show a progress bar on stderr.
        rebuild: ignore the existing index (and its model) and index everything again.
        commit_every: publish a generation after this many processed images.
        commit_seconds: ... or after this many seconds, whichever comes first.
        precision: image tower mode, ``fp32``, ``bf16``, ``fp16``, ``int8`` or ``auto``; None:
            ``DEFAULT_PRECISION`` for a model loaded by the build, a given encoder's own mode.
        threads: torch intra-op threads while embedding; None picks from the core count.
        image_size: embed images at this many pixels (Hugging Face ViT CLIP: position embeddings
            interpolated, e.g. 336 for a model trained at 224); None keeps what the index recorded
            (the model's own size for a new index). Another size than the recorded one needs
            ``rebuild``.
        index_type, max_memory, target_recall: the FAISS index choice (see
            :class:`retrieval.index_types.IndexOptions`); None keeps what the index recorded
            (or the defaults for a new index).
        engine: ``local`` (this process) or ``ray``: decoding and embedding on a Ray Data actor
            pool (:mod:`indexer.ray_engine`); discovery, the update plan, ids and commits stay here.
        ray_address: the Ray cluster (``auto``, ``HOST:PORT``, ``ray://HOST:10001``); None:
            ``RAY_ADDRESS`` if set, else Ray started on this machine. Only with ``engine="ray"``.
        actors: encoder actors; None: one per ``gpus_per_actor`` GPUs, or per ``cpus_per_actor``
            CPUs of the cluster. Only with ``engine="ray"``.
        gpus_per_actor: GPUs per actor (0: CPU actors). Only with ``engine="ray"``.
        cpus_per_actor: CPUs per actor, its decode and torch threads; None: the cluster's CPUs
            shared among the GPU actors, or up to 4 per CPU actor. Only with ``engine="ray"``.
    """

    model: str = DEFAULT_MODEL
    batch_size: int | None = None
    workers: int | None = None
    device: str = "auto"
    max_pixels: int = DEFAULT_MAX_PIXELS
    draft: bool = True
    progress: bool = False
    rebuild: bool = False
    commit_every: int = 4096
    commit_seconds: float = 300.0
    precision: Precision | None = None
    threads: int | None = None
    index_type: str | None = None
    max_memory: int | None = None
    target_recall: float | None = None
    image_size: int | None = None
    engine: str = "local"
    ray_address: str | None = None
    actors: int | None = None
    gpus_per_actor: float = 0.0
    cpus_per_actor: float | None = None

    def __post_init__(self) -> None:
        # Checked up front: a bad --index-type must fail before hours of embedding.
        IndexOptions(
            index_type=self.index_type or "auto",
            max_memory=self.max_memory if self.max_memory is not None else DEFAULT_MAX_MEMORY,
            target_recall=self.target_recall if self.target_recall is not None else DEFAULT_TARGET_RECALL,
        )
        if self.precision is not None:
            parse_precision(self.precision)
        if self.threads is not None and not is_positive_int(self.threads):
            raise InvalidArgumentError(f"threads must be an integer >= 1, got {self.threads!r}")
        if self.batch_size is not None and not is_positive_int(self.batch_size):
            raise InvalidArgumentError(f"batch size must be an integer >= 1, got {self.batch_size!r}")
        if self.workers is not None and (not is_int(self.workers) or self.workers < 0):
            raise InvalidArgumentError(f"workers must be an integer >= 0, got {self.workers!r}")
        if self.max_pixels < 1:
            raise InvalidArgumentError(f"max_pixels must be >= 1, got {self.max_pixels}")
        if not is_positive_int(self.commit_every):
            raise InvalidArgumentError(f"commit_every must be an integer >= 1, got {self.commit_every!r}")
        if self.image_size is not None and not is_positive_int(self.image_size):
            raise InvalidArgumentError(f"image size must be an integer >= 1, got {self.image_size!r}")
        if self.commit_seconds <= 0:
            raise InvalidArgumentError(f"commit_seconds must be > 0, got {self.commit_seconds}")
        self._check_engine()

    def _check_engine(self) -> None:
        if self.engine not in ENGINES:
            raise InvalidArgumentError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.actors is not None and not is_positive_int(self.actors):
            raise InvalidArgumentError(f"actors must be an integer >= 1, got {self.actors!r}")
        if not _is_number(self.gpus_per_actor) or self.gpus_per_actor < 0:
            raise InvalidArgumentError(f"gpus per actor must be a number >= 0, got {self.gpus_per_actor!r}")
        if self.cpus_per_actor is not None and (not _is_number(self.cpus_per_actor) or self.cpus_per_actor <= 0):
            raise InvalidArgumentError(f"cpus per actor must be a number > 0, got {self.cpus_per_actor!r}")
        if self.engine != "ray":
            given = [name for name, value, default in (
                ("ray_address", self.ray_address, None), ("actors", self.actors, None),
                ("gpus_per_actor", self.gpus_per_actor, 0.0), ("cpus_per_actor", self.cpus_per_actor, None),
            ) if value != default]
            if given:
                raise InvalidArgumentError(f"{', '.join(given)} only apply to engine 'ray' (--engine ray)")

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


@dataclass(frozen=True)
class BuildReport:
    """What a run did; ``to_dict`` is what ``clipsearch index --json`` prints.

    ``added`` new files embedded, ``updated`` changed files re-embedded, ``removed`` rows of
    deleted files dropped, ``unchanged`` rows kept, ``skipped`` files in the skip list,
    ``total`` (= ``indexed``) rows in the index now, ``embedded`` images embedded by this run.
    """

    index_dir: str
    model: str
    dim: int
    added: int
    updated: int
    removed: int
    unchanged: int
    skipped: int
    newly_skipped: int
    total: int
    indexed: int
    embedded: int
    resumed: bool
    commits: int
    seconds: float
    images_per_second: float
    decode_seconds: float
    encode_seconds: float
    write_seconds: float
    workers: int
    batch_size: int
    device: str
    threads: int = 0
    precision: str = ""
    # The CPU level the run acted on (retrieval.encoders.cpu), e.g. "avx2"; "" on CUDA.
    cpu_level: str = ""
    engine: str = "local"
    # Ray runs only: the encoder actors and the cluster's resources (ray.cluster_resources()).
    actors: int = 0
    cluster_resources: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.engine != "ray":
            # The Ray fields mean nothing for a local run: its summary leaves them out.
            del data["actors"], data["cluster_resources"]
        return data


__all__ = [
    "DEFAULT_PRECISION",
    "ENGINES",
    "BuildConfig",
    "BuildReport",
    "default_batch_size",
    "default_threads",
    "default_workers",
]
