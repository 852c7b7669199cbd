"""Precision and JPEG decoding of a build: resolve each ``auto`` on the collection's own images, record it.

The precision (:func:`resolve`): ``auto`` runs the quality gate
(:mod:`retrieval.encoders.precision`) on the first images to embed; an update reuses the mode
its manifest records (docs/performance.md, "Precision modes"), and :func:`model_info` keeps
every mode the index's runs used (``precisions``). The decoding (:func:`resolve_decode`):
``auto`` drafts JPEGs only where the sample's draft vectors equal its full-decode vectors within
:data:`DECODE_GATE_MIN_COSINE`, never with precision fp32 (docs/models.md, "JPEG decoding").
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from retrieval.encoders import Encoder
from retrieval.encoders.chooser import RUNTIME_KEYS
from retrieval.encoders.precision import (
    CALIBRATION_IMAGES,
    Precision,
    gate_results_from_info,
    parse_mode,
    parse_precision,
)
from retrieval.errors import InvalidArgumentError

from .build_config import DECODES, DEFAULT_DECODE, Decode
from .dataset import ImageDataset, Item, collate
from .discover import ImageFile
from .shard_reader import ShardReader

# Files tried for a calibration sample: broken files are skipped, a few more are looked at.
SAMPLE_TRIES = 4 * CALIBRATION_IMAGES

# decode auto drafts only where every sample image's draft vector has at least this cosine to its
# full-decode vector. 1e-5 is a hundred times below what the precision gate lets a reduced mode
# move a vector (mean 1e-3), and a hundred times above float32 rounding: a drafted index then
# ranks as a fully decoded one does. Small inputs and squashing resizes fail it (the DCT
# reduction aliases what the antialiased resize would have averaged): those decode in full.
DECODE_GATE_MIN_COSINE = 0.99999


def apply_precision(enc: Encoder, precision: Precision) -> None:
    """Set the image precision of an already-loaded encoder (``build_index(encoder=...)``).

    Raises:
        InvalidArgumentError: a mode the device cannot run.
    """
    if precision != enc.image_precision.requested:
        enc.image_precision.request(precision)


def resolve(
    enc: Encoder,
    previous_info: Mapping[str, Any] | None,
    root: str | os.PathLike[str] | ShardReader,
    files: Sequence[ImageFile],
    *,
    max_pixels: int,
    draft: bool = False,
    keep_recorded: bool = False,
) -> list[Item]:
    """Resolve an ``auto`` image precision before embedding, and for fp32, bf16 and int8 the runtime
    that runs it (on the same sample); a no-op for any other fixed mode. Returns the sample it
    calibrated on (decoded as ``draft`` says; empty where it decoded none), for
    :func:`resolve_decode` to gate on without decoding it again.

    With ``keep_recorded`` (no mode asked for) an update of an index asks for the mode its
    manifest records (fp32 for an index from before precision modes), so all its vectors are
    made alike, and asks first for the runtime it records (torch for a bf16 or int8 index from
    before runtimes were recorded for those modes). An update reuses the mode a
    previous ``auto`` run chose; otherwise the first decodable images of ``files`` (up to 16),
    decoded in full unless ``draft``, calibrate it. With nothing to embed it stays unresolved.
    """
    tower = enc.image_precision
    prev = previous_info or {}
    # New vectors from the runtime the index's came from, so that the index stays uniform.
    # A reduced-mode index from before its runtime was recorded came from torch's tower.
    recorded = prev.get("image_runtime") or ("torch" if prev.get("precision") in ("bf16", "int8") else None)
    enc.follow_image_runtime(str(recorded) if recorded else None, str(prev["precision"]) if prev.get("precision") else None)
    if keep_recorded and previous_info is not None:
        try:
            tower.request(parse_precision(str(prev.get("precision_requested") or prev.get("precision") or "fp32")))
        except InvalidArgumentError:
            pass  # e.g. int8 recorded on a CPU run, now on CUDA: the default (auto) decides
    if not files or (tower.mode is not None and not enc.image_runtime_pending()):
        return []
    recorded = prev.get("precision")
    if tower.mode is None and prev.get("precision_requested") == "auto" and recorded not in (None, "auto"):
        gate = (prev.get("precision_gate") or {}).get("gate")
        try:
            tower.set(parse_mode(str(recorded)), gate_results_from_info(gate))
            if not enc.image_runtime_pending():
                return []
        except InvalidArgumentError:
            pass  # e.g. int8 recorded on a CPU run, now on CUDA: calibrate anew
    good = _sample(enc, root, files, max_pixels, draft)
    # Every item of ``good`` holds pixels, so they stack whenever there is one.
    pixels = collate(good).pixels if good else None
    if pixels is not None:
        enc.calibrate_images(pixels)
    return good


def _sample(
    enc: Encoder, root: str | os.PathLike[str] | ShardReader, files: Sequence[ImageFile], max_pixels: int, draft: bool,
    among: Sequence[int] | None = None,
) -> list[Item]:
    """The first decodable images (up to :data:`CALIBRATION_IMAGES`) of the first
    :data:`SAMPLE_TRIES` ``files`` (of the items at ``among`` only, where given), decoded as ``draft`` says."""
    dataset = ImageDataset(root, files[:SAMPLE_TRIES], enc.preprocess, max_pixels=max_pixels, draft=draft)
    good = []
    for i in among if among is not None else range(len(dataset)):
        item = dataset[i]
        if item.pixels is not None:
            good.append(item)
            if len(good) == CALIBRATION_IMAGES:
                break
    return good


@dataclass(frozen=True)
class DecodeChoice:
    """How a run decodes JPEGs: what was asked (``requested``), what that decided (``draft``),
    and for ``auto`` the gate's figures or why no gate ran (``gate``)."""

    requested: Decode
    draft: bool
    gate: Mapping[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """What the manifest's ``preprocess`` records (beside the preprocessing settings)."""
        data: dict[str, Any] = {"jpeg_draft": self.draft, "decode": self.requested}
        if self.gate:
            data["decode_gate"] = dict(self.gate)
        return data

    @classmethod
    def from_record(cls, data: Mapping[str, Any] | None) -> DecodeChoice | None:
        """The choice a manifest's ``preprocess`` records; None for one from before ``decode``
        existed, or junk."""
        if data is None or data.get("decode") not in DECODES or not isinstance(data.get("jpeg_draft"), bool):
            return None
        gate = data.get("decode_gate")
        return cls(data["decode"], data["jpeg_draft"], dict(gate) if isinstance(gate, Mapping) else {})


def decode_request(given: Decode | None, recorded: Mapping[str, Any] | None) -> Decode:
    """The decoding a run asks for: ``given`` (``BuildConfig.decode``), else what the index
    records (``preprocess`` of its manifest), else ``auto``. An index from before the choice
    existed drafted its JPEGs unless it recorded ``"jpeg_draft": false``."""
    if given is not None:
        return given
    if recorded is None:
        return DEFAULT_DECODE
    choice = DecodeChoice.from_record(recorded)
    if choice is not None:
        return choice.requested
    return "full" if recorded.get("jpeg_draft") is False else "draft"


def resolve_decode(
    enc: Encoder,
    root: str | os.PathLike[str] | ShardReader,
    files: Sequence[ImageFile],
    *,
    requested: Decode,
    recorded: Mapping[str, Any] | None,
    max_pixels: int,
    sample: Sequence[Item] = (),
) -> DecodeChoice:
    """Decide whether this run drafts JPEGs. ``full`` and ``draft`` decide alone; ``auto``
    decodes in full with precision fp32, else reuses an ``auto`` decision the index records for
    the same precision, else gates: the first decodable images of ``files`` (the precision's
    calibration sample) are embedded from full and from draft decoding, and draft is used only
    if every cosine is at least :data:`DECODE_GATE_MIN_COSINE`. Call it after the precision is
    resolved (:func:`resolve`), passing the ``sample`` it returns (decoded in full): the gate
    then decodes it in draft only. With nothing to embed an ``auto`` keeps the recorded
    decision, else decodes in full.
    """
    if requested != "auto":
        return DecodeChoice(requested, requested == "draft")
    before = DecodeChoice.from_record(recorded)
    if before is not None and before.requested != "auto":
        before = None
    full = list(sample)
    if not full and enc.image_precision.mode is None and files:
        # Not calibrated yet (a caller that skipped resolve): the precision decides first.
        full = _sample(enc, root, files, max_pixels, draft=False)
        if full:
            enc.calibrate_images(collate(full).pixels)  # type: ignore[arg-type]  # items with pixels stack
    mode = enc.image_precision.mode
    if mode == "fp32":
        return DecodeChoice("auto", False, {"reason": "precision fp32: exact, so decoded in full"})
    if before is not None and before.gate.get("precision") == mode and "passed" in before.gate:
        return before
    if not files:
        return before if before is not None else DecodeChoice("auto", False)
    if not full:
        full = _sample(enc, root, files, max_pixels, draft=False)
    if not full:
        return DecodeChoice("auto", False)
    drafted = _sample(enc, root, files, max_pixels, draft=True, among=[it.index for it in full])
    if len(drafted) != len(full):  # a file changed under us: no fair comparison, so no draft
        return DecodeChoice("auto", False, {"reason": "the sample did not decode alike twice"})
    import torch

    # Images draft leaves alone (small ones, most non-JPEGs) have cosine 1 without a model call.
    moved = [i for i, (a, b) in enumerate(zip(full, drafted, strict=True)) if not torch.equal(a.pixels, b.pixels)]  # type: ignore[arg-type]  # sampled items hold pixels
    cos = np.ones(len(full))
    if moved:
        reference = enc.embed_pixels(collate([full[i] for i in moved]).pixels)  # type: ignore[arg-type]  # items with pixels stack
        candidate = enc.embed_pixels(collate([drafted[i] for i in moved]).pixels)  # type: ignore[arg-type]  # as above
        cos[moved] = np.sum(reference.astype(np.float64) * candidate.astype(np.float64), axis=1)
    passed = bool(cos.min() >= DECODE_GATE_MIN_COSINE)
    gate = {
        "samples": len(full),
        "mean_cosine": round(float(cos.mean()), 8),
        "min_cosine": round(float(cos.min()), 8),
        "min_cosine_threshold": DECODE_GATE_MIN_COSINE,
        "precision": enc.image_precision.mode,
        "passed": passed,
    }
    return DecodeChoice("auto", passed, gate)


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


__all__ = [
    "DECODE_GATE_MIN_COSINE",
    "SAMPLE_TRIES",
    "DecodeChoice",
    "apply_precision",
    "decode_request",
    "model_info",
    "resolve",
    "resolve_decode",
]
