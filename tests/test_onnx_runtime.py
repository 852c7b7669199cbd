"""The fp32 image tower on ONNX Runtime and OpenVINO (retrieval.encoders.runtime): parity with
torch and HF, vectors independent of the batch (an update equals a rebuild), the cached export,
the missing package and the failed export. The order they are tried in: test_image_runtime.py."""

from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="the [onnx] extra is not installed")
torch = pytest.importorskip("torch")

from imagegen import make_jpegs  # noqa: E402

from indexer import build_index  # noqa: E402
from retrieval import ImageIndex  # noqa: E402
from retrieval.encoders import HFClipEncoder  # noqa: E402
from retrieval.encoders import runtime as R  # noqa: E402
from retrieval.encoders.runtime import export as E  # noqa: E402
from retrieval.encoders.runtime import image as IR  # noqa: E402
from retrieval.errors import InvalidArgumentError, ModelLoadError  # noqa: E402
from retrieval.images import load_pixels  # noqa: E402


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("onnx") / "photos"
    make_jpegs(root, 12, size=(160, 120))
    return root


@pytest.fixture(scope="module")
def pixels(tiny_model: Path, photos: Path) -> torch.Tensor:
    cfg = HFClipEncoder.load(str(tiny_model), device="cpu").preprocess
    return torch.stack([load_pixels(p, cfg)[0] for p in sorted(photos.iterdir())])


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """One export cache for the module (exports are what is slow), never the user's."""
    path = tmp_path_factory.getbasetemp() / "onnx-cache-test"
    monkeypatch.setenv(E.ONNX_CACHE_ENV, str(path))
    monkeypatch.delenv(R.RUNTIME_ENV, raising=False)
    return path


# Each runtime whose package is installed (the test extra installs both).
RUNTIMES = [
    pytest.param(name, marks=pytest.mark.skipif(bool(IR.RUNTIMES[name].missing()), reason=f"{name} is not installed"))
    for name in IR.AUTO_ORDER
]


def _encoder(model: Path, runtime: str, monkeypatch: pytest.MonkeyPatch, pixels: torch.Tensor) -> HFClipEncoder:
    monkeypatch.setenv(R.RUNTIME_ENV, runtime)
    enc = HFClipEncoder.load(str(model), device="cpu", precision="fp32")
    enc.embed_pixels(pixels[:2])  # the runtime is chosen here
    return enc


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_fp32_on_a_runtime_matches_torch_and_hf(
    runtime: str, tiny_model: Path, pixels: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import CLIPModel

    enc = _encoder(tiny_model, runtime, monkeypatch, pixels)
    assert enc.info["image_runtime"] == runtime and enc.info["image_runtime_version"]
    parity = enc.info["image_runtime_parity"]
    assert parity["min_cosine"] >= R.PARITY_MIN_COSINE and f"{runtime}_seconds" in parity
    tch = _encoder(tiny_model, "torch", monkeypatch, pixels)
    assert tch.info["image_runtime"] == "torch"
    a, b = enc.embed_pixels(pixels), tch.embed_pixels(pixels)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    with torch.inference_mode():
        hf = CLIPModel.from_pretrained(tiny_model).eval().get_image_features(pixel_values=pixels)
    hf = getattr(hf, "pooler_output", hf).numpy()
    hf /= np.linalg.norm(hf, axis=1, keepdims=True)
    assert float(np.min(np.sum(a * hf, axis=1))) >= R.PARITY_MIN_COSINE


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_vectors_do_not_depend_on_the_batch(
    runtime: str, tiny_model: Path, pixels: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    enc = _encoder(tiny_model, runtime, monkeypatch, pixels)
    together = enc.embed_pixels(pixels)
    for lo, hi in ((0, 1), (5, 6), (3, 10), (11, 12)):
        np.testing.assert_array_equal(enc.embed_pixels(pixels[lo:hi]), together[lo:hi])


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_update_equals_rebuild_and_the_manifest_names_the_runtime(
    runtime: str, tiny_model: Path, photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(R.RUNTIME_ENV, runtime)
    files = sorted(p.name for p in photos.iterdir())
    common = dict(model=str(tiny_model), workers=0, device="cpu", precision="fp32")
    build_index(photos, tmp_path / "u.idx", files=files[:5], batch_size=3, **common)
    build_index(photos, tmp_path / "u.idx", batch_size=4, **common)
    build_index(photos, tmp_path / "r.idx", batch_size=16, **common)
    a, b = ImageIndex.open(tmp_path / "u.idx"), ImageIndex.open(tmp_path / "r.idx")
    order_a = np.argsort([r["path"] for r in a.rows(range(len(a)))])
    order_b = np.argsort([r["path"] for r in b.rows(range(len(b)))])
    np.testing.assert_array_equal(a.embeddings()[order_a], b.embeddings()[order_b])
    info = json.loads((tmp_path / "r.idx" / "manifest.json").read_text())["model_info"]
    assert info["precision"] == "fp32" and info["image_runtime"] == runtime
    # Image queries run on the runtime the index's vectors came from: an image finds itself.
    monkeypatch.delenv(R.RUNTIME_ENV)
    hit = b.search_image(b.source_file(0), k=1)[0]
    assert hit.id == 0 and hit.score == pytest.approx(1.0, abs=1e-6)
    assert b.encoder.info["image_runtime"] == runtime  # type: ignore[attr-defined]


def test_the_export_is_made_once_and_kept_in_the_cache(
    tiny_model: Path, pixels: torch.Tensor, monkeypatch: pytest.MonkeyPatch, _cache: Path
) -> None:
    _encoder(tiny_model, "onnxruntime", monkeypatch, pixels)
    files = list(_cache.glob("vision-*.onnx"))
    assert files and not list(_cache.glob(".export-*"))

    def no_export(*args: object, **kwargs: object) -> None:
        raise AssertionError("exported again")

    monkeypatch.setattr(E, "export_vision", no_export)
    assert _encoder(tiny_model, "onnxruntime", monkeypatch, pixels).info["image_runtime"] == "onnxruntime"


def test_missing_packages_mean_torch_and_one_notice(
    tiny_model: Path, pixels: torch.Tensor, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # import onnxruntime / openvino now raise ImportError
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    monkeypatch.setitem(sys.modules, "openvino", None)
    with caplog.at_level(logging.WARNING, logger="retrieval.encoders.runtime"):
        enc = _encoder(tiny_model, "auto", monkeypatch, pixels)
        enc.embed_pixels(pixels)
    assert enc.info["image_runtime"] == "torch"
    notices = [r.getMessage() for r in caplog.records if r.name == "retrieval.encoders.runtime"]
    assert len(notices) == 1 and "\n" not in notices[0]
    assert R.ORT_INSTALL in notices[0] and R.OV_INSTALL in notices[0]
    for runtime, install in (("onnxruntime", R.ORT_INSTALL), ("openvino", R.OV_INSTALL)):
        with pytest.raises(ModelLoadError, match=re.escape(install)):
            _encoder(tiny_model, runtime, monkeypatch, pixels)


def test_a_failed_export_names_the_model_and_the_operator(
    tiny_model: Path, pixels: torch.Tensor, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv(E.ONNX_CACHE_ENV, str(tmp_path / "empty-cache"))

    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("Exporting the operator 'aten::scaled_dot_product_attention' to ONNX opset version 17 is not supported.")

    monkeypatch.setattr(torch.onnx, "export", refuse)
    with pytest.raises(ModelLoadError) as info:
        _encoder(tiny_model, "onnxruntime", monkeypatch, pixels)
    assert str(tiny_model) in str(info.value) and "aten::scaled_dot_product_attention" in str(info.value)
    assert not list((tmp_path / "empty-cache").glob("*"))  # no half-written file left
    with caplog.at_level(logging.WARNING, logger="retrieval.encoders.runtime"):
        enc = _encoder(tiny_model, "auto", monkeypatch, pixels)
    assert enc.info["image_runtime"] == "torch" and "aten::scaled_dot_product_attention" in enc.info["image_runtime_note"]


def test_reduced_modes_and_an_unknown_runtime(tiny_model: Path, pixels: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> None:
    enc = HFClipEncoder.load(str(tiny_model), device="cpu", precision="int8")
    enc.embed_pixels(pixels[:2])
    assert "image_runtime" not in enc.info  # int8 runs on torch; the record is about fp32
    monkeypatch.setenv(R.RUNTIME_ENV, "tensorrt")
    with pytest.raises(InvalidArgumentError, match="CLIPSEARCH_IMAGE_RUNTIME"):
        HFClipEncoder.load(str(tiny_model), device="cpu", precision="fp32").embed_pixels(pixels[:2])
