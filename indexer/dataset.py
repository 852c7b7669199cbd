"""Decode and preprocess images in DataLoader workers; failures become skip records.

A worker never raises for a bad file: the item carries the reason instead, and
:func:`collate` separates good images (stacked into one tensor) from failures, so one broken
file cannot end a long run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from retrieval.errors import ImageDecodeError
from retrieval.images import DEFAULT_MAX_PIXELS, PreprocessConfig, load_pixels
from retrieval.layout import display_path

from .discover import ImageFile

if TYPE_CHECKING:
    import torch


@dataclass
class Item:
    """One decoded file (``pixels`` set) or one failure (``error`` set)."""

    index: int
    pixels: torch.Tensor | None
    width: int
    height: int
    error: str | None
    seconds: float


@dataclass
class Batch:
    """A collated batch: good images in order, and the failures of the same slice."""

    indices: list[int]
    pixels: torch.Tensor | None
    widths: list[int]
    heights: list[int]
    failures: list[tuple[int, str]]
    decode_seconds: float


class ImageDataset:
    """Map-style dataset over discovered files: item ``i`` is file ``i`` decoded and preprocessed."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        files: Sequence[ImageFile],
        preprocess: PreprocessConfig,
        *,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        draft: bool = True,
    ) -> None:
        self.root = os.fsencode(root)
        self.files = list(files)
        self.preprocess = preprocess
        self.max_pixels = max_pixels
        self.draft = draft

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> Item:
        rel = self.files[index].rel
        start = time.perf_counter()
        try:
            pixels, width, height = load_pixels(
                os.path.join(self.root, rel),
                self.preprocess,
                max_pixels=self.max_pixels,
                draft=self.draft,
                name=display_path(rel),
            )
        except ImageDecodeError as exc:
            return Item(index, None, 0, 0, exc.reason, time.perf_counter() - start)
        except Exception as exc:  # noqa: BLE001 - a decoder bug on one file must not end the run
            return Item(index, None, 0, 0, f"decode failed: {type(exc).__name__}: {exc}", time.perf_counter() - start)
        return Item(index, pixels, width, height, None, time.perf_counter() - start)


def collate(items: Sequence[Item]) -> Batch:
    """Stack the good items of a batch and list the failures."""
    import torch

    good = [it for it in items if it.pixels is not None]
    return Batch(
        indices=[it.index for it in good],
        pixels=torch.stack([it.pixels for it in good]) if good else None,  # type: ignore[misc]
        widths=[it.width for it in good],
        heights=[it.height for it in good],
        failures=[(it.index, it.error or "unknown error") for it in items if it.pixels is None],
        decode_seconds=sum(it.seconds for it in items),
    )
