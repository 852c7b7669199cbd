"""Hybrid ranking as a user meets it: the default k in every mode and surface, filters,
``min_score`` and ``sort=taken`` on the fused list, and hits that say why they are where they are."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import cli_here
from photos import exif_bytes
from PIL import Image

from indexer import build_index
from retrieval import ImageIndex
from retrieval.errors import InvalidArgumentError
from retrieval.filters import Filter
from retrieval.hits import DEFAULT_K
from retrieval.keywords import KEYWORD_WEIGHT, Z_FLOOR

MODES = ("hybrid", "vector", "keyword")
BEACHES = 14  # more than DEFAULT_K match the word "beach"


@pytest.fixture(scope="module")
def beach_index(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    photos = tmp_path_factory.mktemp("hybrid") / "photos"
    photos.mkdir()
    rng = np.random.default_rng(0)
    for i in range(BEACHES):
        img = Image.fromarray(rng.integers(0, 255, (40, 56, 3), dtype=np.uint8))
        # Half of them dated, a day apart: sort=taken has something to reorder.
        exif = exif_bytes(taken=f"2024:06:{i + 1:02d} 12:00:00") if i % 2 else b""
        img.save(photos / f"beach_{i:02d}.jpg", exif=exif)
    for name in ("mountain", "forest", "city"):
        Image.fromarray(rng.integers(0, 255, (40, 56, 3), dtype=np.uint8)).save(photos / f"{name}.jpg")
    out = photos.parent / "photos.idx"
    build_index(photos, out, model=str(tiny_model), batch_size=8, workers=0, device="cpu", precision="fp32")
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sort", ["score", "taken"])
def test_the_default_k_in_every_mode(beach_index: Path, mode: str, sort: str) -> None:
    idx = ImageIndex.open(beach_index, device="cpu")
    assert len(idx.search("beach", mode=mode, sort=sort)) == DEFAULT_K
    assert len(idx.search("beach", k=3, mode=mode, sort=sort)) == 3
    # A filter that leaves more than k: still k; fewer: all of them.
    assert len(idx.search("beach", mode=mode, sort=sort, where=Filter(path_glob="beach_*"))) == DEFAULT_K
    few = idx.search("beach", mode=mode, sort=sort, where=Filter(path_glob="beach_0[0-2]*"))
    assert sorted(h.path for h in few) == ["beach_00.jpg", "beach_01.jpg", "beach_02.jpg"]
    # min_score without k: every hit at or above it (no cap), with k: at most k.
    every = idx.search("beach", mode=mode, sort=sort, min_score=-1.0)
    assert len(every) == (BEACHES + 3 if mode != "keyword" else BEACHES)
    assert len(idx.search("beach", k=4, mode=mode, sort=sort, min_score=-1.0)) == 4


def test_sort_taken_orders_the_fused_selection_by_date(beach_index: Path) -> None:
    idx = ImageIndex.open(beach_index, device="cpu")
    by_score = idx.search("beach", k=6)
    by_date = idx.search("beach", k=6, sort="taken")
    assert {h.id for h in by_date} == {h.id for h in by_score}
    dated = [h.taken for h in by_date if h.taken]
    assert dated == sorted(dated, reverse=True) and by_date[-1].taken is None


def test_hits_say_why_they_are_there(beach_index: Path) -> None:
    idx = ImageIndex.open(beach_index, device="cpu")
    fused = idx.search("beach mountain", k=17)
    assert all(h.fused is not None and h.keyword is not None for h in fused)
    assert [h.fused for h in fused] == sorted((h.fused for h in fused), reverse=True)  # type: ignore[misc]
    for h in fused:
        # The fused score is computed from the hit's own cosine and keyword share.
        scale = idx.vectors.cosine_scale(idx.encoders.embed_texts(["beach mountain"])[0])
        z = (h.score - scale.mean) / scale.std
        assert h.fused == pytest.approx(max(z, Z_FLOOR) + KEYWORD_WEIGHT * h.keyword, abs=1e-4)  # type: ignore[operator]
        assert (h.keyword > 0) == bool(h.matched)  # type: ignore[operator]
    keyword = idx.search("beach", mode="keyword")
    assert all(h.keyword == 1.0 and h.fused is None for h in keyword)
    # Equal matches: the vector side decides.
    assert [h.score for h in keyword] == sorted((h.score for h in keyword), reverse=True)
    vector = idx.search("beach", mode="vector")
    assert all(h.fused is None and h.keyword is None and h.matched is None for h in vector)
    # No word matches: exactly the vector ranking, nothing fused.
    none = idx.search("zebra crossing")
    assert [(h.id, h.score) for h in none] == [(h.id, h.score) for h in idx.search("zebra crossing", mode="vector")]
    assert all(h.fused is None for h in none)


def test_a_query_of_stop_words_is_the_vector_ranking(beach_index: Path) -> None:
    idx = ImageIndex.open(beach_index, device="cpu")
    hybrid = idx.search("the a of with")
    assert [(h.id, h.score) for h in hybrid] == [(h.id, h.score) for h in idx.search("the a of with", mode="vector")]
    assert idx.search("the a of with", mode="keyword") == []


@pytest.mark.parametrize("k", [0, -1, 2.5, True])
def test_a_bad_k_is_refused_in_every_mode(beach_index: Path, k: object) -> None:
    idx = ImageIndex.open(beach_index, device="cpu")
    for mode in MODES:
        with pytest.raises(InvalidArgumentError, match="k must be an integer"):
            idx.search("beach", k=k, mode=mode)  # type: ignore[arg-type]


def test_cli_default_k_and_why(beach_index: Path) -> None:
    proc = cli_here(["search", beach_index, "beach mountain", "--device", "cpu"])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == DEFAULT_K and "mountain.jpg  [path: mountain | words 0.78, fused" in lines[0]  # the rarer word weighs more
    proc = cli_here(["search", beach_index, "beach", "--mode", "keyword", "--sort", "taken", "--json", "--device", "cpu"])
    results = json.loads(proc.stdout)["results"]
    assert len(results) == DEFAULT_K and all(r["keyword"] == 1.0 for r in results)
    bad = cli_here(["search", beach_index, "beach", "-k", "0", "--device", "cpu"])
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1 and "k" in bad.stderr


def test_http_default_k_in_every_mode(beach_index: Path, tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from clipsearch.server import create_app

    with TestClient(create_app([beach_index], cache_dir=tmp_path, device="cpu", warm=False), raise_server_exceptions=False) as c:
        for mode in MODES:
            got = c.get("/api/search", params={"q": "beach", "mode": mode}).json()["results"]
            assert len(got) == DEFAULT_K, mode
            posted = c.post("/api/search", json={"text": "beach", "mode": mode, "sort": "taken"}).json()["results"]
            assert len(posted) == DEFAULT_K, mode
        fused = c.get("/api/search", params={"q": "beach mountain"}).json()["results"]
        assert fused[0]["fused"] >= fused[-1]["fused"] and 0 < fused[0]["keyword"] <= 1
        bad = c.get("/api/search", params={"q": "beach", "k": 0})
        assert 400 <= bad.status_code < 500 and "k" in bad.json()["error"]


def test_a_vector_candidate_keeps_its_words_beyond_the_keyword_depth(beach_index: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import retrieval.hybrid as hybrid

    idx = ImageIndex.open(beach_index, device="cpu")
    whole = idx.search("beach", k=BEACHES + 3)
    monkeypatch.setattr(hybrid, "KEYWORD_DEPTH", 1)  # one keyword-only candidate; the rest come from the vector side
    cut = idx.search("beach", k=BEACHES + 3)
    assert [(h.id, h.keyword, h.fused) for h in cut] == [(h.id, h.keyword, h.fused) for h in whole]
    assert sum(h.keyword == 1.0 for h in cut) == BEACHES
