"""One encoder's choice of runtime for its image tower on the CPU: OpenVINO, ONNX Runtime or torch.

Per mode. The exact tower (``fp32``): tried in order (:data:`ORDERS`), on the first images
the tower sees; the first that installs, loads, matches torch (:data:`~. PARITY_MIN_COSINE`)
and gives every image the same vector whatever its batch (:func:`batch_drift`) runs the tower.
OpenVINO comes first: its fp32 tower ran faster than ONNX Runtime's at ViT-B/32 and ViT-L/14
on the CPUs where it passed the batch check (``benchmarks/README.md``); on the AVX2
host measured its vectors moved with the batch, so there the check hands the tower to ONNX
Runtime.

The reduced modes run on OpenVINO only on the CPU levels where its tower was measured faster
than torch's and independent of the batch (:data:`LEVELS`):

- ``bf16`` with AMX: the fp32 export compiled with the bf16 inference hint (AMX bf16 products);
  torch's bf16 (``autocast``) is slower there and its vectors move with the batch, so an
  ``auto`` build never picks it on the CPU
  (:meth:`retrieval.encoders.precision.PixelPrecisionMixin._auto_passes_over`);
- ``int8`` with AVX-512 VNNI: NNCF int8 weights, activations quantised per row by the plugin
  (:mod:`.ov_tower`). With AMX the same tower's vectors moved with the batch and torch's int8
  path ran faster, so torch's runs it there, as on every other level
  (:mod:`retrieval.encoders.int8`).

A reduced tower must agree with torch's tower in the same mode (:data:`REDUCED_PARITY_MIN_COSINE`)
and pass the same batch check. ONNX Runtime's int8 quantises a whole batch with one scale, so
its vectors move with the batch: it never runs a reduced mode.

An index records what ran (``image_runtime``); a run that adds to it, and image queries
against it, ask for the same runtime first (:meth:`ImageRuntimes.follow`), so an index stays
uniform and an indexed image finds itself bit for bit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import InvalidArgumentError, ModelLoadError
from .. import cpu
from . import (
    ORT_INSTALL,
    OV_INSTALL,
    PARITY_IMAGES,
    PARITY_MIN_COSINE,
    RUNTIME_ENV,
    onnxruntime_missing,
    openvino_int8_missing,
    openvino_missing,
    runtime_choice,
)

if TYPE_CHECKING:
    import torch

LOG = logging.getLogger(__package__)

Tower = Callable[["torch.Tensor | np.ndarray"], np.ndarray]


# A reduced tower must agree this closely with torch's tower in the same mode, image by image
# (both approximate fp32; measured 0.9998 between the int8 towers at ViT-B/32 and ViT-L/14).
REDUCED_PARITY_MIN_COSINE = 0.999


@dataclass(frozen=True)
class Runtime:
    """A runtime that can run an exported image tower in some of the modes."""

    name: str
    label: str
    install: str
    missing: Callable[[], str | None]
    # (export, mode, activation group of an int8 tower) -> the tower in that mode.
    load: Callable[[Path, str, int], Tower]
    version: Callable[[], str]
    modes: tuple[str, ...] = ("fp32",)
    # Why the int8 tower cannot be made here (its extra packages), where it needs more than ``missing``.
    int8_missing: Callable[[], str | None] | None = None
    # export -> the file the int8 tower is made from (what its checks are remembered by).
    int8_file: Callable[[Path], Path] | None = None

    def missing_for(self, mode: str) -> str | None:
        """Why this runtime cannot run ``mode``'s tower here (a package missing), or None."""
        return (self.int8_missing if mode == "int8" and self.int8_missing else self.missing)()

    def tower_file(self, export: Path, mode: str) -> Path:
        """The file ``mode``'s tower runs from: the export, or for int8 the file made from it."""
        return self.int8_file(export) if mode == "int8" and self.int8_file is not None else export


def _ort_tower(path: Path, mode: str, group: int) -> Tower:
    from .ort_tower import OrtImageTower

    return OrtImageTower(path)


def _ort_version() -> str:
    import onnxruntime

    return str(onnxruntime.__version__)


def _ov_tower(path: Path, mode: str, group: int) -> Tower:
    from .ov_tower import OvImageTower, int8_model

    if mode == "int8":
        return OvImageTower(int8_model(path), mode="int8", int8_group=group)
    return OvImageTower(path, mode=mode)


def _ov_version() -> str:
    from .ov_tower import openvino_version

    return openvino_version()


def _ov_int8_file(export: Path) -> Path:
    from .ov_tower import int8_path

    return int8_path(export)


RUNTIMES: dict[str, Runtime] = {
    "openvino": Runtime(
        "openvino", "OpenVINO", OV_INSTALL, openvino_missing, _ov_tower, _ov_version, ("fp32", "bf16", "int8"),
        openvino_int8_missing, _ov_int8_file,
    ),
    "onnxruntime": Runtime("onnxruntime", "ONNX Runtime", ORT_INSTALL, onnxruntime_missing, _ort_tower, _ort_version),
}
# The runtimes tried for each mode, in order; torch after them.
ORDERS: dict[str, tuple[str, ...]] = {"fp32": ("openvino", "onnxruntime"), "bf16": ("openvino",), "int8": ("openvino",)}
AUTO_ORDER = ORDERS["fp32"]
# The CPU levels (after the caps) where a reduced mode's runtime tower is tried: where it was
# measured faster than torch's and its vectors did not move with the batch (benchmarks/README.md).
# bf16 needs AMX (with AVX-512 BF16 alone bf16 products ran slower than fp32 in
# oneDNN); OpenVINO's int8 with AMX moved with the batch, and torch's int8 ran faster there.
LEVELS: dict[str, tuple[str, ...]] = {"bf16": ("amx",), "int8": ("avx512_vnni",)}
# The modes a runtime other than torch may run.
RUNTIME_MODES: tuple[str, ...] = tuple(ORDERS)
# What an index records of the choice (ImageRuntime.info).
RUNTIME_KEYS: tuple[str, ...] = ("image_runtime", "image_runtime_version", "image_runtime_parity", "image_runtime_note")


def tried_here(mode: str) -> bool:
    """Whether ``auto`` tries a runtime for ``mode``'s tower on this CPU (after the caps)."""
    levels = LEVELS.get(mode)
    return levels is None or cpu.cpu_level() in levels


def batch_drift(tower: Tower, sample: torch.Tensor, together: np.ndarray) -> float:
    """The largest change of a vector when its image runs in another batch: the first image
    alone, the last three in reverse order (another batch size, other positions) and, for a
    sample of fewer than :data:`~.PARITY_IMAGES` images, the sample repeated to that many
    (kernels are picked by the batch size: OpenVINO's int8 tower on AMX gave other vectors to
    batches of up to 4 images than to larger ones). 0.0 where the runtime's kernels do not
    depend on the batch."""
    n = len(sample)
    tail = slice(max(0, n - 3), n)
    probes = [(sample[:1], together[:1]), (sample[tail].flip(0), together[tail][::-1])]
    if n < PARITY_IMAGES:
        copies = -(-PARITY_IMAGES // n)
        probes.append((sample.repeat(copies, 1, 1, 1), np.tile(together, (copies, 1))))
    return max(float(np.abs(tower(images) - expected).max()) for images, expected in probes)


class ImageRuntime:
    """One encoder's choice of runtime for one mode of its image tower, made on first use.

    Args:
        model_name: the model's name (for messages).
        export: ``() -> Path`` of the cached ONNX export (made on first call).
        applies: False where only torch can run the tower (CUDA, NaFlex, another backend).
        mode: ``fp32``, ``bf16`` or ``int8``.
        int8_group: input features per activation scale of an int8 tower (the model's width).
    """

    def __init__(self, model_name: str, export: Callable[[], Any], applies: bool, mode: str = "fp32",
                 int8_group: int = 0) -> None:
        self.model_name = model_name
        self._export = export
        self.applies = applies
        self.mode = mode
        self.int8_group = int8_group
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
        ``torch`` for an index from before runtimes were recorded), unless the environment
        names one. None: no index to match, the usual order."""
        if recorded != self.recorded:
            self.recorded = recorded
            self.reset()

    @property
    def _order(self) -> tuple[str, ...]:
        return ORDERS[self.mode]

    def _plan(self) -> tuple[list[str], bool]:
        """The runtimes to try, in order (none: torch), and whether a failure is an error."""
        choice = runtime_choice()
        if choice == "torch":
            return [], False
        if choice != "auto":
            if choice not in self._order:
                return [], False  # ONNX Runtime named: it runs the fp32 tower only, reduced modes stay on torch
            if not self.applies:
                raise ModelLoadError(
                    f"{RUNTIME_ENV}={choice}: {RUNTIMES[choice].label} runs only the image tower of a Hugging "
                    f"Face CLIP or SigLIP FixRes model on the CPU ({self.model_name} here is not one)"
                )
            return [choice], True
        if not self.applies or self.recorded == "torch":
            return [], False
        if not tried_here(self.mode):
            return [], False  # not measured faster here, or not batch-independent: torch runs the mode
        if self.recorded in self._order:
            return [self.recorded, *(name for name in self._order if name != self.recorded)], False
        return list(self._order), False

    @property
    def first(self) -> str | None:
        """The runtime tried first (None: torch, with nothing to try)."""
        candidates, _ = self._plan()
        return candidates[0] if candidates and self.applies else None

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
            ModelLoadError: with ``CLIPSEARCH_IMAGE_RUNTIME`` naming a runtime, that runtime
                cannot be used (the message says why: the package to install, the failed
                export, the failed check).
        """
        if self.name is not None:
            return self._tower
        candidates, strict = self._plan()
        sample = pixel_values[:PARITY_IMAGES]
        reference: list[tuple[np.ndarray, float]] = []

        def torch_vectors() -> tuple[np.ndarray, float]:
            if not reference:
                t0 = time.perf_counter()
                reference.append((torch_embed(sample), time.perf_counter() - t0))
            return reference[0]

        reasons: list[str] = []
        for name in candidates:
            runtime = RUNTIMES[name]
            outcome = self._try(runtime, sample, torch_vectors)
            if isinstance(outcome, str):
                if strict:
                    raise ModelLoadError(f"{RUNTIME_ENV}={name}: {outcome}")
                # A runtime that is not installed is worth a word only when nothing else runs.
                reasons.append(outcome)
                continue
            self.name, self._tower = name, outcome
            if self.recorded is not None and self.recorded != name:
                why = "; ".join(reasons) if self.recorded in RUNTIMES else "this version does not know it"
                self.note = f"the index's vectors came from {self.recorded}, which cannot run here: {why}"
                LOG.warning("%s image tower of %s runs on %s: %s", self.mode, self.model_name, runtime.label, self.note)
            else:
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
        """``runtime``'s tower where it passes every check, else why not (one line)."""
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
        candidate = tower(sample)
        seconds = time.perf_counter() - t0
        cos = np.sum(reference.astype(np.float64) * candidate.astype(np.float64), axis=1)
        floor = PARITY_MIN_COSINE if self.mode == "fp32" else REDUCED_PARITY_MIN_COSINE
        if float(cos.min()) < floor:
            return f"{runtime.label}'s {self.mode} vectors differ from torch's (min cosine {cos.min():.7f} < {floor})"
        drift = batch_drift(tower, sample, candidate)
        if drift:
            return (
                f"{runtime.label}'s {self.mode} vectors change with the batch on this CPU (by up to {drift:.1e}), "
                "so an update would not equal a rebuild"
            )
        self.parity = {
            "images": len(sample), "mean_cosine": round(float(cos.mean()), 7), "min_cosine": round(float(cos.min()), 7),
            "torch_seconds": round(torch_seconds, 3), f"{runtime.name}_seconds": round(seconds, 3),
        }
        self._remember(runtime, export, tower, int(sample.shape[-1]))
        return tower

    def _remember(self, runtime: Runtime, export: Path, tower: Tower, image_size: int) -> None:
        """Keep the pass (:mod:`.checks`), so that a query process can reopen this tower without
        torch's; with the tower's probe vector, which that process must reproduce bit for bit."""
        from . import checks

        assert self.parity is not None
        key = checks.check_key(runtime.name, runtime.version(), self.mode, runtime.tower_file(export, self.mode))
        probe = tower(checks.probe_pixels(image_size))[0]
        checks.record(key, checks.PassedChecks(dict(self.parity), probe, self.int8_group if self.mode == "int8" else 0))

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
    """An encoder's runtime choices, one per mode a runtime may run (:data:`RUNTIME_MODES`).

    Args: as :class:`ImageRuntime`'s, less the mode.
    """

    def __init__(self, model_name: str, export: Callable[[], Any], applies: bool, int8_group: int = 0) -> None:
        self._export = export
        self.by_mode = {mode: ImageRuntime(model_name, export, applies, mode, int8_group) for mode in RUNTIME_MODES}

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


__all__ = [
    "AUTO_ORDER",
    "LEVELS",
    "ORDERS",
    "REDUCED_PARITY_MIN_COSINE",
    "RUNTIMES",
    "RUNTIME_KEYS",
    "RUNTIME_MODES",
    "ImageRuntime",
    "ImageRuntimes",
    "Runtime",
    "batch_drift",
    "tried_here",
]
