"""``clipsearch serve``: the HTTP API over the tiny random model (FastAPI's TestClient), and
one run of the real command on a free port.

Module-scoped apps: creating one opens the indexes and loads the query models, so the tests
share two (one open, one with a token) and a small writable index for the live update.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("fastapi", reason="the server extra is not installed: pip install -e '.[server]'")

from fastapi.testclient import TestClient  # noqa: E402

from clipsearch.server import create_app  # noqa: E402
from conftest import clipsearch_exe  # noqa: E402
from imagegen import Collection, photo_like  # noqa: E402

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
    assert set(first) == {"name", "count", "model", "dim", "index_type", "generation"}
    assert (first["count"], first["dim"], first["generation"]) == (info["count"], info["dim"], info["generation"])


def test_search_get_smoke(client: TestClient) -> None:
    resp = client.get("/api/search", params={"q": "a dog", "k": 3})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert set(body) == {"results", "offset", "k", "took_ms"}
    assert len(body["results"]) == 3
    print(body)
