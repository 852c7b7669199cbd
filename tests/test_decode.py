"""JPEG decoding of a build (``decode``: full, draft or auto): exact means exact, fast is measured.

``--precision fp32`` (and ``decode full``) stores vectors equal, within float32 rounding, to the
checkpoint's own processor and ``get_image_features`` for CLIP, SigLIP FixRes and SigLIP 2 NaFlex
on real photos larger than the input; ``auto`` drafts only where its gate measured the draft's
error below 1e-5 of cosine, records the figures, and an update keeps the decision; a file's
vector is the same with or without ``--ocr``, in any batch size and in any file order; an
unknown ``--decode`` is a one-line error.
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import assert_one_line_error, cosines
from photos import photo
from PIL import Image

from indexer import build_index
from indexer.build_config import BuildConfig
from indexer.calibrate import DECODE_GATE_MIN_COSINE, DecodeChoice, decode_request
from retrieval.errors import InvalidArgumentError
from retrieval.index import ImageIndex
from retrieval.layout import read_manifest
from retrieval.tools.random_model import make_random_clip, make_random_siglip

# Real photos (scikit-image's), non-square, each several times the tiny models' 64 px input;
# one above twice OCR's edge (720 px), which OCR then reads from a JPEG draft of its own.
SHOTS = {
    "astronaut": ("astronaut.png", (512, 360)),
    "chelsea": ("chelsea.png", (451, 300)),
    "coffee": ("coffee.png", (600, 400)),
    "rocket": ("rocket.jpg", (427, 640)),
    "motorcycle": ("motorcycle_left.png", (741, 500)),
    "coffee-large": ("coffee.png", (2200, 1500)),
}
EXACT = 0.99999
COMMON: dict[str, Any] = {"workers": 0, "device": "cpu", "batch_size": 4}


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("decode") / "photos"
    root.mkdir()
    for name, (source, size) in SHOTS.items():
        img = photo(source, max_side=1000)
        # Cropped to the aspect of ``size``, then resized to it (up for the large one).
        w, h = img.size
        aspect = size[0] / size[1]
        crop = (w, round(w / aspect)) if w / h < aspect else (round(h * aspect), h)
        crop = (min(crop[0], w), min(crop[1], h))
        img = img.crop((0, 0, *crop)).resize(size, Image.Resampling.LANCZOS)
        img.save(root / f"{name}.jpg", quality=92)
    return root


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("decode_models")
    return {
        "clip": make_random_clip(root / "clip", preset="tiny", seed=0),
        "siglip": make_random_siglip(root / "siglip", preset="siglip-tiny", seed=0),
        "naflex": make_random_siglip(root / "naflex", preset="siglip2-naflex-tiny", seed=0),
    }


def _reference(family: str, model_dir: Path, files: list[Path]) -> np.ndarray:
    """The checkpoint's own processor and ``get_image_features`` on the files decoded in full."""
    from transformers import AutoModel, AutoProcessor

    model = AutoModel.from_pretrained(model_dir).eval()
    processor = AutoProcessor.from_pretrained(model_dir)
    images = [Image.open(p).convert("RGB") for p in files]
    with torch.no_grad():
        out = model.get_image_features(**processor(images=images, return_tensors="pt"))
    t = out if isinstance(out, torch.Tensor) else out.pooler_output
    return (t / t.norm(dim=-1, keepdim=True)).numpy()


def _stored(index_dir: Path) -> dict[str, np.ndarray]:
    idx = ImageIndex.open(index_dir, device="cpu")
    return dict(zip(idx.metadata.paths(), idx.vectors.embeddings(), strict=True))


@pytest.mark.parametrize("family", ["clip", "siglip", "naflex"])
def test_fp32_equals_the_reference_processor(family: str, models: dict[str, Path], photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "idx"
    build_index(photos, out, model=str(models[family]), precision="fp32", **COMMON)
    stored = _stored(out)
    files = sorted(photos.iterdir())
    ref = _reference(family, models[family], files)
    got = np.stack([stored[p.name] for p in files])
    assert cosines(got, ref).min() >= EXACT, (family, cosines(got, ref))
    pre = read_manifest(out).preprocess
    # auto (the default) never drafts with fp32, and says why.
    assert (pre["decode"], pre["jpeg_draft"]) == ("auto", False) and "fp32" in pre["decode_gate"]["reason"]
    # Drafted, the 64 px models' vectors move by more than float32 rounding: the test sees it.
    # NaFlex's up to 256 x 256 input drafts these photos at 1/2 at most, and moves them less.
    drafted = tmp_path / "draft"
    build_index(photos, drafted, model=str(models[family]), precision="fp32", decode="draft", **COMMON)
    worst = cosines(np.stack([_stored(drafted)[p.name] for p in files]), ref).min()
    assert worst < (EXACT if family != "naflex" else 1 - 1e-8), (family, worst)
    assert read_manifest(drafted).preprocess["jpeg_draft"] is True
    # An image query decodes as the index's images were: each file finds its own stored vector.
    for index_dir in (out, drafted):
        idx, stored_here = ImageIndex.open(index_dir, device="cpu"), _stored(index_dir)
        for p in files[:2]:
            np.testing.assert_allclose(idx.encoders.embed_image(p)[0], stored_here[p.name], rtol=0, atol=2e-6)


def test_auto_gate_decodes_in_full_where_draft_is_not_harmless(models: dict[str, Path], photos: Path, tmp_path: Path) -> None:
    # SigLIP's 64 px squash from photos of 300-1000 px: the draft's error is far above 1e-5.
    auto, full = tmp_path / "auto", tmp_path / "full"
    build_index(photos, auto, model=str(models["siglip"]), precision="int8", **COMMON)
    build_index(photos, full, model=str(models["siglip"]), precision="int8", decode="full", **COMMON)
    pre = read_manifest(auto).preprocess
    gate = pre["decode_gate"]
    assert (pre["decode"], pre["jpeg_draft"], gate["passed"], gate["precision"]) == ("auto", False, False, "int8")
    assert gate["samples"] == len(SHOTS) and gate["min_cosine"] < DECODE_GATE_MIN_COSINE <= 1.0
    assert gate["min_cosine"] <= gate["mean_cosine"] < 1.0 and gate["min_cosine_threshold"] == DECODE_GATE_MIN_COSINE
    a, b = _stored(auto), _stored(full)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert read_manifest(full).preprocess["decode"] == "full" and "decode_gate" not in read_manifest(full).preprocess


def test_auto_drafts_where_the_gate_passes_and_an_update_keeps_it(
    models: dict[str, Path], photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from indexer import calibrate

    root = tmp_path / "photos"
    shutil.copytree(photos, root)
    monkeypatch.setattr(calibrate, "DECODE_GATE_MIN_COSINE", 0.5)  # every draft passes
    auto = tmp_path / "auto"
    build_index(root, auto, model=str(models["clip"]), precision="int8", **COMMON)
    gate = read_manifest(auto).preprocess["decode_gate"]
    assert read_manifest(auto).preprocess["jpeg_draft"] is True and gate["passed"] and gate["min_cosine_threshold"] == 0.5
    monkeypatch.undo()
    # An update reuses the recorded decision (no gate again, even with the real threshold) ...
    photo("chelsea.png", max_side=700).save(root / "new.jpg", quality=90)
    report = build_index(root, auto, model=str(models["clip"]), **COMMON)
    assert report.added == 1 and read_manifest(auto).preprocess["decode_gate"] == gate
    drafted = tmp_path / "draft"
    build_index(root, drafted, model=str(models["clip"]), precision="int8", decode="draft", **COMMON)
    a, b = _stored(auto), _stored(drafted)
    assert all(np.array_equal(a[k], b[k]) for k in b)
    # ... and --precision fp32 on it decodes in full again (exact means exact).
    (root / "new.jpg").unlink()
    photo("coffee.png", max_side=700).save(root / "new2.jpg", quality=90)
    build_index(root, auto, model=str(models["clip"]), precision="fp32", **COMMON)
    assert read_manifest(auto).preprocess["jpeg_draft"] is False


def _build_vectors(models: dict[str, Path], root: Path, out: Path, **kwargs: Any) -> dict[str, np.ndarray]:
    build_index(root, out, model=str(models["clip"]), precision="fp32", workers=0, device="cpu", **kwargs)
    # Keyed by the photo's name, whatever prefix set the walk order.
    return {path.split("_", 1)[-1]: vec for path, vec in _stored(out).items()}


def _fake_ocr(seen: dict[str, tuple[int, int]]) -> Callable[[Image.Image], str | None]:
    def recognise(image: Image.Image) -> str | None:
        seen[f"{image.size[0]}x{image.size[1]}"] = image.size
        return "text"

    return recognise


@pytest.mark.parametrize("decode", ["draft", "full"])
def test_a_files_vector_does_not_depend_on_the_rest_of_the_build(
    decode: str, models: dict[str, Path], photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from indexer import ocr

    names = sorted(p.name for p in photos.iterdir())
    forward, backward = tmp_path / "forward", tmp_path / "backward"
    forward.mkdir()
    backward.mkdir()
    for i, name in enumerate(names):
        shutil.copy(photos / name, forward / f"{i:02d}_{name}")
        shutil.copy(photos / name, backward / f"{len(names) - i:02d}_{name}")
    base = _build_vectors(models, forward, tmp_path / "base", decode=decode, batch_size=8)
    seen: dict[str, tuple[int, int]] = {}
    monkeypatch.setattr(ocr, "recognise", _fake_ocr(seen))
    runs = {
        "ocr": _build_vectors(models, forward, tmp_path / "ocr", decode=decode, batch_size=8, ocr=True),
        "batch 1": _build_vectors(models, forward, tmp_path / "one", decode=decode, batch_size=1),
        "reversed": _build_vectors(models, backward, tmp_path / "rev", decode=decode, batch_size=3),
    }
    assert len(base) == len(SHOTS)
    for run, vectors in runs.items():
        for name, vec in base.items():
            assert np.array_equal(vectors[name], vec), (run, name)
    # OCR read every image at its own decode (shorter side >= 720 where the file has it).
    assert len(seen) == len(SHOTS) and max(min(s) for s in seen.values()) >= 720


def test_ocr_reads_the_same_image_in_either_decode_mode(photos: Path, models: dict[str, Path]) -> None:
    from retrieval.encoders import load_encoder
    from retrieval.images import load_photo

    cfg = load_encoder(str(models["clip"]), device="cpu").preprocess
    for path in sorted(photos.iterdir()):
        full_px, full = load_photo(path, cfg, draft=False, keep_edge=720)
        draft_px, drafted = load_photo(path, cfg, draft=True, keep_edge=720)
        assert np.array_equal(np.asarray(full.image), np.asarray(drafted.image)), path.name
        # The model's pixels are those of a decode without keep_edge.
        for px, draft in ((full_px, False), (draft_px, True)):
            alone, _ = load_photo(path, cfg, draft=draft)
            assert torch.equal(px, alone), (path.name, draft)


def test_decode_option_and_its_deprecated_alias(tmp_path: Path) -> None:
    assert BuildConfig().decode is None and BuildConfig(decode="full").decode == "full"
    with pytest.raises(InvalidArgumentError, match="unknown decode 'fast'.*auto, full, draft"):
        BuildConfig(decode="fast")  # type: ignore[arg-type]
    with pytest.warns(DeprecationWarning, match="decode="):
        assert BuildConfig(draft=False).decode == "full"
    with pytest.warns(DeprecationWarning):
        assert BuildConfig().replace(draft=True).decode == "draft"
    with warnings.catch_warnings(), pytest.raises(InvalidArgumentError, match="contradicts"):
        warnings.simplefilter("ignore", DeprecationWarning)
        BuildConfig(draft=True, decode="full")


def test_what_an_index_records_decides_an_update() -> None:
    assert decode_request(None, None) == "auto"
    assert decode_request("draft", {"decode": "full", "jpeg_draft": False}) == "draft"
    assert decode_request(None, {"decode": "full", "jpeg_draft": False}) == "full"
    # An index from before the choice: it drafted unless it recorded otherwise.
    assert decode_request(None, {"shortest_edge": 224, "jpeg_draft": True}) == "draft"
    assert decode_request(None, {"shortest_edge": 224, "jpeg_draft": False}) == "full"
    assert decode_request(None, {"shortest_edge": 224}) == "draft"
    choice = DecodeChoice("auto", True, {"samples": 3, "min_cosine": 0.999995, "passed": True, "precision": "int8"})
    assert DecodeChoice.from_record(json.loads(json.dumps(choice.record()))) == choice
    assert DecodeChoice.from_record({"decode": "fast", "jpeg_draft": True}) is None


def test_unknown_decode_is_a_one_line_error(photos: Path, tmp_path: Path) -> None:
    from conftest import cli_here

    out = tmp_path / "idx"
    proc = cli_here(["index", photos, out, "--decode", "fast"])
    assert_one_line_error(proc.returncode, proc.stderr, "--decode", "fast", codes=(2,), prefix="clipsearch index: error: ")
    assert not out.exists()
