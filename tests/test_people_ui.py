"""People in the web UI (a real headless Chromium, against ``clipsearch serve`` on an index built
with ``--faces``): the strip of faces, a person's page (their photos newest first, as the API
lists them), renaming in place, the person filter on a text search, "nobody else", and the
address that brings a person's page back.

The index is :func:`facegen.build_two_people`'s (Alice and Bob); the browser, server and page
helpers are test_browser.py's (Chromium as described there)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from facegen import build_two_people
from test_browser import PAGE, Server, api_ids, browser, open_ui, page, search, serve, shown_ids, wait_for_url

pytestmark = pytest.mark.slow  # a browser, and the server in a subprocess
pytest.importorskip("dlib", reason="the faces extra: pip install 'clipsearch[faces]'")

__all__ = ["browser", "page"]  # fixtures, imported for pytest to find


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    return build_two_people(tmp_path_factory.mktemp("people_ui"), tiny_model)


@pytest.fixture()
def server(tmp_path: Path, family: Path) -> Iterator[Server]:
    # A copy per test: renaming writes the index's people.json.
    served = tmp_path / "family"
    shutil.copytree(family, served)
    with serve([served], tmp_path / "cache") as running:
        yield running


def _ids(server: Server) -> dict[str, int]:
    return {p["label"]: p["id"] for p in server.get("/api/people")["people"]}


def _strip(page: Any) -> list[str]:
    page.wait_for_selector("[data-testid=people-strip] [data-testid=person]")
    return [t.strip() for t in page.locator("[data-testid=person] .person-label").all_inner_texts()]


def test_the_strip_shows_everyone_and_a_click_opens_their_page(page: Any, server: Server) -> None:
    open_ui(page, server)
    assert _strip(page) == ["Alice", "Bob"]
    page.wait_for_function(
        "() => [...document.querySelectorAll('[data-testid=person] img')].every(i => i.complete && i.naturalWidth > 0)"
    )
    ids = _ids(server)
    page.locator(f"[data-testid=person][data-person='{ids['Alice']}']").click()
    expected = server.get("/api/search", person=ids["Alice"], k=PAGE)
    assert shown_ids(page, len(expected["results"])) == api_ids(expected)
    wait_for_url(page, person=str(ids["Alice"]))
    assert page.locator("[data-testid=person-page]").is_visible()
    assert page.locator("[data-testid=person-title]").inner_text() == "Alice"
    assert "3 photos" in page.locator("[data-testid=person-count]").inner_text()
    # Newest first, under day headings; each photo says who is in it.
    assert [r["path"] for r in expected["results"]] == ["pair.jpg", "a1.jpg", "a0.jpg"]
    first = page.locator("[data-testid=results] [data-result-id]").first
    assert first.locator("[data-testid=hit-people]").inner_text() == "Alice, Bob"
    assert page.locator("[data-testid=day]").count() == 3
    # The address brings the page back.
    open_ui(page, server, f"person={ids['Alice']}")
    assert shown_ids(page, 3) == api_ids(expected)
    page.locator("[data-testid=person-title]").wait_for(state="visible")


def test_a_person_is_renamed_in_place(page: Any, server: Server) -> None:
    ids = _ids(server)
    open_ui(page, server, f"person={ids['Bob']}")
    page.locator("[data-testid=person-title]").wait_for(state="visible")
    box = page.locator("[data-testid=person-name]")
    assert box.input_value() == "Bob"
    box.fill("Robert")
    box.press("Enter")
    page.wait_for_function("() => document.querySelector('[data-testid=person-title]').textContent === 'Robert'")
    assert _ids(server)["Robert"] == ids["Bob"]  # saved in the index
    assert "Robert" in _strip(page)
    assert "Robert" in page.locator("[data-testid=results] [data-result-id]").first.inner_text()
    # A name already taken is refused, and said so; nothing changes.
    box.fill("alice")
    box.press("Enter")
    page.locator("[data-testid=error]").wait_for(state="visible")
    assert "already called" in page.locator("[data-testid=error]").inner_text()
    assert set(_ids(server)) == {"Alice", "Robert"}


def test_the_person_filter_on_a_text_search(page: Any, server: Server) -> None:
    ids = _ids(server)
    open_ui(page, server)
    _strip(page)
    search(page, "a photo")
    everything = server.get("/api/search", q="a photo", k=PAGE)
    assert shown_ids(page, len(everything["results"])) == api_ids(everything)
    page.locator(f"[data-testid=person][data-person='{ids['Bob']}']").click()
    bobs = server.get("/api/search", q="a photo", person=ids["Bob"], k=PAGE)
    assert shown_ids(page, 3) == api_ids(bobs)
    wait_for_url(page, q="a photo", person=str(ids["Bob"]))
    assert page.locator("[data-testid=chosen-person]").all_inner_texts() == ["Bob ×"]
    assert page.locator("[data-testid=person-page]").is_hidden()  # a query: the results, not the page
    page.locator("[data-testid=only-people]").check()
    alone = server.get("/api/search", q="a photo", person=ids["Bob"], only_people="true", k=PAGE)
    assert sorted(shown_ids(page, 2)) == sorted(api_ids(alone))
    wait_for_url(page, q="a photo", person=str(ids["Bob"]), only_people="true")
    # Removing the chip searches everyone again.
    page.locator("[data-testid=chosen-person]").click()
    assert shown_ids(page, len(everything["results"])) == api_ids(everything)
    assert page.locator("[data-testid=chosen-people]").is_hidden()
