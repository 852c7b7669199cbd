"""``clipsearch serve``: the HTTP API over the tiny random model (FastAPI's TestClient), and
one run of the real command on a free port.

Module-scoped apps: creating one opens the indexes and loads the query models, so the tests
share two (one open, one with a token) and a small writable index for the live update.
"""

from __future__ import annotations

import io
import json
import os
import posixpath
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("fastapi", reason="the server extra is not installed: pip install -e '.[server]'")

from conftest import clipsearch_exe  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from imagegen import Collection, photo_like  # noqa: E402

from clipsearch.server import create_app  # noqa: E402
from retrieval.request import SearchRequest  # noqa: E402

TOKEN = "s3cret-token"


def _write_photos(root: Path, count: int, first_seed: int = 100) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        photo_like(96 + 8 * i, 72, seed=first_seed + i).save(root / f"p{i:02d}.jpg", quality=90)


@pytest.fixture(scope="module")
def live_index(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> tuple[Path, Path]:
    """A small writable index (``live.idx``) and its photo folder, for the live update."""
    from indexer import build_index

    base = tmp_path_factory.mktemp("live")
    photos = base / "photos"
    _write_photos(photos, 6)
    out = base / "live.idx"
    build_index(photos, out, model=str(tiny_model), batch_size=8, workers=0, device="cpu")
    return photos, out


@pytest.fixture(scope="module")
def thumb_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("thumbs")


@pytest.fixture(scope="module")
def client(built_index: Path, live_index: tuple[Path, Path], thumb_cache: Path) -> Iterator[TestClient]:
    """The open app over ``photos.idx`` (the default) and ``live.idx``; uploads up to 1 MiB."""
    app = create_app([built_index, live_index[1]], cache_dir=thumb_cache, device="cpu", max_upload_mb=1)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@pytest.fixture(scope="module")
def locked(built_index: Path, thumb_cache: Path) -> Iterator[TestClient]:
    app = create_app([built_index], token=TOKEN, cache_dir=thumb_cache, device="cpu", warm=False)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def _error(resp: Any, status: int) -> str:
    """The response is ``status`` with a one-line ``{"error": ...}`` body and no traceback."""
    assert resp.status_code == status, (resp.status_code, resp.text)
    body = resp.json()
    assert set(body) == {"error"}, body
    assert isinstance(body["error"], str) and body["error"] and "\n" not in body["error"]
    assert "Traceback" not in resp.text
    assert resp.headers["x-content-type-options"] == "nosniff"
    return str(body["error"])


def test_health_and_indexes(client: TestClient, built_index: Path) -> None:
    resp = client.get("/api/health")
    assert resp.status_code == 200
    assert resp.json() == {"status": "ok", "indexes": ["photos.idx", "live.idx"]}
    assert resp.headers["x-content-type-options"] == "nosniff"
    listed = client.get("/api/indexes").json()
    assert [i["name"] for i in listed] == ["photos.idx", "live.idx"]
    info = json.loads((built_index / "manifest.json").read_text())
    first = listed[0]
    assert set(first) == {"name", "count", "model", "dim", "index_type", "generation", "query_languages"}
    assert first["query_languages"] == []  # CLIP reads any language as it is
    assert (first["count"], first["dim"], first["generation"]) == (info["count"], info["dim"], info["generation"])


def test_search_get_smoke(client: TestClient) -> None:
    resp = client.get("/api/search", params={"q": "a dog", "k": 3})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert set(body) == {"results", "offset", "k", "took_ms"}
    assert len(body["results"]) == 3
    print(body)


# -- helpers ------------------------------------------------------------------------------------


def _ids_by_path(index_dir: Path) -> dict[str, int]:
    from retrieval.index import ImageIndex

    return {p: i for i, p in enumerate(ImageIndex.open(index_dir).metadata.paths())}


def _server_text_mode(client: TestClient) -> str:
    """The precision the server's default index runs text queries in (``auto`` chooses per
    process: a CLI or library call compared with the server must ask for the same)."""
    served = client.app.state.indexes.get(None).current()  # type: ignore[attr-defined]
    served.encoders.embed_texts(["a photo"])  # the text tower is chosen with the first text
    return str(getattr(served.encoders.text_encoder, "mode", "auto"))


def _cli_search(capsys: pytest.CaptureFixture[str], client: TestClient, *args: str) -> list[dict[str, Any]]:
    """``clipsearch search ... --json`` (the command's own main, in this process), its text
    tower in the precision the server's default index runs: ``auto`` keeps a one-shot command's
    text tower in fp32, where a server's may take int8 (docs/server.md)."""
    from clipsearch.cli import main

    capsys.readouterr()
    assert main(["search", *args, "--json", "--device", "cpu", "--precision", _server_text_mode(client)]) == 0
    return list(json.loads(capsys.readouterr().out)["results"])


def _same_ranking(api: list[dict[str, Any]], cli: list[dict[str, Any]]) -> None:
    assert [r["id"] for r in api] == [r["id"] for r in cli]
    assert [r["path"] for r in api] == [r["path"] for r in cli]
    np.testing.assert_allclose([r["score"] for r in api], [r["score"] for r in cli], rtol=0, atol=1e-6)


# -- search: equality with the CLI -------------------------------------------------------------


def test_search_equals_cli(client: TestClient, built_index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cli = _cli_search(capsys, client, str(built_index), "a dog on a beach", "-k", "8")
    got = client.get("/api/search", params={"q": "a dog on a beach", "k": 8})
    assert got.status_code == 200
    body = got.json()
    assert (body["offset"], body["k"]) == (0, 8) and body["took_ms"] >= 0
    _same_ranking(body["results"], cli)
    # offset: the same ranking, sliced
    page = client.get("/api/search", params={"q": "a dog on a beach", "k": 3, "offset": 4}).json()
    assert (page["offset"], page["k"]) == (4, 3)
    _same_ranking(page["results"], cli[4:7])
    # POST JSON answers the same as GET
    posted = client.post("/api/search", json={"text": "a dog on a beach", "k": 3, "offset": 4}).json()
    _same_ranking(posted["results"], cli[4:7])


def test_search_with_filters_equals_cli(client: TestClient, built_index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prefixes = ["--path-prefix", "photos/", "--path-prefix", "formats/"]
    cli = _cli_search(capsys, client, str(built_index), "red", "-k", "6", *prefixes, "--min-width", "64")
    assert cli and all(r["path"].startswith(("photos/", "formats/")) for r in cli)
    params: dict[str, Any] = {"q": "red", "k": 4, "offset": 2, "path_prefix": ["photos/", "formats/"], "min_width": 64}
    got = client.get("/api/search", params=params).json()["results"]
    _same_ranking(got, cli[2:6])
    assert all(r["width"] >= 64 for r in got)
    filters = {"path_prefix": ["photos/", "formats/"], "min_width": 64}
    posted = client.post("/api/search", json={"text": "red", "k": 4, "offset": 2, "filters": filters}).json()["results"]
    _same_ranking(posted, cli[2:6])
    glob = client.get("/api/search", params={"q": "red", "k": 50, "path_glob": "exif/*.jpg"}).json()["results"]
    assert sorted(r["path"] for r in glob) == ["exif/rotated_3.jpg", "exif/rotated_6.jpg"]
    dated = client.get("/api/search", params={"q": "red", "k": 5, "modified_after": "2999-01-01"}).json()["results"]
    assert dated == []


def test_result_fields(client: TestClient, built_index: Path, collection: Collection) -> None:
    results = client.get("/api/search", params={"q": "x", "k": 1000}).json()["results"]
    ids = _ids_by_path(built_index)
    assert len(results) == len(ids)
    for r in results:
        assert set(r) == {
            "id", "path", "score", "taken", "camera", "gps", "matched", "ocr_text", "keyword", "fused", "caption", "url", "width", "height",
            "image_url", "thumbnail_url", "faces", "media", "start", "end", "frame_time", "moments", "video_url",
        }
        assert r["faces"] is None  # built without --faces
        assert r["media"] is None and r["video_url"] is None  # an index of images
        assert ids[r["path"]] == r["id"]
        assert r["image_url"] == f"/api/images/{r['id']}?index=photos.idx"
        assert r["thumbnail_url"] == f"/api/thumbnails/{r['id']}?size=256&index=photos.idx"
        if r["path"] in collection.good:
            assert (r["width"], r["height"]) == collection.good[r["path"]]


def test_search_by_image_id_vector_and_upload(
    client: TestClient, built_index: Path, collection: Collection, capsys: pytest.CaptureFixture[str]
) -> None:
    from retrieval.index import ImageIndex

    target = _ids_by_path(built_index)["photos/a.jpg"]
    similar = client.post("/api/search", json={"image_id": target, "k": 5}).json()["results"]
    # itself first, or tied with its copy (link_to_photo.jpg is a symlink to it)
    assert target in [r["id"] for r in similar if r["score"] == pytest.approx(1.0, abs=1e-5)]
    expected = ImageIndex.open(built_index).search(SearchRequest(similar_to=target, k=5))
    assert [r["id"] for r in similar] == [h.id for h in expected]
    # a vector, not normalised by the caller: the server normalises it
    vector = (ImageIndex.open(built_index).vectors.vectors_of([target])[0] * 3.5).tolist()
    by_vector = client.post("/api/search", json={"vector": vector, "k": 5}).json()["results"]
    _same_ranking(by_vector, [h.to_dict() for h in expected])
    # an uploaded file ranks as `clipsearch search --image` does
    photo = collection.root / "formats" / "rgba.png"
    cli = _cli_search(capsys, client, str(built_index), "--image", str(photo), "-k", "6")
    files = {"image": ("q.png", photo.read_bytes(), "image/png")}
    uploaded = client.post("/api/search", files=files, data={"k": "4", "offset": "2"})
    assert uploaded.status_code == 200, uploaded.text
    _same_ranking(uploaded.json()["results"], cli[2:6])
    filtered = client.post("/api/search", files=files, data={"k": "50", "path_prefix": ["exif/"]}).json()["results"]
    assert {r["path"] for r in filtered} == {"exif/rotated_3.jpg", "exif/rotated_6.jpg"}


def test_query_arithmetic_equals_cli(
    client: TestClient, built_index: Path, collection: Collection, capsys: pytest.CaptureFixture[str]
) -> None:
    from retrieval.index import ImageIndex
    from retrieval.query_terms import QueryTerm

    cli = _cli_search(capsys, client, str(built_index), "2:a dog", "--add", "in the snow", "--subtract", "0.5:grass", "-k", "6")
    got = client.get("/api/search", params={"q": "2:a dog", "add": ["in the snow"], "subtract": ["0.5:grass"], "k": 6})
    assert got.status_code == 200, got.text
    _same_ranking(got.json()["results"], cli)
    posted = client.post("/api/search", json={"text": "2:a dog", "add": ["in the snow"], "subtract": ["0.5:grass"], "k": 6})
    _same_ranking(posted.json()["results"], cli)
    # An image of the index as a term (by id), and an uploaded image as the first term.
    index = ImageIndex.open(built_index, device="cpu", precision=_server_text_mode(client))
    target = _ids_by_path(built_index)["photos/a.jpg"]
    body = {"image_id": target, "add": [{"text": "at night", "weight": 0.5}], "subtract": [{"image_id": 0, "weight": 0.3}], "k": 5}
    terms = [QueryTerm(target, "id"), QueryTerm("at night", weight=0.5)]
    expected = index.search(SearchRequest(add=terms, subtract=[QueryTerm(0, "id", 0.3)], k=5))
    _same_ranking(client.post("/api/search", json=body).json()["results"], [h.to_dict() for h in expected])
    photo = collection.root / "formats" / "rgba.png"
    cli = _cli_search(capsys, client, str(built_index), "--image", str(photo), "--subtract", "grass", "-k", "4")
    files = {"image": ("q.png", photo.read_bytes(), "image/png")}
    uploaded = client.post("/api/search", files=files, data={"k": "4", "subtract": ["grass"]})
    assert uploaded.status_code == 200, uploaded.text
    _same_ranking(uploaded.json()["results"], cli)
    # No term names a file on the server: a path is read as text.
    as_text = client.get("/api/search", params={"q": "x", "add": ["/etc/passwd"], "k": 3}).json()["results"]
    _same_ranking(as_text, [h.to_dict() for h in index.search(SearchRequest(add=["x", "/etc/passwd"], k=3))])
    for params, words in [
        ({"q": "a", "subtract": ["a"]}, "cancel out"),
        ({"q": "a", "add": ["0:b"]}, "weight 0"),
        ({"q": "a", "add": ["b"] * 17}, "at most 16"),
    ]:
        assert words in _error(client.get("/api/search", params=params), 400)
    for body, status, words in [
        ({"vector": [0.1] * 48, "add": ["b"]}, 400, "not with a vector"),
        ({"text": "a", "add": ["b"] * 9, "subtract": ["c"] * 8}, 400, "at most 16"),
        ({"text": "a", "add": [{"text": "b", "image_id": 1}]}, 400, "exactly one of text and image_id"),
        ({"text": "a", "add": [{"image_id": 10**6}]}, 404, "no image"),
        ({"text": "a", "add": [{"text": "b", "colour": 1}]}, 422, "add.0"),
    ]:
        assert words in _error(client.post("/api/search", json=body), status)


def test_several_indexes(client: TestClient, live_index: tuple[Path, Path]) -> None:
    other = client.get("/api/search", params={"q": "a tree", "k": 3, "index": "live.idx"}).json()["results"]
    assert other and all(r["path"].startswith("p") and r["path"].endswith(".jpg") for r in other)
    assert all(r["image_url"].endswith("?index=live.idx") for r in other)
    image = client.get(other[0]["image_url"])
    assert image.status_code == 200 and image.content == (live_index[0] / other[0]["path"]).read_bytes()
    default = client.get("/api/search", params={"q": "a tree", "k": 3}).json()["results"]
    assert [r["path"] for r in default] != [r["path"] for r in other]


def test_duplicate_names_and_bad_dirs(built_index: Path, tmp_path: Path) -> None:
    from retrieval.errors import InvalidArgumentError, NotAnIndexError

    twin = tmp_path / "x" / built_index.name
    twin.parent.mkdir()
    twin.symlink_to(built_index)
    with pytest.raises(InvalidArgumentError, match="two indexes are named 'photos.idx'"):
        create_app([built_index, twin], warm=False)
    with pytest.raises(NotAnIndexError):
        create_app([tmp_path], warm=False)


# -- bad input: one line of JSON, never a traceback ----------------------------------------------

BAD_GETS = [
    ({}, 400, "give a text query"),
    ({"q": "   "}, 400, "give a text query"),
    ({"q": "x", "k": 0}, 422, "k:"),
    ({"q": "x", "k": 1001}, 422, "k:"),
    ({"q": "x", "k": "ten"}, 422, "k:"),
    ({"q": "x", "offset": -1}, 422, "offset:"),
    ({"q": "x", "offset": 9995, "k": 10}, 400, "offset + k"),
    ({"q": "x", "index": "nope"}, 404, "unknown index 'nope'"),
    ({"q": "x", "min_width": -1}, 400, "min_width"),
    ({"q": "x", "min_width": "wide"}, 422, "min_width:"),
    ({"q": "x", "min_width": 100, "max_width": 10}, 400, "nothing can match"),
    ({"q": "x", "modified_after": "last tuesday"}, 400, "cannot read time"),
    # A misspelt filter is refused, never dropped into unfiltered results (as POST's fields).
    ({"q": "x", "bogus": "1"}, 422, "bogus: unknown field"),
    ({"q": "x", "min_widht": "3"}, 422, "min_widht: unknown field"),
]


@pytest.mark.parametrize(("params", "status", "words"), BAD_GETS)
def test_bad_get_search(client: TestClient, params: dict[str, Any], status: int, words: str) -> None:
    assert words in _error(client.get("/api/search", params=params), status)


BAD_POSTS: list[tuple[Any, int, str]] = [
    ({"text": "x", "colour": "red"}, 422, "colour: unknown field"),
    ({"text": "x", "vector": [1.0] * 48}, 400, "exactly one of"),
    ({"k": 3}, 400, "exactly one of"),
    ({"text": ""}, 400, "non-empty"),
    ({"text": "x", "k": 0}, 422, "k:"),
    ({"text": "x", "k": 1001}, 422, "k:"),
    ({"vector": [1.0, 2.0, 3.0]}, 400, "48 numbers"),
    ({"vector": [0.0] * 48}, 400, "all zeros"),
    ({"vector": ["a"] * 48}, 422, "vector.0"),
    ({"image_id": 10**6}, 404, "no image 1000000"),
    ({"image_id": -1}, 422, "image_id:"),
    ({"text": "x", "filters": {"min_widht": 3}}, 422, "filters.min_widht: unknown field"),
    ({"text": "x", "filters": {"min_width": -3}}, 400, "min_width"),
    ({"text": "x", "index": "nope"}, 404, "unknown index"),
    ([1, 2], 422, "request"),
]


@pytest.mark.parametrize(("body", "status", "words"), BAD_POSTS)
def test_bad_post_search(client: TestClient, body: Any, status: int, words: str) -> None:
    assert words in _error(client.post("/api/search", json=body), status)


def test_malformed_json_nan_and_content_type(client: TestClient) -> None:
    headers = {"content-type": "application/json"}
    assert "malformed JSON" in _error(client.post("/api/search", content=b'{"text": "x",', headers=headers), 400)
    assert "malformed JSON" in _error(client.post("/api/search", content=b"\xff\xfe", headers=headers), 400)
    nan = b'{"vector": [NaN' + b", 1.0" * 47 + b"]}"
    assert "finite" in _error(client.post("/api/search", content=nan, headers=headers), 400)
    inf = b'{"vector": [Infinity' + b", 1.0" * 47 + b"]}"
    assert "finite" in _error(client.post("/api/search", content=inf, headers=headers), 400)
    _error(client.post("/api/search", content=b"text=x", headers={"content-type": "text/plain"}), 415)


def test_bad_uploads(client: TestClient, collection: Collection) -> None:
    def upload(data: bytes, **fields: Any) -> Any:
        return client.post("/api/search", files={"image": ("q.jpg", data, "image/jpeg")}, data=fields)

    assert "not an image" in _error(upload(b"hello, not an image"), 400)
    assert "empty file" in _error(upload(b""), 400)
    truncated = (collection.root / "broken" / "truncated.jpg").read_bytes()
    assert "truncated" in _error(upload(truncated), 400)
    bomb = (collection.root / "broken" / "bomb.png").read_bytes()
    assert "decompression bomb" in _error(upload(bomb), 400)
    good = (collection.root / "photos" / "a.jpg").read_bytes()
    assert "colour: unknown field" in _error(upload(good, colour="red"), 422)
    assert "k:" in _error(upload(good, k="0"), 422)
    no_file = client.post("/api/search", data={"k": "3"}, files={"other": ("a.txt", b"x", "text/plain")})
    assert '"image" file' in _error(no_file, 400)
    two = [("image", ("a.jpg", good, "image/jpeg")), ("image", ("b.jpg", good, "image/jpeg"))]
    _error(client.post("/api/search", files=two), 400)
    # an image file is the query: no second kind beside it
    assert "text: unknown field" in _error(upload(good, text="a dog"), 422)


def test_upload_limit(client: TestClient) -> None:
    # the client app's limit is 1 MiB; Content-Length says more: 413 before the body is read
    big = b"\xff\xd8" + b"\0" * (1024 * 1024 + 100 * 1024)
    resp = client.post("/api/search", files={"image": ("big.jpg", big, "image/jpeg")})
    assert "larger than the limit of 1 MiB" in _error(resp, 413)

    # no Content-Length (a chunked body): stopped while it streams in
    def chunks() -> Iterator[bytes]:
        boundary = b"--xyz\r\n"
        yield boundary + b'Content-Disposition: form-data; name="image"; filename="big.jpg"\r\nContent-Type: image/jpeg\r\n\r\n'
        for _ in range(40):
            yield b"\0" * 65536
        yield b"\r\n--xyz--\r\n"

    resp = client.post("/api/search", content=chunks(), headers={"content-type": "multipart/form-data; boundary=xyz"})
    assert "content-length" not in {k.lower() for k in resp.request.headers}
    assert "larger than the limit" in _error(resp, 413)


# -- files by id only --------------------------------------------------------------------------


def test_original_image(client: TestClient, built_index: Path, collection: Collection) -> None:
    ids = _ids_by_path(built_index)
    for rel, media in (("photos/a.jpg", "image/jpeg"), ("formats/rgba.png", "image/png"), ("formats/still.webp", "image/webp")):
        resp = client.get(f"/api/images/{ids[rel]}")
        assert resp.status_code == 200
        assert resp.content == (collection.root / rel).read_bytes()
        assert resp.headers["content-type"] == media
        assert resp.headers["x-content-type-options"] == "nosniff"
        etag = resp.headers["etag"]
        again = client.get(f"/api/images/{ids[rel]}", headers={"If-None-Match": etag})
        assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == etag
    # a non-UTF-8 file name is served by its id like any other
    latin = next(p for p in ids if p.startswith("intl/latin1_caf"))
    resp = client.get(f"/api/images/{ids[latin]}")
    assert resp.status_code == 200 and resp.content[:2] == b"\xff\xd8"


TRAVERSALS = [
    "/api/images/-1",
    "/api/images/abc",
    "/api/images/99999",
    "/api/images/1.0",
    "/api/images/+1",
    "/api/images/%2e%2e",
    "/api/images/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
    "/api/images/..%2f..%2f..%2fetc%2fpasswd",
    "/api/images/%2fetc%2fpasswd",
    "/api/images//etc/passwd",
    "/api/images/0/../../../etc/passwd",
    "/api/images/" + "9" * 40,
    "/api/thumbnails/-1",
    "/api/thumbnails/abc",
    "/api/thumbnails/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
    "/api/thumbnails/99999",
    "/static/..%2f..%2f..%2fetc%2fpasswd",
    "/static/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
]


@pytest.mark.parametrize("url", TRAVERSALS)
def test_traversal_and_bad_ids(client: TestClient, url: str) -> None:
    resp = client.get(url)
    assert resp.status_code == 404, (url, resp.status_code)
    assert "root:" not in resp.text
    if url.startswith("/api"):
        _error(resp, 404)


def test_nothing_outside_the_source_root(client: TestClient, built_index: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from retrieval.source_files import SourceFiles

    secret = tmp_path / "secret.jpg"
    photo_like(32, 32, seed=1).save(secret)

    def escaping(self: SourceFiles, id: int) -> Path:
        # as if the index recorded "../<somewhere>": the server must refuse it on its own
        root = self._manifest.source_root
        return Path(root, "..", os.path.relpath(secret, root))

    monkeypatch.setattr(SourceFiles, "path", escaping)
    for url in ("/api/images/0", "/api/thumbnails/0?size=64"):
        assert "outside its source root" in _error(client.get(url), 404)


# -- thumbnails --------------------------------------------------------------------------------


def test_thumbnails(client: TestClient, built_index: Path, thumb_cache: Path) -> None:
    ids = _ids_by_path(built_index)

    def thumb(rel: str, size: int) -> Image.Image:
        resp = client.get(f"/api/thumbnails/{ids[rel]}", params={"size": size})
        assert resp.status_code == 200, resp.text
        assert resp.headers["content-type"] == "image/jpeg"
        assert "max-age" in resp.headers["cache-control"]
        img = Image.open(io.BytesIO(resp.content))
        assert img.format == "JPEG" and max(img.size) <= size
        return img

    assert thumb("photos/a.jpg", 128).size == (128, 96)
    assert thumb("photos/panorama.jpg", 256).size[0] == 256
    assert thumb("photos/2023/d.Jpeg", 256).size == (64, 64)  # never enlarged
    # EXIF orientation 6: stored 200x100, shown 100x200
    assert thumb("exif/rotated_6.jpg", 128).size == (64, 128)
    # transparency composited on white: rgba.png's left 60 of 160 columns are fully transparent
    rgba = np.asarray(thumb("formats/rgba.png", 128).convert("RGB"), dtype=int)
    assert rgba[:, :40].min() >= 245
    # default size 256
    assert max(Image.open(io.BytesIO(client.get(f"/api/thumbnails/{ids['photos/a.jpg']}").content)).size) == 256
    assert "size must be one of" in _error(client.get(f"/api/thumbnails/{ids['photos/a.jpg']}", params={"size": 100}), 400)
    assert "size:" in _error(client.get(f"/api/thumbnails/{ids['photos/a.jpg']}", params={"size": "big"}), 422)


def test_thumbnail_etag_and_disk_cache(client: TestClient, built_index: Path, thumb_cache: Path) -> None:
    image_id = _ids_by_path(built_index)["photos/2023/summer/b.JPG"]
    url = f"/api/thumbnails/{image_id}?size=64"
    first = client.get(url)
    etag = first.headers["etag"]
    assert first.status_code == 200 and etag
    assert client.get(url, headers={"If-None-Match": etag}).status_code == 304
    assert client.get(url, headers={"If-None-Match": f'"other", W/{etag}'}).status_code == 304
    assert client.get(url, headers={"If-None-Match": '"other"'}).status_code == 200
    # cached on disk under the recorded content hash and the size; the next request reads it
    cached = list(thumb_cache.rglob(etag.strip('"') + ".jpg"))
    assert len(cached) == 1 and cached[0].read_bytes() == first.content
    marker = io.BytesIO()
    Image.new("RGB", (7, 7), (1, 2, 3)).save(marker, "JPEG")
    cached[0].write_bytes(marker.getvalue())
    assert client.get(url).content == marker.getvalue()
    assert not [p for p in thumb_cache.rglob("*") if p.name.startswith(".tmp-")]


# -- the token, the UI, the docs ---------------------------------------------------------------


def test_token(locked: TestClient) -> None:
    for url in ("/api/health", "/api/indexes", "/api/search?q=x", "/api/images/0", "/api/thumbnails/0"):
        resp = locked.get(url)
        assert "token" in _error(resp, 401)
        assert resp.headers["www-authenticate"] == "Bearer"
        _error(locked.get(url, headers={"Authorization": "Bearer wrong"}), 401)
        _error(locked.get(url, headers={"Authorization": TOKEN}), 401)
        _error(locked.get(url, headers={"Authorization": f"Basic {TOKEN}"}), 401)
    _error(locked.post("/api/search", json={"text": "x"}), 401)
    ok = locked.get("/api/health", headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200 and ok.json()["status"] == "ok"
    # the UI (which asks for the token) and the docs stay reachable without it
    for url in ("/", "/static/app.js", "/static/style.css", "/docs"):
        assert locked.get(url).status_code == 200, url


def test_ui_and_headers(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'type="search" name="q"' in page.text and 'data-testid="results"' in page.text
    csp = page.headers["content-security-policy"]
    for rule in ("default-src 'none'", "script-src 'self'", "style-src 'self'", "img-src 'self' blob: data:", "media-src 'self' blob:",
                 "frame-ancestors 'none'"):
        assert rule in csp
    assert "unsafe-inline" not in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    head = client.head("/")
    assert head.status_code == 200 and head.content == b"" and head.headers["content-security-policy"] == csp
    js = client.get("/static/app.js")
    assert js.status_code == 200 and "javascript" in js.headers["content-type"]
    _error(client.get("/static/missing.js"), 404)
    _error(client.get("/api/nothing"), 404)


# A static import or export-from of a relative module: `import ... from "./x.js"`, `export ... from "./x.js"`.
_JS_IMPORT = re.compile(r"""^\s*(?:import|export)\b[^;'"]*?\bfrom\s*["'](\.{1,2}/[^"']+)["']""", re.MULTILINE)


def _ui_modules(client: TestClient) -> dict[str, str]:
    """The URLs of app.js and every module it imports, transitively, as the browser would fetch
    them, each with the content type it was served with."""
    seen: dict[str, str] = {}
    todo = ["/static/app.js"]
    while todo:
        url = todo.pop()
        if url in seen:
            continue
        resp = client.get(url)
        assert resp.status_code == 200, url
        seen[url] = resp.headers["content-type"]
        base = url.rsplit("/", 1)[0]
        for spec in _JS_IMPORT.findall(resp.text):
            todo.append(posixpath.normpath(posixpath.join(base, spec)))
    return seen


def test_ui_modules_served_as_javascript(client: TestClient) -> None:
    # Browsers refuse a module script served with a type other than JavaScript's.
    modules = _ui_modules(client)
    assert len(modules) > 1 and all(url.startswith("/static/") for url in modules)
    for url, content_type in modules.items():
        assert "javascript" in content_type, (url, content_type)


def test_no_browser_ui(built_index: Path, client: TestClient) -> None:
    modules = _ui_modules(client)
    with TestClient(create_app([built_index], browser_ui=False, warm=False)) as c:
        _error(c.get("/"), 404)
        for url in modules:
            _error(c.get(url), 404)
        assert c.get("/api/health").status_code == 200


def test_docs_offline(client: TestClient) -> None:
    docs = client.get("/docs")
    assert docs.status_code == 200
    assert "cdn" not in docs.text.lower() and "/docs-assets/swagger-ui-bundle.js" in docs.text
    csp = docs.headers["content-security-policy"]
    assert "'sha256-" in csp and "http" not in csp
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css"):
        assert client.get(f"/docs-assets/{asset}").status_code == 200
    spec = client.get("/openapi.json").json()
    assert {"/api/health", "/api/indexes", "/api/search", "/api/images/{image_id}", "/api/thumbnails/{image_id}"} <= set(spec["paths"])
    post = spec["paths"]["/api/search"]["post"]["requestBody"]["content"]
    assert set(post) == {"application/json", "multipart/form-data"}
    assert "Filters" in spec["components"]["schemas"]
    # the bundled Swagger UI (4.x) reads OpenAPI 3.0 only: /docs loads a 3.0 rendering of the same document
    assert spec["openapi"].startswith("3.1")
    assert '"/docs/openapi-3.0.json"' in docs.text.replace("'", '"')
    legacy = client.get("/docs/openapi-3.0.json").json()
    assert legacy["openapi"] == "3.0.3" and set(legacy["paths"]) == set(spec["paths"])
    assert '{"type": "null"}' not in json.dumps(legacy) and '"nullable": true' in json.dumps(legacy)


def test_internal_error_is_one_line(client: TestClient, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    from clipsearch.server import search

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom: a bug")

    monkeypatch.setattr(search, "_hits", broken)
    resp = client.get("/api/search", params={"q": "x"})
    assert _error(resp, 500) == "internal server error"
    assert "boom" not in resp.text
    assert "RuntimeError: boom: a bug" in capfd.readouterr().err


# -- concurrency -------------------------------------------------------------------------------


def test_concurrent_requests_agree_with_sequential_ones(client: TestClient, built_index: Path, collection: Collection) -> None:
    from concurrent.futures import ThreadPoolExecutor

    photo = (collection.root / "photos" / "a.jpg").read_bytes()
    ids = _ids_by_path(built_index)

    def ask(i: int) -> Any:
        kind = i % 4
        if kind == 0:
            return client.get("/api/search", params={"q": f"query {i % 3}", "k": 5}).json()["results"]
        if kind == 1:
            return client.post("/api/search", files={"image": ("q.jpg", photo, "image/jpeg")}, data={"k": "5"}).json()["results"]
        if kind == 2:
            return client.post("/api/search", json={"image_id": ids["exif/rotated_3.jpg"], "k": 5}).json()["results"]
        return client.get(f"/api/thumbnails/{ids['photos/a.jpg']}", params={"size": 128}).content

    expected = [ask(i) for i in range(12)]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(ask, list(range(12)) * 3))
    for i, answer in enumerate(got):
        want = expected[i % 12]
        if isinstance(want, bytes):
            assert answer == want
        else:
            _same_ranking(answer, want)


def test_model_calls_do_not_block_the_event_loop(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    from retrieval.encoders.query import QueryEncoders

    started, release = threading.Event(), threading.Event()
    original = QueryEncoders.embed_texts

    def slow(self: QueryEncoders, texts: Any, query_lang: str | None = None) -> Any:
        if list(texts) == ["slow one"]:
            started.set()
            assert release.wait(60)
        return original(self, texts, query_lang)

    monkeypatch.setattr(QueryEncoders, "embed_texts", slow)
    held = threading.Thread(target=lambda: client.get("/api/search", params={"q": "slow one"}))
    held.start()
    try:
        assert started.wait(60)
        # While a search sits in its worker thread, the loop answers others (a search of another
        # index, health): both come back while that search is still held, which a blocked loop
        # could only do after the held search gave up (then its request would be over).
        assert client.get("/api/health").status_code == 200
        assert client.get("/api/search", params={"q": "x", "index": "live.idx"}).status_code == 200
        assert held.is_alive() and not release.is_set()
    finally:
        release.set()
        held.join(60)


# -- live updates ------------------------------------------------------------------------------


def test_live_update_and_request_in_flight(
    client: TestClient, live_index: tuple[Path, Path], tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from indexer import build_index
    from retrieval.index import ImageIndex

    photos, index_dir = live_index
    before = client.get("/api/indexes").json()[1]
    assert before["name"] == "live.idx"
    old_count = before["count"]
    entered, release = threading.Event(), threading.Event()
    seen: list[str] = []
    original_metadata = ImageIndex.metadata.fget
    assert original_metadata is not None
    armed = [True]

    def held_metadata(self: ImageIndex) -> Any:
        # the first metadata read of a live.idx search (its result sizes) waits until the new generation is out
        if armed[0] and self.directory == index_dir:
            armed[0] = False
            seen.append(str(self.manifest.generation))
            entered.set()
            assert release.wait(60)
        return original_metadata(self)

    monkeypatch.setattr(ImageIndex, "metadata", property(held_metadata))
    in_flight: list[Any] = []
    worker = threading.Thread(target=lambda: in_flight.append(client.get("/api/search", params={"q": "x", "k": 1000, "index": "live.idx"})))
    worker.start()
    try:
        assert entered.wait(60)
        _write_photos(photos / "new", 1, first_seed=999)
        build_index(photos, index_dir, model=str(tiny_model), batch_size=8, workers=0, device="cpu")
        after = client.get("/api/indexes").json()[1]
        assert after["count"] == old_count + 1 and after["generation"] != before["generation"]
        found = client.get("/api/search", params={"q": "x", "k": 1000, "index": "live.idx"}).json()["results"]
        assert len(found) == old_count + 1 and "new/p00.jpg" in [r["path"] for r in found]
        new_id = next(r["id"] for r in found if r["path"] == "new/p00.jpg")
        assert client.get(f"/api/images/{new_id}?index=live.idx").content == (photos / "new" / "p00.jpg").read_bytes()
    finally:
        release.set()
        worker.join(60)
    # the request that started before the update finished on its own generation, whole
    assert seen == [str(before["generation"])]
    old = in_flight[0].json()["results"]
    assert len(old) == old_count and "new/p00.jpg" not in [r["path"] for r in old]


# -- the command -------------------------------------------------------------------------------


def _raw_get(host: str, port: int, target: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """A GET with the request target sent exactly as given (no client-side normalisation)."""
    import http.client

    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.putrequest("GET", target, skip_accept_encoding=True)
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _start_serve(
    args: list[str], env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], str, Callable[[], str]]:
    """Start ``clipsearch serve``; returns the process, its URL and ``output()``: everything it
    wrote to stderr, once it has exited (joins the reader: no line is missed)."""
    proc = subprocess.Popen(
        [clipsearch_exe(), "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if line.startswith("clipsearch: serving "):
                ready.set()
        ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    ready.wait(120)
    served = [line for line in lines if line.startswith("clipsearch: serving ")]
    if not served:
        proc.kill()
        pytest.fail(f"the server did not start: {''.join(lines)}")

    def output() -> str:
        proc.wait(60)
        reader.join(60)  # stderr ends when the process does
        assert not reader.is_alive()
        return "".join(lines)

    return proc, served[0].split()[-1], output


@pytest.mark.slow
def test_serve_command(built_index: Path, tmp_path: Path) -> None:
    proc, url, output = _start_serve([str(built_index), "--port", "0", "--device", "cpu", "--cache-dir", str(tmp_path / "cache")])
    try:
        assert url.startswith("http://127.0.0.1:") and url.endswith("/")
        port = int(url.rsplit(":", 1)[1].rstrip("/"))
        assert port != 0
        status, body = _raw_get("127.0.0.1", port, "/api/health")
        assert status == 200 and json.loads(body) == {"status": "ok", "indexes": ["photos.idx"]}
        status, body = _raw_get("127.0.0.1", port, "/api/search?q=a+dog&k=2")
        assert status == 200 and len(json.loads(body)["results"]) == 2
        # request targets as an attacker would send them, unnormalised
        for target in (
            "/api/images/../../../../etc/passwd",
            "/api/images/..%2f..%2f..%2f..%2fetc%2fpasswd",
            "/api/images/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
            "/static/../../../../../etc/passwd",
            "/static/%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
            "/static/..%2f..%2f..%2f..%2fetc%2fpasswd",
            "/api/thumbnails/..%2f..%2fetc%2fpasswd",
            "//etc/passwd",
        ):
            status, body = _raw_get("127.0.0.1", port, target)
            assert status in (400, 404), (target, status)
            assert b"root:" not in body and b"Traceback" not in body
        # a second server on the same port: one line, exit 1, before any model loads
        busy_cmd = [clipsearch_exe(), "serve", str(built_index), "--port", str(port)]
        busy = subprocess.run(busy_cmd, capture_output=True, text=True, timeout=120)
        assert busy.returncode == 1
        assert busy.stderr.strip().count("\n") == 0 and "in use" in busy.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
    text = output()
    assert rc == 0, text
    assert text.count("clipsearch: serving") == 1 and "Traceback" not in text
    assert "Loading" not in text and "GET /api" not in text  # no model load report, no access log


@pytest.mark.slow
def test_serve_command_errors(tmp_path: Path) -> None:
    bad = subprocess.run([clipsearch_exe(), "serve", str(tmp_path / "missing"), "--port", "0"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and bad.stderr.startswith("clipsearch: error:")
    assert "Traceback" not in bad.stderr
    # a public address without a token: a warning first (then the same error here)
    public = subprocess.run(
        [clipsearch_exe(), "serve", str(tmp_path / "missing"), "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "CLIPSEARCH_TOKEN"},
    )
    first, *rest = public.stderr.splitlines()
    assert public.returncode == 1 and first.startswith("clipsearch: warning: serving on 0.0.0.0 without a token")
    assert len(rest) == 1


def test_serve_without_the_server_extra(built_index: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from clipsearch.cli import main

    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn -> ImportError
    assert main(["serve", str(built_index), "--port", "0"]) == 1
    assert capsys.readouterr().err == "clipsearch: error: install the server extra: pip install 'clipsearch[server]'\n"


def test_serve_sigint_exits_zero(built_index: Path, tmp_path: Path) -> None:
    args = [str(built_index), "--port", "0", "--device", "cpu", "--cache-dir", str(tmp_path)]
    proc, url, output = _start_serve(args, env={"CLIPSEARCH_TOKEN": TOKEN})
    port = int(url.rsplit(":", 1)[1].rstrip("/"))
    assert _raw_get("127.0.0.1", port, "/api/health")[0] == 401
    assert _raw_get("127.0.0.1", port, "/api/health", {"Authorization": f"Bearer {TOKEN}"})[0] == 200
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 0
    assert "Traceback" not in output()


def test_serve_runs_openblas_single_threaded_unless_told(built_index: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from threadpoolctl import ThreadpoolController

    import clipsearch.cli.serve as serve_cli
    from clipsearch.cli import main

    blas = ThreadpoolController().select(internal_api="openblas")
    before = [lib["num_threads"] for lib in blas.info()]
    seen: list[list[int]] = []
    monkeypatch.setattr(serve_cli, "_serve_forever", lambda *a, **k: seen.append([lib["num_threads"] for lib in blas.info()]))
    try:
        common = [str(built_index), "--port", "0", "--device", "cpu", "--cache-dir", str(tmp_path)]
        assert main(["serve", *common]) == 0
        assert main(["serve", *common, "--blas-threads", "2"]) == 0
    finally:
        blas.limit(limits=max(before) if before else 1)
    assert seen and all(n == 1 for n in seen[0]) and all(n == 2 for n in seen[1])
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", str(built_index), "--blas-threads", "0"])
    assert exit_info.value.code == 2
