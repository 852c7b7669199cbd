"""Text queries default to ``auto``: int8 products where they pass the quality gate (scores within
the gate's cosine of fp32), fp32 with a stated reason where the CPU has no reduced mode;
``precision="fp32"`` (``--precision fp32``) gives exact scores. The gate's outcome is remembered
per weights and CPU setting (retrieval.encoders.memo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from clipsearch.cli import build_parser
from retrieval import ImageIndex
from retrieval.encoders import cpu, memo
from retrieval.encoders.numpy_text import NumpyTextEncoder
from retrieval.encoders.numpy_text import int8 as int8_module
from retrieval.encoders.precision import GATE_MIN_COSINE
from retrieval.encoders.text_choice import ONE_SHOT_TEXTS, one_shot_reason

QUERY = "a red square"
# Every level up to this machine's: a cap makes it behave as that smaller CPU.
LEVELS = cpu.LEVELS[: cpu.rank(cpu.detected_level()) + 1]


def _fp32_vector(built_index: Path) -> np.ndarray:
    model = ImageIndex.open(built_index).encoders.query_model
    return NumpyTextEncoder.load(model).embed_texts([QUERY])[0]


def _has_ort() -> bool:
    import importlib.util

    return importlib.util.find_spec("onnxruntime") is not None


def _precision(info: dict[str, object]) -> dict[str, object]:
    """``text_precision`` without which runtime ran fp32 (``runtime*``: test_text_runtime.py)."""
    return {k: v for k, v in info.items() if not k.startswith("runtime")}


@pytest.mark.parametrize("level", LEVELS)
def test_the_default_text_path_is_the_gated_one(built_index: Path, level: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu.CAP_ENV, level)
    index = ImageIndex.open(built_index, device="cpu")
    planned = index.encoders.text_path()
    # No reduced mode: fp32, on ONNX Runtime in a long-lived process (test_text_runtime.py).
    assert planned.path == ("onnxruntime" if level == "none" and _has_ort() else "numpy")
    if level == "none":
        assert "auto has no reduced mode here (no fast int8 on this CPU, level none)" in planned.reason
    else:
        assert "int8 products where they pass the quality gate" in planned.reason
    hits = index.search(QUERY, k=5)
    info = index.info()["text_precision"]
    assert info["requested"] == "auto"
    refusal = int8_module.int8_refusal()
    if refusal is not None:  # level none (or no kernel): fp32, and why
        assert _precision(info) == {"requested": "auto", "mode": "fp32", "int8": refusal}
    else:
        gate = info["gate"][0]
        assert gate["mode"] == "int8" and gate["samples"] == 24
        # int8 when it passed the gate and ran faster; else fp32 with the reason.
        assert (info["mode"] == "int8" and gate["passed"]) or (info["mode"] == "fp32" and info["int8"])
    # Scores within the gate's cosine of fp32's.
    vector = index.encoders.embed_texts([QUERY])[0]
    assert float(vector @ _fp32_vector(built_index)) >= GATE_MIN_COSINE
    exact = ImageIndex.open(built_index, device="cpu", precision="fp32").search(QUERY, k=5)
    assert max(abs(a.score - b.score) for a, b in zip(hits, exact, strict=True)) <= 1 - GATE_MIN_COSINE


def test_fp32_gives_exact_scores(built_index: Path) -> None:
    index = ImageIndex.open(built_index, device="cpu", precision="fp32")
    hits = index.search(QUERY, k=len(index))
    scores = index.vectors.embeddings() @ _fp32_vector(built_index)
    assert np.allclose([h.score for h in hits], scores[[h.id for h in hits]], rtol=0, atol=1e-6)
    assert _precision(index.info()["text_precision"]) == {"requested": "fp32", "mode": "fp32"}


def test_the_gate_runs_once_per_model_and_cpu(built_index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if int8_module.int8_refusal() is not None:
        pytest.skip(f"no int8 text kernel here: {int8_module.int8_refusal()}")
    first = ImageIndex.open(built_index, device="cpu")
    first.search(QUERY)
    recorded = json.loads(memo.gate_file().read_text())  # type: ignore[union-attr]
    fbgemm = os.environ.get(cpu.FBGEMM_ENV, "").strip().upper() or "-"  # fbgemm's own cap, where the run sets one
    assert len(recorded) == 1 and next(iter(recorded)).endswith(f"|{cpu.cpu_level()}|fbgemm={fbgemm}|0.999/0.99/0.9/10")
    second = ImageIndex.open(built_index, device="cpu")
    second.search(QUERY)
    info = second.info()["text_precision"]
    assert info["gate_cached"] is True and info["mode"] == first.info()["text_precision"]["mode"]
    assert info["gate"] == first.info()["text_precision"]["gate"]
    # Another CPU setting is another key; a cache that cannot be written is no error.
    monkeypatch.setenv(cpu.CAP_ENV, "avx2")
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv(memo.GATE_CACHE_ENV, str(blocked / "text-precision.json"))
    third = ImageIndex.open(built_index, device="cpu")
    third.search(QUERY)
    assert "gate_cached" not in third.info()["text_precision"]
    # A damaged file is ignored and replaced.
    damaged = tmp_path / "damaged.json"
    damaged.write_text("{not json")
    monkeypatch.setenv(memo.GATE_CACHE_ENV, str(damaged))
    ImageIndex.open(built_index, device="cpu").search(QUERY)
    assert len(json.loads(damaged.read_text())) == 1


@pytest.mark.parametrize("command", [["search", "IDX", "q"], ["eval", "IDX", "queries.jsonl"], ["classify", "IDX", "--label", "a"]])
def test_cli_defaults_to_auto(command: list[str]) -> None:
    assert build_parser().parse_args(command).precision == "auto"
    assert build_parser().parse_args([*command, "--precision", "fp32"]).precision == "fp32"


def test_a_one_shot_process_keeps_fp32_and_says_why(built_index: Path) -> None:
    # A command that embeds a handful of texts would spend more on importing torch and quantising
    # the tower than int8 saves on them: auto stays fp32 there, and says so before and after.
    index = ImageIndex.open(built_index, device="cpu", text_queries=1)
    planned = index.encoders.text_path()
    assert planned.path == "numpy" and "auto runs fp32 here, 1 text query in this process" in planned.reason
    hits = index.search(QUERY, k=5)
    info = index.info()["text_precision"]
    assert info["requested"] == "auto" and info["mode"] == "fp32" and "int8 would first import torch" in info["int8"]
    # The same numpy fp32 tower (a long-lived fp32 open may run it on ONNX Runtime instead).
    exact = ImageIndex.open(built_index, device="cpu", precision="fp32", text_queries=1).search(QUERY, k=5)
    assert [(h.id, h.score) for h in hits] == [(h.id, h.score) for h in exact]
    # Enough texts (or a long-lived process: None) and auto gates as before.
    many = ImageIndex.open(built_index, device="cpu", text_queries=ONE_SHOT_TEXTS)
    assert "auto runs fp32 here" not in many.encoders.text_path().reason
    assert one_shot_reason("auto", None) is None and one_shot_reason("int8", 1) is None


def test_cli_search_is_one_shot_and_torch_free(built_index: Path, tmp_path: Path) -> None:
    # The cold CLI search keeps its figures: the default (auto) text query never imports torch.
    script = (
        "import sys, contextlib, io\n"
        "from clipsearch.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    rc = main(['search', {str(built_index)!r}, 'a red square', '--json'])\n"
        "print(rc, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["0", "False"], out.stderr
