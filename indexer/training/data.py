"""The run's data: training pairs decoded and tokenized once, the held-out set, each step's batch.

Pairs whose image cannot be decoded are skipped and reported (through ``warn``), never fatal
unless too few are left.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retrieval.errors import PairsFileError

from .augment import AugmentConfig, decode_training_images, training_batch, validation_pixels
from .contrastive import PairBatch, positive_mask
from .model import LoadedModel
from .pairs import PairsFile, caption_groups
from .validate import ValidationSet, build_validation_set

Log = Callable[[str], None]


def report_skips(pairs: PairsFile, failures: list[Any], warn: Log) -> None:
    """Tell ``warn`` which pairs are left out: bad lines, then undecodable images (the first five)."""
    for line in pairs.skipped_summary():
        warn(line)
    if failures:
        warn(f"{pairs.source}: skipped {len(failures)} pairs whose image cannot be decoded")
        for f in failures[:5]:
            pair = pairs.pairs[f.index]
            warn(f"  {pairs.source}:{pair.line}: {pair.path}: {f.reason}")
        if len(failures) > 5:
            warn(f"  ... and {len(failures) - 5} more")


def data_fingerprint(paths: list[str], captions: list[str]) -> str:
    """Identifies the training pairs (as written), so that a resume notices a changed pairs file."""
    digest = hashlib.sha256()
    for path, caption in zip(paths, captions, strict=True):
        digest.update(f"{path}\0{caption}\n".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


@dataclass(frozen=True)
class TrainingData:
    """The usable training pairs, decoded and tokenized once for the whole run."""

    failures: list[Any]
    images: list[Any]
    tokens: Mapping[str, Any]
    image_groups: Any
    text_groups: Any


def training_data(pairs_file: PairsFile, loaded: LoadedModel, warn: Log) -> TrainingData:
    """Decode the images (skipping, and reporting, those that fail), tokenize the captions.

    Raises:
        PairsFileError: fewer than 2 usable pairs are left.
    """
    import torch

    images, failures = decode_training_images([p.file for p in pairs_file.pairs], loaded.preprocess)
    report_skips(pairs_file, failures, warn)
    keep = [i for i, img in enumerate(images) if img is not None]
    if len(keep) < 2:
        raise PairsFileError(
            f"only {len(keep)} usable pair(s) after decoding the images; training needs at least 2", pairs_file.source
        )
    pairs = [pairs_file.pairs[i] for i in keep]
    captions = [p.caption for p in pairs]
    # Padded once to the longest caption; each batch is cut to its own longest.
    tokens = loaded.tokenizer(captions, padding=True, truncation=True, max_length=loaded.max_length, return_tensors="pt")
    file_ids: dict[Path, int] = {}
    return TrainingData(
        failures=failures,
        images=[images[i] for i in keep],
        tokens=tokens,
        image_groups=torch.tensor([file_ids.setdefault(p.file, len(file_ids)) for p in pairs]),
        text_groups=torch.tensor(caption_groups(captions)),
    )


def validation_data(val_pairs: PairsFile | None, cfg: Any, warn: Log) -> tuple[ValidationSet | None, int]:
    """The held-out set (None without ``--val``) and how many of its pairs were skipped.

    Raises:
        PairsFileError: no validation image can be decoded.
    """
    if val_pairs is None:
        return None, 0
    pixels, failures = validation_pixels([p.file for p in val_pairs.pairs], cfg)
    report_skips(val_pairs, failures, warn)
    ok = [i for i, p in enumerate(pixels) if p is not None]
    if not ok:
        raise PairsFileError("no usable validation pair after decoding the images", val_pairs.source)
    vset = build_validation_set(
        [val_pairs.pairs[i].file for i in ok],
        [val_pairs.pairs[i].caption for i in ok],
        [pixels[i] for i in ok],  # type: ignore[misc]  # ok holds only indices of decoded (non-None) pixels
    )
    return vset, len(val_pairs.skipped) + len(failures)


def make_batch(data: TrainingData, idx: Any, cfg: Any, aug: AugmentConfig, generator: Any, device: Any) -> PairBatch:
    """The pairs ``idx`` of ``data`` as one step's batch on ``device`` (crops drawn from ``generator``)."""
    rows = idx.tolist()
    pixels = training_batch([data.images[i] for i in rows], cfg, aug, generator)
    mask = data.tokens["attention_mask"][idx]
    width = int(mask.sum(dim=1).max())  # drop the padding columns no caption of this batch needs
    return PairBatch(
        pixels=pixels.to(device),
        input_ids=data.tokens["input_ids"][idx][:, :width].to(device),
        attention_mask=mask[:, :width].to(device),
        positives=positive_mask(data.image_groups[idx], data.text_groups[idx]).to(device),
    )


__all__ = [
    "Log", "TrainingData", "data_fingerprint", "make_batch", "report_skips", "training_data", "validation_data",
]  # fmt: skip
