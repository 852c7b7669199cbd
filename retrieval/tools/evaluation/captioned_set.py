"""A captioned image set and the image-path rule every loader applies.

Paths are made relative to the images root the indexer is given (an ``image_prefix`` is put in
front of every path, e.g. ``flickr30k-images``) and normalised like ``build_index(files=...)``
does, so that they are exactly the paths the index stores and ``search`` returns.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass, field

from ...errors import DatasetError, InvalidArgumentError


@dataclass(frozen=True)
class CaptionedSet:
    """Images and their captions, with paths relative to the images root.

    Attributes:
        name: dataset name (``coco``, ``flickr30k``, or the caption file's stem).
        split: the split the images were taken from, or None for a whole caption file.
        images: every image of the set (the gallery to index), unique, in order of first
            appearance in the source file; images without captions are distractors.
        captions: ``(image path, caption)`` pairs in file order; every path is in ``images``.
        source: the file the set was read from (for messages).

    Raises:
        DatasetError: duplicate or empty image paths, an empty caption, or a caption whose
            image is not in ``images``.
    """

    name: str
    split: str | None
    images: tuple[str, ...]
    captions: tuple[tuple[str, str], ...]
    source: str = field(default="<captioned set>", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "images", tuple(self.images))
        object.__setattr__(self, "captions", tuple(tuple(pair) for pair in self.captions))
        seen: set[str] = set()
        for path in self.images:
            if not isinstance(path, str) or not path:
                raise DatasetError(self.source, f"image paths must be non-empty strings, got {path!r}")
            if path in seen:
                raise DatasetError(self.source, f"image {path!r} is listed twice")
            seen.add(path)
        for pair in self.captions:
            if len(pair) != 2:
                raise DatasetError(self.source, f"captions must be (image path, caption) pairs, got {pair!r}")
            path, caption = pair
            if path not in seen:
                raise DatasetError(self.source, f"caption {caption!r} names image {path!r}, which is not in images")
            if not isinstance(caption, str) or not caption.strip():
                raise DatasetError(self.source, f"empty caption for image {path!r}")

    @property
    def n_images(self) -> int:
        return len(self.images)

    @property
    def n_captions(self) -> int:
        return len(self.captions)

    def subset(self, paths: Iterable[str], split: str | None = None) -> CaptionedSet:
        """Keep only the images in ``paths`` (and their captions), in this set's order.

        Args:
            paths: image paths as stored in this set; unknown ones are ignored (use
                :func:`apply_split_file` to have them reported).
            split: the split name of the result (default: unchanged).
        """
        keep = set(paths)
        return CaptionedSet(
            name=self.name,
            split=self.split if split is None else split,
            images=tuple(p for p in self.images if p in keep),
            captions=tuple(c for c in self.captions if c[0] in keep),
            source=self.source,
        )


# -- paths -------------------------------------------------------------------------------------


def normalize_image_path(raw: str, prefix: str = "") -> str:
    """``prefix/raw`` as a normalised relative POSIX path, as ``build_index(files=...)`` stores it.

    Raises:
        InvalidArgumentError: empty, absolute, or leaving the images root (``..``); a
            ``ValueError``, so callers that catch ``ValueError`` catch it too.
    """
    if not isinstance(raw, str) or not raw.strip():
        raise InvalidArgumentError(f"image path must be a non-empty string, got {raw!r}")
    if posixpath.isabs(raw) or os.path.isabs(raw):
        raise InvalidArgumentError(f"image path {raw!r} is absolute; paths must be relative to the images root")
    path = posixpath.normpath(posixpath.join(prefix, raw) if prefix else raw)
    if path in (".", "..") or path.startswith("../") or posixpath.isabs(path):
        raise InvalidArgumentError(f"image path {raw!r} (prefix {prefix!r}) is not inside the images root")
    return path


def check_prefix(prefix: str) -> str:
    """A loader's ``image_prefix``, normalised (``""`` for none).

    Raises:
        DatasetError: absolute or leaving the images root.
    """
    if prefix in ("", "."):
        return ""
    # Reuse the path checks: a prefix must itself be a relative path inside the images root.
    try:
        return normalize_image_path(prefix)
    except InvalidArgumentError as exc:
        raise DatasetError("image_prefix", str(exc)) from None


__all__ = ["CaptionedSet", "check_prefix", "normalize_image_path"]
