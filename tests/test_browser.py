"""The web UI driven by a real headless Chromium (Playwright's sync API), against the real server.

One ``clipsearch serve`` subprocess per module serves a small index built with the tiny random
model; every check compares what the page shows with what the HTTP API answers for the same
query, so the UI is tested for showing the API's ranking, not for a ranking of its own.

Chromium comes from ``CLIPSEARCH_CHROMIUM`` (``make test`` sets it from ``scripts/ensure-chromium``,
which installs one when none is found) or Debian's ``/usr/bin/chromium``. Without one these tests
FAIL (a browser test that skips silently proves nothing) unless ``CLIPSEARCH_SKIP_BROWSER=1``
is set, which skips them and says why. ``scripts/screenshots.py`` writes the README's pictures of
the UI (``docs/ui.png``, ``docs/ui-phone.png``); the screenshot test here checks the same view.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from conftest import clipsearch_exe
from imagegen import make_jpegs

pytestmark = pytest.mark.slow  # a browser, and the server in a subprocess

REPO = Path(__file__).resolve().parent.parent
DEMO_PHOTOS = REPO / "data" / "demo"
DEMO_MODEL = REPO / "data" / "models" / "demo-clip"
PAGE = 8  # results per page in these tests (the UI takes k from the URL)
SERVE_LINE = re.compile(r"clipsearch: serving (http://\S+?)/?\s*$")
START_TIMEOUT_S = 90.0
WAIT_MS = 15_000


def _chromium_path() -> str:
    """The Chromium executable, or fail (skip only when CLIPSEARCH_SKIP_BROWSER=1 says so)."""
    if os.environ.get("CLIPSEARCH_SKIP_BROWSER") == "1":
        pytest.skip("CLIPSEARCH_SKIP_BROWSER=1: browser tests skipped on request")
    wanted = os.environ.get("CLIPSEARCH_CHROMIUM") or "/usr/bin/chromium"
    found = shutil.which(wanted)
    if found is None:
        pytest.fail(
            f"no Chromium at {wanted!r}: run the suite with `make test` (scripts/ensure-chromium gets one), "
            "install Debian's chromium (apt-get install -y chromium), "
            "point CLIPSEARCH_CHROMIUM at a Chromium executable, or set CLIPSEARCH_SKIP_BROWSER=1 to skip",
            pytrace=False,
        )
    return found


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    path = _chromium_path()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:  # the [test] extra installs it
        pytest.fail(f"playwright is not installed ({exc}); pip install -e '.[test]'", pytrace=False)
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=path, args=["--no-sandbox"])
        yield chromium
        chromium.close()


class Server:
    """A running ``clipsearch serve``: its base URL and a small JSON client for the API."""

    def __init__(self, url: str, token: str | None) -> None:
        self.url = url
        self.token = token

    def _call(self, path: str, data: bytes | None = None, content_type: str | None = None) -> dict[str, Any]:
        request = urllib.request.Request(self.url + path, data=data)
        if content_type:
            request.add_header("Content-Type", content_type)
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(request, timeout=60) as resp:
            return json.loads(resp.read())

    def get(self, path: str, **params: Any) -> dict[str, Any]:
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        return self._call(f"{path}?{query}" if query else path)

    def post_json(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("/api/search", json.dumps(body).encode(), "application/json")

    def post_image(self, image: Path, **fields: Any) -> dict[str, Any]:
        boundary = uuid.uuid4().hex
        parts = [
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
            for name, value in fields.items()
        ]
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="{image.name}"\r\n'
            "Content-Type: image/jpeg\r\n\r\n".encode() + image.read_bytes() + b"\r\n"
        )
        body = b"".join(parts) + f"--{boundary}--\r\n".encode()
        return self._call("/api/search", body, f"multipart/form-data; boundary={boundary}")


@contextmanager
def serve(index_dirs: Sequence[Path], cache_dir: Path, token: str | None = None) -> Iterator[Server]:
    """Run ``clipsearch serve INDEX_DIR... --port 0`` until the block ends; yield once it is listening.

    Thumbnails are cached in ``cache_dir`` (a temporary directory), not the user's cache.
    """
    cmd = [clipsearch_exe(), "serve", *map(os.fspath, index_dirs), "--port", "0", "--cache-dir", os.fspath(cache_dir)]
    if token:
        cmd += ["--token", token]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    ready = threading.Event()
    found: list[str] = []

    def drain() -> None:  # keep reading stderr so the server never blocks on a full pipe
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            match = SERVE_LINE.search(line)
            if match and not found:
                found.append(match.group(1))
                ready.set()
        ready.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        ready.wait(START_TIMEOUT_S)
        if not found:
            raise AssertionError(f"clipsearch serve did not start (exit {proc.poll()}):\n{''.join(lines)[-3000:]}")
        yield Server(found[0], token)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(timeout=5)


@pytest.fixture(scope="module", autouse=True)
def demo_build(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path]]:
    """``clipsearch index data/demo`` with the demo model (what ``make demo`` runs), started in the
    background as the module begins, so that its CPU time overlaps the browser tests' waiting;
    the screenshot test (the last) waits for it."""
    _chromium_path()  # no browser: fail (or skip) before spending CPU on an index
    out = tmp_path_factory.mktemp("demo") / "demo.idx"
    log = out.with_name("index.log")
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [clipsearch_exe(), "index", DEMO_PHOTOS, out, "--model", DEMO_MODEL, "--device", "cpu"],
            stdout=sink, stderr=subprocess.STDOUT,
        )
    yield proc, out, log
    if proc.poll() is None:  # only part of the module ran: the index is not needed
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """20 pictures under cars/ and 10 under boats/: enough for three pages and a path filter."""
    root = tmp_path_factory.mktemp("ui_photos") / "photos"
    make_jpegs(root / "cars", 20, size=(160, 120), seed=0)
    make_jpegs(root / "boats", 10, size=(120, 160), seed=100)
    return root


@pytest.fixture(scope="module")
def ui_index(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, photos: Path) -> Path:
    from indexer import build_index

    out = tmp_path_factory.mktemp("ui_index") / "photos.idx"
    build_index(photos, out, model=str(tiny_model), device="cpu")
    return out


@pytest.fixture(scope="module")
def boats_index(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, photos: Path) -> Path:
    """A second index (the boats alone), so the page shows its index picker."""
    from indexer import build_index

    out = tmp_path_factory.mktemp("ui_index") / "boats.idx"
    build_index(photos / "boats", out, model=str(tiny_model), device="cpu")
    return out


@pytest.fixture(scope="module")
def dated_index(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    """Four photos with EXIF dates around Christmas 2023 (one with a camera and GPS) and one
    undated: for the inclusive end date, the day headings and the viewer's facts."""
    from imagegen import photo_like
    from photos import exif_bytes

    from indexer import build_index

    root = tmp_path_factory.mktemp("dated") / "photos"
    root.mkdir()
    taken = {
        "eve.jpg": exif_bytes("2023:12:24 18:30:00", "+01:00", "Apple", "iPhone 13", ((48, 51, 29.0), "N", (2, 17, 40.0), "E")),
        "christmas.jpg": exif_bytes("2023:12:25 09:00:00", "+01:00"),
        "before.jpg": exif_bytes("2023:12:23 12:00:00"),
        "old.jpg": exif_bytes("2019:03:02 10:00:00", make="NIKON", model="D750"),
        "undated.jpg": None,
    }
    for i, (name, exif) in enumerate(taken.items()):
        photo_like(160, 120, 300 + i).save(root / name, "JPEG", **({"exif": exif} if exif else {}))
    out = tmp_path_factory.mktemp("ui_index") / "dated.idx"
    build_index(root, out, model=str(tiny_model), device="cpu")
    return out


@pytest.fixture(scope="module")
def server(
    ui_index: Path, boats_index: Path, dated_index: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    with serve([ui_index, boats_index, dated_index], tmp_path_factory.mktemp("ui_cache")) as running:
        yield running


@pytest.fixture(scope="module")
def query_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_jpegs(tmp_path_factory.mktemp("ui_query"), 1, size=(100, 80), seed=7)[0]


@pytest.fixture()
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser context per test (own history, sessionStorage and cache); fails the test on
    any script error or console error (a CSP violation is one)."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    tab = context.new_page()
    tab.set_default_timeout(WAIT_MS)
    problems: list[str] = []
    tab.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    # Chromium logs every 4xx answer as "Failed to load resource"; the tests expect some of those.
    tab.on("console", lambda msg: problems.append(f"console: {msg.text}")
           if msg.type == "error" and not msg.text.startswith("Failed to load resource") else None)
    yield tab
    context.close()
    assert not problems, problems


# ---- helpers -----------------------------------------------------------------------------


def open_filters(page: Any) -> None:
    """Open the filter panel (closed by default while no filter is set)."""
    toggle = page.locator("[data-testid=filters-toggle]")
    if toggle.get_attribute("aria-expanded") != "true":
        toggle.click()
    page.locator("[data-testid=filters]").wait_for(state="visible")


def open_ui(page: Any, server: Server, query: str = "") -> None:
    page.goto(f"{server.url}/?k={PAGE}{'&' + query if query else ''}")
    page.wait_for_selector("body[data-ready='true']", state="attached")


def shown_ids(page: Any, count: int | None = None) -> list[int]:
    """The result ids in the grid, in order, once the page has settled (and shows ``count``)."""
    page.wait_for_selector("[data-testid=results]:not([aria-busy])", state="attached")
    if count is not None:
        page.wait_for_function(
            "n => document.querySelectorAll('[data-testid=results] [data-result-id]').length === n", arg=count
        )
    return [int(x) for x in page.locator("[data-testid=results] [data-result-id]").evaluate_all(
        "els => els.map(e => e.dataset.resultId)"
    )]


def api_ids(answer: dict[str, Any]) -> list[int]:
    return [r["id"] for r in answer["results"]]


def search(page: Any, text: str) -> None:
    box = page.locator("input[name=q]")
    box.fill(text)
    box.press("Enter")


def wait_for_url(page: Any, **params: str) -> None:
    """Wait until the address holds exactly these search parameters (besides k, and index unless given)."""
    def matches(url: str) -> bool:
        got = {k: v[0] for k, v in urllib.parse.parse_qs(urllib.parse.urlsplit(url).query).items() if k != "k"}
        if "index" not in params:
            got.pop("index", None)
        return got == params
    page.wait_for_url(matches)


def thumbnails_loaded(page: Any) -> int:
    """How many grid thumbnails have decoded pixels (after waiting for the first few)."""
    page.wait_for_function(
        "() => [...document.querySelectorAll('[data-testid=results] img')].slice(0, 4)"
        ".every(i => i.complete && i.naturalWidth > 0)"
    )
    return page.locator("[data-testid=results] img").evaluate_all(
        "imgs => imgs.filter(i => i.complete && i.naturalWidth > 0).length"
    )


# ---- the tests ---------------------------------------------------------------------------


def test_text_search_shows_the_api_ranking(page: Any, server: Server) -> None:
    open_ui(page, server)
    search(page, "a red car")
    expected = server.get("/api/search", q="a red car", k=PAGE)
    assert shown_ids(page, PAGE) == api_ids(expected)
    wait_for_url(page, q="a red car")
    first = page.locator("[data-testid=results] [data-result-id]").first
    assert expected["results"][0]["path"] in first.inner_text()
    assert f"{expected['results'][0]['score']:.3f}" in first.inner_text()
    assert page.locator("[data-testid=results] img").first.get_attribute("loading") == "lazy"
    assert thumbnails_loaded(page) >= 4
    assert page.locator("[data-testid=error]").is_hidden()


def test_query_arithmetic_terms_are_searched_and_kept_in_the_url(page: Any, server: Server) -> None:
    open_ui(page, server)
    open_filters(page)
    page.fill("input[name=add]", "0.5:at night")
    page.fill("input[name=subtract]", "grass")
    search(page, "a red car")
    expected = server.get("/api/search", q="a red car", add="0.5:at night", subtract="grass", k=PAGE)
    assert shown_ids(page, PAGE) == api_ids(expected)
    assert api_ids(expected) != api_ids(server.get("/api/search", q="a red car", k=PAGE))
    wait_for_url(page, q="a red car", add="0.5:at night", subtract="grass")
    page.reload()
    page.wait_for_selector("body[data-ready='true']", state="attached")
    assert shown_ids(page, PAGE) == api_ids(expected)
    assert page.input_value("input[name=add]") == "0.5:at night" and page.input_value("input[name=subtract]") == "grass"
    # Terms that cancel out are the server's 400, shown on the page.
    page.fill("input[name=add]", "")
    page.fill("input[name=subtract]", "a red car")
    search(page, "a red car")
    page.wait_for_selector("[data-testid=error]:not([hidden])")
    assert "cancel out" in page.inner_text("[data-testid=error]")


def test_more_like_this_shows_the_image_id_search(page: Any, server: Server) -> None:
    open_ui(page, server)
    search(page, "a boat")
    shown = shown_ids(page, PAGE)
    page.locator(f"[data-result-id='{shown[2]}']").click()
    viewer = page.locator("[data-testid=viewer]")
    viewer.wait_for(state="visible")
    page.wait_for_function("() => { const i = document.querySelector('[data-testid=viewer-image]'); "
                           "return i.complete && i.naturalWidth > 0; }")
    viewer.get_by_role("button", name="More like this").click()
    expected = server.post_json({"image_id": shown[2], "k": PAGE})
    wait_for_url(page, image_id=str(shown[2]))
    assert shown_ids(page, PAGE) == api_ids(expected)
    assert api_ids(expected)[0] == shown[2]  # the image itself comes first
    assert viewer.is_hidden()


def test_query_image_upload_shows_the_multipart_search(page: Any, server: Server, query_image: Path) -> None:
    open_ui(page, server)
    page.locator("input[name=image]").set_input_files(query_image)
    expected = server.post_image(query_image, k=PAGE)
    assert shown_ids(page, PAGE) == api_ids(expected)
    note = page.locator("[data-testid=query-image]")
    assert note.is_visible() and "cannot be put in the address" in note.inner_text()


def test_query_image_dropped_on_the_page(page: Any, server: Server, query_image: Path) -> None:
    open_ui(page, server)
    data = list(query_image.read_bytes())
    transfer = page.evaluate_handle(
        """bytes => { const t = new DataTransfer();
                     t.items.add(new File([new Uint8Array(bytes)], 'query.jpg', {type: 'image/jpeg'}));
                     return t; }""",
        data,
    )
    page.dispatch_event("main", "dragenter", {"dataTransfer": transfer})
    page.locator("[data-testid=drop-overlay]").wait_for(state="visible")
    page.dispatch_event("main", "drop", {"dataTransfer": transfer})
    expected = server.post_image(query_image, k=PAGE)
    assert shown_ids(page, PAGE) == api_ids(expected)
    assert page.locator("[data-testid=drop-overlay]").is_hidden()


def test_back_and_forward_restore_earlier_searches(page: Any, server: Server) -> None:
    open_ui(page, server)
    first = api_ids(server.get("/api/search", q="a red car", k=PAGE))
    second = api_ids(server.get("/api/search", q="a blue boat", k=PAGE, path_prefix="boats/"))
    search(page, "a red car")
    assert shown_ids(page, PAGE) == first
    open_filters(page)
    page.locator("input[name=path_prefix]").fill("boats/")
    # A filter applies at once (after a typing pause): a search of its own, in the history.
    wait_for_url(page, q="a red car", path_prefix="boats/")
    assert shown_ids(page, PAGE) == api_ids(server.get("/api/search", q="a red car", k=PAGE, path_prefix="boats/"))
    search(page, "a blue boat")
    wait_for_url(page, q="a blue boat", path_prefix="boats/")
    assert shown_ids(page, PAGE) == second
    page.go_back()
    wait_for_url(page, q="a red car", path_prefix="boats/")
    page.go_back()
    wait_for_url(page, q="a red car")
    assert shown_ids(page, PAGE) == first
    assert page.locator("input[name=q]").input_value() == "a red car"
    assert page.locator("input[name=path_prefix]").input_value() == ""
    page.go_forward()
    page.go_forward()
    wait_for_url(page, q="a blue boat", path_prefix="boats/")
    assert shown_ids(page, PAGE) == second
    assert page.locator("input[name=path_prefix]").input_value() == "boats/"


def test_reload_and_a_shared_link_restore_the_search(page: Any, server: Server) -> None:
    expected = api_ids(server.get("/api/search", q="a green field", k=PAGE, path_prefix="cars/"))
    open_ui(page, server)
    open_filters(page)
    page.locator("input[name=path_prefix]").fill("cars/")
    search(page, "a green field")
    assert shown_ids(page, PAGE) == expected
    page.reload()
    page.wait_for_selector("body[data-ready='true']", state="attached")
    assert shown_ids(page, PAGE) == expected
    assert page.locator("input[name=q]").input_value() == "a green field"
    # The same address opened in a new tab (a shared link) shows the same search.
    other = page.context.new_page()
    other.goto(page.url)
    assert shown_ids(other, PAGE) == expected
    other.close()


def test_load_more_appends_the_next_page(page: Any, server: Server) -> None:
    open_ui(page, server)
    search(page, "a photo")
    pages = [api_ids(server.get("/api/search", q="a photo", k=PAGE, offset=o)) for o in (0, PAGE, 2 * PAGE, 3 * PAGE)]
    assert [len(p) for p in pages] == [8, 8, 8, 6]
    assert shown_ids(page, PAGE) == pages[0]
    more = page.locator("[data-testid=load-more]")
    more.click()
    assert shown_ids(page, 2 * PAGE) == pages[0] + pages[1]
    more.click()
    more.click()  # the button waits for the previous page (it is disabled while loading)
    assert shown_ids(page, 30) == pages[0] + pages[1] + pages[2] + pages[3]
    more.wait_for(state="hidden")  # fewer than k came back: the end


def test_cut_off_sort_and_dates_are_sent_and_kept(page: Any, server: Server) -> None:
    open_ui(page, server)
    ranked = server.get("/api/search", q="a photo", k=PAGE)["results"]
    cut = f"{(ranked[2]['score'] + ranked[3]['score']) / 2:.6f}"
    open_filters(page)
    page.fill("input[name=min_score]", cut)
    page.select_option("select[name=sort]", "taken")
    search(page, "a photo")
    expected = server.get("/api/search", q="a photo", k=PAGE, min_score=cut, sort="taken")
    assert len(expected["results"]) == 3 and shown_ids(page, 3) == api_ids(expected)
    wait_for_url(page, q="a photo", min_score=cut, sort="taken")
    # The generated photos carry no date: a date filter leaves none, and says so.
    page.fill("input[name=taken_after]", "2020-01-01")
    search(page, "a photo")
    wait_for_url(page, q="a photo", min_score=cut, sort="taken", taken_after="2020-01-01")
    assert shown_ids(page) == []
    # ...and says why: the same search without the date finds photos, none of them dated.
    page.locator("[data-testid=status]").filter(has_text="none of the images this search finds has a date taken").wait_for()
    # A reload brings the controls back from the address.
    page.reload()
    page.wait_for_selector("body[data-ready='true']", state="attached")
    assert page.input_value("input[name=taken_after]") == "2020-01-01" and page.input_value("select[name=sort]") == "taken"
    assert page.input_value("input[name=min_score]") == cut
    # A cut-off outside [-1, 1]: said beside the box, in words.
    page.fill("input[name=taken_after]", "")
    page.fill("input[name=min_score]", "3")
    error = page.locator("[data-testid=min_score-error]")
    error.wait_for(state="visible")
    assert "Min score must be a number from -1 to 1" in error.inner_text()


def test_mode_switch_is_sent_and_kept_and_matched_words_are_shown(page: Any, server: Server) -> None:
    open_ui(page, server)
    open_filters(page)
    page.select_option("select[name=mode]", "keyword")
    search(page, "Boats")
    expected = server.get("/api/search", q="Boats", k=PAGE, mode="keyword")
    assert expected["results"] and all(r["path"].startswith("boats/") for r in expected["results"])
    assert shown_ids(page, len(expected["results"])) == api_ids(expected)
    wait_for_url(page, q="Boats", mode="keyword")
    # Under each thumbnail: the query's words found in its text (here its folder's name).
    matched = page.locator("[data-testid=results] [data-testid=matched]").first
    assert matched.inner_text() == "boats" and "file name: boats" in (matched.get_attribute("title") or "")
    page.reload()
    page.wait_for_selector("body[data-ready='true']", state="attached")
    assert page.input_value("select[name=mode]") == "keyword"
    # The default ("pictures and words") sends no mode: the server's hybrid ranking.
    page.select_option("select[name=mode]", "")
    search(page, "Boats")
    wait_for_url(page, q="Boats")
    assert shown_ids(page, PAGE) == api_ids(server.get("/api/search", q="Boats", k=PAGE))


def test_errors_are_shown_not_a_blank_page(page: Any, server: Server) -> None:
    open_ui(page, server)
    search(page, "   ")
    error = page.locator("[data-testid=error]")
    error.wait_for(state="visible")
    assert "Type something" in error.inner_text()
    assert error.get_attribute("role") == "alert"
    # A server error: its one-line {"error"} text is shown (an index that is not served: 404).
    open_ui(page, server, "q=a+dog&index=no-such-index")
    error.wait_for(state="visible")
    assert "no-such-index" in error.inner_text()
    assert page.locator("input[name=q]").is_visible()
    # An upload the server cannot decode: its 400 reason is shown.
    open_ui(page, server)
    page.locator("input[name=image]").set_input_files(
        {"name": "broken.jpg", "mimeType": "image/jpeg", "buffer": b"this is not a JPEG"}
    )
    error.wait_for(state="visible")
    assert "decode" in error.inner_text()
    # The error names the user's file, and the "searching by" note and its preview are gone.
    assert "broken.jpg" in error.inner_text() and "'upload'" not in error.inner_text()
    assert page.locator("[data-testid=query-image]").is_hidden()
    assert page.locator("[data-testid=query-image-preview]").get_attribute("src") is None
    assert shown_ids(page) == []


def test_keyboard_only_open_and_close(page: Any, server: Server) -> None:
    open_ui(page, server)
    search(page, "a red car")
    ids = shown_ids(page, PAGE)
    # From the search box, Tab reaches the first result after the form's controls (a date input
    # is three stops in Chromium: month, day, year).
    page.keyboard.press("Tab")
    for _ in range(30):
        if page.evaluate("() => document.activeElement.dataset.resultId") is not None:
            break
        page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.dataset.resultId") == str(ids[0])
    page.keyboard.press("Enter")
    viewer = page.locator("[data-testid=viewer]")
    viewer.wait_for(state="visible")
    assert page.evaluate("() => document.activeElement.textContent") == "More like this"
    page.keyboard.press("Escape")
    viewer.wait_for(state="hidden")
    page.wait_for_function("id => document.activeElement && document.activeElement.dataset.resultId === id", arg=str(ids[0]))


def test_index_picker_searches_the_chosen_index(page: Any, server: Server, boats_index: Path) -> None:
    names = [info["name"] for info in server.get("/api/indexes")]
    assert names == ["photos.idx", "boats.idx", "dated.idx"]
    open_ui(page, server)
    picker = page.locator("select[name=index]")
    assert picker.is_visible()
    search(page, "a red car")
    assert shown_ids(page, PAGE) == api_ids(server.get("/api/search", q="a red car", k=PAGE))
    picker.select_option("boats.idx")  # the search on screen is run again on the chosen index
    wait_for_url(page, q="a red car", index="boats.idx")
    expected = server.get("/api/search", q="a red car", k=PAGE, index="boats.idx")
    assert shown_ids(page, PAGE) == api_ids(expected)
    assert all("boats.idx" in r["thumbnail_url"] for r in expected["results"])
    page.reload()
    page.wait_for_selector("body[data-ready='true']", state="attached")
    assert picker.input_value() == "boats.idx"
    assert shown_ids(page, PAGE) == api_ids(expected)


def test_token_is_asked_once_then_sent(browser: Any, ui_index: Path, tmp_path: Path) -> None:
    with serve([ui_index], tmp_path / "cache", token="s3cret-token") as server:
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        page.goto(f"{server.url}/?k={PAGE}&q=a+red+car")  # not ready until it has the token
        dialog = page.locator("[data-testid=token-dialog]")
        dialog.wait_for(state="visible")
        page.locator("[data-testid=token-input]").fill("wrong")
        page.locator("[data-testid=token-input]").press("Enter")
        page.locator("[data-testid=token-error]").wait_for(state="visible")  # refused: asked again
        page.locator("[data-testid=token-input]").fill("s3cret-token")
        page.locator("[data-testid=token-submit]").click()
        dialog.wait_for(state="hidden")
        expected = api_ids(server.get("/api/search", q="a red car", k=PAGE))
        assert shown_ids(page, PAGE) == expected
        # Thumbnails cannot send the header from <img src>: they come through blob: URLs.
        assert thumbnails_loaded(page) >= 4
        old_blob = page.locator("[data-testid=results] img").first.get_attribute("src")
        assert old_blob.startswith("blob:")
        # The token is kept for the tab: a new search does not ask again.
        search(page, "a boat")
        wait_for_url(page, q="a boat")
        assert shown_ids(page, PAGE) == api_ids(server.get("/api/search", q="a boat", k=PAGE))
        assert dialog.is_hidden()
        thumbnails_loaded(page)
        # The replaced grid's blob: URLs were revoked (fetching one fails).
        assert page.evaluate("url => fetch(url).then(() => 'alive', () => 'revoked')", old_blob) == "revoked"
        context.close()


def test_cards_show_the_captions_of_images_from_shards(browser: Any, tiny_model: Path, tmp_path: Path) -> None:
    """An index of WebDataset shards: each card shows its caption (text, never HTML) and the
    viewer the caption and source url; the original is served out of the shard."""
    import dataclasses

    from shardgen import make_samples, write_shards

    from indexer import build_index

    samples = make_samples(4)
    samples[0] = dataclasses.replace(samples[0], caption="<b>bold</b> caption")
    write_shards(tmp_path / "shards", samples, 2)
    build_index(tmp_path / "shards", tmp_path / "shards.idx", model=str(tiny_model), device="cpu", precision="fp32")
    with serve([tmp_path / "shards.idx"], tmp_path / "cache") as running:
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        try:
            open_ui(page, running)
            search(page, "a photo")
            expected = running.get("/api/search", q="a photo", k=PAGE)
            assert shown_ids(page, 4) == api_ids(expected)
            captions = page.locator("[data-testid=results] [data-testid=caption]").all_inner_texts()
            assert captions == [r["caption"] for r in expected["results"]]
            assert page.locator("[data-testid=results] b").count() == 0  # a caption's markup is text
            assert thumbnails_loaded(page) >= 4
            page.locator("[data-testid=results] [data-result-id]").first.click()
            first = expected["results"][0]
            page.wait_for_function("t => document.body.innerText.includes(t)", arg=first["url"])
        finally:
            page.close()


def header_box(page: Any) -> dict[str, float]:
    box = page.locator("[data-testid=header]").bounding_box()
    assert box is not None
    return box


def test_header_is_one_row_on_a_laptop_and_a_phone(browser: Any, server: Server) -> None:
    """At 1280x800 the header is one row (<= 80 px) with the filters closed; at 390x844 the search
    row fits the screen, results start below the header, also after "More like this" from far down."""
    for width, height in ((1280, 800), (390, 844)):
        context = browser.new_context(viewport={"width": width, "height": height})
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        try:
            page.goto(f"{server.url}/?k=24")
            page.wait_for_selector("body[data-ready='true']", state="attached")
            search(page, "a photo")
            shown_ids(page, 24)
            header = header_box(page)
            assert page.locator("[data-testid=filters]").is_hidden()
            if width == 1280:
                assert header["height"] <= 80, header
            for testid in ("search-button", "filters-toggle", "image-picker"):
                box = page.locator(f"[data-testid={testid}]").bounding_box()
                assert box and box["x"] >= 0 and box["x"] + box["width"] <= width and box["y"] + box["height"] <= header["height"], testid
            q = page.locator("input[name=q]").bounding_box()
            assert q and q["width"] >= 100
            first = page.locator("[data-testid=results] [data-result-id]").first.bounding_box()
            assert first and header["y"] + header["height"] <= first["y"] < height
            # From the bottom of the page, "More like this": its results start in view, below the header.
            last = page.locator("[data-testid=results] [data-result-id]").last
            last_id = last.get_attribute("data-result-id") or ""
            last.scroll_into_view_if_needed()
            last.click()
            page.locator("[data-testid=more-like-this]").click()
            wait_for_url(page, image_id=last_id)
            shown_ids(page, 24)
            header = header_box(page)
            first = page.locator("[data-testid=results] [data-result-id]").first.bounding_box()
            assert first and header["y"] + header["height"] <= first["y"] < height, (header, first)
        finally:
            context.close()


def test_filters_apply_at_once_and_the_address_keeps_them_and_the_pages(page: Any, server: Server) -> None:
    open_ui(page, server)
    search(page, "a photo")
    shown_ids(page, PAGE)
    open_filters(page)
    page.select_option("select[name=sort]", "taken")  # no Enter: it applies on change
    wait_for_url(page, q="a photo", sort="taken")
    assert shown_ids(page, PAGE) == api_ids(server.get("/api/search", q="a photo", k=PAGE, sort="taken"))
    ranked = server.get("/api/search", q="a photo", k=PAGE)["results"]
    cut = f"{(ranked[4]['score'] + ranked[5]['score']) / 2:.6f}"
    page.fill("input[name=min_score]", cut)  # a text box: applies once typing pauses
    wait_for_url(page, q="a photo", sort="taken", min_score=cut)
    assert shown_ids(page, 5) == api_ids(server.get("/api/search", q="a photo", k=PAGE, sort="taken", min_score=cut))
    assert page.locator("[data-testid=filter-count]").inner_text() == "2"
    # Back walks the filter changes.
    page.go_back()
    wait_for_url(page, q="a photo", sort="taken")
    assert shown_ids(page, PAGE) == api_ids(server.get("/api/search", q="a photo", k=PAGE, sort="taken"))
    assert page.input_value("input[name=min_score]") == ""
    # Pages loaded are kept: a reload shows as many.
    page.locator("[data-testid=load-more]").click()
    wait_for_url(page, q="a photo", sort="taken", pages="2")
    both = shown_ids(page, 2 * PAGE)
    page.reload()
    page.wait_for_selector("body[data-ready='true']", state="attached")
    assert shown_ids(page, 2 * PAGE) == both


def test_a_bad_value_in_the_address_is_shown_beside_its_control(page: Any, server: Server) -> None:
    open_ui(page, server, "q=a+red+car&min_score=abc&taken_after=2023-13-45")
    note = page.locator("[data-testid=min_score-error]")
    note.wait_for(state="visible")
    assert "Min score must be a number from -1 to 1" in note.inner_text() and "abc" in note.inner_text()
    assert page.input_value("input[name=min_score]") == "abc"  # kept, to be corrected
    assert page.locator("input[name=min_score]").get_attribute("aria-invalid") == "true"
    assert "2023-13-45" in page.inner_text("[data-testid=taken_after-error]")
    assert page.input_value("input[name=q]") == "a red car"
    assert "correct the marked filter" in page.inner_text("[data-testid=status]")
    assert shown_ids(page) == []  # not searched without the cut-off asked for
    page.fill("input[name=min_score]", "-1")
    wait_for_url(page, q="a red car", min_score="-1")
    assert shown_ids(page, PAGE) == api_ids(server.get("/api/search", q="a red car", k=PAGE, min_score=-1))
    assert note.is_hidden()


def test_reversed_dates_are_said_in_words(page: Any, server: Server) -> None:
    open_ui(page, server)
    search(page, "a photo")
    shown_ids(page, PAGE)
    open_filters(page)
    page.fill("input[name=taken_after]", "2025-01-01")
    page.fill("input[name=taken_to]", "2020-01-01")
    error = page.locator("[data-testid=taken_to-error]")
    error.wait_for(state="visible")
    assert error.inner_text() == "The start date (2025-01-01) is after the end date (2020-01-01)."
    # Checked on the page: never sent, so never the server's "taken_after (2025-01-01) is after
    # taken_before (...)".
    assert page.locator("[data-testid=error]").is_hidden()
    assert page.locator("input[name=taken_to]").get_attribute("aria-invalid") == "true"
    assert "taken_after" not in page.inner_text("body")


def test_the_end_date_is_inclusive_and_days_are_headed(page: Any, server: Server) -> None:
    open_ui(page, server, "index=dated.idx&q=a+photo&sort=taken&taken_to=2023-12-24")
    expected = server.get("/api/search", q="a photo", k=PAGE, index="dated.idx", sort="taken", taken_before="2023-12-25")
    paths = [r["path"] for r in expected["results"]]
    assert paths == ["eve.jpg", "before.jpg", "old.jpg"]  # the 24th itself is in
    assert shown_ids(page, 3) == api_ids(expected)
    assert page.locator("[data-testid=filters]").is_visible()  # a filter is set: the panel is open
    days = page.locator("[data-testid=results] [data-testid=day]").all_inner_texts()
    assert len(days) == 3 and "2023" in days[0] and "24" in days[0] and "2019" in days[2]
    # An older link's exclusive taken_before reads as the day before, included.
    open_ui(page, server, "index=dated.idx&q=a+photo&sort=taken&taken_before=2023-12-25")
    assert page.input_value("input[name=taken_to]") == "2023-12-24"
    assert shown_ids(page, 3) == api_ids(expected)


def open_viewer_at(page: Any, rank: int) -> Any:
    page.locator("[data-testid=results] [data-result-id]").nth(rank).click()
    viewer = page.locator("[data-testid=viewer]")
    viewer.wait_for(state="visible")
    page.wait_for_function("() => { const i = document.querySelector('[data-testid=viewer-image]'); "
                           "return i.complete && i.naturalWidth > 0 && i.style.width; }")
    return viewer


def test_viewer_steps_with_the_arrow_keys_and_never_upscales_past_twice(page: Any, server: Server) -> None:
    open_ui(page, server)
    search(page, "a photo")
    shown_ids(page, PAGE)
    results = server.get("/api/search", q="a photo", k=PAGE)["results"]
    viewer = open_viewer_at(page, 0)
    name = page.locator("[data-testid=viewer-name]")
    assert name.inner_text() == results[0]["path"].rsplit("/", 1)[-1]
    assert page.inner_text("[data-testid=viewer-folder]") == results[0]["path"].rsplit("/", 1)[0] + "/"
    # The pictures are 160x120 on a 1280x800 screen: shown at most twice their size.
    size = page.evaluate("() => { const i = document.querySelector('[data-testid=viewer-image]'); "
                         "return [i.getBoundingClientRect().width, i.naturalWidth]; }")
    assert 0 < size[0] <= 2 * size[1]
    first_src = page.get_attribute("[data-testid=viewer-image]", "src")
    page.keyboard.press("ArrowRight")
    page.wait_for_function("t => document.querySelector('[data-testid=viewer-name]').textContent === t",
                           arg=results[1]["path"].rsplit("/", 1)[-1])
    assert page.get_attribute("[data-testid=viewer-image]", "src") != first_src
    assert page.inner_text("[data-testid=viewer-position]").startswith("2 of")
    page.keyboard.press("ArrowLeft")
    page.wait_for_function("t => document.querySelector('[data-testid=viewer-name]').textContent === t",
                           arg=results[0]["path"].rsplit("/", 1)[-1])
    assert page.locator("[data-testid=viewer-prev]").is_disabled()
    page.locator("[data-testid=viewer-next]").click()
    page.wait_for_function("t => document.querySelector('[data-testid=viewer-name]').textContent === t",
                           arg=results[1]["path"].rsplit("/", 1)[-1])
    assert page.get_attribute("[data-testid=viewer-original]", "download") == results[1]["path"].rsplit("/", 1)[-1]
    page.keyboard.press("Escape")
    viewer.wait_for(state="hidden")
    # Focus is on the card of the picture last shown.
    page.wait_for_function("id => document.activeElement && document.activeElement.dataset.resultId === id", arg=str(results[1]["id"]))


def test_viewer_says_when_where_and_with_what(page: Any, server: Server) -> None:
    open_ui(page, server, "index=dated.idx&q=a+photo&sort=taken")
    expected = server.get("/api/search", q="a photo", k=PAGE, index="dated.idx", sort="taken")["results"]
    assert shown_ids(page, 5) == [r["id"] for r in expected]
    eve = next(i for i, r in enumerate(expected) if r["path"] == "eve.jpg")
    assert expected[eve]["gps"] is not None
    open_viewer_at(page, eve)
    taken = page.inner_text("[data-testid=viewer-taken]")
    # The camera's own clock (18:30 at +01:00), in words, whatever the browser's time zone.
    assert taken.startswith("Taken ") and "2023" in taken and "24" in taken and "with Apple iPhone 13" in taken
    assert "6:30" in taken or "18:30" in taken
    lat, lon = expected[eve]["gps"]
    link = page.locator("[data-testid=viewer-map]")
    assert link.get_attribute("href") == f"https://www.openstreetmap.org/?mlat={lat}&mlon={lon}#map=16/{lat}/{lon}"
    assert "48.85" in page.inner_text("[data-testid=viewer-gps]") and "N" in page.inner_text("[data-testid=viewer-gps]")
    # An undated picture without GPS says neither.
    undated = next(i for i, r in enumerate(expected) if r["path"] == "undated.jpg")
    for _ in range(undated - eve):
        page.keyboard.press("ArrowRight")
    page.wait_for_function("() => document.querySelector('[data-testid=viewer-name]').textContent === 'undated.jpg'")
    assert page.locator("[data-testid=viewer-gps]").is_hidden() and page.locator("[data-testid=viewer-taken]").is_hidden()


def test_screenshot_of_the_demo_collection(
    browser: Any, tmp_path: Path, demo_build: tuple[subprocess.Popen[bytes], Path, Path]
) -> None:
    """The README's screenshot's view: the demo collection indexed with the demo model, searched for
    a banana, written to a temporary file and checked to be a 1280x800 PNG (scripts/screenshots.py
    writes docs/ui.png from the same view)."""
    from PIL import Image

    proc, index, log = demo_build
    assert proc.wait(timeout=600) == 0, log.read_text(errors="replace")[-3000:]
    target = tmp_path / "ui.png"
    with serve([index], tmp_path / "cache") as server:
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        page.goto(server.url + "/")
        page.wait_for_selector("body[data-ready='true']", state="attached")
        search(page, "a banana")
        expected = api_ids(server.get("/api/search", q="a banana", k=24))
        assert shown_ids(page, 24) == expected
        page.wait_for_function(  # every thumbnail in the first screenful has been drawn
            "() => [...document.querySelectorAll('[data-testid=results] img')].slice(0, 12)"
            ".every(i => i.complete && i.naturalWidth > 0)"
        )
        assert page.locator("select[name=index]").is_hidden()  # one index: no picker
        page.locator("input[name=q]").blur()
        target.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(target))
        context.close()
    with Image.open(target) as shot:
        assert shot.format == "PNG"
        assert shot.size == (1280, 800)
