"""int8 products in the numpy text tower (retrieval.encoders.numpy_text.int8): parity with fp32,
batch independence, ``auto``'s gate and speed check, CPU caps, fallbacks, ImageIndex and the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import cosines

from retrieval import ImageIndex
from retrieval.encoders.numpy_text import NumpyTextEncoder, UnsupportedTextTower, text_path
from retrieval.encoders.numpy_text import int8 as int8_module
from retrieval.encoders.numpy_text.encoder import keep_if_faster
from retrieval.encoders.numpy_text.weights import DenseLinear
from retrieval.encoders.precision import GATE_MEAN_COSINE, GateResult

TEXTS = ("a banana", "a black cat sleeping on a sofa", "a photo of " + "very " * 90 + "long", "x", "naïve café 東京")

pytestmark = pytest.mark.skipif(
    int8_module.int8_refusal() is not None, reason=f"no int8 text kernel here: {int8_module.int8_refusal()}"
)


@pytest.fixture(autouse=True)
def _numpy_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    """The numpy tower's own fp32 products (subprocesses inherit it): long-lived fp32 opens
    would otherwise run ONNX Runtime's (tests/test_text_runtime.py)."""
    monkeypatch.setenv("CLIPSEARCH_TEXT_RUNTIME", "numpy")


def test_int8_product_equals_the_dequantised_product() -> None:
    rng = np.random.default_rng(0)
    dense = DenseLinear(rng.standard_normal((64, 48), dtype=np.float32) * 0.1, rng.standard_normal(48, dtype=np.float32))
    x = rng.standard_normal((7, 64), dtype=np.float32)
    # 8-bit inputs only where int8 dot products do not saturate (VNNI, AMX): on AVX2 (real or
    # capped, FBGEMM_ENABLE_INSTRUCTIONS=AVX2) fbgemm's 16-bit pair sums overflow on them, which
    # is why such a CPU runs 7-bit ones (activation_bits, test_cpu_caps_choose_the_activation_range_or_refuse).
    for reduce_range in (False, True) if int8_module.activation_bits() == 8 else (True,):
        got = int8_module.Int8DynamicLinear(dense, reduce_range=reduce_range)(x)
        want = x @ dense.weight + dense.bias
        assert got.shape == (7, 48) and got.dtype == np.float32
        # int8 weights and 8- (7-) bit inputs: a few parts in a thousand of the output's range.
        tolerance = (0.01 if not reduce_range else 0.02) * np.abs(want).max()
        assert np.abs(got - want).max() < tolerance
        assert not np.array_equal(got, want)  # it really is quantised
    with pytest.raises(TypeError, match="float32 product"):
        int8_module.quantize_layer(
            int8_module.quantize_layer(_first_layer(), reduce_range=False), reduce_range=False
        )


def _first_layer() -> object:
    from retrieval.encoders.numpy_text.weights import LayerWeights

    rng = np.random.default_rng(1)

    def dense(i: int, o: int) -> DenseLinear:
        return DenseLinear(rng.standard_normal((i, o), dtype=np.float32), np.zeros(o, dtype=np.float32))

    ones, zeros = np.ones(8, dtype=np.float32), np.zeros(8, dtype=np.float32)
    return LayerWeights(ones, zeros, dense(8, 24), dense(8, 8), ones, zeros, dense(8, 16), dense(16, 8))


def test_int8_tower_tracks_fp32_and_a_text_does_not_depend_on_its_batch(tiny_model: Path) -> None:
    fp32 = NumpyTextEncoder.load(str(tiny_model))
    int8 = NumpyTextEncoder.load(str(tiny_model), precision="int8")
    assert int8.mode == "int8" and int8.requested == "int8" and int8._tower.uses_torch and not fp32._tower.uses_torch
    assert int8.precision_info()["int8"] == f"{int8_module.activation_bits()}-bit activations, torch fbgemm"
    batch = int8.embed_texts(list(TEXTS))
    single = np.stack([int8.embed_texts([t])[0] for t in TEXTS])
    reversed_batch = int8.embed_texts(list(reversed(TEXTS)))[::-1]
    # Each text runs alone: bit-identical whatever it is batched with, in any order.
    assert np.array_equal(batch, single) and np.array_equal(batch, reversed_batch)
    cos = cosines(batch, fp32.embed_texts(list(TEXTS)))
    assert cos.mean() >= GATE_MEAN_COSINE and cos.min() >= 0.99
    assert np.allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-6)
    assert int8.fingerprint == fp32.fingerprint and int8.dim == fp32.dim


def test_auto_gates_int8_and_keeps_it_only_when_faster(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    auto = NumpyTextEncoder.load(str(tiny_model), precision="auto")
    info = auto.precision_info()
    assert info["requested"] == "auto" and len(info["gate"]) == 1 and info["gate"][0]["mode"] == "int8"
    assert info["gate"][0]["samples"] == 24 and info["gate"][0]["passed"]
    # The tiny tower is overhead-bound: whichever mode won the timing, the note says why int8 lost.
    assert auto.mode == "int8" or "ran no faster" in info["int8"]
    # The outcome is remembered for these weights on this CPU: the next cold load does not gate.
    again = NumpyTextEncoder.load(str(tiny_model), precision="auto")
    assert again.mode == auto.mode and again.precision_info() == {**info, "gate_cached": True}
    monkeypatch.setenv("CLIPSEARCH_GATE_CACHE", "off")

    # A gate that fails: fp32, with the failing figures recorded.
    def failing(mode: str, reference: np.ndarray, candidate: np.ndarray, seconds: float = 0.0) -> GateResult:
        return GateResult(mode, len(reference), 0.98, 0.9, 0.5, 10, seconds)

    monkeypatch.setattr("retrieval.encoders.precision.gate", failing)
    failed = NumpyTextEncoder.load(str(tiny_model), precision="auto")
    assert failed.mode == "fp32" and not failed._tower.uses_torch
    assert failed.precision_info()["gate"][0]["passed"] is False


def test_planned_text_path_by_precision(tiny_model: Path) -> None:
    assert "fp32, no torch" in text_path(str(tiny_model)).reason
    assert text_path(str(tiny_model), precision="int8").path == "numpy"
    assert "where they pass the quality gate" in text_path(str(tiny_model), precision="auto").reason
    assert text_path(str(tiny_model), precision="bf16").path == "torch"


def test_keep_if_faster() -> None:
    assert keep_if_faster("int8", {"fp32": 0.3, "int8": 0.1}) == ("int8", None)
    mode, note = keep_if_faster("int8", {"fp32": 0.1, "int8": 0.1})
    assert mode == "fp32" and note is not None and "100 ms against 100 ms for the 24 probe texts" in note
    assert keep_if_faster("fp32", {"fp32": 0.3}) == ("fp32", None)


def test_cpu_caps_choose_the_activation_range_or_refuse(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fp32 = NumpyTextEncoder.load(str(tiny_model)).embed_texts(list(TEXTS))
    monkeypatch.setenv("CLIPSEARCH_CPU_CAP", "avx2")
    avx2 = NumpyTextEncoder.load(str(tiny_model), precision="int8")
    assert avx2.precision_info()["int8"] == "7-bit activations, torch fbgemm"
    assert all(p.reduce_range for p in (avx2._tower._layers[0].qkv, avx2._tower._layers[-1].fc2))  # type: ignore[attr-defined]
    assert cosines(avx2.embed_texts(list(TEXTS)), fp32).mean() >= GATE_MEAN_COSINE
    monkeypatch.setenv("CLIPSEARCH_CPU_CAP", "none")
    assert int8_module.int8_refusal() == "no fast int8 on this CPU (level none)"
    auto = NumpyTextEncoder.load(str(tiny_model), precision="auto")
    assert auto.mode == "fp32" and auto.precision_info() == {
        "requested": "auto", "mode": "fp32", "int8": "no fast int8 on this CPU (level none)",
    }  # fmt: skip
    with pytest.raises(UnsupportedTextTower, match="no fast int8"):
        NumpyTextEncoder.load(str(tiny_model), precision="int8")
    with pytest.raises(UnsupportedTextTower, match="bf16 runs in torch"):
        NumpyTextEncoder.load(str(tiny_model), precision="bf16")


def test_fbgemm_on_its_avx2_kernels_gets_7_bit_inputs(tiny_model: Path) -> None:
    # fbgemm has no AVX-VNNI kernels, so an AVX-VNNI laptop runs its AVX2 ones, as does any CPU
    # with FBGEMM_ENABLE_INSTRUCTIONS=AVX2 (read by fbgemm once per process: a subprocess). With
    # 8-bit inputs there, the tiny tower's texts fell to a mean cosine of 0.976 against fp32.
    code = (
        "import json, numpy as np; from retrieval.encoders.numpy_text import NumpyTextEncoder, int8; "
        f"texts = {list(TEXTS)!r}; "
        f"a = NumpyTextEncoder.load({str(tiny_model)!r}, precision='int8'); "
        f"b = NumpyTextEncoder.load({str(tiny_model)!r}).embed_texts(texts); "
        "c = (a.embed_texts(texts).astype(np.float64) * b).sum(1); "
        "print(json.dumps([int8.activation_bits(), a.precision_info()['int8'], float(c.mean()), float(c.min())]))"
    )
    env = {k: v for k, v in os.environ.items() if k != "CLIPSEARCH_CPU_CAP"} | {"FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True, timeout=120)
    bits, note, mean, least = json.loads(out.stdout)
    assert (bits, note) == (7, "7-bit activations, torch fbgemm")
    assert mean >= GATE_MEAN_COSINE and least >= 0.999


def test_fp32_queries_never_import_torch_for_int8(tiny_model: Path) -> None:
    code = (
        "import sys; from retrieval.encoders.numpy_text import NumpyTextEncoder; "
        f"e = NumpyTextEncoder.load({str(tiny_model)!r}); e.embed_texts(['a dog']); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "False"


def test_image_index_runs_int8_text_queries_on_the_numpy_path(built_index: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fp32 = ImageIndex.open(built_index, device="cpu")
    int8 = ImageIndex.open(built_index, device="cpu", precision="int8")
    planned = int8.encoders.text_path()
    assert planned.path == "numpy" and "int8 products" in planned.reason
    got, want = int8.search("a red square", k=5), fp32.search("a red square", k=5)
    assert int8.encoders.text_path().reason.startswith("loaded, int8 products (")
    assert isinstance(int8.encoders.text_encoder, NumpyTextEncoder) and int8._queries.loaded_encoder is None  # no torch model loaded
    assert len(got) == len(want) == 5
    assert abs(got[0].score - want[0].score) < 0.02
    # Where this machine has no int8 kernel, int8 queries go to the torch path (its own int8).
    monkeypatch.setattr(int8_module, "int8_refusal", lambda: "no kernel (test)")
    fallback = ImageIndex.open(built_index, device="cpu", precision="int8")
    assert len(fallback.search("a red square", k=5)) == 5
    assert fallback.encoders.text_path().path == "torch"


@pytest.mark.slow
def test_cli_search_with_int8_text(built_index: Path) -> None:
    env = {**os.environ}
    args = [sys.executable, "-m", "clipsearch", "search", str(built_index), "a red square", "-k", "3", "--json"]
    ours = subprocess.run([*args, "--precision", "int8"], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert ours.returncode == 0, ours.stderr
    assert len(json.loads(ours.stdout)["results"]) == 3 and "Traceback" not in ours.stderr
    bad = subprocess.run([*args, "--precision", "int4"], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert bad.returncode == 1 and bad.stderr.strip() == (
        "clipsearch: error: unknown precision 'int4'; use one of fp32, bf16, fp16, int8, auto"
    )
