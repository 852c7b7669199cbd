"""How a tower runs: which runtime runs the image or the text tower in each mode, chosen in one place.

The candidates are data (:data:`CANDIDATES`): one row per tower, mode and runtime, with the CPU
levels (after the caps, :mod:`.cpu`) where the row is tried, in the order tried. What no row
runs, or what every row fails, the tower's reference runs (:data:`REFERENCE`): torch's image
tower, the numpy text tower.

One check, :func:`agreement`: the candidate's vectors of a sample against the reference's, each
cosine at least the row's floor, and the same vectors when inputs run in other batches (an
update must equal a rebuild). One place that decides, records what passed (:mod:`.memo`, with
the probe vector a reopened tower must reproduce) and says why: :class:`ImageRuntime` (one per
image mode of an encoder) and :func:`choose_text_runtime`.

The runtime asked for, :func:`requested_runtime`: the user's setting, ``CLIPSEARCH_IMAGE_RUNTIME``
or ``CLIPSEARCH_TEXT_RUNTIME`` (docs/performance.md): ``auto`` (the default) walks the rows; the
reference's name runs the reference; a runtime's name runs that runtime where it can, and makes
a failure an error; for texts, ``torch`` sends queries to the backend's own torch tower. A
caller that must force a path (a benchmark, a test) passes it as the ``requested`` argument
instead. ``CLIPSEARCH_TEXT_PATH=torch``, the older name of ``CLIPSEARCH_TEXT_RUNTIME=torch``,
still works with a warning.

For text queries the size of the process decides too: a one-shot command (fewer than
:data:`ONE_SHOT_TEXTS` texts) keeps ``auto`` in fp32 and fp32 on numpy, without importing torch
or onnxruntime (:func:`one_shot_reason`, :func:`text_runtime_refusal`).

An index records what ran (``image_runtime``); a run that adds to it, and image queries against
it, ask for the same runtime first (:meth:`ImageRuntime.follow`), so an index stays uniform and
an indexed image finds itself bit for bit.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ..errors import InvalidArgumentError, ModelLoadError
from . import cpu, memo
from .base import first_line
from .precision import PROBE_TEXTS
from .runtime import ORT_INSTALL, RuntimeUnavailable
from .runtime.image import RUNTIMES, Runtime, Tower

if TYPE_CHECKING:
    import torch

LOG = logging.getLogger(__name__)

TowerKind = Literal["image", "text"]

# A runtime's exact (fp32) tower must agree this closely with the reference, vector by vector.
PARITY_MIN_COSINE = 0.99999
# A reduced tower must agree this closely with torch's tower in the same mode (both approximate fp32).
REDUCED_PARITY_MIN_COSINE = 0.999
# Images of the first batch the image checks run on.
PARITY_IMAGES = 16


@dataclass(frozen=True)
class Candidate:
    """One row of :data:`CANDIDATES`: ``runtime`` may run ``tower``'s ``mode`` on the CPU
    ``levels`` (after the caps; None: every level) where its vectors pass :func:`agreement` at
    ``min_cosine``."""

    tower: TowerKind
    mode: str
    runtime: str
    levels: tuple[str, ...] | None = None
    min_cosine: float = PARITY_MIN_COSINE


# The reduced image modes run on OpenVINO only on the levels where its tower was measured faster
# than torch's and independent of the batch (benchmarks/README.md): bf16 with AMX (the bf16
# inference hint), int8 with AVX-512 VNNI (NNCF int8 weights, activations quantised per row).
# ONNX Runtime quantises a whole batch with one scale, so it never runs a reduced mode.
CANDIDATES: tuple[Candidate, ...] = (
    Candidate("image", "fp32", "openvino"),
    Candidate("image", "fp32", "onnxruntime"),
    Candidate("image", "bf16", "openvino", ("amx",), REDUCED_PARITY_MIN_COSINE),
    Candidate("image", "int8", "openvino", ("avx512_vnni",), REDUCED_PARITY_MIN_COSINE),
    Candidate("text", "fp32", "onnxruntime"),
)
# What runs a tower where no row does.
REFERENCE: dict[TowerKind, str] = {"image": "torch", "text": "numpy"}
# The user's setting of the runtime asked for, per tower (docs/performance.md).
SETTINGS: dict[TowerKind, str] = {"image": "CLIPSEARCH_IMAGE_RUNTIME", "text": "CLIPSEARCH_TEXT_RUNTIME"}
RUNTIME_ENV = SETTINGS["image"]
TEXT_RUNTIME_ENV = SETTINGS["text"]
# What may be asked for beside the rows' runtimes and the reference: texts on the backend's torch tower.
ALSO: dict[TowerKind, tuple[str, ...]] = {"image": (), "text": ("torch",)}
# The older setting of CLIPSEARCH_TEXT_RUNTIME=torch, still read (with a warning).
TEXT_PATH_ENV = "CLIPSEARCH_TEXT_PATH"
# What an index records of the image tower's choice (ImageRuntime.info).
RUNTIME_KEYS: tuple[str, ...] = ("image_runtime", "image_runtime_version", "image_runtime_parity", "image_runtime_note")


def candidates(tower: TowerKind, mode: str | None) -> tuple[Candidate, ...]:
    """The rows of ``tower`` in ``mode``, in the order tried (on every level)."""
    return tuple(c for c in CANDIDATES if c.tower == tower and c.mode == mode)


def runtime_modes(tower: TowerKind) -> tuple[str, ...]:
    """The modes some runtime other than the reference may run."""
    return tuple(dict.fromkeys(c.mode for c in CANDIDATES if c.tower == tower))


def choices(tower: TowerKind) -> tuple[str, ...]:
    """What may be asked for: ``auto``, the reference, or a runtime of some row."""
    return ("auto", REFERENCE[tower], *dict.fromkeys(c.runtime for c in CANDIDATES if c.tower == tower), *ALSO[tower])


def tried_here(mode: str) -> bool:
    """Whether ``auto`` tries a runtime for ``mode``'s image tower on this CPU (after the caps)."""
    return any(c.levels is None or cpu.cpu_level() in c.levels for c in candidates("image", mode))


def requested_runtime(tower: TowerKind, requested: str | None = None) -> str:
    """The runtime asked for ``tower``: ``requested`` when given, else the user's setting
    (``auto`` when unset).

    Raises:
        InvalidArgumentError: an unknown value.
    """
    setting = SETTINGS[tower]
    value = (requested if requested is not None else os.environ.get(setting, "")).strip().lower() or "auto"
    if tower == "text" and requested is None and value == "auto" and os.environ.get(TEXT_PATH_ENV, "").strip().lower() == "torch":
        warnings.warn(f"{TEXT_PATH_ENV}=torch is deprecated; set {TEXT_RUNTIME_ENV}=torch instead", FutureWarning, stacklevel=2)
        return "torch"
    known = choices(tower)
    if value not in known:
        what = "a runtime" if tower == "image" else "a text runtime"
        raise InvalidArgumentError(f"{setting}={value!r} is not {what}; use one of {', '.join(known)}")
    return value


@dataclass(frozen=True)
class Agreement:
    """What :func:`agreement` found: the figures, and why the candidate fails (None: it passes)."""

    figures: dict[str, float]
    failure: str | None = None


def agreement(
    label: str, what: str, against: str, reference: np.ndarray, candidate: np.ndarray, min_cosine: float,
    drift: Callable[[], float] = lambda: 0.0,
) -> Agreement:
    """The one check of a candidate tower: each of its normalised vectors of a sample has cosine
    at least ``min_cosine`` to the reference's (``against``), and ``drift()`` (the largest change
    of a vector when its input runs in another batch) is 0.

    ``label`` and ``what`` name the candidate in the failure (``OpenVINO``, ``fp32 vectors``).
    """
    cos = np.sum(reference.astype(np.float64) * candidate.astype(np.float64), axis=1)
    figures = {"mean_cosine": round(float(cos.mean()), 7), "min_cosine": round(float(cos.min()), 7)}
    if not float(cos.min()) >= min_cosine:  # also catches NaN
        return Agreement(figures, f"{label}'s {what} differ from {against}'s (min cosine {cos.min():.7f} < {min_cosine})")
    moved = drift()
    if moved:
        return Agreement(
            figures,
            f"{label}'s {what} change with the batch on this CPU (by up to {moved:.1e}), so an update would not equal a rebuild",
        )
    return Agreement(figures)


def batch_drift(tower: Tower, sample: torch.Tensor, together: np.ndarray) -> float:
    """The largest change of an image's vector when it runs in another batch: the first image
    alone, the last three in reverse order (another batch size, other positions) and, for a
    sample of fewer than :data:`PARITY_IMAGES` images, the sample repeated to that many (kernels
    are picked by the batch size). 0.0 where the runtime's kernels do not depend on the batch."""
    n = len(sample)
    tail = slice(max(0, n - 3), n)
    probes = [(sample[:1], together[:1]), (sample[tail].flip(0), together[tail][::-1])]
    if n < PARITY_IMAGES:
        copies = -(-PARITY_IMAGES // n)
        probes.append((sample.repeat(copies, 1, 1, 1), np.tile(together, (copies, 1))))
    return max(float(np.abs(tower(images) - expected).max()) for images, expected in probes)


# -- the image tower ---------------------------------------------------------------------------


class ImageRuntime:
    """One encoder's choice of runtime for one mode of its image tower, made on first use.

    Args:
        model_name: the model's name (for messages).
        export: ``() -> Path`` of the cached ONNX export (made on first call).
        applies: False where only torch can run the tower (CUDA, NaFlex, another backend).
        mode: ``fp32``, ``bf16`` or ``int8``.
        int8_group: input features per activation scale of an int8 tower (the model's width).
        requested: the runtime asked for, overriding the user's setting (:func:`requested_runtime`).
    """

    def __init__(self, model_name: str, export: Callable[[], Any], applies: bool, mode: str = "fp32",
                 int8_group: int = 0, requested: str | None = None) -> None:
        self.model_name = model_name
        self._export = export
        self.applies = applies
        self.mode = mode
        self.int8_group = int8_group
        self.requested = requested
        self.name: str | None = None  # "torch", "openvino" or "onnxruntime" once chosen
        self.note: str | None = None
        self.parity: dict[str, float] | None = None
        self.recorded: str | None = None
        self._tower: Tower | None = None

    def reset(self) -> None:
        """Forget the choice (the input size changed: another export)."""
        self.name, self.note, self.parity, self._tower = None, None, None, None

    def follow(self, recorded: str | None) -> None:
        """Ask first for the runtime an index's vectors came from (its ``image_runtime``;
        ``torch`` for an index from before runtimes were recorded), unless the setting names
        one. None: no index to match, the usual order."""
        if recorded != self.recorded:
            self.recorded = recorded
            self.reset()

    def _plan(self) -> tuple[list[str], bool]:
        """The runtimes to try, in order (none: torch), and whether a failure is an error."""
        order = [c.runtime for c in candidates("image", self.mode)]
        choice = requested_runtime("image", self.requested)
        if choice == "torch":
            return [], False
        if choice != "auto":
            if choice not in order:
                return [], False  # ONNX Runtime named: it runs the fp32 tower only, reduced modes stay on torch
            if not self.applies:
                raise ModelLoadError(
                    f"{RUNTIME_ENV}={choice}: {RUNTIMES[choice].label} runs only the image tower of a Hugging "
                    f"Face CLIP or SigLIP FixRes model on the CPU ({self.model_name} here is not one)"
                )
            return [choice], True
        if not self.applies or self.recorded == "torch" or not tried_here(self.mode):
            return [], False
        if self.recorded in order:
            return [self.recorded, *(name for name in order if name != self.recorded)], False
        return order, False

    @property
    def pending(self) -> bool:
        """Whether the choice is still to be made on a sample of images: not made yet, and not
        settled without one (torch asked for, or a tower no other runtime runs)."""
        return self.name is None and self.applies and bool(self._plan()[0])

    def tower(self, pixel_values: torch.Tensor, torch_embed: Callable[[torch.Tensor], np.ndarray]) -> Tower | None:
        """The tower to run batches of this mode on, or None for torch; chosen on the first
        call, with ``pixel_values`` (its first images) for the checks against ``torch_embed``
        (the torch tower's normalised vectors in this mode).

        Raises:
            ModelLoadError: with a runtime asked for by name, that runtime cannot be used (the
                message says why: the package to install, the failed export, the failed check).
        """
        if self.name is not None:
            return self._tower
        planned, strict = self._plan()
        sample = pixel_values[:PARITY_IMAGES]
        reference: list[tuple[np.ndarray, float]] = []

        def torch_vectors() -> tuple[np.ndarray, float]:
            if not reference:
                t0 = time.perf_counter()
                reference.append((torch_embed(sample), time.perf_counter() - t0))
            return reference[0]

        reasons: list[str] = []
        for name in planned:
            runtime = RUNTIMES[name]
            outcome = self._try(runtime, sample, torch_vectors)
            if isinstance(outcome, str):
                if strict:
                    raise ModelLoadError(f"{RUNTIME_ENV}={name}: {outcome}")
                reasons.append(outcome)
                continue
            self.name, self._tower = name, outcome
            if self.recorded is not None and self.recorded != name:
                why = "; ".join(reasons) if self.recorded in RUNTIMES else "this version does not know it"
                self.note = f"the index's vectors came from {self.recorded}, which cannot run here: {why}"
                LOG.warning("%s image tower of %s runs on %s: %s", self.mode, self.model_name, runtime.label, self.note)
            else:
                # A runtime that is not installed is worth a word only when nothing else runs.
                failed = [r for r in reasons if " is not installed" not in r]
                self.note = "; ".join(failed) or None
                if failed:
                    LOG.info("%s image tower of %s runs on %s: %s", self.mode, self.model_name, runtime.label, self.note)
            return outcome
        self.name = "torch"
        if self.recorded in RUNTIMES:
            # The index's vectors came from another tower: the new ones will differ a little.
            self.note = f"the index's vectors came from {self.recorded}, which cannot run here: {'; '.join(reasons)}"
            LOG.warning("%s image tower of %s runs on torch: %s", self.mode, self.model_name, self.note)
        elif reasons:
            self.note = "; ".join(reasons)
            # torch's int8 tower is a fast path of its own: a missing OpenVINO is no cause for alarm there.
            level = logging.WARNING if self.mode == "fp32" else logging.INFO
            LOG.log(level, "%s image tower of %s runs on torch: %s", self.mode, self.model_name, self.note)
        return None

    def _try(self, runtime: Runtime, sample: torch.Tensor, torch_vectors: Callable[[], tuple[np.ndarray, float]]) -> Tower | str:
        """``runtime``'s tower where it passes :func:`agreement`, else why not (one line)."""
        missing = runtime.missing_for(self.mode)
        if missing is not None:
            return f"{runtime.name} is not installed ({missing}); for the faster {self.mode} path: {runtime.install}"
        try:
            export = Path(self._export())
            tower = runtime.load(export, self.mode, self.int8_group)
        except ModelLoadError as exc:
            return str(exc)
        reference, torch_seconds = torch_vectors()
        t0 = time.perf_counter()
        vectors = tower(sample)
        seconds = time.perf_counter() - t0
        row = next(c for c in candidates("image", self.mode) if c.runtime == runtime.name)
        found = agreement(runtime.label, f"{self.mode} vectors", "torch", reference, vectors, row.min_cosine,
                          lambda: batch_drift(tower, sample, vectors))
        if found.failure is not None:
            return found.failure
        self.parity = {
            "images": len(sample), **found.figures,
            "torch_seconds": round(torch_seconds, 3), f"{runtime.name}_seconds": round(seconds, 3),
        }
        self._remember(runtime, export, tower, int(sample.shape[-1]))
        return tower

    def _remember(self, runtime: Runtime, export: Path, tower: Tower, image_size: int) -> None:
        """Keep the pass (:mod:`.memo`), so that a query process can reopen this tower without
        torch's; with the tower's probe vector, which that process must reproduce bit for bit."""
        assert self.parity is not None
        key = memo.check_key(runtime.name, runtime.version(), self.mode, runtime.tower_file(export, self.mode))
        probe = tower(memo.probe_pixels(image_size))[0]
        memo.record_check(key, memo.PassedChecks(dict(self.parity), probe, self.int8_group if self.mode == "int8" else 0))

    def info(self) -> dict[str, Any]:
        """What an index records (``image_runtime`` and its details), once chosen, or where
        nothing is left to choose (torch asked for, or a tower only torch runs)."""
        if self.name is None:
            try:
                settled = not self._plan()[0]
            except (InvalidArgumentError, ModelLoadError):
                return {}  # the choice will raise when the tower runs, and say why
            return {"image_runtime": "torch"} if settled else {}
        data: dict[str, Any] = {"image_runtime": self.name}
        if self.name in RUNTIMES:
            data["image_runtime_version"] = RUNTIMES[self.name].version()
            if self.mode == "int8":
                data["int8_activation_bits"] = 8  # the runtime's own codes, whatever torch's kernel would use
        if self.parity is not None:
            data["image_runtime_parity"] = self.parity
        if self.note:
            data["image_runtime_note"] = self.note
        return data


class ImageRuntimes:
    """An encoder's runtime choices, one per mode a runtime may run (:func:`runtime_modes`).

    Args: as :class:`ImageRuntime`'s, less the mode.
    """

    def __init__(self, model_name: str, export: Callable[[], Any], applies: bool, int8_group: int = 0,
                 requested: str | None = None) -> None:
        self._export = export
        self.by_mode = {mode: ImageRuntime(model_name, export, applies, mode, int8_group, requested)
                        for mode in runtime_modes("image")}

    def export(self) -> Path:
        """The cached ONNX export every runtime's tower is made from (made on first call)."""
        return Path(self._export())

    def get(self, mode: str | None) -> ImageRuntime | None:
        """The choice for ``mode``; None for a mode only torch runs (fp16)."""
        return self.by_mode.get(mode or "")

    def follow(self, recorded: str | None, precision: str | None = None) -> None:
        """Ask first for the runtime an index's vectors came from, for the mode they were made
        in (``precision``; None: every mode); the other modes keep the usual order."""
        for mode, runtime in self.by_mode.items():
            runtime.follow(recorded if precision in (None, mode) else None)

    def follow_as(self, other: ImageRuntimes) -> None:
        """Ask first, per mode, for what ``other`` was asked to follow (the same encoder's
        choices for another input size)."""
        for mode, runtime in self.by_mode.items():
            runtime.follow(other.by_mode[mode].recorded)

    def pending(self, mode: str | None) -> bool:
        """Whether ``mode``'s choice is still to be made on a sample of images."""
        runtime = self.get(mode)
        return runtime is not None and runtime.pending

    def info(self, mode: str | None) -> dict[str, Any]:
        """What an index of ``mode`` records (``image_runtime`` and its details), once chosen."""
        runtime = self.get(mode)
        return runtime.info() if runtime is not None else {}


# -- the text tower ----------------------------------------------------------------------------

# Below this many text queries in a process (a one-shot command), ``auto`` keeps the text tower in
# fp32 and fp32 stays on numpy: int8 needs torch imported and the tower quantised first, ONNX
# Runtime its export loaded and checked, which costs more than either saves on so few texts (the
# break-even is measured in benchmarks/README.md).
ONE_SHOT_TEXTS = 256


def _few(text_queries: int) -> str:
    queries = "1 text query" if text_queries == 1 else f"{text_queries} text queries"
    return f"{queries} in this process (fewer than {ONE_SHOT_TEXTS})"


def one_shot_reason(precision: str, text_queries: int | None) -> str | None:
    """Why ``auto`` stays fp32 in a process that will run only ``text_queries`` texts (None: the
    rule does not apply: another precision, a long-lived process, or enough texts)."""
    if precision != "auto" or text_queries is None or text_queries >= ONE_SHOT_TEXTS:
        return None
    return f"{_few(text_queries)}: int8 would first import torch and quantise the tower, which costs more than it saves on so few"


def text_runtime_refusal(text_queries: int | None, check_package: bool = True, requested: str | None = None) -> str | None:
    """Why the exact (fp32) text tower would stay on numpy rather than ONNX Runtime, judged
    without loading anything (None: ONNX Runtime may run it, export and check allowing);
    ``check_package``: also whether onnxruntime is installed (without importing it).

    Raises:
        InvalidArgumentError: an unknown runtime asked for.
    """
    choice = requested_runtime("text", requested)
    if choice == "numpy":
        return f"{TEXT_RUNTIME_ENV}=numpy"
    if choice == "auto" and text_queries is not None and text_queries < ONE_SHOT_TEXTS:
        return f"{_few(text_queries)}: ONNX Runtime would first load and check its export, which costs more than it saves on so few"
    if check_package and importlib.util.find_spec("onnxruntime") is None:
        return f"onnxruntime is not installed; for the faster exact path: {ORT_INSTALL}"
    return None


@dataclass
class TextRuntime:
    """What runs the fp32 text tower and why.

    Attributes:
        name: ``numpy`` or ``onnxruntime``.
        note: why numpy runs it (None when ONNX Runtime does).
        parity: the check's figures when it ran (texts, cosines, seconds per runtime).
        version: onnxruntime's version when it runs the tower.
        tried: whether ONNX Runtime was tried (False: refused before, by the setting, the
            one-shot rule or the package not being installed).
    """

    name: str = "numpy"
    note: str | None = None
    parity: dict[str, float] = field(default_factory=dict)
    version: str | None = None
    tried: bool = False

    def record(self) -> dict[str, Any]:
        """JSON-able: ``runtime`` and, where there are, ``runtime_note``, ``runtime_parity``,
        ``runtime_version``; empty where ONNX Runtime was not tried (the text path says why)."""
        if not self.tried:
            return {}
        data: dict[str, Any] = {"runtime": self.name}
        if self.note:
            data["runtime_note"] = self.note
        if self.parity:
            data["runtime_parity"] = dict(self.parity)
        if self.version:
            data["runtime_version"] = self.version
        return data


def choose_text_runtime(
    name: str,
    directory: Path,
    fingerprint: Callable[[], str],
    numpy_tower: Any,
    embed: Callable[[Any, Sequence[str]], np.ndarray],
    text_queries: int | None,
    requested: str | None = None,
) -> tuple[Any | None, TextRuntime]:
    """The ONNX Runtime tower to run fp32 text queries on (None: keep ``numpy_tower``), and the record.

    Args:
        name: the model's name (for messages).
        directory: the checkpoint directory (exported from when no export is cached).
        fingerprint: ``() -> str``, the weights' fingerprint (the cache key).
        numpy_tower: the loaded numpy tower (its ``cfg``; the reference).
        embed: ``embed(tower, texts) -> normalised vectors``, the encoder's own loop.
        text_queries: how many texts the process will embed, when it knows.
        requested: the runtime asked for, overriding the user's setting.

    Raises:
        RuntimeUnavailable: with ``onnxruntime`` asked for, ONNX Runtime cannot be used (the
            message says why: the package to install, the failed export or check).
    """
    strict = requested_runtime("text", requested) == "onnxruntime"
    refusal = text_runtime_refusal(text_queries, check_package=False, requested=requested)  # a missing package is warned about below
    if refusal is not None:
        if strict:
            raise RuntimeUnavailable(f"{TEXT_RUNTIME_ENV}=onnxruntime: {refusal}")
        return None, TextRuntime(note=refusal)

    def fall_back(why: str, parity: dict[str, float] | None = None) -> tuple[None, TextRuntime]:
        if strict:
            raise RuntimeUnavailable(f"{TEXT_RUNTIME_ENV}=onnxruntime: {why}")
        LOG.warning("exact text tower of %s runs on numpy: %s", name, why)
        return None, TextRuntime(note=why, parity=parity or {}, tried=True)

    try:
        import onnxruntime
    except ImportError as exc:
        return fall_back(f"{first_line(exc)}; for the faster exact path: {ORT_INSTALL}")
    from .runtime.export import cached_text_export
    from .runtime.ort_text import OrtTextTower

    cfg = numpy_tower.cfg
    try:
        path = cached_text_export(directory, fingerprint(), cfg.max_positions, name, cfg.eos_token_id)
    except ModelLoadError as exc:
        return fall_back(str(exc))
    try:
        tower = OrtTextTower(path, cfg)
    except ModelLoadError as exc:
        # A damaged cache entry: removed, so that the next load exports it again.
        path.unlink(missing_ok=True)
        return fall_back(f"{exc} (removed; the next load exports it again)")
    t0 = time.perf_counter()
    reference = embed(numpy_tower, PROBE_TEXTS)
    t1 = time.perf_counter()
    try:
        vectors = embed(tower, PROBE_TEXTS)
    except Exception as exc:  # noqa: BLE001  (onnxruntime raises its own untyped errors)
        return fall_back(f"ONNX Runtime failed on the probe texts: {first_line(exc)}")
    t2 = time.perf_counter()
    # Each text runs alone at its own length: the first one alone must give its vector again.
    row = candidates("text", "fp32")[0]
    found = agreement("ONNX Runtime", "vectors", "numpy", reference, vectors, row.min_cosine,
                      lambda: float(np.abs(embed(tower, PROBE_TEXTS[:1]) - vectors[:1]).max()))
    parity = {"texts": len(PROBE_TEXTS), **found.figures, "numpy_seconds": round(t1 - t0, 3), "onnxruntime_seconds": round(t2 - t1, 3)}
    if found.failure is not None:
        return fall_back(found.failure, parity)
    return tower, TextRuntime("onnxruntime", None, parity, onnxruntime.__version__, tried=True)


__all__ = [
    "CANDIDATES",
    "ONE_SHOT_TEXTS",
    "PARITY_IMAGES",
    "PARITY_MIN_COSINE",
    "REDUCED_PARITY_MIN_COSINE",
    "REFERENCE",
    "RUNTIME_ENV",
    "RUNTIME_KEYS",
    "SETTINGS",
    "TEXT_PATH_ENV",
    "TEXT_RUNTIME_ENV",
    "Agreement",
    "Candidate",
    "ImageRuntime",
    "ImageRuntimes",
    "TextRuntime",
    "agreement",
    "batch_drift",
    "candidates",
    "choices",
    "choose_text_runtime",
    "one_shot_reason",
    "requested_runtime",
    "runtime_modes",
    "text_runtime_refusal",
    "tried_here",
]
