"""The web UI (a real headless Chromium, against ``clipsearch serve``) on an NLLB-CLIP index:
the language control appears because the model needs one, its codes are offered, a query
without one shows the server's reason, and one with it shows the HTTP API's ranking and keeps
the language in the address.

The browser, server and page helpers are test_browser.py's (Chromium as described there)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from imagegen import make_jpegs
from test_browser import PAGE, Server, api_ids, browser, open_ui, page, search, serve, shown_ids, wait_for_url

from retrieval.tools.random_model.multilingual import make_random_multilingual

pytestmark = pytest.mark.slow  # a browser, and the server in a subprocess

__all__ = ["browser", "page"]  # fixtures, imported for pytest to find


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from indexer import build_index

    model = make_random_multilingual(tmp_path_factory.mktemp("ui_nllb") / "nllb", "nllb-clip-tiny", seed=4)
    photos = tmp_path_factory.mktemp("ui_nllb_photos") / "photos"
    make_jpegs(photos, 10, size=(96, 72), seed=5)
    out = tmp_path_factory.mktemp("ui_nllb_index") / "photos.idx"
    build_index(photos, out, model=f"open_clip:local-dir:{model}", device="cpu", workers=0)
    with serve([out], tmp_path_factory.mktemp("ui_nllb_cache")) as running:
        yield running


def test_ui_asks_for_and_sends_the_query_language(page: object, server: Server) -> None:
    open_ui(page, server)
    control = page.locator("input[name=query_lang]")  # type: ignore[attr-defined]
    assert control.is_visible()
    offered = page.eval_on_selector_all("#query-langs option", "options => options.map(o => o.value)")  # type: ignore[attr-defined]
    assert {"eng_Latn", "zho_Hans", "arb_Arab"} <= set(offered)
    # Without a language the server's one-line reason is shown.
    search(page, "一只猫")
    error = page.locator("[data-testid=error]")  # type: ignore[attr-defined]
    error.wait_for(state="visible")
    assert "query_lang" in error.inner_text()
    for language, text in (("zho_Hans", "一只猫"), ("arb_Arab", "قطة على الأريكة")):
        control.fill(language)
        search(page, text)
        expected = server.get("/api/search", q=text, k=PAGE, query_lang=language)
        assert shown_ids(page, PAGE) == api_ids(expected)
        wait_for_url(page, q=text, query_lang=language)
    page.reload()  # type: ignore[attr-defined]
    page.wait_for_selector("body[data-ready='true']", state="attached")  # type: ignore[attr-defined]
    assert control.input_value() == "arb_Arab"
