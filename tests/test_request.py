"""``SearchRequest``: a search checked once where it enters, then trusted; and the narrow
``ImageIndex`` that answers it (its collaborators, its former names kept with a warning)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from retrieval import ImageIndex
from retrieval.errors import InvalidArgumentError
from retrieval.filters import Filter
from retrieval.hits import Cut
from retrieval.query_terms import QueryTerm
from retrieval.request import SearchRequest

NARROW = {"open", "reopen", "count", "dim", "search", "search_image", "search_vectors", "rows", "info",
          "encoders", "vectors", "metadata", "files", "keywords", "people"}


# -- the value --------------------------------------------------------------------------------


def test_a_request_is_checked_when_made() -> None:
    req = SearchRequest(text="a cat", k=5, min_score=0.1, sort="taken", mode="keyword", where=Filter(path_glob="*.jpg"))
    assert req.kind == "text" and req.cut == Cut(5, 0.1, "taken") and req.terms == ()
    with pytest.raises(Exception, match="cannot assign|frozen"):
        req.k = 3  # type: ignore[misc]
    assert SearchRequest(similar_to=np.int64(3)).similar_to == 3
    vec = SearchRequest(vector=[[0.6, 0.8]]).vector
    assert isinstance(vec, np.ndarray) and vec.shape == (2,) and not vec.flags.writeable


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "give a query"),
        ({"text": "  "}, "non-empty text"),
        ({"text": "a", "image": "x.jpg"}, "give one query"),
        ({"text": "a", "k": 0}, "k must be an integer >= 1"),
        ({"text": "a", "k": True}, "k must be an integer >= 1"),
        ({"text": "a", "min_score": 1.5}, r"min_score must be in \[-1, 1\]"),
        ({"text": "a", "min_score": "0.3"}, "min_score must be a number"),
        ({"text": "a", "sort": "date"}, "sort must be one of"),
        ({"text": "a", "mode": "fuzzy"}, "mode must be one of"),
        ({"image": "x.jpg", "mode": "keyword"}, "mode keyword takes a text query alone"),
        ({"text": "a", "add": ["b"], "mode": "keyword"}, "mode keyword takes a text query alone"),
        ({"similar_to": -1}, "no image with id"),
        ({"similar_to": "3"}, "no image with id"),
        ({"vector": [1.0, float("nan")]}, "finite"),
        ({"vector": [[1.0, 0.0], [0.0, 1.0]]}, "one row"),
        ({"vector": [1.0, 0.0], "add": ["b"]}, "not with a vector"),
        ({"vector": [1.0, 0.0], "similar_to": 1}, "takes no image or image id"),
        ({"add": "a dog"}, "lists of terms"),
        ({"add": [""]}, "empty"),
        ({"add": [QueryTerm("a", weight=1.0)], "subtract": [3]}, "a query term is"),
        ({"text": "a", "where": {"path_glob": "*"}}, "where must be a Filter"),
    ],
)
def test_bad_requests_raise_the_typed_error(kwargs: dict, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        SearchRequest(**kwargs)


def test_query_arithmetic_takes_the_query_as_its_first_term() -> None:
    req = SearchRequest(text="a dog", add=["in the snow", QueryTerm(4, "id", 0.5)], subtract=[Path("grass.jpg")])
    assert req.kind == "terms"
    assert req.terms == (QueryTerm("a dog"), QueryTerm("in the snow"), QueryTerm(4, "id", 0.5), QueryTerm("grass.jpg", "image", -1.0))
    assert SearchRequest(similar_to=2, subtract=["x"]).terms[0] == QueryTerm(2, "id")


def test_with_vector_is_a_text_request_embedded_already() -> None:
    req = SearchRequest(text="a cat", k=3)
    embedded = req.with_vector(np.array([0.6, 0.8], np.float32))
    assert embedded.kind == "text" and embedded.cut is req.cut and req.vector is None
    with pytest.raises(InvalidArgumentError, match="text request"):
        SearchRequest(similar_to=1).with_vector([1.0, 0.0])


# -- the index that answers it -----------------------------------------------------------------


def test_every_kind_answers_as_the_calls_before_it(built_index: Path) -> None:
    index = ImageIndex.open(built_index, device="cpu")
    where = Filter(path_glob="*")
    text = index.search(SearchRequest(text="a dog", k=4, where=where))
    assert [h.id for h in text] == [h.id for h in index.search("a dog", k=4, where=where)]
    stored = index.vectors.vectors_of([2])
    similar = index.search(SearchRequest(similar_to=2, k=3))
    assert similar[0].id == 2 and [h.id for h in similar] == [h.id for h in index.search_vectors(stored, k=3)[0]]
    by_vector = index.search(SearchRequest(vector=stored[0], k=3, min_score=-1.0))
    assert [h.id for h in by_vector] == [h.id for h in similar]
    image = index.search(SearchRequest(image=index.files.path(1), k=3))
    assert [h.id for h in image] == [h.id for h in index.search_image(index.files.path(1), k=3)]
    embedded = SearchRequest(text="a dog", k=4).with_vector(index.encoders.embed_texts(["a dog"])[0])
    assert [h.id for h in index.search(embedded)] == [h.id for h in text]
    combined = index.search(SearchRequest(similar_to=2, subtract=[QueryTerm(2, "id", 0.5)], k=3))
    assert combined[0].id == 2
    # What depends on the index is checked by it, once.
    with pytest.raises(InvalidArgumentError, match="no image with id"):
        index.search(SearchRequest(similar_to=index.count))
    with pytest.raises(InvalidArgumentError, match="shape"):
        index.search(SearchRequest(vector=[1.0, 0.0]))
    with pytest.raises(InvalidArgumentError, match="in it"):
        index.search(SearchRequest(text="a dog"), k=3)


def test_the_index_is_narrow_and_its_former_names_warn(built_index: Path) -> None:
    public = {m for m in dir(ImageIndex) if not m.startswith("_")}
    assert public == NARROW, public ^ NARROW
    index = ImageIndex.open(built_index, device="cpu")
    assert {"directory", "manifest"} <= set(vars(index))
    with pytest.warns(DeprecationWarning, match=r"ImageIndex.search_similar is deprecated: use index.search\(SearchRequest\(similar_to"):
        old = index.search_similar(2, k=3)
    assert [h.id for h in old] == [h.id for h in index.search(SearchRequest(similar_to=2, k=3))]
    with pytest.warns(DeprecationWarning, match="use index.files.path") as caught:
        assert index.source_file(1) == index.files.path(1)
    # The warning points at the line that used the former name, not at the index's own code.
    assert [w.filename for w in caught if "source_file" in str(w.message)] == [__file__]
    with pytest.warns(DeprecationWarning, match="use index.encoders.cache_info"):
        assert index.query_cache_info() == index.encoders.cache_info()
    with pytest.warns(DeprecationWarning, match="use index.vectors.exact_scores"):
        assert index.exact_scores is index.vectors.exact_scores
    with pytest.warns(DeprecationWarning, match="use index.metadata.sizes_of"):
        assert index.sizes_of([0]).tolist() == index.metadata.sizes_of([0]).tolist()
    with pytest.warns(DeprecationWarning, match="search_many"):
        many = index.search_many(["a dog", "grass"], k=2)
    assert [[h.id for h in hits] for hits in many] == [[h.id for h in index.search(q, k=2)] for q in ("a dog", "grass")]
    with pytest.warns(DeprecationWarning, match="use index.vectors.search_ids"):
        unbound = ImageIndex.search_ids  # the class's former method, handed around unbound
    vector = index.vectors.vectors_of([2])
    assert np.array_equal(unbound(index, vector, 3)[1], index.vectors.search_ids(vector, 3)[1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
            index.nonsense  # noqa: B018


# -- the edges ---------------------------------------------------------------------------------


def test_the_cli_refuses_a_bad_request_in_one_line_before_opening_the_index(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from clipsearch.cli import main

    # No index at this path: the request is refused first, in the library's words.
    for args, message in ((["a cat", "--min-score", "2"], "min_score must be in"),
                          (["a cat", "--add", "0:b"], "has weight 0"),
                          (["--image", "x.jpg", "--mode", "keyword"], "mode keyword takes a text query alone")):
        assert main(["search", str(tmp_path / "nowhere"), *args]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("clipsearch: error:") and message in err, err


def test_http_refuses_a_bad_request_with_a_4xx_json_error(built_index: Path, tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from clipsearch.server import create_app

    with TestClient(create_app([built_index], cache_dir=tmp_path, device="cpu", warm=False)) as client:
        for body, message in (({"text": "a", "min_score": 3}, "min_score must be in"),
                              ({"text": " "}, "non-empty text"),
                              ({"image_id": 1, "mode": "keyword"}, "mode keyword takes a text query alone"),
                              ({"vector": [0.0, 0.0]}, "all zeros")):
            resp = client.post("/api/search", json=body)
            assert resp.status_code == 400 and message in resp.json()["error"], resp.text
        assert client.post("/api/search", json={"image_id": 10_000}).status_code == 404
