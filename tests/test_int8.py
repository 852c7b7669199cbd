"""Per-row int8 inference: quantisation error bounds, parity with fp32 layers, and vectors that
do not depend on their batch-mates (so an int8 update equals an int8 rebuild, bit for bit)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from imagegen import make_jpegs
from indexer import build_index
from retrieval import ImageIndex
from retrieval.encoders import HFClipEncoder
from retrieval.encoders import precision as P
from retrieval.encoders import int8 as I8
from retrieval.encoders.int8 import Int8Linear, Int8PatchEmbedding, quantize_int8, quantize_rows
from retrieval.images import load_pixels


def test_row_quantisation_error_is_half_a_step() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 40, generator=g) * torch.logspace(-3, 2, 64)[:, None]
    x[1] = 0.0  # all zero
    x[2] = x[2].abs() + 1.0  # all positive: the range is widened to include 0
    x[3] = -x[3].abs() - 1.0  # all negative
    x[4, :] = 7.0  # constant
    codes, scale, zero = quantize_rows(x)
    assert codes.dtype == torch.uint8 and scale.shape == zero.shape == (64, 1)
    back = (codes.float() - zero) * scale
    assert torch.all((back - x).abs() <= scale * 0.5 + 1e-6 * x.abs() + 1e-12)
    assert torch.equal(back[1], torch.zeros(40))
    # Each row uses the whole code range (its zero point may pin one end): 254 steps.
    assert int(codes[0].max()) - int(codes[0].min()) in (253, 254)


@pytest.mark.parametrize("shape", [(1, 13), (5, 64), (3, 7, 32), (0, 16)])
@pytest.mark.parametrize("bias", [True, False])
def test_int8_linear_matches_fp32(shape: tuple[int, ...], bias: bool, backend: str) -> None:
    torch.manual_seed(1)
    k = shape[-1]
    linear = nn.Linear(k, 24, bias=bias)
    x = torch.randn(*shape)
    q = Int8Linear(linear)
    with torch.inference_mode():
        ref, out = linear(x), q(x)
    assert out.shape == ref.shape and out.dtype == torch.float32
    if out.numel():
        err = (out - ref).norm() / ref.norm()
        assert err < 0.02, float(err)


BACKENDS = ["onednn", "int_mm"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test with oneDNN's uint8 x int8 linear and with the ``torch._int_mm`` fallback."""
    if request.param == "onednn" and not I8._onednn_int8():
        pytest.skip("oneDNN's int8 linear needs an x86 CPU with int8 dot products")
    monkeypatch.setattr(I8, "_onednn_int8", lambda: request.param == "onednn")
    return str(request.param)


@pytest.mark.parametrize("k,n", [(96, 48), (37, 5), (768, 64)])
def test_int8_linear_rows_are_independent_of_their_batch(backend: str, k: int, n: int) -> None:
    torch.manual_seed(2)
    q = Int8Linear(nn.Linear(k, n))
    x = torch.randn(37, k) * torch.linspace(0.01, 30, 37)[:, None]
    with torch.inference_mode():
        whole = q(x)
        for i in (0, 5, 36):
            assert torch.equal(q(x[i : i + 1]), whole[i : i + 1])
        assert torch.equal(q(x[3:20]), whole[3:20])
        assert torch.equal(q(x.t().contiguous().t()), whole)  # a strided input: same codes


def test_int8_backends_agree_and_copies_repack(monkeypatch: pytest.MonkeyPatch) -> None:
    if not I8._onednn_int8():
        pytest.skip("oneDNN's int8 linear needs an x86 CPU with int8 dot products")
    torch.manual_seed(4)
    q = Int8Linear(nn.Linear(64, 40))
    x = torch.randn(9, 64)
    with torch.inference_mode():
        fast = q(x)
        copied = copy.deepcopy(q)  # oneDNN's packed weight cannot be copied: packed again
        assert torch.equal(copied(x), fast)
        monkeypatch.setattr(I8, "_onednn_int8", lambda: False)
        slow = q(x)
    # The same integer sums; only the float steps of dequantisation may round differently.
    torch.testing.assert_close(slow, fast, rtol=1e-6, atol=1e-6)


def test_fused_projections_equal_separate_layers_and_release_the_product() -> None:
    torch.manual_seed(5)
    parent = nn.Module()
    for name, bias in (("q_proj", True), ("k_proj", False), ("v_proj", True)):
        setattr(parent, name, nn.Linear(32, 16, bias=bias))
    separate = {name: Int8Linear(getattr(parent, name)) for name in ("q_proj", "k_proj", "v_proj")}
    I8._fuse_projections(parent)
    x = torch.randn(2, 7, 32)
    with torch.inference_mode():
        for name in ("k_proj", "q_proj", "v_proj"):  # any order
            assert torch.equal(getattr(parent, name)(x), separate[name](x))
        assert parent.q_proj.fused._output is None  # all three served: nothing held
        y = torch.randn(2, 7, 32)
        assert torch.equal(parent.q_proj(y), separate["q_proj"](y))
        assert torch.equal(parent.q_proj(x), separate["q_proj"](x))  # a new input: computed anew
        assert torch.equal(parent.v_proj(y), separate["v_proj"](y))


def test_patch_embedding_matches_the_convolution() -> None:
    torch.manual_seed(3)
    conv = nn.Conv2d(3, 32, kernel_size=8, stride=8, bias=False)
    x = torch.randn(2, 3, 36, 28)  # not multiples of the kernel: the remainder is dropped
    q = Int8PatchEmbedding(conv)
    with torch.inference_mode():
        ref, out = conv(x), q(x)
    assert out.shape == ref.shape == (2, 32, 4, 3)
    assert (out - ref).norm() / ref.norm() < 0.02
    assert q.weight.dtype == torch.float32  # transformers reads the convolution's weight dtype


def test_quantize_int8_converts_clip_and_leaves_the_original(tiny_model: Path) -> None:
    from transformers import CLIPVisionModelWithProjection

    from retrieval.encoders.base import quiet_transformers

    with quiet_transformers():
        model = CLIPVisionModelWithProjection.from_pretrained(tiny_model).eval()
    q = quantize_int8(model)
    layer = q.vision_model.encoder.layers[0]
    assert isinstance(layer.mlp.fc1, Int8Linear)
    attn = layer.self_attn  # q/k/v: one product over the shared input
    assert attn.q_proj.fused is attn.k_proj.fused is attn.v_proj.fused
    assert isinstance(attn.q_proj.fused.linear, Int8Linear)
    assert type(layer.mlp.activation_fn).__name__ == "_SiluInPlace"  # quick-GELU folded
    assert isinstance(q.vision_model.embeddings.patch_embedding, Int8PatchEmbedding)
    assert isinstance(q.visual_projection, Int8Linear)
    assert type(model.vision_model.encoder.layers[0].mlp.fc1) is nn.Linear  # a copy was converted


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("int8") / "photos"
    make_jpegs(root, 20, size=(160, 120))
    return root


def test_tiny_clip_in_int8_is_close_to_fp32_and_batch_invariant(tiny_model: Path, photos: Path) -> None:
    ref = HFClipEncoder.load(str(tiny_model), device="cpu")
    enc = HFClipEncoder.load(str(tiny_model), device="cpu", precision="int8")
    pixels = torch.stack([load_pixels(p, enc.preprocess)[0] for p in sorted(photos.iterdir())])
    vectors = enc.embed_pixels(pixels)
    result = P.gate("int8", ref.embed_pixels(pixels), vectors)
    assert result.passed and result.mean_cosine > 0.9999, result
    for lo, hi in ((0, 1), (7, 8), (3, 11), (19, 20)):
        np.testing.assert_array_equal(enc.embed_pixels(pixels[lo:hi]), vectors[lo:hi])
    # Captions are padded to the batch's longest, and fp32 attention over another length rounds
    # differently (as in fp32 itself): close, not bit-identical.
    texts = ["a dog", "a red race car on a track", "x " * 100]
    together = enc.embed_texts(texts)
    for i, text in enumerate(texts):
        np.testing.assert_allclose(enc.embed_texts([text]), together[i : i + 1], rtol=0, atol=1e-4)


def test_int8_update_equals_int8_rebuild_bit_for_bit(tiny_model: Path, photos: Path, tmp_path: Path) -> None:
    files = sorted(p.name for p in photos.iterdir())
    common = dict(model=str(tiny_model), workers=0, device="cpu", precision="int8")
    build_index(photos, tmp_path / "u.idx", files=files[:7], batch_size=3, **common)
    report = build_index(photos, tmp_path / "u.idx", batch_size=4, **common)
    assert report.added == 13
    build_index(photos, tmp_path / "r.idx", batch_size=16, **common)
    a, b = ImageIndex.open(tmp_path / "u.idx"), ImageIndex.open(tmp_path / "r.idx")
    order_a = np.argsort([r["path"] for r in a.rows(range(len(a)))])
    order_b = np.argsort([r["path"] for r in b.rows(range(len(b)))])
    np.testing.assert_array_equal(a.embeddings()[order_a], b.embeddings()[order_b])


def _model_info(index_dir: Path) -> dict:
    return json.loads((index_dir / "manifest.json").read_text())["model_info"]


def test_default_is_auto_for_a_new_index_and_the_recorded_mode_on_update(
    tiny_model: Path, photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = sorted(p.name for p in photos.iterdir())
    out = tmp_path / "d.idx"
    build_index(photos, out, model=str(tiny_model), workers=0, device="cpu", files=files[:8])
    info = _model_info(out)
    assert info["precision_requested"] == "auto" and info["precision_gate"]["gate"][0]["mode"] == "int8"

    fixed = tmp_path / "f.idx"
    build_index(photos, fixed, model=str(tiny_model), workers=0, device="cpu", precision="fp32", files=files[:8])

    def no_calibration(*args: object, **kwargs: object) -> None:
        raise AssertionError("an update without --precision calibrated")

    monkeypatch.setattr(P, "choose", no_calibration)
    report = build_index(photos, fixed, model=str(tiny_model), workers=0, device="cpu")
    info = _model_info(fixed)
    assert report.added == 12 and report.precision == "fp32"
    assert (info["precision"], info["precision_requested"], info["precisions"]) == ("fp32", "fp32", ["fp32"])
    # An index from before precision modes (nothing recorded) holds fp32 vectors: kept so.
    few = tmp_path / "few"
    make_jpegs(few, 4, size=(96, 80))
    old = tmp_path / "old.idx"
    build_index(few, old, model=str(tiny_model), workers=0, device="cpu", precision="fp32", files=["img_00000.jpg"])
    manifest = json.loads((old / "manifest.json").read_text())
    for key in ("precision", "precision_requested", "precisions"):
        manifest["model_info"].pop(key)
    manifest.pop("manifest_digest")  # hand-edited: a stale digest would be reported as damage
    (old / "manifest.json").write_text(json.dumps(manifest))
    report = build_index(few, old, model=str(tiny_model), workers=0, device="cpu")
    assert report.added == 3 and report.precision == "fp32" and _model_info(old)["precisions"] == ["fp32"]


def test_auto_keeps_fp32_without_int8_dot_products(
    tiny_model: Path, photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(P, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    assert P.auto_candidates(torch.device("cpu")) == ()
    monkeypatch.setattr(P, "cpu_flags", lambda: frozenset({"avx2", "avx_vnni"}))
    assert P.auto_candidates(torch.device("cpu")) == ("int8",)
    monkeypatch.setattr(P, "cpu_flags", lambda: frozenset({"avx512_vnni", "amx_bf16", "amx_int8"}))
    assert P.auto_candidates(torch.device("cpu")) == ("bf16", "int8")
    monkeypatch.setattr(P, "cpu_flags", lambda: frozenset())
    files = sorted(p.name for p in photos.iterdir())[:4]
    report = build_index(photos, tmp_path / "n.idx", model=str(tiny_model), workers=0, device="cpu", files=files)
    info = _model_info(tmp_path / "n.idx")
    assert report.precision == "fp32" and info["precision_requested"] == "auto" and "precision_gate" not in info


def test_retained_heap_applies_on_glibc_and_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    import platform

    from indexer import heap

    with heap.retained_heap() as applied:
        big = torch.ones(8 << 20)  # 32 MB: from the heap, not mmap
        del big
    assert applied == (platform.libc_ver()[0] == "glibc")
    monkeypatch.setenv(heap.OPT_OUT_ENV, "1")
    with heap.retained_heap() as applied:
        assert not applied
