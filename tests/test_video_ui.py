"""Videos in the web UI (a real headless Chromium, against ``clipsearch serve``): a video's result
shows its best moment; opening it plays the file from that second (the server answering the
browser's Range requests); a codec the browser cannot play (HEVC) shows the moment's frame and
says to download it.

The index is :func:`tests.videoindex.car_index`'s with one more video, an HEVC ``phone.mp4``
whose 2-3 s match the query less well than ``trip.mp4``'s 3-6 s; the browser, server and page
helpers are test_browser.py's (Chromium as described there)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import pytest
from test_browser import PAGE, Server, api_ids, browser, open_ui, page, serve, shown_ids, wait_for_url

pytest.importorskip("av")

from tests.videoindex import VideoRows, car_index, query_vector, unit  # noqa: E402

pytestmark = pytest.mark.slow  # a browser, and the server in a subprocess

__all__ = ["browser", "page"]  # fixtures, imported for pytest to find

QUERY = "a red car on a bridge"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[Server]:
    q = query_vector(tiny_model, QUERY)
    rng = np.random.default_rng(3)
    phone = np.stack([unit(q + 0.6 * unit(rng.standard_normal(len(q)))) if t in (2, 3) else unit(rng.standard_normal(len(q)))
                      for t in range(6)])
    extra = [VideoRows("phone.mp4", "libx265", list(range(6)), phone, 6.0)]
    index = car_index(tmp_path_factory.mktemp("video_ui") / "clips.idx", tiny_model, QUERY, extra)
    with serve([index], tmp_path_factory.mktemp("video_ui_cache")) as running:
        yield running


def _video_state(page: Any) -> dict[str, Any]:
    return page.evaluate(
        "() => { const v = document.querySelector('[data-testid=viewer-video]');"
        " return v ? {time: v.currentTime, ready: v.readyState, src: v.currentSrc, error: v.error && v.error.code} : null; }"
    )


def test_a_video_plays_from_its_moment_and_hevc_falls_back_to_its_frame(page: Any, server: Server) -> None:
    expected = server.get("/api/search", q=QUERY, mode="vector", k=PAGE)
    paths = [r["path"] for r in expected["results"]]
    assert paths[0] == "trip.mp4" and "phone.mp4" in paths
    open_ui(page, server, f"q={quote(QUERY)}&mode=vector")
    assert shown_ids(page, len(paths)) == api_ids(expected)
    first = page.locator("[data-testid=results] [data-result-id]").first
    assert first.locator("[data-testid=moment]").inner_text() == "▶ 00:03–00:06 +1"
    assert page.locator("[data-testid=results] [data-testid=moment]").count() == 3  # the three videos, not the images
    # Opened: the <video> starts at the moment's first second, the frames there decoded.
    first.click()
    page.wait_for_function(
        "() => { const v = document.querySelector('[data-testid=viewer-video]'); return v && v.readyState >= 2 && v.currentTime >= 3; }",
        timeout=15_000,
    )
    state = _video_state(page)
    assert state["src"].endswith("#t=3,6") and state["error"] is None and 3 <= state["time"] < 6.5
    page.keyboard.press("Escape")
    # HEVC: this Chromium cannot play it; the moment's frame is shown with a note instead.
    phone = page.locator("[data-testid=results] [data-result-id]").nth(paths.index("phone.mp4"))
    assert phone.locator("[data-testid=moment]").inner_text() == "▶ 00:02–00:04"
    phone.click()
    page.locator("[data-testid=video-note]").wait_for(state="visible", timeout=15_000)
    assert "download" in page.locator("[data-testid=video-note]").inner_text()
    page.wait_for_function(
        "() => { const i = document.querySelector('[data-testid=viewer-image]'); return !i.hidden && i.complete && i.naturalWidth > 0; }"
    )
    assert page.locator("[data-testid=viewer-video]").count() == 0


def test_the_media_control_shows_only_videos_and_stays_in_the_address(page: Any, server: Server) -> None:
    everything = server.get("/api/search", q=QUERY, mode="vector", k=PAGE)
    videos = server.get("/api/search", q=QUERY, mode="vector", k=PAGE, media="video")
    assert any(r["media"] is None for r in everything["results"]) and any(r["media"] == "video" for r in everything["results"])
    assert videos["results"] and all(r["media"] == "video" for r in videos["results"])
    open_ui(page, server, f"q={quote(QUERY)}&mode=vector")
    assert shown_ids(page, len(everything["results"])) == api_ids(everything)
    if page.locator("[data-testid=filters]").is_hidden():  # opened already where a filter (mode) is set
        page.locator("[data-testid=filters-toggle]").click()
    page.locator("[data-testid=media]").select_option("video")
    wait_for_url(page, q=QUERY, mode="vector", media="video")
    # Only the video hits, each with its moment.
    assert shown_ids(page, len(videos["results"])) == api_ids(videos)
    assert page.locator("[data-testid=results] [data-testid=moment]").count() == len(videos["results"])
    # Kept in the address: a reload (or a shared link) shows the same choice and results.
    page.reload()
    page.wait_for_selector("body[data-ready='true']", state="attached")
    assert shown_ids(page, len(videos["results"])) == api_ids(videos)
    assert page.locator("[data-testid=media]").input_value() == "video"
    # Back to everything: photos again.
    page.locator("[data-testid=media]").select_option("")
    wait_for_url(page, q=QUERY, mode="vector")
    assert shown_ids(page, len(everything["results"])) == api_ids(everything)
    # An address with a media the API does not take says so beside the control and shows both.
    open_ui(page, server, f"q={quote(QUERY)}&mode=vector&media=audio")
    assert shown_ids(page, len(everything["results"])) == api_ids(everything)
    assert "audio" in page.locator("[data-testid=media-error]").inner_text()
