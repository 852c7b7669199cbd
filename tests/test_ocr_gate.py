"""indexer.ocr's gate: the detector alone on a downscaled copy decides whether the full pass runs.

Real rendered photos (a textured photo-like background, a light sign, DejaVu Sans Bold) through the
real engine; a spy around the engine counts the gate's detector calls and the full passes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from indexer import ocr
from retrieval.keywords import fold


def _font(px: int) -> ImageFont.FreeTypeFont:
    try:
        return ImageFont.truetype("DejaVuSans-Bold.ttf", px)
    except OSError:
        pytest.skip("DejaVuSans-Bold.ttf is not installed (fonts-dejavu-core)")


def _photo(width: int, seed: int = 0) -> Image.Image:
    """A 4:3 photo-like picture without text: a colour with smooth blotches."""
    rng = np.random.default_rng(seed)
    height = width * 3 // 4
    small = np.clip(rng.integers(60, 160, 3) + rng.integers(-40, 40, (height // 8, width // 8, 3)), 0, 255)
    return Image.fromarray(small.astype(np.uint8)).resize((width, height), Image.Resampling.BILINEAR)


def _with_sign(img: Image.Image, text: str, px: int) -> Image.Image:
    """``img`` with ``text`` (``px`` pixels tall) on a light sign, left of centre."""
    draw = ImageDraw.Draw(img)
    font = _font(px)
    x, y = img.width // 20, img.height * 5 // 12
    box = draw.textbbox((x, y), text, font=font)
    draw.rectangle([box[0] - 10, box[1] - 10, box[2] + 10, box[3] + 10], fill=(240, 238, 228))
    draw.text((x, y), text, font=font, fill=(15, 15, 15))
    return img


def _found(words: list[str], text: str | None) -> list[str]:
    # As the keyword side matches OCR text: folded, inside runs without spaces.
    flat = fold(text or "").replace(" ", "").replace("\n", "")
    return [w for w in words if fold(w) in flat]


class _Spy:
    """The real engine, counting direct detector calls (the gate) and full passes."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.gate_shapes: list[tuple[int, ...]] = []
        self.full_passes = 0

    def text_det(self, img: np.ndarray) -> Any:
        self.gate_shapes.append(img.shape)
        return self.engine.text_det(img)

    def __call__(self, img: np.ndarray, **kwargs: Any) -> Any:
        self.full_passes += 1
        return self.engine(img, **kwargs)


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> _Spy:
    spy = _Spy(ocr._get_engine())
    monkeypatch.setattr(ocr, "_get_engine", lambda: spy)
    return spy


def test_a_photo_without_text_costs_only_the_gate(spy: _Spy) -> None:
    assert ocr.recognise(_photo(1200, seed=3)) is None
    # The detector looked once, at the gate's size, and recognition never ran.
    assert [max(s[:2]) for s in spy.gate_shapes] == [ocr.GATE_MAX_SIDE]
    assert spy.full_passes == 0


def test_rendered_text_passes_the_gate_and_is_read_at_full_size(spy: _Spy) -> None:
    words = ["Tokyo", "Marathon", "2026"]
    text = ocr.recognise(_with_sign(_photo(1000, seed=1), " ".join(words), 32))
    assert _found(words, text) == words
    assert len(spy.gate_shapes) == 1 and spy.full_passes == 1


@pytest.mark.parametrize("px", [16, 20])
def test_small_text_on_a_large_photo_is_still_read(spy: _Spy, px: int) -> None:
    # At the gate's size this text is a fraction of its height; the gate must still see it.
    words = ["Platform", "Bakery", "Museum"]
    text = ocr.recognise(_with_sign(_photo(1200, seed=px), " ".join(words), px))
    assert spy.full_passes == 1, "the gate missed the text"
    assert _found(words, text) == words


def test_an_image_no_larger_than_the_gate_goes_straight_to_the_full_pass(spy: _Spy) -> None:
    # The gate would cost as much as the full pass's own detection: it is left out.
    sign = _with_sign(Image.new("RGB", (360, 120), (235, 235, 225)), "INVOICE 4711", 28)
    assert _found(["INVOICE", "4711"], ocr.recognise(sign)) == ["INVOICE", "4711"]
    assert ocr.recognise(_photo(ocr.GATE_MAX_SIDE)) is None
    assert spy.gate_shapes == [] and spy.full_passes == 2


def test_a_strip_skips_the_gate() -> None:
    # A gate copy thinner than the detector's 32 px step would be rounded away.
    assert ocr._gate_size((ocr.GATE_MAX_SIDE * 40, 400)) is None
    assert ocr._gate_size((ocr.GATE_MAX_SIDE * 2, 200)) == (ocr.GATE_MAX_SIDE, 100)
    assert ocr._gate_size((1200, 900)) == (ocr.GATE_MAX_SIDE, ocr.GATE_MAX_SIDE * 3 // 4)
    assert ocr._gate_size((ocr.GATE_MAX_SIDE, 100)) is None
