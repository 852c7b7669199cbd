"""A SigLIP index through every surface: the CLI (index, search, classify, eval-zeroshot,
duplicates), the HTTP API and the Ray engine, with queries in Chinese, Cyrillic, Arabic (right
to left) and emoji reaching the model intact."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import cli_here
from helpers import local_ray
from imagegen import photo_like

from retrieval.index import ImageIndex
from retrieval.tools.random_model import make_random_siglip
from retrieval.tools.zeroshot import ZeroShotClassifier

QUERIES = {"chinese": "一只猫在沙发上", "cyrillic": "кошка на диване", "arabic": "قطة على الأريكة", "emoji": "🐱🛋️✨"}
LABELS = ["cat", "dog", "car"]


@pytest.fixture(scope="module")
def siglip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_random_siglip(tmp_path_factory.mktemp("siglip_cli") / "siglip2", seed=1)


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("siglip_cli_photos") / "photos"
    root.mkdir()
    for i, (w, h) in enumerate([(120, 80), (64, 64), (50, 140), (300, 200), (97, 61), (80, 120), (70, 70), (140, 90)]):
        photo_like(w, h, seed=90 + i).save(root / f"p{i}.png")
    # A planted near copy, for duplicates.
    photo_like(120, 80, seed=90).save(root / "p0_copy.jpg", quality=95)
    return root


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory, siglip_dir: Path, photos: Path) -> Path:
    """Built by the CLI in a subprocess, as a user would."""
    out = tmp_path_factory.mktemp("siglip_cli_idx") / "idx"
    proc = cli_here(["index", photos, out, "--model", siglip_dir, "--device", "cpu", "--precision", "fp32", "--workers", "0"])
    assert proc.returncode == 0, proc.stderr
    return out


def _in_process(capsys: pytest.CaptureFixture[str], *args: object) -> str:
    from clipsearch.cli import main

    capsys.readouterr()
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


def test_cli_search_passes_every_script_intact(index_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # fp32 on both sides: auto's choice on the torch path depends on timing, so scores compare exactly only in fp32.
    index = ImageIndex.open(index_dir, device="cpu", precision="fp32")
    assert index.manifest.model_info["model_type"] == "siglip"
    stored = index.vectors.embeddings()
    encoder = index.encoders.encoder
    # One in a subprocess: the console script's own argv decoding (UTF-8 locale) included.
    proc = cli_here(["search", index_dir, QUERIES["arabic"], "-k", "3", "--json", "--device", "cpu", "--precision", "fp32"])
    assert proc.returncode == 0, proc.stderr
    expected = stored @ encoder.embed_texts([QUERIES["arabic"]])[0]
    assert [r["score"] for r in json.loads(proc.stdout)["results"]] == pytest.approx(sorted(expected, reverse=True)[:3], abs=1e-5)
    vectors = {}
    for name, query in QUERIES.items():
        doc = json.loads(_in_process(capsys, "search", index_dir, query, "-k", "4", "--json", "--device", "cpu", "--precision", "fp32"))
        vectors[name] = encoder.embed_texts([query])[0]
        expected = np.sort(stored @ vectors[name])[::-1][:4]
        assert [r["score"] for r in doc["results"]] == pytest.approx(list(expected), abs=1e-5), name
    # Each script is its own query (nothing folded to ASCII or dropped on the way).
    assert len({tuple(np.round(v, 5)) for v in vectors.values()}) == len(QUERIES)


def test_cli_classify_gives_independent_sigmoid_probabilities(index_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    index = ImageIndex.open(index_dir, device="cpu", precision="fp32")
    classifier = ZeroShotClassifier.build(index.encoders.encoder, LABELS, ["a photo of a {}."])
    scale, bias = index.encoders.encoder.logit_params()
    assert bias is not None
    cos = index.vectors.embeddings() @ classifier.weights.T
    expected = 1 / (1 + np.exp(-(scale * cos + bias)))
    labels = [a for lb in LABELS for a in ("--label", lb)]
    doc = json.loads(_in_process(capsys, "classify", index_dir, *labels, "--top-k", "3", "--json", "--precision", "fp32"))
    first = doc["results"][0]
    got = {item["label"]: item["score"] for item in first["labels"]}
    assert got == pytest.approx({lb: float(expected[0, j]) for j, lb in enumerate(LABELS)}, abs=1e-5)
    assert abs(sum(got.values()) - 1.0) > 1e-3  # not a softmax


def test_cli_eval_zeroshot_and_duplicates(siglip_dir: Path, index_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "folder"
    for c, label in enumerate(LABELS):
        (folder / label).mkdir(parents=True)
        for i in range(2):
            photo_like(80, 60, seed=10 * c + i).save(folder / label / f"{i}.png")
    report = json.loads(_in_process(capsys, "eval-zeroshot", "--model", siglip_dir, folder, "--json", "--device", "cpu"))
    assert report["images"] == 6 and report["classes"] == 3 and 0 <= report["acc1"] <= 1
    dup = json.loads(_in_process(capsys, "duplicates", index_dir, "--threshold", "0.99", "--json"))
    grouped = [{g["keep"]["path"], *(d["path"] for d in g["duplicates"])} for g in dup["groups"]]
    assert {"p0.png", "p0_copy.jpg"} in grouped


@pytest.fixture(scope="module")
def client(index_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from fastapi.testclient import TestClient

    from clipsearch.server import create_app

    app = create_app([index_dir], cache_dir=tmp_path_factory.mktemp("thumbs"), device="cpu", precision="fp32")
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def test_http_api_passes_every_script_intact(client: object, index_dir: Path) -> None:
    index = ImageIndex.open(index_dir, device="cpu", precision="fp32")
    stored = index.vectors.embeddings()
    for name, query in QUERIES.items():
        expected = list(np.sort(stored @ index.encoders.encoder.embed_texts([query])[0])[::-1][:3])
        got = client.get("/api/search", params={"q": query, "k": 3})  # type: ignore[attr-defined]
        assert got.status_code == 200, got.text
        assert [r["score"] for r in got.json()["results"]] == pytest.approx(expected, abs=1e-5), name
        posted = client.post("/api/search", json={"text": query, "k": 3})  # type: ignore[attr-defined]
        assert [r["score"] for r in posted.json()["results"]] == pytest.approx(expected, abs=1e-5), name


def test_ray_engine_builds_the_same_siglip_index(siglip_dir: Path, photos: Path, index_dir: Path, tmp_path: Path) -> None:
    from indexer import build_index

    out = tmp_path / "ray.idx"
    with local_ray():
        build_index(photos, out, model=str(siglip_dir), engine="ray", batch_size=4, device="cpu", precision="fp32")
    local, remote = ImageIndex.open(index_dir, device="cpu"), ImageIndex.open(out, device="cpu")
    assert remote.manifest.model_info["model_type"] == "siglip"
    order = {p: i for i, p in enumerate(remote.metadata.paths())}
    ours = remote.vectors.embeddings()[[order[p] for p in local.metadata.paths()]]
    assert (ours * local.vectors.embeddings()).sum(1).min() >= 0.9999
