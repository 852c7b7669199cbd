"""Reduced precision: modes, the quality gate, ``auto`` and what the manifest records."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import cli_here, run_cli
from helpers import folder_pixels
from imagegen import make_jpegs

from indexer import build_index
from indexer.build import BuildConfig
from retrieval.encoders import HFClipEncoder, cpu, load_encoder
from retrieval.encoders import precision as P
from retrieval.errors import InvalidArgumentError
from retrieval.images import load_pixels


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("prec") / "photos"
    make_jpegs(root, 20, size=(160, 120))
    return root


@pytest.fixture(scope="module")
def pixels(tiny_model: Path, photos: Path) -> torch.Tensor:
    return folder_pixels(photos, HFClipEncoder.load(str(tiny_model), device="cpu").preprocess)


def test_parse_precision_and_mode() -> None:
    assert P.PRECISIONS == ("fp32", "bf16", "fp16", "int8", "auto") and P.MODES == P.PRECISIONS[:-1]
    for mode in P.PRECISIONS:
        assert P.parse_precision(mode) == mode
    for bad in ("fp64", "", "INT8", None, 16, b"fp32"):
        with pytest.raises(InvalidArgumentError, match="unknown precision"):
            P.parse_precision(bad)
    assert P.parse_mode("int8") == "int8"
    with pytest.raises(InvalidArgumentError, match="not auto"):
        P.parse_mode("auto")


def test_unknown_precision_is_refused(tiny_model: Path) -> None:
    for bad in ("fp64", "", "INT8"):
        with pytest.raises(InvalidArgumentError, match="unknown precision"):
            load_encoder(str(tiny_model), device="cpu", precision=bad)
    with pytest.raises(InvalidArgumentError, match="unknown precision"):
        BuildConfig(precision="half")
    with pytest.raises(InvalidArgumentError, match="threads"):
        BuildConfig(threads=0)


@pytest.mark.parametrize("mode", ["bf16", "fp16", "int8"])
def test_reduced_modes_stay_close_to_fp32(tiny_model: Path, pixels: torch.Tensor, mode: str) -> None:
    ref = HFClipEncoder.load(str(tiny_model), device="cpu")
    enc = HFClipEncoder.load(str(tiny_model), device="cpu", precision=mode)
    result = P.gate(mode, ref.embed_pixels(pixels), enc.embed_pixels(pixels))
    assert result.passed, result
    texts = list(P.PROBE_TEXTS[:6])
    cos = (ref.embed_texts(texts) * enc.embed_texts(texts)).sum(axis=1)
    assert cos.min() >= 0.99, cos
    assert enc.info["precision"] == mode
    if mode == "int8":  # 7-bit codes where 8-bit ones would saturate (no int8 dot products)
        assert enc.info["int8_activation_bits"] == (8 if cpu.has_int8_dot() else 7)


def test_gate_figures_and_choice() -> None:
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(30, 16)).astype(np.float32)
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    same = P.gate("int8", ref, ref.copy())
    assert same.passed and same.mean_cosine == pytest.approx(1.0) and (same.topk_overlap, same.k) == (1.0, 10)
    noisy = ref + rng.normal(scale=0.5, size=ref.shape).astype(np.float32)
    noisy /= np.linalg.norm(noisy, axis=1, keepdims=True)
    bad = P.gate("int8", ref, noisy)
    assert not bad.passed and bad.min_cosine < 0.99
    # The first passing candidate wins; a failing one is rejected and its figures kept.
    vectors = {"fp32": ref, "bf16": noisy, "int8": ref}
    mode, results = P.choose(lambda m: vectors[m], ["bf16", "int8"])
    assert mode == "int8" and [r.mode for r in results] == ["bf16", "int8"] and not results[0].passed
    mode, results = P.choose(lambda m: vectors[m], ["bf16"])
    assert mode == "fp32" and len(results) == 1

    def unused(mode: str) -> np.ndarray:
        raise AssertionError(f"embedded the sample in {mode} with nothing to compare")

    assert P.choose(unused, []) == ("fp32", [])
    assert P.topk_overlap(ref[:1], ref[:1]) == (1.0, 0)


def _info(index_dir: Path) -> dict:
    proc = cli_here(["info", index_dir, "--json"])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["model_info"]


def test_auto_records_its_choice_and_updates_reuse_it(
    tiny_model: Path, photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "auto.idx"
    files = sorted(p.name for p in photos.iterdir())
    report = build_index(photos, out, model=str(tiny_model), workers=0, device="cpu", precision="auto", files=files[:16])
    info = _info(out)
    assert info["precision_requested"] == "auto" and info["precision"] == report.precision
    candidates = P.auto_candidates(torch.device("cpu"))
    gate = info.get("precision_gate", {}).get("gate", [])
    # Tried fastest first (the candidates of this CPU's level), each on the 16 calibration images.
    assert [g["mode"] for g in gate] == list(candidates[: len(gate)])
    assert all(g["samples"] == 16 and g["k"] == 10 for g in gate)
    # The gate worked out here, for each candidate it tried (fastest first): the 16 calibration
    # images embedded in fp32 and in the candidate, each image's cosine and its 10 nearest
    # sample images compared in numpy, then the thresholds; the first to pass is the choice.
    cfg = HFClipEncoder.load(str(tiny_model), device="cpu").preprocess
    sample = torch.stack([load_pixels(photos / name, cfg)[0] for name in files[:16]])
    ref = load_encoder(str(tiny_model), device="cpu", precision="fp32").embed_pixels(sample).astype(np.float64)
    chosen = "fp32"
    for tried in gate:
        cand = load_encoder(str(tiny_model), device="cpu", precision=tried["mode"]).embed_pixels(sample).astype(np.float64)
        cosines = np.sum(ref * cand, axis=1)
        nearest = [
            [set(np.argsort(-np.where(np.arange(16) == i, -np.inf, db @ ref[i]), kind="stable")[:10].tolist()) for i in range(16)]
            for db in (ref, cand)
        ]
        overlap = float(np.mean([len(a & b) / 10 for a, b in zip(*nearest, strict=True)]))
        passed = bool(cosines.mean() >= 0.999 and cosines.min() >= 0.99 and overlap >= 0.9)
        assert tried["mean_cosine"] == pytest.approx(cosines.mean(), abs=2e-6), tried
        assert tried["min_cosine"] == pytest.approx(cosines.min(), abs=2e-6), tried
        assert tried["topk_overlap"] == round(overlap, 4) and tried["passed"] == passed, tried
        if passed:
            assert tried is gate[-1]  # no candidate is tried after one passes
            chosen = tried["mode"]
    if chosen == "fp32":  # every candidate was tried and failed; none at all: no gate recorded
        assert len(gate) == len(candidates) and (bool(gate) == ("precision_gate" in info))
    assert info["precision"] == chosen
    assert info["precisions"] == [info["precision"]]

    # An update with auto reuses the recorded mode: no calibration.
    def no_calibration(*args: object, **kwargs: object) -> None:
        raise AssertionError("auto calibrated again on update")

    monkeypatch.setattr(P, "choose", no_calibration)
    report = build_index(photos, out, model=str(tiny_model), workers=0, device="cpu", precision="auto")
    assert report.added == 4 and report.precision == info["precision"]
    assert _info(out).get("precision_gate") == info.get("precision_gate")


def test_auto_rejects_a_failing_mode(tiny_model: Path, photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_gate = P.gate

    def failing(mode: str, ref: np.ndarray, cand: np.ndarray, seconds: float = 0.0) -> P.GateResult:
        r = real_gate(mode, ref, cand, seconds)
        return P.GateResult(r.mode, r.samples, r.mean_cosine, 0.5, r.topk_overlap, r.k, r.seconds)

    monkeypatch.setattr(P, "gate", failing)
    candidates = P.auto_candidates(torch.device("cpu"))
    if not candidates:
        pytest.skip(f"no reduced mode to gate on a {cpu.cpu_level()} CPU (see test_int8's fp32-only test)")
    report = build_index(photos, tmp_path / "i", model=str(tiny_model), workers=0, device="cpu", precision="auto")
    assert report.precision == "fp32"
    manifest = json.loads((tmp_path / "i" / "manifest.json").read_text())
    gate = manifest["model_info"]["precision_gate"]["gate"]
    # Every candidate tried, in order, and each rejected with the figure that failed it.
    assert [g["mode"] for g in gate] == list(candidates)
    assert [g["passed"] for g in gate] == [False] * len(candidates) and {g["min_cosine"] for g in gate} == {0.5}


def test_fp32_is_exact_and_another_mode_on_update_is_recorded(tiny_model: Path, photos: Path, tmp_path: Path) -> None:
    from retrieval import ImageIndex

    files = sorted(p.name for p in photos.iterdir())
    out = tmp_path / "x.idx"
    report = build_index(photos, out, model=str(tiny_model), workers=0, device="cpu", precision="fp32", files=files[:10])
    assert report.precision == "fp32"
    enc = HFClipEncoder.load(str(tiny_model), device="cpu")
    ref = np.concatenate([enc.embed_pixels(load_pixels(photos / f, enc.preprocess)[0][None]) for f in files[:10]])
    np.testing.assert_allclose(ImageIndex.open(out).vectors.embeddings(), ref, atol=1e-6)
    # An update in another mode is allowed (its vectors agree within the gate) and recorded.
    report = build_index(photos, out, model=str(tiny_model), workers=0, device="cpu", precision="int8")
    info = json.loads((out / "manifest.json").read_text())["model_info"]
    assert report.added == 10 and (info["precision"], info["precisions"]) == ("int8", ["fp32", "int8"])


def test_cli_precision_options(tiny_model: Path, photos: Path, tmp_path: Path) -> None:
    bad = cli_here(["index", photos, tmp_path / "b.idx", "--model", tiny_model, "--precision", "fp64", "--no-progress"])
    assert bad.returncode == 1 and bad.stderr.startswith("clipsearch: error: unknown precision 'fp64'")
    assert len(bad.stderr.strip().splitlines()) == 1 and not (tmp_path / "b.idx").exists()
    out = tmp_path / "c.idx"
    ok = cli_here(
        ["index", photos, out, "--model", tiny_model, "--precision", "int8", "--threads", "1", "--workers", "0", "--json", "--no-progress"]
    )
    assert ok.returncode == 0, ok.stderr
    summary = json.loads(ok.stdout)
    assert (summary["precision"], summary["threads"], summary["cpu_level"]) == ("int8", 1, cpu.cpu_level())
    bad = run_cli(["index", photos, tmp_path / "d.idx", "--model", tiny_model, "--no-progress"], env={cpu.CAP_ENV: "avx3"})
    assert bad.returncode == 1 and bad.stderr.strip() == (
        "clipsearch: error: CLIPSEARCH_CPU_CAP='avx3' is not a CPU level; use one of none, avx2, avx_vnni, avx512_vnni, amx"
    )
    assert not (tmp_path / "d.idx").exists()
    hits = cli_here(["search", out, "a dog", "--precision", "int8", "--json", "-k", "3"])
    assert hits.returncode == 0, hits.stderr
    assert len(json.loads(hits.stdout)["results"]) == 3
    bad = cli_here(["search", out, "a dog", "--precision", "nope"])
    assert bad.returncode == 1 and "unknown precision 'nope'" in bad.stderr


def test_the_modes_auto_gates_are_the_rows_of_the_one_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Which reduced modes auto tries, per tower, device and CPU level, is read from the chooser's
    one table: a row taken out or put in changes what every tower gates, and nothing else decides."""
    from retrieval.encoders import chooser as CH

    # An AVX2 CPU whatever the host (a cap lowers the level, never raises it).
    for name in (cpu.CAP_ENV, "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    monkeypatch.setattr(cpu.platform, "machine", lambda: "x86_64")
    assert P.auto_candidates(torch.device("cpu")) == ("int8",)
    # What torch's image tower may run in auto is the table's too, with why not where it may not.
    assert CH.refusal("image", "int8", "torch", "cpu") is None and CH.refusal("image", "bf16", "torch", "cuda") is None
    assert CH.refusal("image", "bf16", "torch", "cpu") == CH.NO_ROW[("image", "bf16", "torch", "cpu")]
    assert P.auto_candidates(torch.device("cpu"), "text") == ("int8",)
    assert CH.auto_modes("text", "cpu", "numpy") == ("int8",)
    without_torch_int8 = tuple(c for c in CH.CANDIDATES if not (c.runtime == "torch" and c.mode == "int8"))
    monkeypatch.setattr(CH, "CANDIDATES", without_torch_int8)
    # OpenVINO's int8 row applies only with AVX-512 VNNI: at AVX2 nothing is left to gate but
    # the numpy text tower's int8.
    assert P.auto_candidates(torch.device("cpu")) == ()
    assert P.auto_candidates(torch.device("cpu"), "text") == ()
    assert CH.auto_modes("text", "cpu", "numpy") == ("int8",)
    monkeypatch.setattr(CH, "CANDIDATES", (*without_torch_int8, CH.Candidate("image", "fp16", "torch", CH.from_level("avx2"))))
    assert P.auto_candidates(torch.device("cpu")) == ("fp16",)
    monkeypatch.setenv(cpu.CAP_ENV, "none")
    assert P.auto_candidates(torch.device("cpu")) == ()
    assert CH.refusal("image", "fp16", "torch", "cpu") == "no row runs the fp16 image tower on torch here"
    assert CH.refusal("image", "fp32", "torch", "cpu") is None and CH.refusal("text", "fp32", "numpy", "cpu") is None
    # CUDA rows ignore the CPU's level.
    assert P.auto_candidates(torch.device("cuda")) == ("fp16", "bf16")
