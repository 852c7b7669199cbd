"""OCR for ``index --ocr``: the engines side by side, and what OCR costs a build.

Engines: RapidOCR (``rapidocr-onnxruntime``, PP-OCR models packaged in the wheel; run as
:mod:`indexer.ocr` runs it: the detector alone on a 640 px copy first, the full pass only where
it found text, no angle classifier, one thread) and Tesseract (Debian's ``tesseract-ocr``, through its command line with its default
page segmentation; ``--psm 11``, sparse text, found nothing on these signs). Each reads the same
signs: words drawn with Pillow (DejaVu Sans Bold) on a textured photo-like background (640x480,
or ``--photo-side`` on the longer side) at three text sizes, as PNG and after JPEG quality 75.
A word is found when its folded form appears in the engine's folded output with spaces removed,
as the keyword side matches it (PP-OCR drops spaces, and the keyword side matches inside such
runs; it reads the digit 0 as the letter o, which OCR confuses). Also timed: each engine on
photos without text (the common case in a photo library; RapidOCR's gate, the detector alone on
a downscaled copy, is what they cost).

``--index N``: ``build_index`` images per second on N photos with text and N without, with and
without ``ocr=True``, and with OCR added later to the index built without it (the text read,
nothing embedded again). The model is a tiny random one, so OCR's cost shows;
``--index-preset vit-b-32`` gives the embedding its real share.

Prints one JSON line (machine facts and the rows), then a readable table.

    python benchmarks/bench_ocr.py [--signs 20] [--sizes 16,24,40] [--index 8] [--index-preset tiny|vit-b-32] [--photo-side 640]
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import ROOT
from _harness import Bench

sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from PIL import Image, ImageDraw, ImageFont  # noqa: E402

WORDS = ["INVOICE", "4711", "Tokyo", "Marathon", "2026", "WiFi", "password", "garden42", "Venice", "Gondola", "EXIT",
         "Platform", "Bakery", "Fresh", "Bread", "Museum", "Open", "Daily", "Parking", "Zone", "Hotel", "Central",
         "Station", "Coffee", "Receipt", "Total", "Menu", "Pizza", "Harbour", "Lighthouse"]


def _font(px: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    for name in ("DejaVuSans-Bold.ttf", "/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf"):
        try:
            return ImageFont.truetype(name, px)
        except OSError:
            continue
    return ImageFont.load_default(px)


def _background(rng: np.random.Generator, size: tuple[int, int] = (640, 480)) -> Image.Image:
    w, h = size
    base = rng.integers(60, 160, 3)
    noise = rng.integers(-40, 40, (h // 8, w // 8, 3))
    small = np.clip(base + noise, 0, 255).astype(np.uint8)
    return Image.fromarray(small).resize(size, Image.Resampling.BILINEAR)


def sign(words: list[str], px: int, seed: int, jpeg: bool, side: int = 640) -> Image.Image:
    """A photo-like picture, ``side`` pixels wide (4:3), with ``words`` on a light sign, text ``px`` pixels tall."""
    rng = np.random.default_rng(seed)
    img = _background(rng, (side, side * 3 // 4))
    draw = ImageDraw.Draw(img)
    font = _font(px)
    text = " ".join(words)
    box = draw.textbbox((0, 0), text, font=font)
    x, y = 40, side * 5 // 16
    draw.rectangle([x - 12, y - 12, x + box[2] + 12, y + box[3] + 12], fill=(240, 238, 228))
    draw.text((x, y), text, font=font, fill=(15, 15, 15))
    if jpeg:
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=75)
        img = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    return img


def _rapidocr() -> Callable[[Image.Image], str] | None:
    try:
        from indexer import ocr

        ocr.check_engine()
    except Exception:  # noqa: BLE001 - not installed: a row saying so
        return None
    return lambda img: ocr.recognise(img) or ""


def _tesseract() -> Callable[[Image.Image], str] | None:
    exe = shutil.which("tesseract")
    if exe is None:
        return None

    def run(img: Image.Image) -> str:
        buf = io.BytesIO()
        img.save(buf, "PNG")
        return subprocess.run([exe, "stdin", "stdout"], input=buf.getvalue(), capture_output=True,
                              check=False).stdout.decode("utf-8", "replace")

    return run


ENGINES: dict[str, Callable[[], Callable[[Image.Image], str] | None]] = {"rapidocr": _rapidocr, "tesseract": _tesseract}
PACKAGES = {"rapidocr": "pip install 'clipsearch[ocr]'", "tesseract": "apt-get install tesseract-ocr"}


def _found(words: list[str], text: str) -> int:
    from retrieval.keywords import fold

    flat = fold(text).replace(" ", "").replace("\n", "")
    return sum(fold(w) in flat for w in words)


def compare(signs: int, sizes: list[int], engines: list[str], side: int = 640) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for name in engines:
        run = ENGINES[name]()
        if run is None:
            rows.append({"engine": name, "installed": False, "install": PACKAGES[name]})
            continue
        run(sign(WORDS[:2], 24, 0, False))  # model load, first-call set-up
        for px in sizes:
            for jpeg in (False, True):
                found = total = 0
                seconds = 0.0
                for i in range(signs):
                    words = [WORDS[(i * 3 + j) % len(WORDS)] for j in range(3)]
                    img = sign(words, px, 1000 + i, jpeg, side)
                    t0 = time.perf_counter()
                    text = run(img)
                    seconds += time.perf_counter() - t0
                    found += _found(words, text)
                    total += len(words)
                rows.append({"engine": name, "installed": True, "text_px": px, "jpeg75": jpeg,
                             "word_recall": round(found / total, 3), "images_per_s": round(signs / seconds, 2)})
        blank = [_background(np.random.default_rng(50 + i), (side, side * 3 // 4)) for i in range(max(3, signs // 2))]
        t0 = time.perf_counter()
        for img in blank:
            run(img)
        rows.append({"engine": name, "installed": True, "text_px": 0, "jpeg75": False, "word_recall": None,
                     "images_per_s": round(len(blank) / (time.perf_counter() - t0), 2)})
    return rows


def index_cost(n: int, work: Path, side: int = 640, preset: str = "tiny") -> list[dict[str, Any]]:
    """build_index images/s on n photos with text and n without: without OCR, with it, and with
    it added later to the index built without it (``index --ocr`` again: the text is read, the
    images are not embedded again)."""
    from indexer import build_index
    from retrieval.tools.random_model import make_random_clip

    model = make_random_clip(work / "model", preset=preset, seed=0)
    rows = []
    for kind in ("with_text", "without_text"):
        photos = work / kind
        photos.mkdir()
        for i in range(n):
            img = sign([WORDS[i % len(WORDS)], WORDS[(i + 7) % len(WORDS)]], 32, i, False, side) if kind == "with_text" \
                else _background(np.random.default_rng(i), (side, side * 3 // 4))
            img.save(photos / f"{i:04d}.jpg", quality=90)
        for ocr in ("off", "on", "added later"):
            out = work / f"{kind}-{ocr}.idx"
            if ocr == "added later":
                shutil.copytree(work / f"{kind}-off.idx", out)
            report = build_index(photos, out, model=str(model), device="cpu", precision="fp32", workers=0, ocr=ocr != "off")
            rows.append({"photos": kind, "ocr": ocr, "images": n, "seconds": report.seconds,
                         "images_per_s": round(n / report.seconds, 3) if report.seconds else None,
                         "embedded": report.added, "text_read": report.text_read, "with_ocr_text": report.with_ocr_text})
    return rows


def main(argv: list[str] | None = None) -> int:
    bench = Bench("bench_ocr", __doc__, "work_dir")
    p = bench.parser
    p.add_argument("--signs", type=int, default=20, help="signs per size and compression (default 20)")
    p.add_argument("--sizes", default="16,24,40", help="text heights in pixels (default 16,24,40)")
    p.add_argument("--engines", default="rapidocr,tesseract")
    p.add_argument("--index", type=int, default=8, metavar="N", help="photos per kind for the build cost (0: skip)")
    p.add_argument("--index-preset", default="tiny", choices=["tiny", "vit-b-32"],
                   help="the random model of the build rows (default tiny: OCR's share shows; vit-b-32: the embedding's)")
    p.add_argument("--photo-side", type=int, default=640, help="photo width in pixels, 4:3 (default 640)")
    args = bench.parse(argv)
    engines = [e for e in args.engines.split(",") if e]
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        return bench.fail(f"unknown engine {unknown[0]!r} (known: {', '.join(ENGINES)})", status=2)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.photo_side < 320:
        return bench.fail(f"--photo-side must be at least 320, got {args.photo_side}", status=2)
    rows = compare(args.signs, [int(s) for s in args.sizes.split(",")], engines, args.photo_side)
    build: list[dict[str, Any]] = []
    if args.index:
        with bench.scratch() as work:
            build = index_cost(args.index, work, args.photo_side, args.index_preset)
    table = [f"{'engine':<10} {'text px':>7} {'jpeg75':>6} {'recall':>7} {'img/s':>7}"]
    for r in rows:
        if not r["installed"]:
            table.append(f"{r['engine']:<10} not installed ({r['install']})")
            continue
        recall = "-" if r["word_recall"] is None else f"{r['word_recall']:.3f}"
        px = "no text" if r["text_px"] == 0 else str(r["text_px"])
        table.append(f"{r['engine']:<10} {px:>7} {str(r['jpeg75']):>6} {recall:>7} {r['images_per_s']:>7.2f}")
    if build:
        table += ["", f"{'photos':<13} {'ocr':<12} {'img/s':>7} {'embedded':>9} {'text read':>10}  ratio to no OCR"]
        base = {r["photos"]: r["images_per_s"] for r in build if r["ocr"] == "off"}
        for r in build:
            ratio = r["images_per_s"] / base[r["photos"]] if base[r["photos"]] and r["images_per_s"] else float("nan")
            table.append(f"{r['photos']:<13} {r['ocr']:<12} {r['images_per_s'] or 0:>7.2f} {r['embedded']:>9} {r['text_read']:>10}  "
                         f"{ratio:.2f}")
    bench.report({"bench": "ocr", "photo_side": args.photo_side, "engines": rows, "index": build}, table)
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
