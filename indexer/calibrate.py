"""Precision of a build: resolve ``auto`` on the collection's own images, record it.

``auto`` embeds a small calibration sample (the first images to embed, decoded in-process) in
fp32 and in each reduced candidate, fastest first, and keeps the first that passes the gate
(:mod:`retrieval.encoders.precision`). An update of an index whose manifest records a mode
chosen by ``auto`` reuses that mode without calibrating again. Another explicit mode on update
is allowed (its vectors agree with fp32's within the gate) and recorded: ``model_info`` keeps
``precision`` (this run's mode) and ``precisions`` (every mode the index's runs embedded with).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from retrieval.encoders import Encoder
from retrieval.encoders.precision import (
    CALIBRATION_IMAGES,
    Precision,
    gate_results_from_info,
    parse_mode,
    parse_precision,
)
from retrieval.encoders.runtime.image import RUNTIME_KEYS
from retrieval.errors import InvalidArgumentError

from .dataset import ImageDataset, collate
from .discover import ImageFile
from .shards import ShardReader

# Files tried for a calibration sample: broken files are skipped, a few more are looked at.
SAMPLE_TRIES = 4 * CALIBRATION_IMAGES


def apply_precision(enc: Encoder, precision: Precision) -> None:
    """Set the image precision of an already-loaded encoder (``build_index(encoder=...)``).

    Raises:
        InvalidArgumentError: a mode the device cannot run.
    """
    if precision != enc.image_precision.requested:
        enc.image_precision.request(precision)


def _runtime_pending(enc: Encoder) -> bool:
    """Whether the fp32, bf16 or int8 tower has still to choose its runtime (torch, OpenVINO or ONNX
    Runtime, on the sample, before the manifest records which): backends without that choice
    have none."""
    runtimes = getattr(enc, "image_runtimes", None)
    return runtimes is not None and bool(runtimes.pending(enc.image_precision.mode))


def resolve(
    enc: Encoder,
    previous_info: Mapping[str, Any] | None,
    root: str | os.PathLike[str] | ShardReader,
    files: Sequence[ImageFile],
    *,
    max_pixels: int,
    draft: bool,
    keep_recorded: bool = False,
) -> None:
    """Resolve an ``auto`` image precision before embedding, and for fp32, bf16 and int8 the runtime
    that runs it (on the same sample); a no-op for any other fixed mode.

    With ``keep_recorded`` (no mode asked for) an update of an index asks for the mode its
    manifest records (fp32 for an index from before precision modes), so all its vectors are
    made alike, and asks first for the runtime it records (torch for a bf16 or int8 index from
    before runtimes were recorded for those modes). An update reuses the mode a
    previous ``auto`` run chose; otherwise the first decodable images of ``files`` (up to 16)
    calibrate it. With nothing to embed it stays unresolved.
    """
    tower = enc.image_precision
    prev = previous_info or {}
    runtimes = getattr(enc, "image_runtimes", None)
    if runtimes is not None:
        # New vectors from the runtime the index's came from, so that the index stays uniform.
        # A reduced-mode index from before its runtime was recorded came from torch's tower.
        recorded = prev.get("image_runtime") or ("torch" if prev.get("precision") in ("bf16", "int8") else None)
        runtimes.follow(str(recorded) if recorded else None, str(prev["precision"]) if prev.get("precision") else None)
    if keep_recorded and previous_info is not None:
        try:
            tower.request(parse_precision(str(prev.get("precision_requested") or prev.get("precision") or "fp32")))
        except InvalidArgumentError:
            pass  # e.g. int8 recorded on a CPU run, now on CUDA: the default (auto) decides
    if not files or (tower.mode is not None and not _runtime_pending(enc)):
        return
    recorded = prev.get("precision")
    if tower.mode is None and prev.get("precision_requested") == "auto" and recorded not in (None, "auto"):
        gate = (prev.get("precision_gate") or {}).get("gate")
        try:
            tower.set(parse_mode(str(recorded)), gate_results_from_info(gate))
            if not _runtime_pending(enc):
                return
        except InvalidArgumentError:
            pass  # e.g. int8 recorded on a CPU run, now on CUDA: calibrate anew
    dataset = ImageDataset(root, files[:SAMPLE_TRIES], enc.preprocess, max_pixels=max_pixels, draft=draft)
    good = []
    for i in range(len(dataset)):
        item = dataset[i]
        if item.pixels is not None:
            good.append(item)
            if len(good) == CALIBRATION_IMAGES:
                break
    # Every item of ``good`` holds pixels, so they stack whenever there is one.
    pixels = collate(good).pixels if good else None
    if pixels is not None:
        enc.calibrate_images(pixels)


def model_info(enc_info: Mapping[str, Any], previous_info: Mapping[str, Any] | None, embedded: bool) -> dict[str, Any]:
    """The encoder's info (``enc.info``, from whichever process embedded) plus ``precisions``:
    the modes of this run and of the runs before it."""
    info = dict(enc_info)
    mode = info.get("precision")
    if mode is None:
        return info
    before: list[str] = []
    if previous_info is not None:
        recorded = previous_info.get("precisions")
        if isinstance(recorded, list):
            before = [str(m) for m in recorded]
        else:
            # An index from before precision modes existed holds fp32 vectors.
            before = [str(previous_info.get("precision", "fp32"))]
        if not embedded and previous_info.get("precision") not in (None, "auto"):
            # Nothing embedded now: the index's precision is still the recorded one.
            for key in ("precision", "precision_requested", "precision_gate", "int8_activation_bits", *RUNTIME_KEYS):
                if key in previous_info:
                    info[key] = previous_info[key]
                else:
                    info.pop(key, None)
            mode = info.get("precision")
    modes = set(before)
    if embedded or previous_info is None:
        modes.add(str(mode))
    info["precisions"] = sorted(m for m in modes if m != "auto")
    return info


__all__ = ["SAMPLE_TRIES", "apply_precision", "model_info", "resolve"]
