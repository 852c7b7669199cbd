"""An index's image tower reopened on the runtime its vectors came from, without torch's model.

A cold image query would otherwise load torch's tower to check the runtime's against it.
:func:`open_recorded` reopens the tower from the cached files where this machine remembers its
passed checks (:mod:`.memo`) and it reproduces the remembered probe vector bit for bit; else it
says why, and the caller uses the full encoder (docs/performance.md, "Image queries reopen the
recorded tower").
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from ..errors import ModelLoadError
from ..images import DEFAULT_MAX_PIXELS, PreprocessConfig, load_pixels
from ..images.preprocess_numpy import load_pixels_array, numpy_preprocessing
from . import cpu, memo
from .chooser import RUNTIME_ENV, requested_runtime, runtime_modes
from .hf.checkpoint import checkpoint_fingerprint, read_model_type
from .hf.family import FAMILIES, Family
from .image_choice import plan
from .runtime.export import cache_dir, export_key
from .runtime.image import RUNTIMES, Tower, TowerFailed, guarded

if TYPE_CHECKING:
    from pathlib import Path

    import torch

    from ..layout import Manifest


@dataclass(frozen=True)
class RecordedTower:
    """The image half of an encoder, for queries: the index's recorded tower on its runtime
    (an :class:`~.base.ImageQueryEncoder`, as the full encoder is), with what
    :class:`~.query.QueryEncoders` checks of an encoder (family, fingerprint, dim)."""

    name: str
    family: Family
    fingerprint: str
    dim: int
    runtime: str
    mode: str
    tower: Tower
    backend: str = "hf"

    @property
    def family_name(self) -> str:
        return self.family.name

    def embed_pixels(self, pixel_values: torch.Tensor | np.ndarray) -> np.ndarray:
        """``(N, dim)`` L2-normalised float32 vectors of preprocessed images."""
        return self.tower(pixel_values)

    def embed_image(self, source: str | bytes | os.PathLike[str] | BinaryIO, cfg: PreprocessConfig, draft: bool = True) -> np.ndarray:
        """The ``(1, dim)`` vector of an image file, decoded as ``draft`` says (as the index's
        images were) and preprocessed by ``cfg`` in numpy where that is torch's result bit for
        bit (:func:`numpy_pixels`), else in torch.

        Raises:
            ImageDecodeError: the image cannot be decoded.
        """
        if numpy_pixels(cfg):
            return self.tower(load_pixels_array(source, cfg, max_pixels=DEFAULT_MAX_PIXELS, draft=draft)[None])
        pixels, _, _ = load_pixels(source, cfg, max_pixels=DEFAULT_MAX_PIXELS, draft=draft)
        return self.tower(pixels[None])

    def image_query_path(self) -> dict[str, str | None]:
        """This tower on its runtime, and one line for ``info`` on what runs image queries."""
        reason = f"{self.mode} image tower on {RUNTIMES[self.runtime].label}, reopened from its remembered checks"
        return {"tower": "recorded", "runtime": self.runtime, "reason": reason}


def numpy_pixels(cfg: PreprocessConfig) -> bool:
    """Whether :mod:`retrieval.images.preprocess_numpy` gives torch's pixels for ``cfg`` here:
    bicubic everywhere torch's uint8 kernels run; bilinear only where torchvision takes torch's
    native uint8 kernel too (x86 CPUs with AVX2, torch's dispatch not lowered to ``default``),
    as elsewhere it resizes through float32."""
    if not numpy_preprocessing(cfg):
        return False
    if cfg.resample == "bicubic":
        return True
    native = cpu.rank(cpu.detected_level()) >= cpu.rank("avx2")
    return native and os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower() != "default"


def open_recorded(manifest: Manifest, model: str, device: str) -> RecordedTower | str:
    """The index's recorded image tower, reopened without torch's model, or why it cannot be.

    Args:
        manifest: the index's manifest (``model_info`` says the mode, runtime and input size).
        model: the query model (the index's unless another was named).
        device: the device asked for: ``auto`` and ``cpu`` run on the CPU, as the runtimes do.

    Never raises for a tower it cannot reopen: the reason comes back, and the full encoder,
    which raises with the right message where there is one, takes over.
    """
    info: dict[str, Any] = dict(manifest.model_info)
    runtime, mode = info.get("image_runtime"), info.get("precision")
    if manifest.backend != "hf" or model.startswith("open_clip:"):
        return f"{manifest.backend} models embed images with torch"
    if device not in ("auto", "cpu"):
        return f"--device {device} runs images with torch"
    if runtime not in RUNTIMES or mode not in runtime_modes("image"):
        return f"the index's images were embedded with {runtime or 'torch'} in {mode or 'fp32'}"
    if "max_num_patches" in info:
        return "NaFlex towers run on torch"
    choice = requested_runtime("image")
    if choice not in ("auto", runtime):
        return f"{choice} asked for ({RUNTIME_ENV})"
    if plan(mode, runtime)[0][:1] != [runtime]:
        return f"{mode} towers do not run on {runtime} on this CPU"
    spec = RUNTIMES[runtime]
    missing = spec.missing(mode)
    if missing is not None:
        return f"{runtime} is not installed ({missing})"
    try:
        return _reopen(manifest, model, runtime, mode, int(info.get("embed_image_size") or info["image_size"]))
    except (KeyError, TypeError, ValueError) as exc:
        return f"the index's model_info lacks what reopening needs ({exc})"
    except ModelLoadError as exc:
        return str(exc)


def _reopen(manifest: Manifest, model: str, runtime: str, mode: str, image_size: int) -> RecordedTower | str:
    from .hf.checkpoint import cached_checkpoint

    found = cached_checkpoint(model)
    if found is None:
        return f"{model} is not a local checkpoint or in the local Hugging Face cache"
    name, directory = found
    family = FAMILIES.get(read_model_type(directory, name) or "")
    if family is None or family.naflex:
        return f"{name} is not of a family whose towers the runtimes run"
    # Hashing the weights releases the GIL: it runs while the runtime imports.
    with ThreadPoolExecutor(max_workers=1) as pool:
        hashing = pool.submit(checkpoint_fingerprint, directory)
        spec = RUNTIMES[runtime]
        version = spec.version()
        fingerprint = hashing.result()
    if fingerprint != manifest.model_fingerprint:
        return "the query model's weights are not the index's"
    export: Path = cache_dir() / export_key(fingerprint, image_size)
    tower_file = spec.tower_file(export, mode)
    if not (export.is_file() and tower_file.is_file()):
        return f"no cached {mode} tower for {name} at {image_size} px"
    passed = memo.lookup_check(memo.check_key(runtime, version, mode, tower_file))
    if passed is None:
        return f"this machine has no remembered checks of the {mode} tower on {spec.label} at these settings"
    tower = spec.load(export, mode, passed.int8_group)
    try:
        probe = guarded(tower)(memo.probe_pixels(image_size))[0]
    except TowerFailed as failed:
        return f"the {mode} tower on {spec.label} failed on the probe image: {failed}"
    if probe.shape != passed.probe.shape or not np.array_equal(probe, passed.probe):
        return f"the {mode} tower on {spec.label} no longer gives the remembered probe vector"
    return RecordedTower(name, family, fingerprint, int(probe.shape[0]), runtime, mode, tower)


__all__ = ["RecordedTower", "numpy_pixels", "open_recorded"]
