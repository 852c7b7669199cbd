"""The relevance cut-off: ``min_score`` returns every image scoring at least S (however many), on
the Python API, the CLI and the HTTP API, and refuses S outside [-1, 1]; ``sort`` and the date
filters over HTTP."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import cli_here
from helpers import assert_one_line_error

from retrieval.errors import InvalidArgumentError
from retrieval.filters import Filter
from retrieval.index import ImageIndex
from retrieval.request import SearchRequest


@pytest.fixture(scope="module")
def index(built_index: Path) -> ImageIndex:
    # fp32 text queries, as the CLI and the server below are asked for: the same scores everywhere.
    return ImageIndex.open(built_index, device="cpu", precision="fp32")


def _exact(index: ImageIndex, query: np.ndarray, min_score: float, where: Filter | None = None) -> list[int]:
    scores = index.vectors.embeddings() @ query
    keep = scores >= min_score
    if where is not None:
        keep &= index.metadata.mask(where)
    ids = np.flatnonzero(keep)
    return ids[np.lexsort((ids, -scores[ids]))].tolist()


def _cut_after(index: ImageIndex, query: np.ndarray, n: int) -> float:
    # Midway between the n-th and the next score: no score sits on the cut, whatever the rounding.
    ranked = index.search_vectors(query[None], k=n + 1)[0]
    return (ranked[n - 1].score + ranked[n].score) / 2


def test_every_hit_at_or_above_the_cut_off(index: ImageIndex) -> None:
    query = index.encoders.embed_texts(["a red square"])[0]
    cut = _cut_after(index, query, 15)
    hits = index.search_vectors(query[None], min_score=cut)[0]
    # More than the default 10 when that many score high enough: "however many that is".
    assert [h.id for h in hits] == _exact(index, query, cut)
    assert len(hits) > 10 and all(h.score >= cut for h in hits)
    assert [h.id for h in index.search("a red square", min_score=cut)] == [h.id for h in hits]
    # k caps the answer; -1 takes every image; 1.0 only exact matches.
    assert [h.id for h in index.search("a red square", k=3, min_score=cut)] == [h.id for h in hits[:3]]
    assert len(index.search("a red square", min_score=-1.0)) == index.count
    assert index.search("a red square", min_score=1.0) == []


def test_cut_off_with_filters_and_more_like_this(index: ImageIndex) -> None:
    where = Filter(min_width=100)
    similar = index.search(SearchRequest(similar_to=0, min_score=0.5, where=where))
    assert [h.id for h in similar] == _exact(index, index.vectors.vectors_of([0])[0], 0.5, where)
    unfiltered = index.search(SearchRequest(similar_to=0, min_score=0.9))
    assert unfiltered[0].id == 0 and unfiltered[0].score == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("bad", [1.5, -1.01, float("nan"), float("inf"), "0.3", True])
def test_a_cut_off_outside_minus_one_to_one_is_refused(index: ImageIndex, bad: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="min_score"):
        index.search("a dog", min_score=bad)
    with pytest.raises(InvalidArgumentError, match="min_score"):
        SearchRequest(similar_to=0, min_score=bad)


@pytest.mark.slow
def test_cli_min_score(built_index: Path, index: ImageIndex) -> None:
    query = index.encoders.embed_texts(["a blue circle"])[0]
    cut = _cut_after(index, query, 12)
    proc = cli_here(["search", built_index, "a blue circle", "--min-score", repr(cut), "--json", "--device", "cpu", "--precision",
                    "fp32"])
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)["results"]
    assert [r["id"] for r in results] == _exact(index, query, cut)
    assert set(results[0]) >= {"id", "path", "score", "taken", "camera", "gps"}
    none = cli_here(["search", built_index, "a blue circle", "--min-score", "1"])
    assert none.returncode == 0 and none.stdout.strip() == "no results (no image scores at least 1.0)"
    for bad in ("1.5", "-2", "nan"):
        proc = cli_here(["search", built_index, "a blue circle", "--min-score", bad])
        assert_one_line_error(proc.returncode, proc.stderr, "min_score must be")
    word = cli_here(["search", built_index, "x", "--min-score", "high"])
    assert_one_line_error(word.returncode, word.stderr, "--min-score", codes=(2,), prefix="clipsearch search: error: ")


# -- over HTTP ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(built_index: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from clipsearch.server import create_app

    app = create_app([built_index], cache_dir=tmp_path_factory.mktemp("thumbs"), device="cpu", warm=False, precision="fp32")
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def _error(resp: Any, status: int) -> str:
    assert resp.status_code == status, (resp.status_code, resp.text)
    body = resp.json()
    assert set(body) == {"error"} and "\n" not in body["error"]
    return str(body["error"])


def test_api_min_score_pages_and_sort(client: Any, index: ImageIndex) -> None:
    query = index.encoders.embed_texts(["a green stripe"])[0]
    cut = _cut_after(index, query, 15)
    # The Python API's answer (checked against exact scores above) is the server's.
    want = [h.id for h in index.search("a green stripe", min_score=cut)]
    assert len(want) >= 15
    got = client.get("/api/search", params={"q": "a green stripe", "min_score": cut, "k": 100}).json()
    assert [r["id"] for r in got["results"]] == want
    assert {"taken", "camera", "gps"} <= set(got["results"][0])
    # Pages of the cut-off's hits follow each other.
    pages = [client.post("/api/search", json={"text": "a green stripe", "min_score": cut, "k": 5, "offset": o}).json()["results"]
             for o in range(0, len(want) + 5, 5)]
    assert [r["id"] for page in pages for r in page] == want
    by_date = client.post("/api/search", json={"text": "a green stripe", "sort": "taken", "k": 5}).json()["results"]
    assert sorted(r["id"] for r in by_date) == sorted(h.id for h in index.search("a green stripe", k=5))


def test_api_bad_cut_off_sort_and_dates(client: Any) -> None:
    assert "min_score" in _error(client.get("/api/search", params={"q": "x", "min_score": 2}), 400)
    assert "min_score" in _error(client.post("/api/search", json={"text": "x", "min_score": -3}), 400)
    _error(client.get("/api/search", params={"q": "x", "min_score": "high"}), 422)
    assert "sort" in _error(client.post("/api/search", json={"text": "x", "sort": "newest"}), 400)
    assert "cannot read time" in _error(client.get("/api/search", params={"q": "x", "taken_after": "May"}), 400)
    body = {"text": "x", "filters": {"taken_after": "2022-01-01", "taken_before": "2021-01-01"}}
    assert "taken_after" in _error(client.post("/api/search", json=body), 400)
    # No photo of the generated collection has a date: a date filter matches none of them.
    empty = client.post("/api/search", json={"text": "x", "filters": {"taken_after": "1900-01-01"}})
    assert empty.status_code == 200 and empty.json()["results"] == []
