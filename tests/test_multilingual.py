"""open_clip's multilingual text towers from local copies: XLM-R (reads any language as it is)
and NLLB-CLIP (its tokenizer must be told the query's FLORES-200 language).

Tiny random checkpoints laid out like open_clip's ``xlm-roberta-base-ViT-B-32`` and
``nllb-clip-base`` (:mod:`retrieval.tools.random_model.multilingual`): the vectors are checked against
open_clip's own model and the Hugging Face tokenizer on the unchanged text; an NLLB query names
its language on the CLI (``--query-lang``), in the Python API (``query_lang=``) and over HTTP
(``query_lang``), and is refused, in one line, without one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import cli_here
from imagegen import photo_like

from retrieval.encoders import load_encoder
from retrieval.errors import InvalidArgumentError
from retrieval.index import ImageIndex
from retrieval.request import SearchRequest
from retrieval.tools.random_model.multilingual import make_random_multilingual

open_clip = pytest.importorskip("open_clip")
torch = pytest.importorskip("torch")

QUERIES = {"chinese": "一只猫", "cyrillic": "кот на диване", "arabic": "قطة على الأريكة", "emoji": "🐱🐱 cat"}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("multilingual")
    return {name: make_random_multilingual(root / name, name, seed=3) for name in ("xlm-roberta-tiny", "nllb-clip-tiny")}


def _reference(folder: Path, texts: list[str], language: str | None = None) -> np.ndarray:
    """open_clip's own model on the Hugging Face tokenizer's ids for the unchanged texts."""
    from transformers import AutoTokenizer

    model = open_clip.create_model(f"local-dir:{folder}", pretrained_text=False).eval()
    tok = AutoTokenizer.from_pretrained(folder) if language is None else AutoTokenizer.from_pretrained(folder, src_lang=language)
    ids = tok(texts, return_tensors="pt", max_length=32, padding="max_length", truncation=True).input_ids
    if language is not None:
        assert (ids[:, 0] == tok.convert_tokens_to_ids(language)).all()  # the language token leads
    with torch.inference_mode():
        out = model.encode_text(ids).numpy()
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def test_xlm_roberta_reads_every_script_as_it_is(models: dict[str, Path]) -> None:
    folder = models["xlm-roberta-tiny"]
    encoder = load_encoder(f"open_clip:local-dir:{folder}", device="cpu", precision="fp32")
    assert encoder.query_languages == ()  # type: ignore[attr-defined]
    texts = list(QUERIES.values())
    got = encoder.embed_texts(texts)
    np.testing.assert_allclose(got, _reference(folder, texts), atol=1e-5)
    # A language given to a model that takes none changes nothing.
    np.testing.assert_array_equal(encoder.embed_texts(texts, language="zho_Hans"), got)  # type: ignore[call-arg]
    assert len({tuple(np.round(v, 5)) for v in got}) == len(texts)


def test_nllb_needs_the_query_language(models: dict[str, Path]) -> None:
    folder = models["nllb-clip-tiny"]
    encoder = load_encoder(f"open_clip:local-dir:{folder}", device="cpu", precision="fp32")
    codes = encoder.query_languages  # type: ignore[attr-defined]
    assert len(codes) == 202 and {"eng_Latn", "zho_Hans", "rus_Cyrl", "arb_Arab"} <= set(codes)
    with pytest.raises(InvalidArgumentError, match=r"needs the query's language.*--query-lang.*zho_Hans"):
        encoder.embed_texts(["一只猫"])
    with pytest.raises(InvalidArgumentError, match=r"unknown query language 'zh'.*FLORES-200"):
        encoder.embed_texts(["一只猫"], language="zh")  # type: ignore[call-arg]
    for language, text in (("zho_Hans", QUERIES["chinese"]), ("rus_Cyrl", QUERIES["cyrillic"]), ("arb_Arab", QUERIES["arabic"])):
        got = encoder.embed_texts([text], language=language)  # type: ignore[call-arg]
        np.testing.assert_allclose(got, _reference(folder, [text], language), atol=1e-5)
    # The language is part of the input: the same text in two languages is two vectors.
    zh = encoder.embed_texts(["一只猫"], language="zho_Hans")  # type: ignore[call-arg]
    en = encoder.embed_texts(["一只猫"], language="eng_Latn")  # type: ignore[call-arg]
    assert float(zh[0] @ en[0]) < 0.9999


@pytest.fixture(scope="module")
def nllb_index(tmp_path_factory: pytest.TempPathFactory, models: dict[str, Path]) -> Path:
    photos = tmp_path_factory.mktemp("nllb_photos") / "photos"
    photos.mkdir()
    for i in range(6):
        photo_like(64 + 8 * i, 48, seed=40 + i).save(photos / f"p{i}.png")
    out = tmp_path_factory.mktemp("nllb_idx") / "idx"
    model = f"open_clip:local-dir:{models['nllb-clip-tiny']}"
    proc = cli_here(["index", photos, out, "--model", model, "--device", "cpu", "--precision", "fp32", "--workers", "0"])
    assert proc.returncode == 0, proc.stderr
    return out


def _cli(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    from clipsearch.cli import main

    capsys.readouterr()
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_nllb_index_through_the_api_and_the_cli(
    nllb_index: Path, models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    index = ImageIndex.open(nllb_index, device="cpu", precision="fp32")
    assert "zho_Hans" in index.encoders.query_languages()
    with pytest.raises(InvalidArgumentError, match="needs the query's language"):
        index.search("一只猫", k=3)
    stored = index.vectors.embeddings()
    vector = _reference(models["nllb-clip-tiny"], ["一只猫"], "zho_Hans")[0]
    hits = index.search("一只猫", k=3, query_lang="zho_Hans")
    assert [h.score for h in hits] == pytest.approx(sorted(stored @ vector, reverse=True)[:3], abs=1e-5)
    # The query cache keeps languages apart.
    en = index.search("一只猫", k=6, query_lang="eng_Latn")
    assert [h.score for h in en] != pytest.approx([h.score for h in index.search("一只猫", k=6, query_lang="zho_Hans")], abs=1e-6)
    combined = index.search(SearchRequest(add=["一只猫", "кот"], k=3, query_lang="zho_Hans"))
    assert len(combined) == 3

    base = ["search", nllb_index, "一只猫", "-k", "3", "--device", "cpu", "--precision", "fp32"]
    # The console script once (argv decoding included), the rest in this process.
    ok = cli_here([*base, "--query-lang", "zho_Hans", "--json"])
    assert ok.returncode == 0, ok.stderr
    assert [r["score"] for r in json.loads(ok.stdout)["results"]] == pytest.approx([h.score for h in hits], abs=1e-5)
    code, out, err = _cli(capsys, *base)
    assert code == 1 and out == ""
    assert len(err.strip().splitlines()) == 1 and "--query-lang" in err
    code, _, err = _cli(capsys, *base, "--query-lang", "chinese")
    assert code == 1 and "unknown query language 'chinese'" in err

    queries = tmp_path / "q.jsonl"
    queries.write_text(json.dumps({"query": "一只猫", "relevant": ["p0.png"]}, ensure_ascii=False) + "\n", encoding="utf-8")
    code, _, err = _cli(capsys, "eval", nllb_index, queries, "--device", "cpu", "--precision", "fp32")
    assert code == 1 and "--query-lang" in err
    code, out, err = _cli(
        capsys, "eval", nllb_index, queries, "--device", "cpu", "--precision", "fp32", "--query-lang", "zho_Hans", "--json"
    )
    assert code == 0, err
    scores = stored @ vector
    rank = 1 + int(np.sum(scores > scores[index.metadata.paths().index("p0.png")]))
    assert json.loads(out)["mrr"] == pytest.approx(1 / rank, abs=1e-6)


@pytest.fixture(scope="module")
def client(nllb_index: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from fastapi.testclient import TestClient

    from clipsearch.server import create_app

    app = create_app([nllb_index], cache_dir=tmp_path_factory.mktemp("thumbs"), device="cpu", precision="fp32")
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def test_nllb_over_http(client: object, nllb_index: Path) -> None:
    listed = client.get("/api/indexes").json()  # type: ignore[attr-defined]
    assert "zho_Hans" in listed[0]["query_languages"]
    index = ImageIndex.open(nllb_index, device="cpu", precision="fp32")
    stored = index.vectors.embeddings()
    for language, text in (("zho_Hans", QUERIES["chinese"]), ("arb_Arab", QUERIES["arabic"])):
        expected = sorted(stored @ index.encoders.embed_texts([text], query_lang=language)[0], reverse=True)[:3]
        got = client.get("/api/search", params={"q": text, "k": 3, "query_lang": language})  # type: ignore[attr-defined]
        assert got.status_code == 200, got.text
        assert [r["score"] for r in got.json()["results"]] == pytest.approx(expected, abs=1e-5)
        posted = client.post("/api/search", json={"text": text, "k": 3, "query_lang": language})  # type: ignore[attr-defined]
        assert [r["score"] for r in posted.json()["results"]] == pytest.approx(expected, abs=1e-5)
    missing = client.get("/api/search", params={"q": "一只猫", "k": 3})  # type: ignore[attr-defined]
    assert missing.status_code == 400 and "query_lang" in missing.json()["error"]
    bad = client.post("/api/search", json={"text": "一只猫", "query_lang": "xx"})  # type: ignore[attr-defined]
    assert bad.status_code == 400 and "unknown query language" in bad.json()["error"]


def test_nllb_zero_shot_takes_the_prompts_language(
    nllb_index: Path, models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from retrieval.tools.zeroshot import ZeroShotClassifier

    labels = ["--label", "猫", "--label", "狗"]
    code, _, err = _cli(capsys, "classify", nllb_index, *labels, "--template", "{}", "--json", "--precision", "fp32")
    assert code == 1 and "--query-lang" in err
    code, out, err = _cli(
        capsys, "classify", nllb_index, *labels, "--template", "{}", "--json", "--precision", "fp32", "--query-lang", "zho_Hans"
    )
    assert code == 0, err
    index = ImageIndex.open(nllb_index, device="cpu", precision="fp32")
    expected = ZeroShotClassifier.build(index.encoders.encoder, ["猫", "狗"], ["{}"], query_lang="zho_Hans")
    reference = _reference(models["nllb-clip-tiny"], ["猫", "狗"], "zho_Hans")
    np.testing.assert_allclose(expected.weights, reference, atol=1e-5)
    assert len(json.loads(out)["results"]) == index.count
    folder = tmp_path / "folder"
    for c, label in enumerate(("猫", "狗")):
        (folder / label).mkdir(parents=True)
        photo_like(64, 48, seed=60 + c).save(folder / label / "0.png")
    model = f"open_clip:local-dir:{models['nllb-clip-tiny']}"
    code, _, err = _cli(capsys, "eval-zeroshot", "--model", model, folder, "--device", "cpu")
    assert code == 1 and "--query-lang" in err
    code, out, err = _cli(capsys, "eval-zeroshot", "--model", model, folder, "--device", "cpu", "--query-lang", "zho_Hans", "--json")
    assert code == 0, err
    assert json.loads(out)["images"] == 2
