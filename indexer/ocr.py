"""Text in the pixels (``index --ocr``): RapidOCR's packaged PP-OCR models on ONNX Runtime.

Chosen over Tesseract by word recall and speed on the same rendered signs (benchmarks/bench_ocr.py,
benchmarks/README.md). Runs in the decode workers, on the decoded image, in two steps:

1. **The gate.** The text detector alone looks at a copy downscaled to :data:`GATE_MAX_SIDE` on its
   longer side. Most photos in a library have no text; for them this is all OCR costs (no
   full-size detection, no recognition), and :func:`recognise` returns None.
2. **The full pass**, only where the gate found a box: detection and recognition on the image
   itself (an image over twice :data:`DETECT_MAX_SIDE` is reduced by a whole factor first), so
   text the gate only just saw is read at full size. An image no larger than the gate's size
   skips the gate: the full pass's own detection is then no dearer, and a photo without text
   costs that one pass.

The angle classifier is off (photos are EXIF-oriented). The engine is made once per process, on
first use, with one thread: the decode workers run side by side. An image it cannot read is
indexed without text and counted (its ``note``), never a failed build.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
from PIL import Image

from retrieval.errors import EngineError

# The package that brings the engine, as the one-line error names it.
OCR_PACKAGE = "rapidocr-onnxruntime"
OCR_EXTRA = "pip install 'clipsearch[ocr]'"
# An image over twice this longer side is reduced by a whole factor before OCR (to 960-1919 px).
# RapidOCR 1.4's detector then runs at that size: under limit_type "max" it picks its own limit
# (960, 1500 or 2000) by the image's size, so this is not a cap on detection's size.
DETECT_MAX_SIDE = 960
# The gate's size: the longer side of the copy the detector alone looks at first. The detector's
# cost goes with the pixel count, so a photo without text costs about (GATE_MAX_SIDE / side)^2 of a
# full detection pass, and no recognition. A smaller gate misses small text on large photos (480
# missed most 16 px text on 1440 px photos; 640 found it up to 1919 px): benchmarks/README.md.
GATE_MAX_SIDE = 640
# The detector works on sides rounded to multiples of 32; a gate copy thinner than this (a strip)
# would be rounded away, so such an image goes straight to the full pass, which pads it.
GATE_MIN_SIDE = 32
# Recognised text below this confidence is dropped (RapidOCR's own default).
MIN_SCORE = 0.5
# Decoders that feed OCR decode at least this shorter side (JPEG draft scale), so small text survives.
OCR_MIN_EDGE = 720

_engine: Any = None
_lock = threading.Lock()


def check_engine() -> None:
    """Raises EngineError (one line naming the package) when the OCR engine is not installed."""
    try:
        import rapidocr_onnxruntime  # noqa: F401
    except ImportError as exc:
        raise EngineError(
            f"--ocr needs the OCR engine: {OCR_EXTRA} (installs {OCR_PACKAGE}); it is not importable here ({exc})"
        ) from None


def _get_engine() -> Any:
    global _engine
    with _lock:
        if _engine is None:
            check_engine()
            import logging

            from rapidocr_onnxruntime import RapidOCR

            _engine = RapidOCR(
                det_limit_side_len=DETECT_MAX_SIDE, det_limit_type="max", use_cls=False,
                intra_op_num_threads=1, inter_op_num_threads=1, text_score=MIN_SCORE,
            )
            logging.getLogger("RapidOCR").setLevel(logging.ERROR)  # it logs every call's warnings
        return _engine


def recognise(image: Image.Image) -> str | None:
    """The text in ``image`` (lines in reading order, joined by newlines), None when there is none.

    The detector first looks at a copy downscaled to :data:`GATE_MAX_SIDE`; only where it finds
    a text box does the full pass (detection and recognition at full size) run.

    Raises:
        EngineError: the engine is not installed.
        Exception: whatever the engine raises on this image (callers count it and go on).
    """
    engine = _get_engine()
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    if max(rgb.size) > 2 * DETECT_MAX_SIDE:
        # Cheap integer reduce first: the engine would resize the full image on every call.
        rgb = rgb.reduce(max(rgb.size) // DETECT_MAX_SIDE)
    gate = _gate_size(rgb.size)
    if gate is not None and not _gate_finds_text(engine, rgb.resize(gate, Image.Resampling.BILINEAR)):
        return None
    result, _ = engine(_bgr(rgb), use_cls=False)
    lines = [str(r[1]).strip() for r in (result or []) if len(r) > 2 and float(r[2]) >= MIN_SCORE]
    text = "\n".join(t for t in lines if t)
    return text or None


def _gate_size(size: tuple[int, int]) -> tuple[int, int] | None:
    """The gate's copy's size, or None where the gate would not be cheaper or would not see."""
    if max(size) <= GATE_MAX_SIDE:
        return None  # the full pass's detection costs no more than the gate's
    scale = GATE_MAX_SIDE / max(size)
    width, height = round(size[0] * scale), round(size[1] * scale)
    if min(width, height) < GATE_MIN_SIDE:
        return None  # a strip (a panorama, a line of a scan): the full pass pads it, the gate would not
    return width, height


def _gate_finds_text(engine: Any, small: Image.Image) -> bool:
    """Whether the detector alone finds a text box on ``small``."""
    boxes, _ = engine.text_det(_bgr(small))
    return boxes is not None and len(boxes) > 0


def _bgr(rgb: Image.Image) -> np.ndarray:
    # RapidOCR takes OpenCV's BGR order.
    return np.ascontiguousarray(np.asarray(rgb)[:, :, ::-1])


__all__ = ["DETECT_MAX_SIDE", "GATE_MAX_SIDE", "MIN_SCORE", "OCR_EXTRA", "OCR_MIN_EDGE", "OCR_PACKAGE", "check_engine", "recognise"]
