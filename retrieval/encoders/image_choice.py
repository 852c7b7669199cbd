"""The image tower's choice of runtime: :func:`plan` the runtimes to try for a mode, in order;
:class:`ImageRuntime` (one per mode another runtime may run) tries them on a sample of the
first batch against torch's tower through the chooser's one check
(:func:`~retrieval.encoders.chooser.agreement`, with :func:`batch_drift`), keeps the pass
(:mod:`.memo`) and records it in the index (``image_runtime``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InvalidArgumentError, ModelLoadError
from . import memo
from .chooser import LOG, RUNTIME_ENV, agreement, candidates, requested_runtime, runtime_record, tried_here
from .runtime.image import RUNTIMES, Runtime, Tower, TowerFailed, guarded

if TYPE_CHECKING:
    import torch

# Images of the first batch the image checks run on.
PARITY_IMAGES = 16


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


def plan(mode: str, recorded: str | None = None, requested: str | None = None) -> tuple[list[str], bool]:
    """The runtimes to try for ``mode``'s image tower, in order (none: torch), and whether a
    failure is an error (a runtime asked for by name): the runtime asked for
    (:func:`requested_runtime`), else the rows that apply here, ``recorded`` (the index's
    runtime) first. What the full encoder tries and what an image query reopens
    (:mod:`.recorded_tower`) are decided here alike."""
    order = [c.runtime for c in candidates("image", mode)]
    choice = requested_runtime("image", requested)
    if choice != "auto":
        # torch named, or ONNX Runtime for a reduced mode (it runs the fp32 tower only): torch.
        return ([choice], True) if choice in order else ([], False)
    if recorded == "torch" or not tried_here(mode):
        return [], False
    if recorded in order:
        return [recorded, *(name for name in order if name != recorded)], False
    return order, False


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
        self.export = export
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
        """:func:`plan` for this tower; a runtime asked for by name where only torch runs it is an error."""
        planned, strict = plan(self.mode, self.recorded, self.requested)
        if self.applies:
            return planned, strict
        if strict:
            raise ModelLoadError(
                f"{RUNTIME_ENV}={planned[0]}: {RUNTIMES[planned[0]].label} runs only the image tower of a Hugging "
                f"Face CLIP or SigLIP FixRes model on the CPU ({self.model_name} here is not one)"
            )
        return [], False

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
        chosen: Tower | None = None
        for name in planned:
            outcome = self._try(RUNTIMES[name], sample, torch_vectors)
            if not isinstance(outcome, str):
                chosen = outcome
                break
            if strict:
                raise ModelLoadError(f"{RUNTIME_ENV}={name}: {outcome}")
            reasons.append(outcome)
        self.name, self._tower = (name, chosen) if chosen is not None else ("torch", None)
        label = RUNTIMES[self.name].label if chosen is not None else "torch"
        if self.recorded not in (None, self.name) and (chosen is not None or self.recorded in RUNTIMES):
            # The index's vectors came from another tower: the new ones will differ a little.
            if self.recorded == "torch":  # only a runtime asked for by name moves an index made on torch
                self.note = f"the index's vectors came from torch; {RUNTIME_ENV}={self.name} asks for {label}"
            else:
                why = "; ".join(reasons) if self.recorded in RUNTIMES else "this version does not know it"
                self.note = f"the index's vectors came from {self.recorded}, which cannot run here: {why}"
            level = logging.WARNING
        else:
            # A runtime that is not installed is worth a word only when nothing else runs; and
            # torch's int8 tower is a fast path of its own, no cause for alarm.
            shown = reasons if chosen is None else [r for r in reasons if " is not installed" not in r]
            self.note = "; ".join(shown) or None
            level = logging.WARNING if chosen is None and self.mode == "fp32" else logging.INFO
        if self.note:
            LOG.log(level, "%s image tower of %s runs on %s: %s", self.mode, self.model_name, label, self.note)
        return chosen

    def _try(self, runtime: Runtime, sample: torch.Tensor, torch_vectors: Callable[[], tuple[np.ndarray, float]]) -> Tower | str:
        """``runtime``'s tower where it passes :func:`agreement`, else why not (one line)."""
        missing = runtime.missing(self.mode)
        if missing is not None:
            return f"{runtime.name} is not installed ({missing}); for the faster {self.mode} path: {runtime.install}"
        try:
            export = Path(self.export())
            tower = runtime.load(export, self.mode, self.int8_group)
        except ModelLoadError as exc:
            return str(exc)
        reference, torch_seconds = torch_vectors()
        row = next(c for c in candidates("image", self.mode) if c.runtime == runtime.name)
        checked = guarded(tower)
        try:
            t0 = time.perf_counter()
            vectors = checked(sample)
            seconds = time.perf_counter() - t0
            found = agreement(runtime.label, f"{self.mode} vectors", "torch", reference, vectors, row.min_cosine,
                              lambda: batch_drift(checked, sample, vectors))
            if found.failure is not None:
                return found.failure
            self.parity = {
                "images": len(sample), **found.figures,
                "torch_seconds": round(torch_seconds, 3), f"{runtime.name}_seconds": round(seconds, 3),
            }
            self._remember(runtime, export, checked, int(sample.shape[-1]))
        except TowerFailed as failed:
            self.parity = None
            return f"{runtime.label}'s {self.mode} tower failed on the images of its check: {failed}"
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
        runtime = RUNTIMES.get(self.name)
        data = runtime_record("image_", self.name, runtime.version() if runtime else None, self.parity, self.note)
        if runtime is not None and self.mode == "int8":
            data["int8_activation_bits"] = 8  # the runtime's own codes, whatever torch's kernel would use
        return data


__all__ = ["PARITY_IMAGES", "ImageRuntime", "batch_drift", "plan"]
