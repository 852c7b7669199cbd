"""The web UI (a real headless Chromium, against ``clipsearch serve`` on a SigLIP index) passes
Chinese, Cyrillic, Arabic (right to left) and emoji queries intact: the page shows the HTTP
API's ranking for the same text, keeps the text in the address and in the search box.

The browser, server and page helpers are test_browser.py's (Chromium as described there)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator

import pytest
from imagegen import make_jpegs
from test_browser import PAGE, Server, api_ids, browser, open_ui, page, search, serve, shown_ids, wait_for_url

from retrieval.tools.random_model import make_random_siglip

pytestmark = pytest.mark.slow  # a browser, and the server in a subprocess

__all__ = ["browser", "page"]  # fixtures, imported for pytest to find

QUERIES = ["一只猫在沙发上", "кошка на диване", "قطة على الأريكة", "🐱🛋️✨"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from indexer import build_index

    model = make_random_siglip(tmp_path_factory.mktemp("ui_siglip") / "siglip2", seed=2)
    photos = tmp_path_factory.mktemp("ui_siglip_photos") / "photos"
    make_jpegs(photos, 12, size=(120, 90), seed=3)
    out = tmp_path_factory.mktemp("ui_siglip_index") / "photos.idx"
    build_index(photos, out, model=str(model), device="cpu", workers=0)
    with serve([out], tmp_path_factory.mktemp("ui_siglip_cache")) as running:
        yield running


@pytest.mark.parametrize("query", QUERIES, ids=["chinese", "cyrillic", "arabic", "emoji"])
def test_ui_passes_the_query_intact(page: object, server: Server, query: str) -> None:
    open_ui(page, server)
    search(page, query)
    expected = server.get("/api/search", q=query, k=PAGE)
    assert shown_ids(page, PAGE) == api_ids(expected)
    wait_for_url(page, q=query)
    assert page.locator("input[name=q]").input_value() == query  # type: ignore[attr-defined]
    # Opened from its address (a shared link), the same text and ranking come back.
    open_ui(page, server, "q=" + urllib.parse.quote(query))
    assert page.locator("input[name=q]").input_value() == query  # type: ignore[attr-defined]
    assert shown_ids(page, PAGE) == api_ids(expected)
