"""``GET /metrics``: Prometheus' text format, parsed back with prometheus-client's own parser;
requests by route and status, latency by route and query kind, model-call time, the index
gauges, reloads of a new generation, the token, and ``metrics=False``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server extra is not installed: pip install -e '.[server]'")

from fastapi.testclient import TestClient  # noqa: E402
from imagegen import photo_like  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from clipsearch.server import create_app  # noqa: E402

TOKEN = "metrics-token"


def _photos(root: Path, first: int, count: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(first, first + count):
        photo_like(80 + 4 * i, 64, seed=500 + i).save(root / f"m{i:02d}.jpg", quality=90)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> tuple[Path, Path]:
    from indexer import build_index

    base = tmp_path_factory.mktemp("metrics")
    photos, out = base / "photos", base / "met.idx"
    _photos(photos, 0, 5)
    build_index(photos, out, model=str(tiny_model), batch_size=8, workers=0, device="cpu")
    return photos, out


@pytest.fixture(scope="module")
def client(live: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    app = create_app([live[1]], cache_dir=tmp_path_factory.mktemp("metrics_cache"), device="cpu")
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of an exposition by (name, labels)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return found.get((name, frozenset(labels.items())), 0.0)


def test_requests_latency_and_model_calls_are_counted(client: TestClient) -> None:
    before = samples(client.get("/metrics").text)
    assert client.get("/api/search", params={"q": "a tree", "k": 2}).status_code == 200
    assert client.post("/api/search", json={"vector": [1.0] * 48, "k": 2}).status_code == 200
    knn = {"text": "a tree", "indice_name": "met.idx", "num_images": 2}
    assert client.post("/knn-service", content=json.dumps(knn)).status_code == 200
    assert client.post("/knn-service", content=b"[]").status_code == 400
    assert client.get("/api/images/999").status_code == 404
    assert client.get("/no/such/path").status_code == 404
    resp = client.get("/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    after = samples(resp.text)

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    req = "clipsearch_http_requests_total"
    assert grew(req, route="/api/search", method="GET", status="200") == 1
    assert grew(req, route="/api/search", method="POST", status="200") == 1
    assert grew(req, route="/knn-service", method="POST", status="200") == 1
    assert grew(req, route="/knn-service", method="POST", status="400") == 1
    assert grew(req, route="/api/images/{image_id}", method="GET", status="404") == 1
    assert grew(req, route="unmatched", method="GET", status="404") == 1  # the path itself is never a label
    lat = "clipsearch_http_request_duration_seconds_count"
    assert grew(lat, route="/api/search", kind="text") == 1
    assert grew(lat, route="/api/search", kind="vector") == 1
    assert grew(lat, route="/knn-service", kind="text") == 1
    assert value(after, "clipsearch_http_request_duration_seconds_sum", route="/api/search", kind="text") > 0
    # Two text queries ran the text tower (the warm-up's calls are not counted); a vector query none.
    assert grew("clipsearch_query_model_seconds_count", index="met.idx", kind="text") == 2
    assert value(after, "clipsearch_query_model_seconds_count", index="met.idx", kind="image") == 0
    assert value(after, "clipsearch_index_images", index="met.idx") == 5


def test_a_new_generation_is_a_reload(client: TestClient, live: tuple[Path, Path], tiny_model: Path) -> None:
    from indexer import build_index

    photos, out = live
    first = samples(client.get("/metrics").text)
    (gen1,) = [dict(labels)["generation"] for (name, labels) in first if name == "clipsearch_index_generation"]
    reloads = value(first, "clipsearch_index_reloads_total", index="met.idx")
    _photos(photos, 5, 2)
    build_index(photos, out, model=str(tiny_model), batch_size=8, workers=0, device="cpu")
    after = samples(client.get("/metrics").text)
    (gen2,) = [dict(labels)["generation"] for (name, labels) in after if name == "clipsearch_index_generation"]
    assert gen2 != gen1
    assert value(after, "clipsearch_index_images", index="met.idx") == 7
    assert value(after, "clipsearch_index_reloads_total", index="met.idx") == reloads + 1


def test_metrics_behind_the_token_and_off_on_request(live: tuple[Path, Path], tmp_path: Path) -> None:
    locked = create_app([live[1]], token=TOKEN, cache_dir=tmp_path, device="cpu", warm=False)
    with TestClient(locked, raise_server_exceptions=False) as c:
        resp = c.get("/metrics")
        assert resp.status_code == 401 and set(resp.json()) == {"error"}
        assert c.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    off = create_app([live[1]], cache_dir=tmp_path, device="cpu", warm=False, metrics=False)
    with TestClient(off, raise_server_exceptions=False) as c:
        assert c.get("/metrics").status_code == 404


def test_two_apps_in_one_process_count_apart(live: tuple[Path, Path], tmp_path: Path) -> None:
    apps: list[Any] = [create_app([live[1]], cache_dir=tmp_path, device="cpu", warm=False) for _ in range(2)]
    with TestClient(apps[0]) as a, TestClient(apps[1]) as b:
        a.get("/api/health")
        a.get("/api/health")
        b.get("/api/health")
        name = "clipsearch_http_requests_total"
        assert value(samples(a.get("/metrics").text), name, route="/api/health", method="GET", status="200") == 2
        assert value(samples(b.get("/metrics").text), name, route="/api/health", method="GET", status="200") == 1
