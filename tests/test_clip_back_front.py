"""clip-retrieval's web front end, clip-front (its built page, shipped in clip-retrieval's package
under ``front/build``), served from another port and opened in headless Chromium with
``?back=`` pointing at ``clipsearch serve``: a typed query shows our images, in the order and
with the URLs ``/knn-service`` answers for the same request.

Chromium as in ``test_browser.py``: ``CLIPSEARCH_CHROMIUM`` (``scripts/ensure-chromium``) or
``/usr/bin/chromium``; without one this test fails unless ``CLIPSEARCH_SKIP_BROWSER=1``.
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server extra is not installed: pip install -e '.[server]'")

from fastapi.testclient import TestClient  # noqa: E402
from test_clip_back import ThreadServer, free_port, index_dir, photos  # noqa: E402, F401  # fixtures

from clipsearch.server import create_app  # noqa: E402

pytestmark = pytest.mark.slow  # a browser

# What clip-front sends for a text search (its defaults: 40 images, 3000 ids, its filters on).
FRONT_REQUEST = {
    "image": None, "image_url": None, "embedding_input": None, "modality": "image", "num_images": 40,
    "num_result_ids": 3000, "use_mclip": False, "deduplicate": True, "use_safety_model": True,
    "use_violence_detector": True, "aesthetic_score": "", "aesthetic_weight": "0.5",
}


def _chromium_path() -> str:
    if os.environ.get("CLIPSEARCH_SKIP_BROWSER") == "1":
        pytest.skip("CLIPSEARCH_SKIP_BROWSER=1: browser tests skipped on request")
    wanted = os.environ.get("CLIPSEARCH_CHROMIUM") or "/usr/bin/chromium"
    found = shutil.which(wanted)
    if found is None:
        pytest.fail(f"no Chromium at {wanted!r}: run scripts/ensure-chromium and set CLIPSEARCH_CHROMIUM", pytrace=False)
    return found


def _front_build() -> Path:
    spec = importlib.util.find_spec("clip_retrieval")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("clip-retrieval is not installed (pip install --no-deps clip-retrieval)", pytrace=False)
    build = Path(next(iter(spec.submodule_search_locations))).parent / "front" / "build"
    if not (build / "index.html").is_file():
        pytest.fail(f"clip-front's built page is not at {build}", pytrace=False)
    return build


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def front() -> Iterator[str]:
    """clip-front's build served as static files on its own port."""
    handler = functools.partial(_Quiet, directory=str(_front_build()))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    thread.join(5)


def test_clip_front_shows_our_images(front: str, index_dir: Path, tmp_path: Path) -> None:  # noqa: F811  # the fixture
    path = _chromium_path()
    from playwright.sync_api import sync_playwright

    app = create_app([index_dir], cache_dir=tmp_path, device="cpu", cors_origins=[front])
    with ThreadServer(app) as back, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.set_default_timeout(20_000)
            problems: list[str] = []
            page.on("pageerror", lambda exc: problems.append(str(exc)))
            page.goto(f"{front}/?back={back.url}")
            page.wait_for_function("() => document.querySelector('clip-front')?.indices?.length > 0")
            assert page.evaluate("() => document.querySelector('clip-front').currentIndex") == "mine.idx"
            page.locator("#searchBar").fill("a red car")
            page.locator("#searchBar").press("Enter")
            page.wait_for_function("() => document.querySelector('clip-front').shadowRoot.querySelectorAll('img.pic').length > 0")
            page.wait_for_function(
                "() => [...document.querySelector('clip-front').shadowRoot.querySelectorAll('img.pic')]"
                ".every(i => i.complete)"
            )
            shown = page.evaluate(
                "() => [...document.querySelector('clip-front').shadowRoot.querySelectorAll('img.pic')]"
                ".map(i => ({src: i.src, w: i.naturalWidth}))"
            )
        finally:
            browser.close()
    with TestClient(app) as c:
        answer = c.post("/knn-service", content=json.dumps({**FRONT_REQUEST, "text": "a red car", "indice_name": "mine.idx"})).json()
    want = [r["url"].replace("http://testserver", back.url) for r in answer]
    assert [s["src"] for s in shown] == want
    assert 1 <= len(want) < 11  # deduplicate on: at least the exact copy is dropped
    assert all(s["w"] > 0 for s in shown), shown  # every image loaded from our /api/images
    assert not problems, problems
