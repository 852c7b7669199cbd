"""The fp32 image tower on OpenVINO and ONNX Runtime (retrieval.encoders.runtime): parity with
torch and HF, vectors independent of the batch (an update equals a rebuild), the cached export,
the missing package and the failed export; the order they are tried in (OpenVINO first, ONNX
Runtime where OpenVINO is missing or fails a check, torch where neither runs), and updates and
image queries following the runtime an index records. The bf16 and int8 towers on OpenVINO:
test_image_runtime_reduced.py."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="the [onnx] extra is not installed")
torch = pytest.importorskip("torch")

from helpers import assert_batch_independent  # noqa: E402
from runtime_fixtures import (  # noqa: E402
    RUNTIMES,
    encoder_on,
    needs_openvino,
    needs_ov_bf16,
    needs_ov_int8,
    update_and_rebuild,
    updated_equals_rebuilt,
    usable,
)

from indexer import build_index  # noqa: E402
from retrieval import ImageIndex  # noqa: E402
from retrieval.encoders import HFClipEncoder  # noqa: E402
from retrieval.encoders import chooser as CH  # noqa: E402
from retrieval.encoders import image_choice as IC  # noqa: E402
from retrieval.encoders import runtime as R  # noqa: E402
from retrieval.encoders.runtime import export as E  # noqa: E402
from retrieval.encoders.runtime import image as IR  # noqa: E402
from retrieval.errors import InvalidArgumentError, ModelLoadError  # noqa: E402

pytestmark = pytest.mark.usefixtures("runtime_cache")  # one export cache, never the user's


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_fp32_on_a_runtime_matches_torch_and_hf(
    runtime: str, tiny_model: Path, pixels: torch.Tensor, monkeypatch: pytest.MonkeyPatch, refused_here: dict[str, str]
) -> None:
    from transformers import CLIPModel

    usable(runtime, refused_here)
    enc = encoder_on(tiny_model, runtime, monkeypatch, pixels)
    assert enc.info["image_runtime"] == runtime and enc.info["image_runtime_version"]
    parity = enc.info["image_runtime_parity"]
    assert parity["min_cosine"] >= CH.PARITY_MIN_COSINE and f"{runtime}_seconds" in parity
    tch = encoder_on(tiny_model, "torch", monkeypatch, pixels)
    assert tch.info["image_runtime"] == "torch"
    a, b = enc.embed_pixels(pixels), tch.embed_pixels(pixels)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    with torch.inference_mode():
        hf = CLIPModel.from_pretrained(tiny_model).eval().get_image_features(pixel_values=pixels)
    hf = getattr(hf, "pooler_output", hf).numpy()
    hf /= np.linalg.norm(hf, axis=1, keepdims=True)
    assert float(np.min(np.sum(a * hf, axis=1))) >= CH.PARITY_MIN_COSINE


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_vectors_do_not_depend_on_the_batch(
    runtime: str, tiny_model: Path, pixels: torch.Tensor, monkeypatch: pytest.MonkeyPatch, refused_here: dict[str, str]
) -> None:
    usable(runtime, refused_here)
    enc = encoder_on(tiny_model, runtime, monkeypatch, pixels)
    assert_batch_independent(enc.embed_pixels, pixels, enc.embed_pixels(pixels), ((0, 1), (5, 6), (3, 10), (11, 12)))


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_update_equals_rebuild_and_the_manifest_names_the_runtime(
    runtime: str, tiny_model: Path, photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    refused_here: dict[str, str],
) -> None:
    usable(runtime, refused_here)
    monkeypatch.setenv(CH.RUNTIME_ENV, runtime)
    u, r = update_and_rebuild(tiny_model, photos, tmp_path, "fp32")
    info = json.loads((tmp_path / "r.idx" / "manifest.json").read_text())["model_info"]
    assert info["precision"] == "fp32" and info["image_runtime"] == runtime
    # Image queries run on the runtime the index's vectors came from: an image finds itself.
    monkeypatch.delenv(CH.RUNTIME_ENV)
    updated_equals_rebuilt(u, r, runtime)


def test_the_export_is_made_once_and_kept_in_the_cache(
    tiny_model: Path, pixels: torch.Tensor, monkeypatch: pytest.MonkeyPatch, runtime_cache: Path
) -> None:
    encoder_on(tiny_model, "onnxruntime", monkeypatch, pixels)
    files = list(runtime_cache.glob("vision-*.onnx"))
    assert files and not list(runtime_cache.glob(".export-*"))

    def no_export(*args: object, **kwargs: object) -> None:
        raise AssertionError("exported again")

    monkeypatch.setattr(E, "export_vision", no_export)
    assert encoder_on(tiny_model, "onnxruntime", monkeypatch, pixels).info["image_runtime"] == "onnxruntime"


def test_missing_packages_mean_torch_and_one_notice(
    tiny_model: Path, pixels: torch.Tensor, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # import onnxruntime / openvino now raise ImportError
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    monkeypatch.setitem(sys.modules, "openvino", None)
    with caplog.at_level(logging.WARNING, logger="retrieval.encoders.chooser"):
        enc = encoder_on(tiny_model, "auto", monkeypatch, pixels)
        enc.embed_pixels(pixels)
    assert enc.info["image_runtime"] == "torch"
    notices = [r.getMessage() for r in caplog.records if r.name == "retrieval.encoders.chooser"]
    assert len(notices) == 1 and "\n" not in notices[0]
    assert R.ORT_INSTALL in notices[0] and R.OV_INSTALL in notices[0]
    for runtime, install in (("onnxruntime", R.ORT_INSTALL), ("openvino", R.OV_INSTALL)):
        with pytest.raises(ModelLoadError, match=re.escape(install)):
            encoder_on(tiny_model, runtime, monkeypatch, pixels)


def test_a_failed_export_names_the_model_and_the_operator(
    tiny_model: Path, pixels: torch.Tensor, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv(E.ONNX_CACHE_ENV, str(tmp_path / "empty-cache"))

    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("Exporting the operator 'aten::scaled_dot_product_attention' to ONNX opset version 17 is not supported.")

    monkeypatch.setattr(torch.onnx, "export", refuse)
    with pytest.raises(ModelLoadError) as info:
        encoder_on(tiny_model, "onnxruntime", monkeypatch, pixels)
    assert str(tiny_model) in str(info.value) and "aten::scaled_dot_product_attention" in str(info.value)
    assert not list((tmp_path / "empty-cache").glob("*"))  # no half-written file left
    with caplog.at_level(logging.WARNING, logger="retrieval.encoders.chooser"):
        enc = encoder_on(tiny_model, "auto", monkeypatch, pixels)
    assert enc.info["image_runtime"] == "torch" and "aten::scaled_dot_product_attention" in enc.info["image_runtime_note"]


def test_reduced_modes_and_an_unknown_runtime(tiny_model: Path, pixels: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> None:
    enc = HFClipEncoder.load(str(tiny_model), device="cpu", precision="fp16")
    enc.embed_pixels(pixels[:2])
    assert "image_runtime" not in enc.info  # fp16 runs on torch only; the record is about fp32, bf16 and int8
    assert encoder_on(tiny_model, "torch", monkeypatch, pixels, "bf16").info["image_runtime"] == "torch"
    monkeypatch.delenv(CH.RUNTIME_ENV)
    monkeypatch.setenv(CH.RUNTIME_ENV, "tensorrt")
    with pytest.raises(InvalidArgumentError, match="CLIPSEARCH_IMAGE_RUNTIME"):
        HFClipEncoder.load(str(tiny_model), device="cpu", precision="fp32").embed_pixels(pixels[:2])


def _batch_dependent(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Make ``name``'s tower give vectors that move with the batch size, as OpenVINO's fp32
    did on an AVX2 host (~4e-6 between batch 1 and 8)."""
    real = IR.RUNTIMES[name]

    def load(path: Path, mode: str, group: int) -> IR.Tower:
        tower = real.load(path, mode, group)
        return lambda x: tower(x) + np.float32(1e-6 * len(x))

    monkeypatch.setitem(IR.RUNTIMES, name, dataclasses.replace(real, load=load))


def _chosen(model: Path, pixels: torch.Tensor) -> HFClipEncoder:
    enc = HFClipEncoder.load(str(model), device="cpu", precision="fp32")
    enc.embed_pixels(pixels[:4])
    return enc


def test_batch_drift_finds_a_tower_that_depends_on_the_batch(pixels: torch.Tensor) -> None:
    def per_image(x: torch.Tensor) -> np.ndarray:
        return x.flatten(1)[:, :8].numpy().copy()

    def per_batch(x: torch.Tensor) -> np.ndarray:
        return per_image(x) + np.float32(len(x))

    def small_batches_apart(x: torch.Tensor) -> np.ndarray:
        # Another kernel for batches of up to 4 images, as OpenVINO's int8 tower has with AMX.
        return per_image(x) + np.float32(len(x) <= 4)

    for n in (1, 2, 4, 5):
        sample = pixels[:n]
        assert IC.batch_drift(per_image, sample, per_image(sample)) == 0.0
        assert IC.batch_drift(per_batch, sample, per_batch(sample)) > 0.0
        # A sample that is itself small still meets a batch of another size.
        assert IC.batch_drift(small_batches_apart, sample, small_batches_apart(sample)) > 0.0


@needs_openvino
def test_auto_tries_openvino_first(
    tiny_model: Path, pixels: torch.Tensor, caplog: pytest.LogCaptureFixture, refused_here: dict[str, str]
) -> None:
    usable("openvino", refused_here)
    with caplog.at_level(logging.INFO, logger="retrieval.encoders.chooser"):
        enc = _chosen(tiny_model, pixels)
    assert enc.info["image_runtime"] == "openvino" and "image_runtime_note" not in enc.info
    assert not [r for r in caplog.records if r.name.startswith("retrieval.encoders.chooser")]


@needs_openvino
def test_a_runtime_whose_vectors_move_with_the_batch_is_passed_over(
    tiny_model: Path, pixels: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    _batch_dependent(monkeypatch, "openvino")
    enc = _chosen(tiny_model, pixels)
    assert enc.info["image_runtime"] == "onnxruntime"
    assert "OpenVINO's fp32 vectors change with the batch" in enc.info["image_runtime_note"]
    monkeypatch.setenv(CH.RUNTIME_ENV, "openvino")
    with pytest.raises(ModelLoadError, match=r"CLIPSEARCH_IMAGE_RUNTIME=openvino: OpenVINO's fp32 vectors change with the batch"):
        _chosen(tiny_model, pixels)
    # Both fail the check: torch, and the note says why for each.
    _batch_dependent(monkeypatch, "onnxruntime")
    monkeypatch.delenv(CH.RUNTIME_ENV)
    enc = _chosen(tiny_model, pixels)
    assert enc.info["image_runtime"] == "torch"
    assert "OpenVINO's fp32 vectors" in enc.info["image_runtime_note"] and "ONNX Runtime's fp32 vectors" in enc.info["image_runtime_note"]


@needs_openvino
def test_a_tower_that_fails_on_its_first_images_is_passed_over(
    tiny_model: Path, pixels: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tower that compiles and then raises on the sample (OpenVINO's int8 one under a oneDNN
    ISA cap: no kernel for a node) is a failed candidate, not a failed build."""

    def load(path: Path, mode: str, group: int) -> IR.Tower:
        def tower(x: torch.Tensor) -> np.ndarray:
            # OpenVINO's shape: the places it passed through, then the cause.
            raise RuntimeError(
                "Exception from src/inference/src/cpp/infer_request.cpp:224:\n"
                "Exception from src/plugins/intel_cpu/src/node.cpp:823:\n"
                "[CPU] FullyConnected node could not create a primitive descriptor\nmore lines"
            )

        return tower

    monkeypatch.setitem(IR.RUNTIMES, "openvino", dataclasses.replace(IR.RUNTIMES["openvino"], load=load))
    enc = _chosen(tiny_model, pixels)
    assert enc.info["image_runtime"] == "onnxruntime"
    note = enc.info["image_runtime_note"]
    assert note == ("OpenVINO's fp32 tower failed on the images of its check: "
                    "[CPU] FullyConnected node could not create a primitive descriptor")
    monkeypatch.setenv(CH.RUNTIME_ENV, "openvino")
    with pytest.raises(ModelLoadError, match=r"CLIPSEARCH_IMAGE_RUNTIME=openvino: OpenVINO's fp32 tower failed on the images of its check"):
        _chosen(tiny_model, pixels)
    monkeypatch.delenv(CH.RUNTIME_ENV)
    # One that fails only on one image (the batch check's first probe) fails the same way.
    real = IR.RUNTIMES["onnxruntime"]

    def load_single_fails(path: Path, mode: str, group: int) -> IR.Tower:
        tower = real.load(path, mode, group)

        def run(x: torch.Tensor) -> np.ndarray:
            if len(x) == 1:
                raise ValueError("no kernel for a batch of one")
            return tower(x)

        return run

    monkeypatch.setitem(IR.RUNTIMES, "onnxruntime", dataclasses.replace(real, load=load_single_fails))
    enc = _chosen(tiny_model, pixels)
    assert enc.info["image_runtime"] == "torch"
    assert "ONNX Runtime's fp32 tower failed on the images of its check: no kernel for a batch of one" in enc.info["image_runtime_note"]
    # One that answers with no vectors at all (OpenVINO's int8 tower did, under a oneDNN cap).
    monkeypatch.setitem(IR.RUNTIMES, "onnxruntime", real)
    monkeypatch.setitem(IR.RUNTIMES, "openvino", dataclasses.replace(
        IR.RUNTIMES["openvino"], load=lambda path, mode, group: lambda x: np.zeros((0, 8), np.float32)))
    enc = _chosen(tiny_model, pixels)
    assert enc.info["image_runtime"] == "onnxruntime"
    assert enc.info["image_runtime_note"] == (
        "OpenVINO's fp32 tower failed on the images of its check: it gave vectors of shape (0, 8) for 4 images")


def test_without_openvino_onnxruntime_runs_without_a_notice(
    tiny_model: Path, pixels: torch.Tensor, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "openvino", None)
    with caplog.at_level(logging.INFO, logger="retrieval.encoders.chooser"):
        enc = _chosen(tiny_model, pixels)
    assert enc.info["image_runtime"] == "onnxruntime" and "image_runtime_note" not in enc.info
    assert not [r for r in caplog.records if r.name.startswith("retrieval.encoders.chooser")]


def test_an_update_and_image_queries_follow_the_recorded_runtime(
    tiny_model: Path, photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = sorted(p.name for p in photos.iterdir())
    common = dict(model=str(tiny_model), workers=0, device="cpu", precision="fp32")
    monkeypatch.setenv(CH.RUNTIME_ENV, "onnxruntime")
    build_index(photos, tmp_path / "u.idx", files=files[:3], batch_size=2, **common)
    build_index(photos, tmp_path / "r.idx", batch_size=8, **common)
    monkeypatch.delenv(CH.RUNTIME_ENV)  # auto would pick OpenVINO for a new index
    build_index(photos, tmp_path / "u.idx", batch_size=3, **common)
    info = json.loads((tmp_path / "u.idx" / "manifest.json").read_text())["model_info"]
    assert info["image_runtime"] == "onnxruntime" and "image_runtime_note" not in info
    updated_equals_rebuilt(ImageIndex.open(tmp_path / "u.idx"), ImageIndex.open(tmp_path / "r.idx"), "onnxruntime")


def test_an_index_made_on_torch_is_queried_on_torch(
    tiny_model: Path, photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CH.RUNTIME_ENV, "torch")
    build_index(photos, tmp_path / "t.idx", model=str(tiny_model), workers=0, device="cpu", precision="fp32")
    monkeypatch.delenv(CH.RUNTIME_ENV)
    index = ImageIndex.open(tmp_path / "t.idx")
    hit = index.search_image(index.files.path(2), k=1)[0]
    assert hit.id == 2 and hit.score == pytest.approx(1.0, abs=1e-6)
    assert index.encoders.encoder.info["image_runtime"] == "torch"  # type: ignore[attr-defined]
    # Not reopened as a recorded tower (retrieval.encoders.recorded_tower): the full encoder ran it.
    assert index.encoders.image_path()["tower"] == "encoder" and "embedded with torch" in str(index.encoders.image_path()["reason"])


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_runtime_asked_for_on_an_index_made_on_torch_says_so(
    runtime: str, tiny_model: Path, photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture, refused_here: dict[str, str],
) -> None:
    """Asked for by name, a runtime embeds an update of an index made on torch, and the one
    notice says so (not that torch cannot run)."""
    files = sorted(p.name for p in photos.iterdir())
    common = dict(model=str(tiny_model), workers=0, device="cpu", precision="fp32")
    monkeypatch.setenv(CH.RUNTIME_ENV, "torch")
    build_index(photos, tmp_path / "t.idx", files=files[:3], **common)
    usable(runtime, refused_here)
    monkeypatch.setenv(CH.RUNTIME_ENV, runtime)
    with caplog.at_level(logging.WARNING, logger="retrieval.encoders.chooser"):
        build_index(photos, tmp_path / "t.idx", **common)
    notices = [r.getMessage() for r in caplog.records if r.name.startswith("retrieval.encoders.chooser")]
    expected = f"the index's vectors came from torch; {CH.RUNTIME_ENV}={runtime} asks for {IR.RUNTIMES[runtime].label}"
    assert len(notices) == 1 and expected in notices[0]
    info = ImageIndex.open(tmp_path / "t.idx").manifest.model_info
    assert info["image_runtime"] == runtime and info["image_runtime_note"] == expected


@pytest.mark.parametrize(
    ("precision", "runtime", "removed", "instead"),
    [
        pytest.param("fp32", "openvino", "openvino", "onnxruntime", marks=needs_openvino, id="fp32"),
        pytest.param("bf16", "openvino-bf16", "openvino", "torch", marks=needs_ov_bf16, id="bf16"),
        pytest.param("int8", "openvino-int8", "nncf", "torch", marks=needs_ov_int8, id="int8"),
    ],
)
def test_a_recorded_runtime_that_cannot_run_is_named_in_one_notice(
    precision: str, runtime: str, removed: str, instead: str, tiny_model: Path, photos: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, refused_here: dict[str, str],
) -> None:
    usable(runtime, refused_here)
    files = sorted(p.name for p in photos.iterdir())
    common = dict(model=str(tiny_model), workers=0, device="cpu", precision=precision)
    build_index(photos, tmp_path / "o.idx", files=files[:3], **common)
    assert ImageIndex.open(tmp_path / "o.idx").manifest.model_info["image_runtime"] == "openvino"
    monkeypatch.setitem(sys.modules, removed, None)
    with caplog.at_level(logging.WARNING, logger="retrieval.encoders.chooser"):
        build_index(photos, tmp_path / "o.idx", **common)
    notices = [r.getMessage() for r in caplog.records if r.name.startswith("retrieval.encoders.chooser")]
    assert len(notices) == 1 and "the index's vectors came from openvino, which cannot run here" in notices[0]
    assert R.OV_INSTALL in notices[0]
    info = ImageIndex.open(tmp_path / "o.idx").manifest.model_info
    assert info["image_runtime"] == instead and "came from openvino" in info["image_runtime_note"]


@needs_openvino
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sigaltstack through the C library")
def test_openvino_leaves_the_signal_stack_as_it_found_it(tiny_model: Path, pixels: torch.Tensor) -> None:
    """compile_model sets a signal stack of its own and puts back the one it found when the
    model is freed: freed in creation order, that left the stack of a freed model in place
    (a later signal crashed the process)."""
    import ctypes
    import gc
    import os
    import signal

    from retrieval.encoders.runtime import ov_tower

    libc = ctypes.CDLL(None)

    def current() -> tuple[int, int, int]:
        stack = ov_tower._StackT()
        assert libc.sigaltstack(None, ctypes.byref(stack)) == 0
        return (stack.ss_sp or 0, stack.ss_flags, stack.ss_size)

    enc = _chosen(tiny_model, pixels)
    path = enc.image_runtimes["fp32"].export()
    before = current()
    first, second = ov_tower.compile_tower(path, 1), ov_tower.compile_tower(path, 1)
    assert current() == before
    del first
    gc.collect()
    del second
    gc.collect()
    assert current() == before
    seen: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert seen == [signal.SIGUSR1]


@needs_openvino
def test_openvino_serves_concurrent_callers(tiny_model: Path, pixels: torch.Tensor) -> None:
    """Image queries in the server call one tower from several threads: each call gets an infer
    request of its own, and requests are reused afterwards."""
    from concurrent.futures import ThreadPoolExecutor

    from retrieval.encoders.runtime.ov_tower import OvImageTower

    # The tower itself, whether or not this CPU passes its batch check.
    tower = OvImageTower(_chosen(tiny_model, pixels).image_runtimes["fp32"].export(), 2)
    slices = [(lo, lo + size) for lo in range(len(pixels)) for size in (1, 2) if lo + size <= len(pixels)] * 4
    expected = {s: tower(pixels[s[0]:s[1]]) for s in set(slices)}
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda s: (s, tower(pixels[s[0]:s[1]])), slices))
    for s, vectors in results:
        np.testing.assert_array_equal(vectors, expected[s])
    assert 1 <= len(tower._idle) <= 4  # type: ignore[attr-defined]


@needs_openvino
def test_ray_actors_ask_for_the_runtime_the_run_records(tiny_model: Path, photos: Path, pixels: torch.Tensor) -> None:
    """A Ray actor embeds on the runtime the driver's choice (or the index) records, not on
    whichever its node would pick first, so that all nodes' vectors are alike."""
    import types

    from indexer.ray_actor import ActorSpec, load_actor_encoder
    from indexer.ray_engine import RayRun

    fake = types.SimpleNamespace(
        cfg=types.SimpleNamespace(model=str(tiny_model), max_pixels=10**8, draft=False),
        pool=types.SimpleNamespace(device="cpu", threads=1),
    )
    info = {"precision": "fp32", "image_runtime": "onnxruntime"}
    spec = RayRun.spec(fake, photos, info)  # type: ignore[arg-type]
    assert isinstance(spec, ActorSpec) and spec.image_runtime == "onnxruntime"
    assert RayRun.spec(fake, photos, {"precision": "int8", "image_runtime": "openvino"}).image_runtime == "openvino"  # type: ignore[arg-type]
    enc = load_actor_encoder(spec)
    enc.embed_pixels(pixels[:4])
    assert enc.info["image_runtime"] == "onnxruntime"  # OpenVINO would be this node's first pick
