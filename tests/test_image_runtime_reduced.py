"""The reduced modes of the image tower on OpenVINO (retrieval.encoders.runtime.image): bf16 with
AMX and int8 with AVX-512 VNNI. Agreement with torch's tower in the same mode, vectors
independent of the batch (an update equals a rebuild), the gate judging the tower that will
run, ``auto`` never taking torch's batch-dependent bf16 on the CPU, indexes made on torch
staying there, and the levels each runtime is tried on."""

from __future__ import annotations

import dataclasses
import logging
import re
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="the [onnx] extra is not installed")
torch = pytest.importorskip("torch")

from helpers import assert_batch_independent, cosines  # noqa: E402
from runtime_fixtures import (  # noqa: E402
    encoder_on,
    needs_ov_bf16,
    needs_ov_int8,
    update_and_rebuild,
    updated_equals_rebuilt,
    usable,
)

from indexer import build_index  # noqa: E402
from retrieval import ImageIndex  # noqa: E402
from retrieval.encoders import HFClipEncoder, cpu  # noqa: E402
from retrieval.encoders import chooser as CH  # noqa: E402
from retrieval.encoders import image_choice as IC  # noqa: E402
from retrieval.encoders import precision as P  # noqa: E402
from retrieval.encoders import runtime as R  # noqa: E402
from retrieval.encoders.runtime import export as E  # noqa: E402
from retrieval.encoders.runtime import image as IR  # noqa: E402
from retrieval.errors import ModelLoadError  # noqa: E402

pytestmark = pytest.mark.usefixtures("runtime_cache")  # one export cache, never the user's

SPANS = ((0, 1), (5, 6), (3, 10), (11, 12))

# -- bf16 ---------------------------------------------------------------------------------------


@needs_ov_bf16
def test_bf16_on_openvino_agrees_with_torch_and_does_not_depend_on_the_batch(
    tiny_model: Path, pixels: torch.Tensor, monkeypatch: pytest.MonkeyPatch, refused_here: dict[str, str]
) -> None:
    usable("openvino-bf16", refused_here)
    ov16 = encoder_on(tiny_model, "openvino", monkeypatch, pixels, "bf16")
    assert ov16.info["image_runtime"] == "openvino" and "int8_activation_bits" not in ov16.info
    assert ov16.info["image_runtime_parity"]["min_cosine"] >= CH.REDUCED_PARITY_MIN_COSINE
    a = ov16.embed_pixels(pixels)
    exact = encoder_on(tiny_model, "torch", monkeypatch, pixels).embed_pixels(pixels)
    assert float(cosines(a, exact).min()) >= P.GATE_MEAN_COSINE
    assert not np.array_equal(a, exact)  # bf16 products indeed
    assert_batch_independent(ov16.embed_pixels, pixels, a, SPANS)
    assert ov16._vision_model is None  # torch's tower served the checks only


@needs_ov_bf16
def test_auto_takes_bf16_on_openvino_with_amx_and_an_update_equals_a_rebuild(
    tiny_model: Path, photos: Path, tmp_path: Path, refused_here: dict[str, str]
) -> None:
    usable("openvino-bf16", refused_here)
    u, r = update_and_rebuild(tiny_model, photos, tmp_path, "auto")
    info = u.manifest.model_info
    assert info["precision"] == "bf16" and info["image_runtime"] == "openvino"
    gate = info["precision_gate"]
    assert [g["mode"] for g in gate["gate"]] == ["bf16"] and gate["gate"][0]["passed"] and "passed_over" not in gate
    updated_equals_rebuilt(u, r, "openvino")


def test_auto_never_takes_torchs_bf16_on_the_cpu(
    tiny_model: Path, photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On any CPU: with bf16 offered first (as with AMX) and only torch to run it, auto passes it
    over (torch's bf16 vectors move with the batch) and says why in the manifest."""
    monkeypatch.setattr(P, "auto_candidates", lambda device, tower="image": ("bf16",))
    monkeypatch.setenv(CH.RUNTIME_ENV, "torch")
    build_index(photos, tmp_path / "t.idx", model=str(tiny_model), workers=0, device="cpu", precision="auto")
    info = ImageIndex.open(tmp_path / "t.idx").manifest.model_info
    assert info["precision"] == "fp32" and info["image_runtime"] == "torch"
    assert "gate" not in info["precision_gate"]  # nothing was gated
    assert "move with the batch" in info["precision_gate"]["passed_over"]["bf16"]
    # Asked for by name, bf16 still runs on torch.
    assert encoder_on(tiny_model, "torch", monkeypatch, torch.zeros(4, 3, 32, 32), "bf16").info["precision"] == "bf16"


def test_a_bf16_index_made_on_torch_stays_on_torch(
    tiny_model: Path, photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bf16 index made on torch, or made before bf16 runtimes were recorded (no
    ``image_runtime``), is updated on torch: OpenVINO's bf16 vectors are close to torch's, not equal."""
    from indexer.calibrate import resolve

    files = sorted(p.name for p in photos.iterdir())
    common = dict(model=str(tiny_model), workers=0, device="cpu", precision="bf16")
    monkeypatch.setenv(CH.RUNTIME_ENV, "torch")
    build_index(photos, tmp_path / "u.idx", files=files[:5], **common)
    monkeypatch.delenv(CH.RUNTIME_ENV)
    build_index(photos, tmp_path / "u.idx", **common)
    assert ImageIndex.open(tmp_path / "u.idx").manifest.model_info["image_runtime"] == "torch"
    enc = HFClipEncoder.load(str(tiny_model), device="cpu", precision="bf16")
    resolve(enc, {"precision": "bf16", "precision_requested": "bf16"}, photos, [], max_pixels=10**8, draft=False)
    assert enc.image_runtimes.get("bf16").recorded == "torch"  # type: ignore[union-attr]
    assert enc.image_runtimes.get("int8").recorded is None  # type: ignore[union-attr]


def test_bf16_on_openvino_is_tried_with_amx_only(monkeypatch: pytest.MonkeyPatch) -> None:
    for level, tried in (("amx", True), ("avx512_vnni", False), ("avx2", False)):
        monkeypatch.setattr(cpu, "cpu_level", lambda level=level: level)
        assert CH.tried_here("bf16") is tried
        assert IC.ImageRuntime("m", lambda: None, True, "bf16").pending is tried
    assert CH.tried_here("fp32")


# -- int8 ---------------------------------------------------------------------------------------


@needs_ov_int8
def test_int8_on_openvino_agrees_with_torch_int8_and_does_not_depend_on_the_batch(
    tiny_model: Path, pixels: torch.Tensor, monkeypatch: pytest.MonkeyPatch, refused_here: dict[str, str]
) -> None:
    usable("openvino-int8", refused_here)
    ov8 = encoder_on(tiny_model, "openvino", monkeypatch, pixels, "int8")
    assert ov8.info["image_runtime"] == "openvino" and ov8.info["int8_activation_bits"] == 8
    assert ov8.info["image_runtime_parity"]["min_cosine"] >= CH.REDUCED_PARITY_MIN_COSINE
    assert "int8" not in ov8.image_precision.variants  # torch's int8 copy served the check only
    tch = encoder_on(tiny_model, "torch", monkeypatch, pixels, "int8")
    assert tch.info["image_runtime"] == "torch"
    a, b = ov8.embed_pixels(pixels), tch.embed_pixels(pixels)
    assert float(np.min(np.sum(a * b, axis=1))) >= CH.REDUCED_PARITY_MIN_COSINE
    assert not np.array_equal(a, b)  # another tower indeed
    assert_batch_independent(ov8.embed_pixels, pixels, a, ((0, 1), (5, 6), (3, 10), (11, 12)))
    # The int8 model is made once from the export and kept beside it.
    assert len(list(ov8.image_runtimes["int8"].export().parent.glob("*-ov-int8-*.xml"))) == 1
    # torch's tower, needed for the checks only, is freed, and loaded again when torch is asked for.
    assert ov8._vision_model is None
    ov8.follow_image_runtime("torch", "int8")
    np.testing.assert_array_equal(ov8.embed_pixels(pixels), b)


@needs_ov_int8
def test_auto_gates_the_int8_tower_that_will_run_and_an_update_equals_a_rebuild(
    tiny_model: Path, photos: Path, tmp_path: Path, refused_here: dict[str, str]
) -> None:
    usable("openvino-int8", refused_here)
    u, r = update_and_rebuild(tiny_model, photos, tmp_path, "auto")
    info = u.manifest.model_info
    assert info["precision"] == "int8" and info["image_runtime"] == "openvino"
    assert info["precision_gate"]["gate"][0]["passed"]
    updated_equals_rebuilt(u, r, "openvino")


def test_an_int8_index_made_on_torch_stays_on_torch(
    tiny_model: Path, photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Updates and image queries of an int8 index made on torch, or made before int8 runtimes
    were recorded (no ``image_runtime``), stay on torch: OpenVINO's int8 vectors are close to
    torch's, not equal, and an index holds vectors of one tower."""
    from indexer.calibrate import resolve

    files = sorted(p.name for p in photos.iterdir())
    common = dict(model=str(tiny_model), workers=0, device="cpu", precision="int8")
    monkeypatch.setenv(CH.RUNTIME_ENV, "torch")
    build_index(photos, tmp_path / "u.idx", files=files[:5], batch_size=3, **common)
    build_index(photos, tmp_path / "r.idx", batch_size=16, **common)
    monkeypatch.delenv(CH.RUNTIME_ENV)
    build_index(photos, tmp_path / "u.idx", batch_size=4, **common)
    u, r = ImageIndex.open(tmp_path / "u.idx"), ImageIndex.open(tmp_path / "r.idx")
    assert u.manifest.model_info["image_runtime"] == "torch"
    updated_equals_rebuilt(u, r, "torch")
    enc = HFClipEncoder.load(str(tiny_model), device="cpu", precision="int8")
    resolve(enc, {"precision": "int8", "precision_requested": "int8"}, photos, [], max_pixels=10**8, draft=False)
    assert enc.image_runtimes.get("int8").recorded == "torch"  # type: ignore[union-attr]
    assert enc.image_runtimes.get("fp32").recorded is None  # type: ignore[union-attr]


@needs_ov_int8
def test_an_int8_tower_whose_vectors_move_with_the_batch_is_passed_over(
    tiny_model: Path, pixels: torch.Tensor, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = IR.RUNTIMES["openvino"]

    def load(path: Path, mode: str, group: int) -> IR.Tower:
        tower = real.load(path, mode, group)
        return lambda x: tower(x) + np.float32(1e-6 * len(x))

    monkeypatch.setitem(IR.RUNTIMES, "openvino", dataclasses.replace(real, load=load))
    with caplog.at_level(logging.WARNING, logger="retrieval.encoders.chooser"):
        enc = encoder_on(tiny_model, "auto", monkeypatch, pixels, "int8")
    assert enc.info["image_runtime"] == "torch"
    assert "OpenVINO's int8 vectors change with the batch" in enc.info["image_runtime_note"]
    assert not [r for r in caplog.records if r.name.startswith("retrieval.encoders.chooser")]  # torch's int8 is no fallback to warn of
    with pytest.raises(ModelLoadError, match="OpenVINO's int8 vectors change with the batch"):
        encoder_on(tiny_model, "openvino", monkeypatch, pixels, "int8")


def test_int8_runs_on_torch_without_nncf_or_where_onnxruntime_is_named(
    tiny_model: Path, pixels: torch.Tensor, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # ONNX Runtime's int8 quantises a whole batch with one scale: it never runs the int8 tower.
    enc = encoder_on(tiny_model, "onnxruntime", monkeypatch, pixels, "int8")
    assert enc.info["image_runtime"] == "torch" and "image_runtime_note" not in enc.info
    monkeypatch.setitem(sys.modules, "nncf", None)
    with caplog.at_level(logging.WARNING, logger="retrieval.encoders.chooser"):
        enc = encoder_on(tiny_model, "auto", monkeypatch, pixels, "int8")
    assert enc.info["image_runtime"] == "torch"
    assert not [r for r in caplog.records if r.name.startswith("retrieval.encoders.chooser")]
    if CH.tried_here("int8"):
        assert R.OV_INSTALL in enc.info["image_runtime_note"]
        with pytest.raises(ModelLoadError, match=re.escape(R.OV_INSTALL)):
            encoder_on(tiny_model, "openvino", monkeypatch, pixels, "int8")


def test_int8_off_the_avx512_vnni_level_stays_on_torch(tiny_model: Path, pixels: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> None:
    """Below AVX-512 VNNI auto leaves int8 to the torch path (on AVX2 its 7-bit codes), and
    with AMX too, where OpenVINO's int8 vectors moved with the batch and torch's ran faster."""
    with monkeypatch.context() as amx:
        amx.setattr(cpu, "cpu_level", lambda: "amx")
        assert encoder_on(tiny_model, "auto", monkeypatch, pixels, "int8").info["image_runtime"] == "torch"
    monkeypatch.setenv(cpu.CAP_ENV, "avx_vnni")
    assert encoder_on(tiny_model, "auto", monkeypatch, pixels, "int8").info["image_runtime"] == "torch"
    monkeypatch.setenv(cpu.CAP_ENV, "avx2")
    enc = encoder_on(tiny_model, "auto", monkeypatch, pixels, "int8")
    assert enc.info["image_runtime"] == "torch" and enc.info["int8_activation_bits"] == 7


@needs_ov_int8
def test_an_int8_model_that_cannot_be_saved_is_a_typed_error(
    tiny_model: Path, pixels: torch.Tensor, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import openvino as ov

    monkeypatch.setenv(E.ONNX_CACHE_ENV, str(tmp_path / "cache"))

    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("No space left on device")

    monkeypatch.setattr(ov, "save_model", refuse)
    with pytest.raises(ModelLoadError, match="cannot save the int8 model of .*: No space left on device"):
        encoder_on(tiny_model, "openvino", monkeypatch, pixels, "int8")
    enc = encoder_on(tiny_model, "auto", monkeypatch, pixels, "int8")
    assert enc.info["image_runtime"] == "torch" and "No space left on device" in enc.info["image_runtime_note"]
    assert not list((tmp_path / "cache").glob(".*"))  # no temporary file left behind
