"""Query arithmetic: term parsing, the weighted combination, and ``search_combined`` / ``search
--add/--subtract`` checked against a ranking computed independently (reference Hugging Face text
features, the stored image embeddings, brute force)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import cli_here

from retrieval.errors import InvalidArgumentError
from retrieval.filters import Filter
from retrieval.index import ImageIndex
from retrieval.query_terms import QueryTerm, as_term, combine, parse_term
from retrieval.request import SearchRequest


def test_parse_term_reads_weights_files_and_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    image = tmp_path / "beach.jpg"
    image.write_bytes(b"not decoded here")
    monkeypatch.chdir(tmp_path)
    assert parse_term("a dog") == QueryTerm("a dog", "text", 1.0)
    assert parse_term("2:a dog") == QueryTerm("a dog", "text", 2.0)
    assert parse_term("-0.5: grass") == QueryTerm("grass", "text", -0.5)
    assert parse_term(".25:x") == QueryTerm("x", "text", 0.25)
    assert parse_term("2:a dog", weights=False) == QueryTerm("2:a dog", "text", 1.0)
    assert parse_term("0.5:./beach.jpg") == QueryTerm("./beach.jpg", "image", 0.5)
    assert parse_term(str(image)) == QueryTerm(str(image), "image", 1.0)
    assert parse_term(image.as_uri()) == QueryTerm(str(image), "image", 1.0)
    # A bare name is text even when such a file exists: only ./ / ~/ file:// mean a file.
    assert parse_term("beach.jpg") == QueryTerm("beach.jpg", "text", 1.0)
    for bad, message in [("./missing.jpg", "is not a file"), ("0:a dog", "weight 0"), ("2:", "empty"), ("  ", "empty")]:
        with pytest.raises(InvalidArgumentError, match=message):
            parse_term(bad)


def test_terms_are_checked_and_coerced(tmp_path: Path) -> None:
    assert as_term("a cat") == QueryTerm("a cat", "text")
    assert as_term(tmp_path / "x.jpg") == QueryTerm(str(tmp_path / "x.jpg"), "image")
    assert QueryTerm("a", weight=2).negated().weight == -2
    for kwargs in [{"weight": float("nan")}, {"weight": 0}, {"weight": True}, {"kind": "video"}, {"value": ""}]:
        with pytest.raises(InvalidArgumentError):
            QueryTerm(**{"value": "a", **kwargs})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="a str"):
        as_term(3)  # type: ignore[arg-type]


def test_combine_normalises_each_term_then_the_sum() -> None:
    a, b = np.array([3.0, 0.0]), np.array([0.0, 0.5])
    out = combine(np.stack([a, b]), [1.0, 1.0])
    assert out.dtype == np.float32 and np.allclose(out, [2**-0.5, 2**-0.5])
    assert np.allclose(combine(np.stack([a, b]), [1.0, -3.0]), np.array([1.0, -3.0]) / 10**0.5)
    with pytest.raises(InvalidArgumentError, match="cancel out"):
        combine(np.stack([a, a]), [1.0, -1.0])


@pytest.fixture(scope="module")
def reference_text(tiny_model: Path):
    from transformers import CLIPModel, CLIPProcessor

    model, proc = CLIPModel.from_pretrained(tiny_model).eval(), CLIPProcessor.from_pretrained(tiny_model)

    def embed(text: str) -> np.ndarray:
        with torch.no_grad():
            out = model.get_text_features(**proc(text=[text], padding=True, return_tensors="pt"))
        feats = (out.pooler_output if hasattr(out, "pooler_output") else out)[0].double().numpy()
        return feats / np.linalg.norm(feats)

    return embed


def _expected(
    index: ImageIndex, parts: list[tuple[float, np.ndarray]], k: int, allowed: np.ndarray | None = None
) -> tuple[list[int], np.ndarray]:
    # Brute force over the stored vectors in float64, ties by ascending id (FAISS's order here).
    q = sum(w * v / np.linalg.norm(v) for w, v in parts)
    q = q / np.linalg.norm(q)
    scores = index.vectors.embeddings().astype(np.float64) @ q
    if allowed is not None:
        scores[~allowed] = -np.inf
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:k]
    return order, scores[order]


def test_search_combined_equals_an_independent_ranking(built_index: Path, reference_text, collection) -> None:
    index = ImageIndex.open(built_index, device="cpu")
    stored = index.vectors.embeddings()
    image_id = 2
    image_file = index.files.path(image_id)
    parts = [(1.0, reference_text("a dog")), (0.5, reference_text("in the snow")), (-1.0, reference_text("grass")),
             (2.0, stored[image_id].astype(np.float64))]
    terms = [QueryTerm("a dog"), QueryTerm("in the snow", weight=0.5), QueryTerm(str(image_file), "image", 2.0)]
    hits = index.search(SearchRequest(add=terms, subtract=["grass"], k=6))
    ids, scores = _expected(index, parts, 6)
    assert [h.id for h in hits] == ids
    assert np.allclose([h.score for h in hits], scores, atol=1e-5)

    where = Filter(path_glob="*.png")
    filtered = index.search(SearchRequest(add=["a dog", image_file], subtract=[QueryTerm("grass", weight=0.3)], k=4, where=where))
    ids, scores = _expected(index, [(1.0, reference_text("a dog")), (1.0, stored[image_id]), (-0.3, reference_text("grass"))], 4,
                            allowed=index.metadata.mask(where))
    assert [h.id for h in filtered] == ids and np.allclose([h.score for h in filtered], scores, atol=1e-5)
    # One text term is a plain text search.
    assert [h.id for h in index.search(SearchRequest(add=["a dog"], k=5))] == [h.id for h in index.search("a dog", k=5, mode="vector")]


def test_search_combined_refuses_bad_terms(built_index: Path, tmp_path: Path) -> None:
    index = ImageIndex.open(built_index, device="cpu")
    with pytest.raises(InvalidArgumentError, match="give a query"):
        SearchRequest(add=[])
    with pytest.raises(InvalidArgumentError, match="cancel out"):
        index.search(SearchRequest(add=["a dog"], subtract=["a dog"]))
    with pytest.raises(InvalidArgumentError, match="lists of terms"):
        SearchRequest(add="a dog")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="k must be"):
        SearchRequest(add=["a dog"], k=0)
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"\xff\xd8 not really")
    from retrieval.errors import ImageDecodeError

    with pytest.raises(ImageDecodeError):
        index.search(SearchRequest(add=["a dog", broken]))


@pytest.mark.slow
def test_cli_add_and_subtract(
    built_index: Path, reference_text, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    index = ImageIndex.open(built_index, device="cpu")
    image_file = index.files.path(1)
    out = cli_here(["search", built_index, "2:a dog", "--add", f"0.5:{image_file}", "--subtract", "grass", "-k", "5", "--json"])
    assert out.returncode == 0, out.stderr
    hits = json.loads(out.stdout)["results"]
    parts = [(2.0, reference_text("a dog")), (0.5, index.vectors.embeddings()[1]), (-1.0, reference_text("grass"))]
    ids, scores = _expected(index, parts, 5)
    assert [h["id"] for h in hits] == ids and np.allclose([h["score"] for h in hits], scores, atol=1e-5)
    # --image as the first term, arithmetic on top of it (in this process: no second torch start-up).
    from clipsearch.cli import main

    capsys.readouterr()
    args = ["search", str(built_index), "--image", str(image_file), "--subtract", "grass", "-k", "3", "--json", "--device", "cpu"]
    assert main(args) == 0
    assert [h["id"] for h in json.loads(capsys.readouterr().out)["results"]] == _expected(
        index, [(1.0, index.vectors.embeddings()[1]), (-1.0, reference_text("grass"))], 3)[0]

    monkeypatch.chdir(tmp_path)
    for args, message in [
        (["a dog", "--add", "./no-such.jpg"], "is not a file"),
        (["a dog", "--subtract", "0:grass"], "weight 0"),
        (["a dog", "--subtract", "a dog"], "cancel out"),
    ]:
        # In this process (the same main as the console script): no torch start-up per case.
        capsys.readouterr()
        assert main(["search", str(built_index), *args, "--device", "cpu"]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("clipsearch: error:") and message in err, err


def test_image_id_terms_use_the_stored_vectors_and_servers_parse_no_files(built_index: Path, reference_text) -> None:
    index = ImageIndex.open(built_index, device="cpu")
    stored = index.vectors.embeddings()
    hits = index.search(SearchRequest(add=[QueryTerm(4, "id"), QueryTerm("a dog", weight=0.5)], subtract=[QueryTerm(1, "id", 0.25)], k=5))
    ids, scores = _expected(index, [(1.0, stored[4]), (0.5, reference_text("a dog")), (-0.25, stored[1])], 5)
    assert [h.id for h in hits] == ids and np.allclose([h.score for h in hits], scores, atol=1e-5)
    for bad in (-1, "4", True):
        with pytest.raises(InvalidArgumentError, match="image id term"):
            QueryTerm(bad, "id")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="no image with id"):
        index.search(SearchRequest(add=[QueryTerm(index.count, "id")]))
    assert parse_term("0.5:./beach.jpg", files=False) == QueryTerm("./beach.jpg", "text", 0.5)
    assert parse_term("/etc/passwd", files=False).kind == "text"
