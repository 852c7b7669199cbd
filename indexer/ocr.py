"""Text in the pixels (``index --ocr``): RapidOCR's packaged PP-OCR models on ONNX Runtime.

Chosen over Tesseract by word recall and speed on the same rendered signs (benchmarks/bench_ocr.py,
benchmarks/README.md). Runs in the decode workers, on the decoded image: a photo larger than
:data:`DETECT_MAX_SIDE` on its longer side is downscaled for detection (the detector's own
``max`` limit), the angle classifier is off (photos are EXIF-oriented), and a photo with no text
costs one detector pass. The engine is made once per process, on first use, with one thread:
the decode workers run side by side. An image it cannot read is indexed without text and
counted (its ``note``), never a failed build.
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
# Detection runs on the photo downscaled to this longer side (RapidOCR's limit_type "max").
DETECT_MAX_SIDE = 960
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

    Raises:
        EngineError: the engine is not installed.
        Exception: whatever the engine raises on this image (callers count it and go on).
    """
    engine = _get_engine()
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    if max(rgb.size) > 2 * DETECT_MAX_SIDE:
        # Cheap integer reduce first: the engine would resize the full image on every call.
        rgb = rgb.reduce(max(rgb.size) // DETECT_MAX_SIDE)
    # RapidOCR takes OpenCV's BGR order.
    result, _ = engine(np.ascontiguousarray(np.asarray(rgb)[:, :, ::-1]), use_cls=False)
    lines = [str(r[1]).strip() for r in (result or []) if len(r) > 2 and float(r[2]) >= MIN_SCORE]
    text = "\n".join(t for t in lines if t)
    return text or None


__all__ = ["DETECT_MAX_SIDE", "MIN_SCORE", "OCR_EXTRA", "OCR_MIN_EDGE", "OCR_PACKAGE", "check_engine", "recognise"]
