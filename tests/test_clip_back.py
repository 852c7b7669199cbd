"""clip-back's API (``/indices-list``, ``/knn-service``, ``/metadata``) on ``clipsearch serve``:
clip-retrieval's own ``ClipClient`` against a real server (uvicorn in a thread), compared with
``/api/search`` for the same query; the shapes, deduplication, ignored and refused options, CORS,
the token, image_url fetches and every bad input (FastAPI's TestClient).

``ClipClient`` is loaded from clip-retrieval's installed package by file path: the package's
``__init__`` imports flask (clip-retrieval's server, not installed here); the client needs only
``requests``.
"""

from __future__ import annotations

import base64
import http.server
import importlib.util
import io
import json
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="the server extra is not installed: pip install -e '.[server]'")

from fastapi.testclient import TestClient  # noqa: E402
from imagegen import photo_like  # noqa: E402

from clipsearch.server import create_app  # noqa: E402
from clipsearch.server.clip_back_query import IGNORED_HEADER, near_duplicates  # noqa: E402

TOKEN = "clip-back-token"
NUM = 6


def load_clip_client() -> ModuleType:
    """clip-retrieval's ``clip_client`` module, by file path (its package imports flask)."""
    spec = importlib.util.find_spec("clip_retrieval")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("clip-retrieval is not installed (pip install --no-deps clip-retrieval)", pytrace=False)
    path = Path(next(iter(spec.submodule_search_locations))) / "clip_client.py"
    loaded = importlib.util.spec_from_file_location("clip_retrieval_clip_client", path)
    assert loaded is not None and loaded.loader is not None
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """10 photos, and ``p00.jpg``'s exact copy as ``zz_copy.jpg`` (a duplicate to drop)."""
    root = tmp_path_factory.mktemp("cb_photos") / "photos"
    root.mkdir()
    for i in range(10):
        photo_like(96 + 4 * i, 72, seed=300 + i).save(root / f"p{i:02d}.jpg", quality=90)
    shutil.copy(root / "p00.jpg", root / "zz_copy.jpg")
    return root


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, photos: Path) -> Path:
    from indexer import build_index

    out = tmp_path_factory.mktemp("cb_index") / "mine.idx"
    build_index(photos, out, model=str(tiny_model), batch_size=8, workers=0, device="cpu")
    return out


@pytest.fixture(scope="module")
def app(index_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return create_app([index_dir], cache_dir=tmp_path_factory.mktemp("cb_cache"), device="cpu", cors_origins=["http://front.test"])


@pytest.fixture(scope="module")
def client(app: Any) -> Iterator[TestClient]:
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ThreadServer:
    """uvicorn serving ``app`` on 127.0.0.1 in a thread of this process."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        for _ in range(500):
            if self.server.started:
                return self
            self.thread.join(0.02)
        raise AssertionError("uvicorn did not start")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def served(app: Any) -> Iterator[ThreadServer]:
    with ThreadServer(app) as running:
        yield running


def _search(client: TestClient, **body: Any) -> list[tuple[int, float]]:
    resp = client.post("/api/search", json={"k": NUM, **body})
    assert resp.status_code == 200, resp.text
    return [(r["id"], r["score"]) for r in resp.json()["results"]]


def _pairs(results: list[dict[str, Any]]) -> list[tuple[int, float]]:
    return [(r["id"], r["similarity"]) for r in results]


def _same(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> None:
    assert [i for i, _ in got] == [i for i, _ in want]
    np.testing.assert_allclose([s for _, s in got], [s for _, s in want], rtol=0, atol=1e-6)


# -- the real client ----------------------------------------------------------------------------


def test_clip_client_text_image_and_embedding_match_api_search(
    served: ThreadServer, client: TestClient, photos: Path, index_dir: Path
) -> None:
    cc = load_clip_client()
    knn = cc.ClipClient(url=served.url + "/knn-service", indice_name="mine.idx", num_images=NUM, deduplicate=False)

    by_text = knn.query(text="a red car")
    _same(_pairs(by_text), _search(client, text="a red car"))
    first = by_text[0]
    assert list(first)[-2:] == ["id", "similarity"]  # clip-back's order: metadata, then id, similarity
    assert isinstance(first["id"], int) and isinstance(first["similarity"], float)
    assert first["url"] == f"{served.url}/api/images/{first['id']}?index=mine.idx"
    assert first["caption"] == first["path"]

    query_image = photos / "p03.jpg"
    by_image = knn.query(image=str(query_image))
    files = {"image": ("q.jpg", query_image.read_bytes(), "image/jpeg")}
    resp = client.post("/api/search", files=files, data={"k": str(NUM)})
    _same(_pairs(by_image), [(r["id"], r["score"]) for r in resp.json()["results"]])

    vector = (np.arange(48, dtype=np.float64) - 20.0).tolist()
    _same(_pairs(knn.query(embedding_input=vector)), _search(client, vector=vector))

    # The url of a result is the original file.
    import requests

    image = requests.get(first["url"], timeout=30)
    assert image.status_code == 200 and image.content == (photos / first["path"]).read_bytes()


def test_clip_client_defaults_are_accepted_and_named_ignored(served: ThreadServer, client: TestClient) -> None:
    import requests

    cc = load_clip_client()
    knn = cc.ClipClient(url=served.url + "/knn-service", indice_name="mine.idx", num_images=4)
    results = knn.query(text="a boat")  # deduplicate, safety, violence and aesthetic options all on
    assert 1 <= len(results) <= 4
    body = {
        "text": "a boat", "indice_name": "mine.idx", "num_images": 4, "modality": "image",
        "use_safety_model": True, "use_violence_detector": True, "aesthetic_score": 9, "aesthetic_weight": 0.5,
    }
    resp = requests.post(served.url + "/knn-service", data=json.dumps(body), timeout=30)
    assert resp.status_code == 200
    assert resp.headers[IGNORED_HEADER] == "use_safety_model, use_violence_detector, aesthetic_score, aesthetic_weight"
    quiet = {**body, "use_safety_model": False, "use_violence_detector": False, "aesthetic_score": "", "aesthetic_weight": ""}
    assert IGNORED_HEADER not in client.post("/knn-service", content=json.dumps(quiet)).headers


# -- shapes -------------------------------------------------------------------------------------


def test_indices_list_and_metadata(client: TestClient, photos: Path) -> None:
    assert client.get("/indices-list").json() == ["mine.idx"]
    body = {"text": "a cat", "indice_name": "mine.idx", "num_images": 2, "num_result_ids": 8}
    results = client.post("/knn-service", content=json.dumps(body), headers={"Content-Type": "text/plain"}).json()
    assert len(results) == 8
    assert all(set(r) == {"url", "caption", "path", "id", "similarity"} for r in results[:2])
    assert all(set(r) == {"id", "similarity"} for r in results[2:])  # clip-front asks /metadata for these
    rest = [r["id"] for r in results[2:]]
    meta = client.post("/metadata", content=json.dumps({"ids": rest, "indice_name": "mine.idx"})).json()
    assert [m["id"] for m in meta] == rest
    names = {p.name for p in photos.iterdir()}
    assert all(m["metadata"]["path"] in names and m["metadata"]["url"].endswith(f"/api/images/{m['id']}?index=mine.idx") for m in meta)
    assert client.post("/metadata", json={"ids": [], "indice_name": "mine.idx"}).json() == []


def test_deduplicate_drops_the_copy_as_clip_back_does(client: TestClient, index_dir: Path) -> None:
    from retrieval.index import ImageIndex

    index = ImageIndex.open(index_dir)
    paths = index.metadata.paths()
    original, copy = paths.index("p00.jpg"), paths.index("zz_copy.jpg")
    body = {"embedding_input": index.vectors.vectors_of([original])[0].tolist(), "indice_name": "mine.idx", "num_images": 11}
    plain = client.post("/knn-service", json=body).json()
    assert {plain[0]["id"], plain[1]["id"]} == {original, copy}  # both score 1.0
    deduped = client.post("/knn-service", json={**body, "deduplicate": True}).json()
    ids = [r["id"] for r in deduped]
    assert ids[0] == plain[0]["id"] and plain[1]["id"] not in ids
    # Exactly what clip-back's rule drops: results linked above 0.94 to a higher-ranked one.
    vectors = index.vectors.vectors_of([r["id"] for r in plain])
    assert ids == [r["id"] for r, gone in zip(plain, near_duplicates(vectors), strict=True) if not gone]


def test_near_duplicates_is_transitive_and_keeps_the_highest_ranked() -> None:
    a = np.array([1.0, 0.0, 0.0])
    b = np.array([0.95, 0.3122, 0.0])  # 0.95 with a
    c = np.array([0.81, 0.5864, 0.0])  # 0.95 with b, 0.81 with a: linked through b
    d = np.array([0.0, 0.0, 1.0])
    drop = near_duplicates(np.stack([a, d, b, c]))
    assert drop.tolist() == [False, False, True, True]
    assert near_duplicates(np.zeros((1, 3))).tolist() == [False]


def test_an_imported_index_has_no_url(index_dir: Path) -> None:
    from types import SimpleNamespace

    from clipsearch.server.clip_back_query import metadata_of

    rows = SimpleNamespace(paths_of=lambda ids: [f"v{i}" for i in ids],
                           sample_meta=lambda ids: [{"caption": None, "url": None} for _ in ids])
    imported = SimpleNamespace(manifest=SimpleNamespace(source_root=""), metadata=rows)
    assert metadata_of(imported, [3, 1], "vec.idx", "http://h/") == [{"caption": "v3", "path": "v3"}, {"caption": "v1", "path": "v1"}]  # type: ignore[arg-type]


# -- refused options and bad inputs -------------------------------------------------------------


def _error(resp: Any, status: int) -> str:
    assert resp.status_code == status, (resp.status_code, resp.text)
    body = resp.json()
    assert set(body) == {"error"} and "\n" not in body["error"] and "Traceback" not in resp.text
    return str(body["error"])


BASE = {"text": "a dog", "indice_name": "mine.idx", "num_images": 3}


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"text": "a dog", "num_images": 3}, 400, "indice_name"),
        ({**BASE, "indice_name": ""}, 400, "indice_name"),
        ({**BASE, "indice_name": "nope"}, 404, "unknown index"),
        ({**BASE, "num_images": 0}, 400, "num_images"),
        ({**BASE, "num_images": 10001}, 400, "num_images"),
        ({**BASE, "num_images": "3"}, 400, "num_images"),
        ({**BASE, "num_images": None}, 400, "num_images"),
        ({**BASE, "num_result_ids": -1}, 400, "num_result_ids"),
        ({**BASE, "text": None, "image": "not base64!!"}, 400, "base64"),
        ({**BASE, "text": None, "image": base64.b64encode(b"plain text, not an image").decode()}, 400, "upload"),
        ({**BASE, "text": None, "embedding_input": [0.1, 0.2]}, 400, "48"),
        ({**BASE, "text": None, "embedding_input": [0.0] * 48}, 400, "zeros"),
        ({**BASE, "text": None, "embedding_input": "0.1,0.2"}, 400, "embedding_input"),
        ({**BASE, "text": None, "embedding_input": [True] * 48}, 400, "numbers"),
        ({**BASE, "text": None}, 400, "give one of"),
        ({**BASE, "text": 5}, 400, "text"),
        ({**BASE, "text": "   "}, 400, "non-empty"),
        ({**BASE, "use_mclip": True}, 400, "use_mclip"),
        ({**BASE, "modality": "text"}, 400, "caption embeddings"),
        ({**BASE, "modality": "audio"}, 400, "modality"),
        ({**BASE, "deduplicate": "yes"}, 400, "deduplicate"),
        ({**BASE, "aesthetic_score": [9]}, 400, "aesthetic_score"),
        ({**BASE, "text": None, "image_url": "http://127.0.0.1:9/x.jpg"}, 400, "--allow-image-urls"),
    ],
)
def test_knn_bad_inputs(client: TestClient, body: dict[str, Any], status: int, says: str) -> None:
    assert says in _error(client.post("/knn-service", content=json.dumps(body)), status)


@pytest.mark.parametrize("raw", [b"[1, 2]", b'"text"', b"null", b"{not json", b"\xff\xfe"])
def test_bodies_that_are_not_objects(client: TestClient, raw: bytes) -> None:
    for route in ("/knn-service", "/metadata"):
        _error(client.post(route, content=raw), 400)


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"ids": [0]}, 400),
        ({"ids": [0], "indice_name": "nope"}, 404),
        ({"ids": [999], "indice_name": "mine.idx"}, 400),
        ({"ids": [-1], "indice_name": "mine.idx"}, 400),
        ({"ids": ["0"], "indice_name": "mine.idx"}, 400),
        ({"ids": 3, "indice_name": "mine.idx"}, 400),
        ({"ids": list(range(10001)), "indice_name": "mine.idx"}, 400),
    ],
)
def test_metadata_bad_inputs(client: TestClient, body: dict[str, Any], status: int) -> None:
    _error(client.post("/metadata", json=body), status)


# -- CORS, token, image_url ---------------------------------------------------------------------


def test_cors_only_for_configured_origins(client: TestClient, index_dir: Path, tmp_path: Path) -> None:
    pre = client.options(
        "/knn-service", headers={"Origin": "http://front.test", "Access-Control-Request-Method": "POST"}
    )
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "http://front.test"
    simple = client.post("/knn-service", content=json.dumps(BASE), headers={"Origin": "http://front.test"})
    assert simple.headers["access-control-allow-origin"] == "http://front.test"
    other = client.post("/knn-service", content=json.dumps(BASE), headers={"Origin": "http://evil.test"})
    assert "access-control-allow-origin" not in other.headers
    closed = create_app([index_dir], cache_dir=tmp_path, device="cpu", warm=False)
    with TestClient(closed) as c:
        resp = c.get("/indices-list", headers={"Origin": "http://front.test"})
        assert resp.status_code == 200 and "access-control-allow-origin" not in resp.headers


def test_bad_cors_origin_is_refused(index_dir: Path) -> None:
    from retrieval.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="CORS origin"):
        create_app([index_dir], cors_origins=["http://x.test/path"], warm=False)


def test_token_guards_clip_back_routes(index_dir: Path, tmp_path: Path) -> None:
    locked = create_app([index_dir], token=TOKEN, cache_dir=tmp_path, device="cpu", warm=False)
    with TestClient(locked, raise_server_exceptions=False) as c:
        _error(c.get("/indices-list"), 401)
        _error(c.post("/knn-service", content=json.dumps(BASE)), 401)
        _error(c.post("/metadata", json={"ids": [0], "indice_name": "mine.idx"}), 401)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert c.get("/indices-list", headers=auth).json() == ["mine.idx"]
        assert len(c.post("/knn-service", content=json.dumps(BASE), headers=auth).json()) == 3


class _Images(http.server.BaseHTTPRequestHandler):
    payloads: dict[str, bytes] = {}

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        data = self.payloads.get(self.path)
        if data is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def test_image_url_fetches_when_allowed(index_dir: Path, tmp_path: Path, photos: Path, client: TestClient) -> None:
    _Images.payloads = {"/q.jpg": (photos / "p05.jpg").read_bytes(), "/big.bin": b"x" * (1024 * 1024 + 1)}
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        allowed = create_app([index_dir], cache_dir=tmp_path, device="cpu", allow_image_urls=True, max_upload_mb=1, warm=False)
        with TestClient(allowed, raise_server_exceptions=False) as c:
            body = {"image_url": f"{base}/q.jpg", "indice_name": "mine.idx", "num_images": NUM}
            resp = c.post("/knn-service", json=body)
            assert resp.status_code == 200, resp.text
            buf = io.BytesIO((photos / "p05.jpg").read_bytes())
            want = client.post("/api/search", files={"image": ("q.jpg", buf, "image/jpeg")}, data={"k": str(NUM)}).json()
            _same(_pairs(resp.json()), [(r["id"], r["score"]) for r in want["results"]])
            assert "404" in _error(c.post("/knn-service", json={**body, "image_url": f"{base}/missing.jpg"}), 400)
            assert "limit" in _error(c.post("/knn-service", json={**body, "image_url": f"{base}/big.bin"}), 400)
            assert "http" in _error(c.post("/knn-service", json={**body, "image_url": "file:///etc/passwd"}), 400)
    finally:
        httpd.shutdown()
        thread.join(5)
