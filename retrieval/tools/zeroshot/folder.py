"""Zero-shot evaluation on an ImageFolder layout: ``FOLDER/<class>/.../<image>``.

Metrics as CLIP_benchmark defines them: ``acc1`` and ``acc5`` (top-1 / top-5 accuracy; top-5
only with at least 5 classes) and ``mean_per_class_recall`` (the mean over classes of the
fraction of that class's images predicted as it: balanced accuracy).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import ImageDecodeError, InvalidArgumentError
from ...images import DEFAULT_MAX_PIXELS, IMAGE_EXTENSIONS, load_pixels
from .classifier import ZeroShotClassifier

if TYPE_CHECKING:
    from ...encoders import Encoder


@dataclass(frozen=True)
class ImageFolder:
    """Class names (sorted folder names) and the ``(file, class index)`` samples under them."""

    root: Path
    folders: tuple[str, ...]
    samples: tuple[tuple[Path, int], ...]

    @property
    def labels(self) -> tuple[str, ...]:
        """What the prompts say: the folder names with ``_`` and ``-`` read as spaces."""
        return tuple(" ".join(name.replace("_", " ").replace("-", " ").split()) for name in self.folders)

    @classmethod
    def scan(cls, root: str | os.PathLike[str]) -> ImageFolder:
        """Class folders are the sub-folders of ``root`` (sorted by name, as torchvision's
        ImageFolder does); their images are found recursively, in sorted order.

        Raises:
            InvalidArgumentError: not a folder, fewer than two classes, or a class without images.
        """
        base = Path(root)
        if not base.is_dir():
            raise InvalidArgumentError(f"{root} is not a folder")
        folders = tuple(sorted(p.name for p in base.iterdir() if p.is_dir() and not p.name.startswith(".")))
        if len(folders) < 2:
            raise InvalidArgumentError(f"{root} needs at least two class folders (FOLDER/<class>/<images>), found {len(folders)}")
        samples: list[tuple[Path, int]] = []
        for label, name in enumerate(folders):
            files = sorted(
                p for p in (base / name).rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file()
            )
            if not files:
                raise InvalidArgumentError(f"the class folder {base / name} has no images")
            samples.extend((f, label) for f in files)
        return cls(base, folders, tuple(samples))


@dataclass(frozen=True)
class ZeroShotReport:
    """What ``clipsearch eval-zeroshot --json`` prints."""

    classes: int
    images: int
    skipped: int
    acc1: float
    acc5: float | None
    mean_per_class_recall: float
    chance: float
    templates: int

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.acc5 is None:
            del out["acc5"]
        return out


def zero_shot_metrics(scores: np.ndarray, targets: np.ndarray, classes: int) -> tuple[float, float | None, float]:
    """``(acc1, acc5 or None below 5 classes, mean_per_class_recall)`` of ``(n, classes)`` scores.

    Ties in the top-k are broken by class order (the lower index wins a place).
    """
    scores = np.asarray(scores)
    targets = np.asarray(targets)
    if scores.ndim != 2 or scores.shape != (len(targets), classes) or not len(targets):
        raise InvalidArgumentError(f"scores must have shape (n>0, {classes}) matching {len(targets)} targets, got {scores.shape}")
    order = np.argsort(-scores, axis=1, kind="stable")
    acc1 = float((order[:, 0] == targets).mean())
    acc5 = float((order[:, :5] == targets[:, None]).any(axis=1).mean()) if classes >= 5 else None
    present = np.unique(targets)
    recalls = [float((order[targets == c, 0] == c).mean()) for c in present]
    return acc1, acc5, float(np.mean(recalls))


def evaluate_folder(
    encoder: Encoder, folder: ImageFolder, templates: tuple[str, ...], batch_size: int = 32, query_lang: str | None = None
) -> ZeroShotReport:
    """Classify every image of ``folder`` among its class names and score the predictions.

    ``query_lang``: the prompts' language, as :meth:`ZeroShotClassifier.build`.

    Files that cannot be decoded are left out and counted in ``skipped``.

    Raises:
        InvalidArgumentError: no image of the folder could be decoded.
    """
    import torch

    classifier = ZeroShotClassifier.build(encoder, folder.labels, templates, query_lang)
    all_scores: list[np.ndarray] = []
    targets: list[int] = []
    skipped = 0
    for start in range(0, len(folder.samples), batch_size):
        pixels, labels = [], []
        for path, label in folder.samples[start : start + batch_size]:
            try:
                pixels.append(load_pixels(path, encoder.preprocess, max_pixels=DEFAULT_MAX_PIXELS)[0])
            except ImageDecodeError:
                skipped += 1
                continue
            labels.append(label)
        if pixels:
            all_scores.append(classifier.scores(encoder.embed_pixels(torch.stack(pixels))))
            targets.extend(labels)
    if not targets:
        raise InvalidArgumentError(f"no image under {folder.root} could be decoded")
    acc1, acc5, recall = zero_shot_metrics(np.concatenate(all_scores), np.asarray(targets), len(folder.folders))
    return ZeroShotReport(
        classes=len(folder.folders),
        images=len(targets),
        skipped=skipped,
        acc1=acc1,
        acc5=acc5,
        mean_per_class_recall=recall,
        chance=1.0 / len(folder.folders),
        templates=len(templates),
    )


__all__ = ["ImageFolder", "ZeroShotReport", "evaluate_folder", "zero_shot_metrics"]
