"""Per-row int8 inference: quantisation error bounds, parity with fp32 layers, and vectors that
do not depend on their batch-mates (so an int8 update equals an int8 rebuild, bit for bit)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import assert_batch_independent, folder_pixels
from imagegen import make_jpegs
from torch import nn

from indexer import build_index
from retrieval import ImageIndex
from retrieval.encoders import HFClipEncoder, cpu
from retrieval.encoders import chooser as CH
from retrieval.encoders import int8 as I8
from retrieval.encoders import precision as P
from retrieval.encoders.int8 import Int8Linear, Int8PatchEmbedding, quantize_int8, quantize_rows
from retrieval.encoders.int8 import linear as int8_linear
from retrieval.encoders.int8.convert import fuse_projections
from retrieval.encoders.int8.kernel import onednn_available
from retrieval.encoders.numpy_text import int8 as text_int8
from retrieval.errors import InvalidArgumentError


@pytest.fixture(autouse=True)
def _torch_int8(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the torch int8 path; OpenVINO's int8 tower, which runs it first
    where installed, has its own (tests/test_image_runtime.py)."""
    monkeypatch.setenv("CLIPSEARCH_IMAGE_RUNTIME", "torch")

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
    # 7-bit codes (CPUs without int8 dot products): 126 steps, codes 0..127, same bound.
    codes, scale, zero = quantize_rows(x, steps=I8.REDUCED_STEPS)
    back = (codes.float() - zero) * scale
    assert int(codes.max()) <= 127 and int(codes[0].max()) - int(codes[0].min()) in (125, 126)
    assert torch.all((back - x).abs() <= scale * 0.5 + 1e-6 * x.abs() + 1e-12)


@pytest.mark.parametrize("shape", [(1, 13), (5, 64), (3, 7, 32), (0, 16)])
@pytest.mark.parametrize("bias", [True, False])
def test_int8_linear_matches_fp32(shape: tuple[int, ...], bias: bool, kernel: I8.Int8Kernel) -> None:
    torch.manual_seed(1)
    k = shape[-1]
    linear = nn.Linear(k, 24, bias=bias)
    x = torch.randn(*shape)
    q = Int8Linear(linear, kernel=kernel)
    with torch.inference_mode():
        ref, out = linear(x), q(x)
    assert out.shape == ref.shape and out.dtype == torch.float32
    if out.numel():
        err = (out - ref).norm() / ref.norm()
        assert err < 0.02, float(err)


def _exact_kernels() -> list[I8.Int8Kernel]:
    """The kernels whose integer sums are exact on this machine's real kernels (not our cap):
    oneDNN with 7-bit codes on any x86; 8-bit codes and ``torch._int_mm`` only with int8 dot
    products (without them both saturate 16-bit pair sums, see test_reduced_range_...)."""
    dot = cpu.rank(cpu.kernel_level()) >= cpu.rank("avx_vnni")
    out = []
    for onednn in (True, False):
        for steps in (I8.FULL_STEPS, I8.REDUCED_STEPS):
            if onednn and not onednn_available():
                continue
            if (steps == I8.FULL_STEPS or not onednn) and not dot:
                continue
            out.append(I8.Int8Kernel(onednn=onednn, steps=steps))
    return out


KERNELS = [I8.Int8Kernel(o, s) for o in (True, False) for s in (I8.FULL_STEPS, I8.REDUCED_STEPS)]


@pytest.fixture(params=KERNELS, ids=lambda k: f"{'onednn' if k.onednn else 'int_mm'}-{k.steps}")
def kernel(request: pytest.FixtureRequest) -> I8.Int8Kernel:
    """Each int8 kernel this CPU runs exactly; the others skip, saying why."""
    if request.param not in _exact_kernels():
        pytest.skip(f"{request.param} is not exact on a {cpu.kernel_level()} CPU (or oneDNN's op is missing)")
    return request.param


@pytest.mark.parametrize("k,n", [(96, 48), (37, 5), (768, 64)])
def test_int8_linear_rows_are_independent_of_their_batch(kernel: I8.Int8Kernel, k: int, n: int) -> None:
    torch.manual_seed(2)
    q = Int8Linear(nn.Linear(k, n), kernel=kernel)
    x = torch.randn(37, k) * torch.linspace(0.01, 30, 37)[:, None]
    with torch.inference_mode():
        whole = q(x)
        for i in (0, 5, 36):
            assert torch.equal(q(x[i : i + 1]), whole[i : i + 1])
        assert torch.equal(q(x[3:20]), whole[3:20])
        assert torch.equal(q(x.t().contiguous().t()), whole)  # a strided input: same codes


def _exact_product(q: Int8Linear, x: torch.Tensor) -> torch.Tensor:
    """What ``q(x)`` must be: its own codes of ``x``, multiplied in float64 (exact for integers)."""
    codes, scale, zero = quantize_rows(x.clone(), steps=q.kernel.steps)
    acc = (codes.double() - zero.double()) @ q.weight_codes.double().t()
    return acc * q.col_scale.double() * scale.double() + q.bias.double()


def _saturating_case() -> tuple[nn.Linear, torch.Tensor]:
    # Weights of +-1 (codes +-127) in pairs of equal sign and inputs near their row maximum:
    # a 16-bit pair sum of 8-bit codes would reach 2 * 254 * 127 and saturate.
    torch.manual_seed(6)
    linear = nn.Linear(256, 32)
    with torch.no_grad():
        linear.weight.copy_(torch.sign(torch.randn(32, 128)).repeat_interleave(2, dim=1))
    x = torch.rand(8, 256) * 0.1 + 1.0
    return linear, x


def test_every_kernel_sums_exactly_and_agrees_with_the_others(kernel: I8.Int8Kernel) -> None:
    linear, x = _saturating_case()
    q = Int8Linear(linear, kernel=kernel)
    with torch.inference_mode():
        out = q(x)
        copied = copy.deepcopy(q)  # oneDNN's packed weight cannot be copied: packed again
        assert torch.equal(copied(x), out)
    # Exact integer sums; only the float steps of dequantisation may round differently.
    torch.testing.assert_close(out.double(), _exact_product(q, x), rtol=1e-6, atol=1e-5)
    torch.manual_seed(4)
    small = nn.Linear(64, 40)
    y = torch.randn(9, 64)
    same_steps = [k for k in _exact_kernels() if k.steps == kernel.steps]
    with torch.inference_mode():
        outs = [Int8Linear(small, kernel=k)(y) for k in same_steps]
    for other in outs[1:]:
        torch.testing.assert_close(other, outs[0], rtol=1e-6, atol=1e-6)


_AVX2_PROBE = """
import json, torch
from torch import nn
from retrieval.encoders import cpu, int8 as I8
torch.manual_seed(6)
linear = nn.Linear(256, 32)
with torch.no_grad():
    linear.weight.copy_(torch.sign(torch.randn(32, 128)).repeat_interleave(2, dim=1))
x = torch.rand(8, 256) * 0.1 + 1.0
def err(kernel):
    q = I8.Int8Linear(linear, kernel=kernel)
    codes, scale, zero = I8.quantize_rows(x.clone(), steps=kernel.steps)
    ref = ((codes.double() - zero.double()) @ q.weight_codes.double().t()) * q.col_scale.double() * scale.double() + q.bias.double()
    with torch.inference_mode():
        return float(((q(x).double() - ref).abs().max() / ref.abs().max()))
chosen = I8.current_kernel()
print(json.dumps({"level": cpu.cpu_level(), "steps": chosen.steps, "chosen": err(chosen),
                  "full": err(I8.Int8Kernel(onednn=True, steps=I8.FULL_STEPS))}))
"""


def test_reduced_range_is_chosen_and_exact_where_onednn_runs_avx2_kernels() -> None:
    """oneDNN told to use AVX2 kernels (as on an AVX2-only host): 8-bit codes saturate there,
    so the kernel chosen has 7-bit codes, and its sums are exact."""
    import subprocess
    import sys

    if not onednn_available():
        pytest.skip("oneDNN's int8 linear is x86-only")
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    env.pop(cpu.CAP_ENV, None)
    proc = subprocess.run([sys.executable, "-c", _AVX2_PROBE], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    probe = json.loads(proc.stdout)
    assert probe["level"] == "avx2" and probe["steps"] == I8.REDUCED_STEPS
    assert probe["chosen"] < 1e-6
    assert probe["full"] > 0.05  # what the reduced range avoids: saturated pair sums


def test_fused_projections_equal_separate_layers_and_release_the_product() -> None:
    torch.manual_seed(5)
    parent = nn.Module()
    for name, bias in (("q_proj", True), ("k_proj", False), ("v_proj", True)):
        setattr(parent, name, nn.Linear(32, 16, bias=bias))
    separate = {name: Int8Linear(getattr(parent, name)) for name in ("q_proj", "k_proj", "v_proj")}
    fuse_projections(parent)
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
    pixels = folder_pixels(photos, enc.preprocess)
    vectors = enc.embed_pixels(pixels)
    result = P.gate("int8", ref.embed_pixels(pixels), vectors)
    assert result.passed and result.mean_cosine > 0.9999, result
    assert_batch_independent(enc.embed_pixels, pixels, vectors, ((0, 1), (7, 8), (3, 11), (19, 20)))
    # Captions are padded to the batch's longest, and fp32 attention over another length rounds
    # differently (as in fp32 itself): close, not bit-identical.
    texts = ["a dog", "a red race car on a track", "x " * 100]
    together = enc.embed_texts(texts)
    for i, text in enumerate(texts):
        np.testing.assert_allclose(enc.embed_texts([text]), together[i : i + 1], rtol=0, atol=1e-4)


def test_cpu_batches_run_in_calls_that_keep_activations_small(
    tiny_model: Path, photos: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch is split into calls of images_per_call images (even sizes), and the int8 vectors
    are the ones one call gives, bit for bit."""
    from retrieval.encoders import chunking
    from retrieval.encoders.hf import encoder as hf_encoder

    enc = HFClipEncoder.load(str(tiny_model), device="cpu", precision="int8")
    pixels = folder_pixels(photos, enc.preprocess)[:10]
    whole = enc.embed_pixels(pixels)
    vision = enc.config.vision_config
    tokens = (pixels.shape[-1] // vision.patch_size) ** 2 + 1
    assert enc._images_per_call(pixels) == chunking.images_per_call(tokens, vision.intermediate_size)
    calls: list[int] = []
    real = hf_encoder.HFClipEncoder._embed_torch

    def counted(self: HFClipEncoder, values: torch.Tensor, mode: P.Mode) -> np.ndarray:
        calls.append(len(values))
        return real(self, values, mode)

    monkeypatch.setattr(hf_encoder.HFClipEncoder, "_embed_torch", counted)
    # Room for 4 images' widest activation per call: 10 images are 3 calls of 4, 3 and 3.
    monkeypatch.setattr(hf_encoder, "images_per_call", lambda t, w: chunking.images_per_call(t, w, limit=4 * t * w * 4))
    np.testing.assert_array_equal(enc.embed_pixels(pixels), whole)
    assert calls == [10, 4, 3, 3]


def test_images_per_call_bounds_the_widest_activation() -> None:
    from retrieval.encoders.chunking import CPU_CALL_BYTES, images_per_call, in_calls

    # ViT-B/32 (50 tokens, MLP 3072) and ViT-L/14 (257 tokens, MLP 4096) at 224 pixels.
    assert images_per_call(50, 3072) == CPU_CALL_BYTES // (50 * 3072 * 4) == 27
    assert images_per_call(257, 4096) == 3
    assert images_per_call(10_000, 10_000) == 1
    with pytest.raises(ValueError):
        images_per_call(0, 3072)
    seen: list[int] = []
    out = in_calls(torch.arange(64).reshape(64, 1), 27, lambda x: (seen.append(len(x)), x.numpy())[1])
    assert seen == [22, 21, 21] and out.ravel().tolist() == list(range(64))


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
    np.testing.assert_array_equal(a.vectors.embeddings()[order_a], b.vectors.embeddings()[order_b])


def _model_info(index_dir: Path) -> dict:
    return json.loads((index_dir / "manifest.json").read_text())["model_info"]


def test_default_is_auto_for_a_new_index_and_the_recorded_mode_on_update(
    tiny_model: Path, photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = sorted(p.name for p in photos.iterdir())
    out = tmp_path / "d.idx"
    build_index(photos, out, model=str(tiny_model), workers=0, device="cpu", files=files[:8])
    info = _model_info(out)
    assert info["precision_requested"] == "auto"
    candidates = P.auto_candidates(torch.device("cpu"))
    if candidates:  # this CPU (or its cap) has a reduced mode to try: the first one not passed over was gated
        gate = info["precision_gate"]
        offered = [mode for mode in candidates if mode not in gate.get("passed_over", {})]
        assert gate["gate"][0]["mode"] == offered[0]
        # Here on torch (this module's runtime), bf16 is passed over: its vectors move with the batch.
        assert "bf16" not in offered
    else:
        assert "precision_gate" not in info and info["precision"] == "fp32"

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


@pytest.mark.parametrize(
    "flags,level,candidates",
    [
        ({"sse4_2"}, "none", ()),
        ({"avx2", "fma"}, "avx2", ("int8",)),
        ({"avx2", "fma", "avx512f", "avx512_bf16"}, "avx2", ("int8",)),  # AVX-512 without VNNI
        ({"avx2", "fma", "avx_vnni"}, "avx_vnni", ("int8",)),
        ({"avx2", "fma", "avx512_vnni"}, "avx512_vnni", ("int8",)),
        ({"avx512_vnni", "amx_bf16", "amx_int8"}, "amx", ("bf16", "int8")),
    ],
)
def test_cpu_level_decides_the_candidates_and_the_int8_range(
    flags: set[str], level: str, candidates: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(cpu.CAP_ENV, raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(cpu.platform, "machine", lambda: "x86_64")
    assert cpu.cpu_level() == level
    assert P.auto_candidates(torch.device("cpu")) == candidates
    assert P.auto_candidates(torch.device("cuda")) == ("fp16", "bf16")
    # torch's text tower gates what the image tower does; the numpy text tower computes int8 only.
    assert P.auto_candidates(torch.device("cpu"), "text") == candidates
    assert CH.auto_modes("text", "cpu", "numpy") == tuple(m for m in candidates if m == "int8")
    # 8-bit codes where the level has int8 dot products and this machine's kernel did not
    # saturate on the probe (on an AVX2 host it does, whatever flags the test pretends).
    dot = level in ("avx_vnni", "avx512_vnni", "amx")
    full = dot and not I8.full_codes_saturate(onednn_available())
    assert I8.current_kernel().steps == (I8.FULL_STEPS if full else I8.REDUCED_STEPS)
    # The text tower's fbgemm has no AVX-VNNI kernels: 8-bit activations from AVX-512 VNNI up.
    text_full = level in ("avx512_vnni", "amx") and not text_int8.full_inputs_saturate()
    assert text_int8.activation_bits() == (8 if text_full else 7)
    # Other architectures: no int8 measured there, so fp32 and the safe range.
    monkeypatch.setattr(cpu.platform, "machine", lambda: "aarch64")
    assert cpu.cpu_level() == "none" and P.auto_candidates(torch.device("cpu")) == ()


def test_the_environment_caps_the_level_and_refuses_an_unknown_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"avx2", "fma", "avx512_vnni", "amx_bf16", "amx_int8"}))
    monkeypatch.setattr(cpu.platform, "machine", lambda: "x86_64")
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", cpu.FBGEMM_ENV):
        monkeypatch.delenv(name, raising=False)
    for cap in cpu.LEVELS:
        monkeypatch.setenv(cpu.CAP_ENV, cap)
        assert cpu.cpu_level() == cap and cpu.detected_level() == "amx"
    monkeypatch.setenv(cpu.CAP_ENV, " AVX2 ")
    assert cpu.cpu_level() == "avx2" and cpu.describe() == {"detected": "amx", "level": "avx2", "cap": " AVX2 "}
    # A cap above the CPU changes nothing.
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    monkeypatch.setenv(cpu.CAP_ENV, "amx")
    assert cpu.cpu_level() == "avx2"
    # oneDNN's own cap lowers the level too (its AVX2 kernels would saturate 8-bit codes).
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"avx2", "fma", "avx512_vnni"}))
    monkeypatch.delenv(cpu.CAP_ENV)
    for isa, level in (("AVX2", "avx2"), ("avx512_core", "avx2"), ("AVX2_VNNI", "avx_vnni"),
                       ("AVX512_CORE_VNNI", "avx512_vnni"), ("SSE41", "none"), ("something_new", "none")):
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)
        assert (cpu.kernel_level(), cpu.cpu_level()) == (level, level), isa
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "DEFAULT")
    assert cpu.cpu_level() == "avx512_vnni"
    # fbgemm's cap is reported, not read as a level (the text tower probes its kernel instead:
    # test_text_int8.test_fbgemm_on_its_avx2_kernels_gets_7_bit_inputs).
    monkeypatch.setenv(cpu.FBGEMM_ENV, "AVX2")
    assert cpu.cpu_level() == "avx512_vnni" and cpu.describe()["fbgemm_cap"] == "AVX2"
    monkeypatch.delenv(cpu.FBGEMM_ENV)
    monkeypatch.setenv(cpu.CAP_ENV, "avx-2")
    with pytest.raises(InvalidArgumentError, match="CLIPSEARCH_CPU_CAP='avx-2' is not a CPU level; use one of none, avx2"):
        cpu.cpu_level()


def test_a_kernel_that_saturates_gets_7_bit_codes_whatever_the_level(monkeypatch: pytest.MonkeyPatch) -> None:
    # The probe itself: oneDNN told to use its AVX2 kernels (read once per process: a
    # subprocess) saturates 8-bit codes on any x86; this machine's own kernels do not where
    # the CPU has AVX-512 VNNI or AMX.
    code = "from retrieval.encoders import int8; print(int8.full_codes_saturate(True))"
    env = {k: v for k, v in os.environ.items() if k != cpu.CAP_ENV} | {"ONEDNN_MAX_CPU_ISA": "AVX2"}
    if onednn_available():
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True, timeout=120)
        assert out.stdout.strip() == "True"
    if cpu.detected_level() in ("avx512_vnni", "amx") and onednn_available() and not os.environ.get("ONEDNN_MAX_CPU_ISA"):
        assert I8.full_codes_saturate(True) is False
    # Wiring: a level with int8 dot products and a kernel that saturated -> 7-bit codes.
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"avx2", "fma", "avx512_vnni"}))
    monkeypatch.setattr(cpu.platform, "machine", lambda: "x86_64")
    for name in (cpu.CAP_ENV, "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(int8_linear, "full_codes_saturate", lambda onednn: True)
    monkeypatch.setattr(text_int8, "full_inputs_saturate", lambda: True)
    assert I8.current_kernel().steps == I8.REDUCED_STEPS and text_int8.activation_bits() == 7
    monkeypatch.setattr(int8_linear, "full_codes_saturate", lambda onednn: False)
    monkeypatch.setattr(text_int8, "full_inputs_saturate", lambda: False)
    assert I8.current_kernel().steps == I8.FULL_STEPS and text_int8.activation_bits() == 8


def test_auto_keeps_fp32_without_a_fast_int8_path_and_does_not_calibrate(
    tiny_model: Path, photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(cpu.CAP_ENV, "none")
    assert P.auto_candidates(torch.device("cpu")) == ()
    embedded: list[int] = []
    real = HFClipEncoder._embed_pixels

    def counting(self: HFClipEncoder, pixel_values: torch.Tensor, mode: str) -> np.ndarray:
        embedded.append(len(pixel_values))
        return real(self, pixel_values, mode)

    monkeypatch.setattr(HFClipEncoder, "_embed_pixels", counting)
    files = sorted(p.name for p in photos.iterdir())[:4]
    report = build_index(photos, tmp_path / "n.idx", model=str(tiny_model), workers=0, device="cpu", files=files)
    info = _model_info(tmp_path / "n.idx")
    assert report.precision == "fp32" and info["precision_requested"] == "auto" and "precision_gate" not in info
    assert sum(embedded) == 4  # each image once: no calibration sample embedded on the side


def test_int8_on_a_capped_cpu_uses_the_reduced_range_and_passes_the_gate(
    tiny_model: Path, photos: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(cpu.CAP_ENV, "avx2")
    if not cpu.has_fast_int8():
        pytest.skip(f"this CPU ({cpu.detected_level()}) is below AVX2")
    enc = HFClipEncoder.load(str(tiny_model), device="cpu", precision="auto")
    ref = HFClipEncoder.load(str(tiny_model), device="cpu")
    pixels = folder_pixels(photos, ref.preprocess)
    vectors = enc.embed_pixels(pixels)
    assert enc.info["precision"] == "int8" and enc.info["precision_gate"]["gate"][0]["mode"] == "int8"
    layer = enc.image_precision.variants["int8"].visual_projection
    assert layer.kernel.steps == I8.REDUCED_STEPS and enc.info["int8_activation_bits"] == 7
    result = P.gate("int8", ref.embed_pixels(pixels), vectors)
    assert result.passed and result.mean_cosine > 0.999, result
    assert_batch_independent(enc.embed_pixels, pixels, vectors, ((0, 1), (3, 11)))


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
