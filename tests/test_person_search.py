"""Search by person: the ``person`` filter (all of them, or only them), "photos of Alice" without a
query (newest first), and the faces with each hit, from Python, the CLI and HTTP.

The index is :func:`facegen.build_two_people`'s: Alice in a0, a1 and the pair, Bob in a2, a3 and
the pair, coffee.jpg without a face.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import cli_here
from facegen import build_two_people

from retrieval.errors import InvalidArgumentError, NoFacesError
from retrieval.faces import People, editing
from retrieval.faces.current import CurrentPeople
from retrieval.faces.edits import NOBODY
from retrieval.filters import Filter
from retrieval.index import ImageIndex
from retrieval.layout import read_manifest
from retrieval.request import SearchRequest

pytest.importorskip("dlib", reason="the faces extra: pip install 'clipsearch[faces]'")

from PIL import Image  # noqa: E402


@pytest.fixture(scope="module")
def two_people(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    return build_two_people(tmp_path_factory.mktemp("person_search"), tiny_model)


def _paths(hits: list) -> list[str]:  # type: ignore[type-arg]
    return [h.path for h in hits]


def test_photos_of_a_person_without_a_query_come_newest_first(two_people: Path, tiny_model: Path) -> None:
    index = ImageIndex.open(two_people, model=str(tiny_model))
    hits = index.search(SearchRequest(where=Filter(person=("Alice",))))
    assert _paths(hits) == ["pair.jpg", "a1.jpg", "a0.jpg"]
    assert all(h.score is None for h in hits)
    assert _paths(index.search(SearchRequest(where=Filter(person=("bob",)), k=2))) == ["pair.jpg", "a2.jpg"]
    # Undated last; a number names a person too.
    bob = People.open(two_people).find("Bob")
    assert _paths(index.search(SearchRequest(where=Filter(person=(f"#{bob}",))))) == ["pair.jpg", "a2.jpg", "a3.jpg"]


def test_all_of_the_people_or_only_them(two_people: Path, tiny_model: Path) -> None:
    index = ImageIndex.open(two_people, model=str(tiny_model))
    assert _paths(index.search(SearchRequest(where=Filter(person=("Alice", "Bob"))))) == ["pair.jpg"]
    assert _paths(index.search(SearchRequest(where=Filter(person=("Alice",), only_people=True)))) == ["a1.jpg", "a0.jpg"]
    assert _paths(index.search(SearchRequest(where=Filter(person=("Alice", "Bob"), only_people=True)))) == ["pair.jpg"]
    # Combined with the other filters.
    where = Filter(person=("Bob",), path_glob="a*")
    assert sorted(_paths(index.search(SearchRequest(where=where)))) == ["a2.jpg", "a3.jpg"]


def test_a_query_ranks_only_the_persons_photos_as_it_ranks_them_all(two_people: Path, tiny_model: Path) -> None:
    index = ImageIndex.open(two_people, model=str(tiny_model))
    everything = index.search("a person in a space suit", k=10, mode="vector")
    bobs = index.search("a person in a space suit", k=10, mode="vector", where=Filter(person=("Bob",)))
    assert _paths(bobs) == [h.path for h in everything if h.path in ("a2.jpg", "a3.jpg", "pair.jpg")]
    assert [h.score for h in bobs] == [h.score for h in everything if h.path in _paths(bobs)]
    by_image = index.search(SearchRequest(image=two_people.parent / "photos" / "a0.jpg", where=Filter(person=("Alice",))))
    assert sorted(_paths(by_image)) == ["a0.jpg", "a1.jpg", "pair.jpg"]


def test_each_hit_says_who_is_in_it(two_people: Path, tiny_model: Path) -> None:
    index = ImageIndex.open(two_people, model=str(tiny_model))
    by_path = {h.path: h for h in index.search("a photo", k=10)}
    assert by_path["pair.jpg"].people == ["Alice", "Bob"]  # left to right: the same size, the box order
    assert by_path["a3.jpg"].people == ["Bob"] and by_path["coffee.jpg"].people == []
    assert by_path["coffee.jpg"].faces == ()
    (face,) = by_path["a0.jpg"].faces or ()
    left, top, right, bottom = face.box
    assert 0 <= left < right <= 512 and 0 <= top < bottom <= 512
    assert by_path["a0.jpg"].to_dict()["faces"] == [{"box": [round(v, 1) for v in face.box], "person": face.person,
                                                    "name": "Alice"}]


def test_edits_apply_to_an_index_already_open(tmp_path: Path, two_people: Path, tiny_model: Path) -> None:
    out = tmp_path / "idx"
    shutil.copytree(two_people, out)
    index = ImageIndex.open(out, model=str(tiny_model))
    bob = People.open(out).find("Bob")
    assert _paths(index.search(SearchRequest(where=Filter(person=("Bob",))))) == ["pair.jpg", "a2.jpg", "a3.jpg"]
    with editing(out) as box:
        box[0] = box[0].named(bob, "Robert").with_hidden(bob)
    hits = index.search(SearchRequest(where=Filter(person=("Robert",))))
    assert _paths(hits) == ["pair.jpg", "a2.jpg", "a3.jpg"]  # asked by name, a hidden person is still found
    assert hits[0].people == ["Alice"]  # but not shown among the faces
    with pytest.raises(NoFacesError, match="Bob"):
        index.search(SearchRequest(where=Filter(person=("Bob",))))


def test_an_open_index_applies_each_edit_as_a_fresh_read_would(tmp_path: Path, two_people: Path) -> None:
    # CurrentPeople applies new edits to the faces it read once; a fresh People reads everything.
    out = tmp_path / "idx"
    shutil.copytree(two_people, out)
    current = CurrentPeople(out, read_manifest(out))
    current.people()
    people = People.open(out)
    alice, bob = people.find("Alice"), people.find("Bob")
    face = people.faces_of(alice)[0].key
    edits = [lambda e: e.moved([face], bob), lambda e: e.named(bob, "Robert"), lambda e: e.moved([face], NOBODY),
             lambda e: e.merged_into(bob, alice), lambda e: e.with_hidden(alice)]
    for edit in edits:
        with editing(out) as box:
            box[0] = edit(box[0])
        fresh = People.open(out)
        assert current.people().person_of.tolist() == fresh.person_of.tolist()
        assert [(p.id, p.label, p.hidden) for p in current.people().everyone(include_hidden=True)] == \
            [(p.id, p.label, p.hidden) for p in fresh.everyone(include_hidden=True)]


def test_bad_person_searches_are_refused(two_people: Path, built_index: Path, tiny_model: Path) -> None:
    index = ImageIndex.open(two_people, model=str(tiny_model))
    with pytest.raises(NoFacesError, match="no person called 'Carol'"):
        index.search("a photo", where=Filter(person=("Carol",)))
    with pytest.raises(NoFacesError, match="--faces"):
        ImageIndex.open(built_index, model=str(tiny_model)).search("a photo", where=Filter(person=("Alice",)))
    for bad in ({"person": ("",)}, {"person": ("  ",)}, {"only_people": True}):
        with pytest.raises(InvalidArgumentError):
            Filter(**bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="filter"):
        SearchRequest()
    with pytest.raises(InvalidArgumentError, match="min_score"):
        SearchRequest(where=Filter(person=("Alice",)), min_score=0.2)
    assert isinstance(NoFacesError("x"), InvalidArgumentError)  # a caller's mistake: 400 over HTTP


def test_search_by_person_on_the_command_line(two_people: Path) -> None:
    listed = cli_here(["search", two_people, "--person", "Alice", "--person", "Bob"])
    assert listed.returncode == 0, listed.stderr
    (line,) = listed.stdout.strip().splitlines()
    assert "pair.jpg" in line and "2024-05-01" in line and "(with Alice, Bob)" in line
    found = cli_here(["search", two_people, "a photo", "--person", "Alice", "--only", "--json"])
    assert found.returncode == 0, found.stderr
    results = json.loads(found.stdout)["results"]
    assert sorted(r["path"] for r in results) == ["a0.jpg", "a1.jpg"]
    assert all(isinstance(r["score"], float) and [f["name"] for f in r["faces"]] == ["Alice"] for r in results)
    browse = json.loads(cli_here(["search", two_people, "--person", "Bob", "--json"]).stdout)["results"]
    assert [r["score"] for r in browse] == [None, None, None]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--person", "Carol"], "no person called 'Carol'"),
        (["--only"], "--person"),
        (["--person", "Alice", "--min-score", "0.2"], "min_score"),
        ([], "give a text query"),
    ],
)
def test_bad_person_searches_on_the_command_line(two_people: Path, args: list[str], message: str) -> None:
    result = cli_here(["search", two_people, *args])
    assert result.returncode != 0 and message in result.stderr
    assert result.stderr.strip().count("\n") == 0


def test_a_person_search_on_an_index_without_faces(built_index: Path) -> None:
    result = cli_here(["search", built_index, "a photo", "--person", "Alice"])
    assert result.returncode != 0 and "--faces" in result.stderr and result.stderr.strip().count("\n") == 0


def test_people_filter_masks_agree_with_images_with(two_people: Path) -> None:
    people = People.open(two_people)
    alice, bob = people.find("Alice"), people.find("Bob")
    assert np.flatnonzero(people.mask(["Alice", f"#{bob}"])).tolist() == people.images_with([alice, bob]).tolist()


# -- over HTTP ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def people_client(tmp_path_factory: pytest.TempPathFactory, two_people: Path, built_index: Path):  # type: ignore[no-untyped-def]
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from clipsearch.server.app import create_app

    root = tmp_path_factory.mktemp("people_http")
    shutil.copytree(two_people, root / "family")
    app = create_app([root / "family", built_index], cache_dir=root / "cache", device="cpu", warm=False)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def test_people_over_http(people_client) -> None:  # type: ignore[no-untyped-def]
    listed = people_client.get("/api/people")
    assert listed.status_code == 200
    body = listed.json()
    assert body["faces"] is True and [p["label"] for p in body["people"]] == ["Alice", "Bob"]
    face = people_client.get(body["people"][0]["face_url"])
    assert face.status_code == 200 and face.headers["content-type"] == "image/jpeg"
    picture = Image.open(io.BytesIO(face.content))
    assert max(picture.size) <= 128
    page = people_client.get("/api/people/alice").json()
    assert page["label"] == "Alice" and sorted(f["path"] for f in page["face_list"]) == ["a0.jpg", "a1.jpg", "pair.jpg"]
    plain = people_client.get("/api/people", params={"index": "photos.idx"}).json()
    assert plain == {"faces": False, "people": []}


def test_search_by_person_over_http(people_client) -> None:  # type: ignore[no-untyped-def]
    browse = people_client.get("/api/search", params={"person": "Alice"})
    assert browse.status_code == 200, browse.text
    results = browse.json()["results"]
    assert [r["path"] for r in results] == ["pair.jpg", "a1.jpg", "a0.jpg"] and {r["score"] for r in results} == {None}
    assert [f["name"] for f in results[0]["faces"]] == ["Alice", "Bob"]
    both = people_client.post("/api/search", json={"text": "a photo", "filters": {"person": ["Alice", "Bob"]}}).json()
    assert [r["path"] for r in both["results"]] == ["pair.jpg"] and isinstance(both["results"][0]["score"], float)
    only = people_client.post("/api/search", json={"filters": {"person": "Bob", "only_people": True}}).json()
    assert [r["path"] for r in only["results"]] == ["a2.jpg", "a3.jpg"]
    plain = people_client.get("/api/search", params={"q": "a photo", "index": "photos.idx"}).json()
    assert all(r["faces"] is None for r in plain["results"])


@pytest.mark.parametrize(
    ("method", "url", "kwargs", "status", "message"),
    [
        ("get", "/api/search", {"params": {"person": "Carol"}}, 400, "no person called 'Carol'"),
        ("get", "/api/search", {"params": {"q": "x", "person": "Alice", "index": "photos.idx"}}, 400, "--faces"),
        ("get", "/api/search", {"params": {"only_people": "true"}}, 400, "--person"),
        ("get", "/api/search", {}, 400, "give a text query"),
        ("get", "/api/people/Carol", {}, 404, "no person called 'Carol'"),
        ("get", "/api/people/Alice/face", {"params": {"size": 100}}, 400, "size"),
        ("patch", "/api/people/Bob", {"json": {"name": "  "}}, 400, "empty"),
        ("patch", "/api/people/Bob", {"json": {"name": "alice"}}, 400, "already called"),
        ("patch", "/api/people/Bob", {"json": {}}, 400, "give a name or hidden"),
        ("patch", "/api/people/Bob", {"json": {"nick": "B"}}, 422, "unknown field"),
        ("post", "/api/people/Bob/merge", {"json": {"into": "#%s"}}, 400, "into itself"),
    ],
)
def test_bad_people_requests(people_client, method: str, url: str, kwargs: dict, status: int, message: str) -> None:  # type: ignore[no-untyped-def,type-arg]
    before = people_client.get("/api/people").json()
    if "json" in kwargs and "into" in kwargs["json"]:
        bob = next(p["id"] for p in before["people"] if p["label"] == "Bob")
        kwargs = {"json": {"into": kwargs["json"]["into"] % bob}}
    response = getattr(people_client, method)(url, **kwargs)
    assert response.status_code == status and message in response.json()["error"]
    assert people_client.get("/api/people").json() == before  # nothing changed


def test_renaming_and_merging_over_http(tmp_path: Path, two_people: Path) -> None:
    from fastapi.testclient import TestClient

    from clipsearch.server.app import create_app

    shutil.copytree(two_people, tmp_path / "family")
    with TestClient(create_app([tmp_path / "family"], cache_dir=tmp_path / "cache", device="cpu", warm=False)) as client:
        renamed = client.patch("/api/people/Bob", json={"name": "Robert"})
        assert renamed.status_code == 200 and renamed.json()["label"] == "Robert"
        assert [r["path"] for r in client.get("/api/search", params={"person": "Robert"}).json()["results"]][:1] == ["pair.jpg"]
        hidden = client.patch("/api/people/Robert", json={"hidden": True}).json()
        assert hidden["hidden"] is True and [p["label"] for p in client.get("/api/people").json()["people"]] == ["Alice"]
        merged = client.post("/api/people/Robert/merge", json={"into": "Alice"})
        assert merged.status_code == 200 and merged.json()["faces"] == 6
    assert People.open(tmp_path / "family").everyone()[0].faces == 6
