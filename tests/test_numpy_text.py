"""The numpy text tower (retrieval.encoders.numpy_text) against transformers and open_clip,
its fallbacks, and the CLI's imports: text search, info, verify and --help never import torch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from helpers import TEXTS, cosines

from retrieval import ImageIndex
from retrieval.encoders import HFClipEncoder
from retrieval.encoders.chooser import TEXT_RUNTIME_ENV
from retrieval.encoders.numpy_text import (
    TEXT_PATH_ENV,
    NumpyTextEncoder,
    UnsupportedTextTower,
    check_text_config,
    text_path,
)


@pytest.fixture(autouse=True)
def _numpy_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    """The numpy tower's own fp32 products (subprocesses inherit it): long-lived fp32 opens
    would otherwise run ONNX Runtime's (tests/test_text_runtime.py)."""
    monkeypatch.setenv("CLIPSEARCH_TEXT_RUNTIME", "numpy")


def _copy_with_config(src: Path, dst: Path, **text_config: object) -> Path:
    """A copy of checkpoint ``src`` with ``text_config`` keys changed (same weights)."""
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config["text_config"].update(text_config)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def _assert_parity(model: Path, texts: Sequence[str] = TEXTS) -> None:
    fast = NumpyTextEncoder.load(str(model))
    torch_enc = HFClipEncoder.load(str(model), device="cpu", precision="fp32")
    ids, mask = fast.tokenize(texts)
    ref = torch_enc.tokenize(texts)
    assert np.array_equal(ids, ref["input_ids"].numpy())
    assert np.array_equal(mask, ref["attention_mask"].numpy())
    expected = torch_enc.embed_texts(list(texts))
    batch = fast.embed_texts(list(texts))
    single = np.stack([fast.embed_texts([t])[0] for t in texts])
    assert cosines(batch, expected).min() >= 0.99999
    assert cosines(single, expected).min() >= 0.99999
    assert np.abs(batch - expected).max() < 1e-5
    assert fast.fingerprint == torch_enc.fingerprint and fast.dim == torch_enc.dim


def test_tokens_truncate_at_the_context_length(tiny_model: Path) -> None:
    fast = NumpyTextEncoder.load(str(tiny_model))
    ids, mask = fast.tokenize(["word " * 200, "a dog"])
    assert ids.shape == (2, 77) and mask[0].sum() == 77 and mask[1].sum() == 4
    assert ids[0, 0] == 49406 and ids[0, -1] == 49407  # BOS first, EOS kept at the end
    assert list(ids[1, 4:]) == [49407] * 73  # padded with the pad token (= EOS) like transformers


def test_parity_with_transformers(tiny_model: Path) -> None:
    _assert_parity(tiny_model)


def test_parity_with_gelu(tiny_model: Path, tmp_path: Path) -> None:
    _assert_parity(_copy_with_config(tiny_model, tmp_path / "gelu", hidden_act="gelu"))


def test_parity_with_legacy_argmax_pooling(tiny_model: Path, tmp_path: Path) -> None:
    # eos_token_id 2: transformers pools at the argmax of the ids (the EOS, the highest id).
    model = _copy_with_config(tiny_model, tmp_path / "legacy", eos_token_id=2)
    assert check_text_config(json.loads((model / "config.json").read_text())).legacy_pooling
    _assert_parity(model)


def test_parity_with_fp16_weights(tmp_path: Path) -> None:
    # The demo model stores float16 weights; from_pretrained(dtype=float32) upcasts them.
    demo = Path(__file__).resolve().parent.parent / "data" / "models" / "demo-clip"
    if not (demo / "model.safetensors").is_file():
        pytest.skip("the demo model is not in this checkout")
    _assert_parity(demo)


def test_parity_with_bf16_weights(tiny_model: Path, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    model = tmp_path / "bf16"
    shutil.copytree(tiny_model, model)
    tensors = load_file(model / "model.safetensors")
    save_file({k: v.to(torch.bfloat16) for k, v in tensors.items()}, model / "model.safetensors", metadata={"format": "pt"})
    _assert_parity(model)


@pytest.mark.slow
def test_parity_with_vit_b_32_text_shapes(tmp_path: Path) -> None:
    from retrieval.tools.random_model import RandomClipSpec, make_random_clip

    spec = RandomClipSpec(
        image_size=32, patch_size=16, vision_hidden=32, vision_layers=1, vision_heads=2, vision_intermediate=64,
        text_hidden=512, text_layers=12, text_heads=8, text_intermediate=2048, projection_dim=512, max_length=77,
    )  # fmt: skip
    _assert_parity(make_random_clip(tmp_path / "b32text", preset=spec, seed=3))


def test_unsupported_configs_fall_back(tiny_model: Path, tmp_path: Path) -> None:
    relu = _copy_with_config(tiny_model, tmp_path / "relu", hidden_act="relu")
    with pytest.raises(UnsupportedTextTower, match="relu"):
        NumpyTextEncoder.load(str(relu))
    assert text_path(str(relu)).path == "torch" and "relu" in text_path(str(relu)).reason
    no_tok = tmp_path / "no_tokenizer"
    shutil.copytree(tiny_model, no_tok)
    (no_tok / "tokenizer.json").unlink()
    assert text_path(str(no_tok)).path == "torch"
    no_eos = tmp_path / "no_eos"
    shutil.copytree(tiny_model, no_eos)
    tok_config = json.loads((no_eos / "tokenizer_config.json").read_text())
    (no_eos / "tokenizer_config.json").write_text(json.dumps({**tok_config, "add_eos_token": False}))
    assert "add_eos_token" in text_path(str(no_eos)).reason
    assert text_path(str(tiny_model)).path == "numpy"
    assert text_path(str(tiny_model), precision="bf16").path == "torch"
    assert text_path(str(tiny_model), device="cuda").path == "torch"
    assert text_path("open_clip:ViT-B-32", backend="open_clip").path == "torch"


def test_the_older_text_path_setting_still_sends_queries_to_torch(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TEXT_RUNTIME_ENV)
    monkeypatch.setenv(TEXT_PATH_ENV, "torch")
    with pytest.warns(FutureWarning, match=f"{TEXT_RUNTIME_ENV}=torch"):
        assert text_path(str(tiny_model)) == text_path(str(tiny_model), runtime="torch")
    monkeypatch.delenv(TEXT_PATH_ENV)
    assert text_path(str(tiny_model), runtime="torch").reason == f"{TEXT_RUNTIME_ENV}=torch"
    assert text_path(str(tiny_model), runtime="numpy").path == "numpy"


def test_index_uses_numpy_path_and_matches_fp32(built_index: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fast = ImageIndex.open(built_index, device="cpu", precision="fp32")  # exact fp32 parity
    assert fast.encoders.text_path().path == "numpy" and fast.info()["text_path"]["path"] == "numpy"
    hits = fast.search("a red square", k=8)
    assert isinstance(fast.encoders.text_encoder, NumpyTextEncoder) and fast._queries.loaded_encoder is None  # no torch model loaded
    monkeypatch.setenv(TEXT_RUNTIME_ENV, "torch")
    slow = ImageIndex.open(built_index, device="cpu", precision="fp32")
    assert slow.encoders.text_path().path == "torch"
    expected = slow.search("a red square", k=8)
    assert isinstance(slow.encoders.text_encoder, HFClipEncoder)
    assert [h.id for h in hits] == [h.id for h in expected]
    assert np.abs(np.array([h.score for h in hits]) - [h.score for h in expected]).max() <= 1e-5


def test_text_path_does_not_depend_on_an_earlier_image_query(built_index: Path, collection: object) -> None:
    index = ImageIndex.open(built_index, device="cpu")
    index.search_image(collection.root / "photos" / "a.jpg", k=1)  # type: ignore[attr-defined]  # collection fixture is typed object
    index.search("a dog", k=1)
    assert isinstance(index.encoders.text_encoder, NumpyTextEncoder) and index.encoders.text_path().path == "numpy"
    given = ImageIndex.open(built_index, encoder=index.encoders.encoder)
    assert given.encoders.text_path().path == "torch" and given.encoders.text_encoder is index.encoders.encoder


def test_index_falls_back_for_reduced_precision(built_index: Path) -> None:
    index = ImageIndex.open(built_index, device="cpu", precision="bf16")
    assert index.encoders.text_path().path == "torch"
    assert index.search("a dog", k=2) and isinstance(index.encoders.text_encoder, HFClipEncoder)


def test_other_weights_are_refused_on_the_numpy_path(built_index: Path, other_model: Path) -> None:
    from retrieval.errors import ModelMismatchError

    index = ImageIndex.open(built_index, model=str(other_model), device="cpu")
    with pytest.raises(ModelMismatchError):
        index.search("a dog")


# -- the CLI in subprocesses ----------------------------------------------------------------------

_HEAVY = ("torch", "transformers", "open_clip", "torchvision")
_PROBE = """
import json, sys
from clipsearch.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
heavy = [m for m in {heavy!r} if m in sys.modules]
print("MODULES " + json.dumps(heavy), file=sys.stderr)
raise SystemExit(code)
"""


def _run_cli(args: Sequence[str], **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    full_env = {**os.environ, **env}
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE.format(heavy=_HEAVY), *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=300,
        check=False,
    )
    line = next(x for x in proc.stderr.splitlines() if x.startswith("MODULES "))
    return proc, json.loads(line[len("MODULES ") :])


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [["--help"], ["search", "--help"], ["info", "{index}"], ["info", "{index}", "--json"], ["verify", "{index}"]],
)
def test_cli_commands_do_not_import_torch(built_index: Path, args: list[str]) -> None:
    proc, heavy = _run_cli([a.format(index=built_index) for a in args])
    assert proc.returncode == 0, proc.stderr
    assert heavy == [], f"{args} imported {heavy}"


@pytest.mark.slow
def test_cli_text_search_without_torch_equals_fp32_transformers(
    built_index: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The torch-free runs in subprocesses (nothing heavy imported); the reference, the same
    command on the torch tower, in this process (which has torch already)."""
    from clipsearch.cli import main

    embedded: list[Sequence[str]] = []
    torch_tower = HFClipEncoder.embed_texts

    def counted(self: HFClipEncoder, texts: Sequence[str], batch_size: int = 256) -> np.ndarray:
        embedded.append(texts)
        return torch_tower(self, texts, batch_size)

    queries = ["a red square", "a photo of a dog on the beach", "word " * 100]
    for query in queries:
        args = ["search", str(built_index), query, "-k", "10", "--json", "--precision", "fp32"]
        proc, heavy = _run_cli(args)
        assert proc.returncode == 0, proc.stderr
        assert heavy == []
        embedded.clear()
        with monkeypatch.context() as env:
            env.setenv(TEXT_RUNTIME_ENV, "torch")
            env.setattr(HFClipEncoder, "embed_texts", counted)
            assert main(args) == 0
        assert embedded, "the reference did not run on the torch tower"
        got = json.loads(proc.stdout)["results"]
        want = json.loads(capsys.readouterr().out)["results"]
        assert [r["id"] for r in got] == [r["id"] for r in want]
        assert max(abs(a["score"] - b["score"]) for a, b in zip(got, want, strict=True)) <= 1e-5


@pytest.mark.slow
def test_cli_info_names_the_text_path(built_index: Path) -> None:
    proc, _ = _run_cli(["info", str(built_index), "--json"])
    assert json.loads(proc.stdout)["text_path"]["path"] == "numpy"
    proc, _ = _run_cli(["info", str(built_index), "--json"], **{TEXT_RUNTIME_ENV: "torch"})
    assert json.loads(proc.stdout)["text_path"] == {"path": "torch", "reason": f"{TEXT_RUNTIME_ENV}=torch"}
