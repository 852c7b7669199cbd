"""The exact (fp32) text tower on ONNX Runtime (retrieval.encoders.text_choice): parity with the
numpy tower and Hugging Face, vectors independent of the batch, which processes choose it (long-
lived ones; a one-shot search stays on numpy without importing torch), the environment override,
and the fallbacks to numpy: the package missing, torch missing, a damaged cached export, a failed
parity check."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import TEXTS, cosines

pytest.importorskip("onnxruntime", reason="the [onnx] extra is not installed")

from retrieval import ImageIndex  # noqa: E402
from retrieval.encoders import chooser as CH  # noqa: E402
from retrieval.encoders import runtime as R  # noqa: E402
from retrieval.encoders.numpy_text import NumpyTextEncoder, text_path  # noqa: E402
from retrieval.encoders.runtime import export as E  # noqa: E402
from retrieval.encoders.text_choice import ONE_SHOT_TEXTS  # noqa: E402
from retrieval.errors import InvalidArgumentError, ModelLoadError  # noqa: E402


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """One export cache for the module (exports are what is slow), never the user's; the
    runtime left to choose."""
    path = tmp_path_factory.getbasetemp() / "onnx-text-cache-test"
    monkeypatch.setenv(E.ONNX_CACHE_ENV, str(path))
    monkeypatch.delenv(CH.TEXT_RUNTIME_ENV, raising=False)
    return path


def _load(model: Path, runtime: str, monkeypatch: pytest.MonkeyPatch, **kwargs: object) -> NumpyTextEncoder:
    monkeypatch.setenv(CH.TEXT_RUNTIME_ENV, runtime)
    return NumpyTextEncoder.load(str(model), **kwargs)  # type: ignore[arg-type]


def test_onnxruntime_vectors_equal_numpy_and_hf(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from transformers import AutoTokenizer, CLIPModel

    ort = _load(tiny_model, "auto", monkeypatch)
    assert ort.runtime.name == "onnxruntime" and ort.loaded_path().path == "onnxruntime"
    info = ort.precision_info()
    assert info["mode"] == "fp32" and info["runtime"] == "onnxruntime"
    assert info["runtime_parity"]["min_cosine"] >= CH.PARITY_MIN_COSINE and info["runtime_parity"]["texts"] > 0
    numpy = _load(tiny_model, "numpy", monkeypatch)
    assert numpy.runtime.name == "numpy" and numpy.runtime.note == f"{CH.TEXT_RUNTIME_ENV}=numpy"
    a, b = ort.embed_texts(list(TEXTS)), numpy.embed_texts(list(TEXTS))
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    model = CLIPModel.from_pretrained(tiny_model).eval()
    tokens = AutoTokenizer.from_pretrained(tiny_model)(list(TEXTS), padding=True, truncation=True, return_tensors="pt")
    with torch.inference_mode():
        hf = model.get_text_features(**tokens)
    hf = getattr(hf, "pooler_output", hf).numpy()
    hf /= np.linalg.norm(hf, axis=1, keepdims=True)
    np.testing.assert_allclose(a, hf, rtol=0, atol=1e-5)
    assert cosines(a, hf).min() >= CH.PARITY_MIN_COSINE


def test_vectors_do_not_depend_on_the_batch(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    enc = _load(tiny_model, "onnxruntime", monkeypatch)
    together = enc.embed_texts(list(TEXTS))
    # Each text alone, in pairs, and in other company: bit for bit the same row (one run per
    # text at its own length; padding never reaches the session).
    alone = np.concatenate([enc.embed_texts([t]) for t in TEXTS])
    np.testing.assert_array_equal(alone, together)
    np.testing.assert_array_equal(enc.embed_texts(list(TEXTS), batch_size=2), together)
    mixed = enc.embed_texts(["x", TEXTS[2], "a banana", "a dog"])
    np.testing.assert_array_equal(mixed[:3], together[[TEXTS.index("x"), 2, 0]])


def test_long_lived_fp32_opens_choose_onnxruntime(built_index: Path) -> None:
    index = ImageIndex.open(built_index, device="cpu", precision="fp32")
    planned = index.encoders.text_path()
    assert planned.path == "onnxruntime" and "ONNX Runtime" in planned.reason
    hits = index.search("a red square", k=5)
    loaded = index.encoders.text_path()
    assert loaded.path == "onnxruntime" and loaded.reason.startswith("loaded, fp32 on ONNX Runtime")
    assert index.info()["text_path"]["path"] == "onnxruntime"
    assert index.info()["text_precision"]["runtime"] == "onnxruntime"
    assert index._queries.loaded_encoder is None  # no torch model loaded for text
    # As many texts as the one-shot rule allows for: the same choice.
    assert text_path(str(index.encoders.query_model), text_queries=ONE_SHOT_TEXTS).path == "onnxruntime"
    one_shot = ImageIndex.open(built_index, device="cpu", precision="fp32", text_queries=1)
    assert one_shot.encoders.text_path().path == "numpy" and "1 text query in this process" in one_shot.encoders.text_path().reason
    exact = one_shot.search("a red square", k=5)
    assert one_shot.encoders.text_path().path == "numpy"
    assert "runtime" not in one_shot.info()["text_precision"]  # not tried: the text path says why
    assert [h.id for h in hits] == [h.id for h in exact]
    assert max(abs(a.score - b.score) for a, b in zip(hits, exact, strict=True)) <= 1e-5


def test_a_one_shot_search_stays_on_numpy_without_torch(built_index: Path) -> None:
    # The cold CLI search (fp32 and the default auto): neither torch nor onnxruntime is imported.
    script = (
        "import sys, contextlib, io\n"
        "from clipsearch.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    a = main(['search', {str(built_index)!r}, 'a red square', '--json', '--precision', 'fp32'])\n"
        f"    b = main(['search', {str(built_index)!r}, 'a red square', '--json'])\n"
        "print(a, b, 'torch' in sys.modules, 'onnxruntime' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=180)
    assert out.stdout.split() == ["0", "0", "False", "False"], out.stderr


def test_the_environment_overrides_the_choice(built_index: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    numpy = _load(tiny_model, "numpy", monkeypatch)
    assert numpy.runtime.name == "numpy"
    assert text_path(str(tiny_model)).path == "numpy" and f"{CH.TEXT_RUNTIME_ENV}=numpy" in text_path(str(tiny_model)).reason
    # onnxruntime: even for one query.
    forced = _load(tiny_model, "onnxruntime", monkeypatch, text_queries=1)
    assert forced.runtime.name == "onnxruntime"
    assert text_path(str(tiny_model), text_queries=1).path == "onnxruntime"
    monkeypatch.setenv(CH.TEXT_RUNTIME_ENV, "tensorrt")
    with pytest.raises(InvalidArgumentError, match=CH.TEXT_RUNTIME_ENV):
        NumpyTextEncoder.load(str(tiny_model))


def test_int8_is_left_alone(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from retrieval.encoders.numpy_text import int8 as int8_module

    if int8_module.int8_refusal() is not None:
        pytest.skip(f"no int8 text kernel here: {int8_module.int8_refusal()}")
    enc = _load(tiny_model, "onnxruntime", monkeypatch, precision="int8")
    assert enc.mode == "int8" and enc.runtime.name == "numpy" and "runtime" not in enc.precision_info()


def test_missing_onnxruntime_stays_on_numpy_and_says_why(
    built_index: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    assert "onnxruntime is not installed" in text_path(str(tiny_model)).reason
    with caplog.at_level("WARNING"):
        enc = _load(tiny_model, "auto", monkeypatch)
    assert enc.runtime.name == "numpy" and R.ORT_INSTALL in (enc.runtime.note or "")
    notices = [r.getMessage() for r in caplog.records if "runs on numpy" in r.getMessage()]
    assert len(notices) == 1 and "\n" not in notices[0] and R.ORT_INSTALL in notices[0]
    index = ImageIndex.open(built_index, device="cpu", precision="fp32")
    assert index.encoders.text_path().path == "numpy"
    assert len(index.search("a red square", k=3)) == 3
    assert index.encoders.text_path().path == "numpy" and R.ORT_INSTALL in index.encoders.text_path().reason
    assert index.info()["text_precision"]["runtime"] == "numpy"
    # Asked for by name: an error that names the package, not a silent fall-back to torch.
    monkeypatch.setenv(CH.TEXT_RUNTIME_ENV, "onnxruntime")
    with pytest.raises(R.RuntimeUnavailable, match="onnxruntime"):
        ImageIndex.open(built_index, device="cpu", precision="fp32").search("a red square", k=3)


def test_without_torch_a_cached_export_still_runs(tiny_model: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import torch

    monkeypatch.setenv(E.ONNX_CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setitem(sys.modules, "torch", None)
    enc = _load(tiny_model, "auto", monkeypatch)
    assert enc.runtime.name == "numpy" and "needs torch and transformers" in (enc.runtime.note or "")
    monkeypatch.setitem(sys.modules, "torch", torch)
    assert _load(tiny_model, "auto", monkeypatch).runtime.name == "onnxruntime"  # exported now
    monkeypatch.setitem(sys.modules, "torch", None)
    assert _load(tiny_model, "auto", monkeypatch).runtime.name == "onnxruntime"  # read from the cache


def test_a_damaged_cached_export_falls_back_and_is_made_again(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(E.ONNX_CACHE_ENV, str(tmp_path / "cache"))
    good = _load(tiny_model, "auto", monkeypatch)
    assert good.runtime.name == "onnxruntime"
    cached = E.cache_dir() / E.text_export_key(good.fingerprint, good.max_text_length)
    assert cached.is_file()
    cached.write_bytes(b"not an onnx file")
    broken = _load(tiny_model, "auto", monkeypatch)
    assert broken.runtime.name == "numpy" and "ONNX Runtime cannot load" in (broken.runtime.note or "")
    assert not cached.exists()  # removed: the next load exports it again
    np.testing.assert_allclose(broken.embed_texts(["a dog"]), good.embed_texts(["a dog"]), rtol=0, atol=1e-5)
    assert _load(tiny_model, "auto", monkeypatch).runtime.name == "onnxruntime"
    # A readable ONNX file that is not a text-tower export (other inputs): refused the same way.
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["pixel_values"], ["y"])], "other", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", E.OPSET)]), cached)
    other = _load(tiny_model, "auto", monkeypatch)
    assert other.runtime.name == "numpy" and "is not a text-tower export" in (other.runtime.note or "")


def test_a_failed_parity_check_falls_back(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CH, "CANDIDATES", tuple(dataclasses.replace(c, min_cosine=1.5) for c in CH.CANDIDATES))  # none passes
    enc = _load(tiny_model, "auto", monkeypatch)
    assert enc.runtime.name == "numpy" and "differ from numpy's" in (enc.runtime.note or "")
    assert enc.precision_info()["runtime_parity"]["min_cosine"] > 0.999
    monkeypatch.setenv(CH.TEXT_RUNTIME_ENV, "onnxruntime")
    with pytest.raises(ModelLoadError, match="differ from numpy's"):
        NumpyTextEncoder.load(str(tiny_model))


def test_the_session_takes_openblas_thread_count(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # serve limits OpenBLAS to --blas-threads (1 by default, for concurrent requests): the
    # session that replaces the numpy products keeps to the same budget.
    threadpoolctl = pytest.importorskip("threadpoolctl")
    if not any(i.get("internal_api") == "openblas" for i in threadpoolctl.threadpool_info()):
        pytest.skip("numpy is not linked against OpenBLAS here")
    with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):
        enc = _load(tiny_model, "onnxruntime", monkeypatch)
    assert enc._tower.session.get_session_options().intra_op_num_threads == 1  # type: ignore[attr-defined]
