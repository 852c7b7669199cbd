"""The README's screenshots of the web UI, taken from the real page on the demo collection.

Serves the demo index (built first with the demo model where it is missing), searches "a banana"
in a headless Chromium and writes ``docs/ui.png`` (1280x800) and ``docs/ui-phone.png`` (390x844).
``--extra DIR`` also writes the filter panel and the viewer, on both screens, for a look before a
UI change is committed.

    .venv/bin/python scripts/screenshots.py [--index /tmp/demo.idx] [--extra /tmp/ui-shots]

Chromium comes from ``CLIPSEARCH_CHROMIUM`` (``scripts/ensure-chromium`` prints one) or
``/usr/bin/chromium``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CLIPSEARCH = Path(sys.executable).with_name("clipsearch")
SERVE_LINE = re.compile(r"clipsearch: serving (http://\S+?)/?\s*$")
SCREENS = {"desktop": (1280, 800), "phone": (390, 844)}
QUERY = "a banana"


def build_demo(index: Path) -> None:
    """``clipsearch index data/demo INDEX --model data/models/demo-clip`` (what ``make demo`` runs)."""
    subprocess.run(
        [str(CLIPSEARCH), "index", str(REPO / "data" / "demo"), str(index), "--model", str(REPO / "data" / "models" / "demo-clip"),
         "--device", "cpu"],
        check=True,
    )


@contextmanager
def serve(index: Path, cache: Path) -> Iterator[str]:
    """``clipsearch serve INDEX --port 0`` until the block ends; yields its base URL."""
    proc = subprocess.Popen([str(CLIPSEARCH), "serve", str(index), "--port", "0", "--cache-dir", str(cache)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    found: list[str] = []
    ready = threading.Event()

    def drain() -> None:  # keep reading stderr so the server never blocks on a full pipe
        assert proc.stderr is not None
        for line in proc.stderr:
            match = SERVE_LINE.search(line)
            if match and not found:
                found.append(match.group(1))
                ready.set()
        ready.set()

    threading.Thread(target=drain, daemon=True).start()
    try:
        ready.wait(120)
        if not found:
            raise SystemExit(f"clipsearch serve did not start (exit {proc.poll()})")
        yield found[0]
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def settled(page: Any, count: int) -> None:
    """Wait for the grid to hold ``count`` results whose first screenful of thumbnails is drawn."""
    page.wait_for_function(
        "n => document.querySelectorAll('[data-testid=results] [data-result-id]').length >= n"
        " && !document.querySelector('[data-testid=results][aria-busy]')", arg=count)
    page.wait_for_function(
        "() => [...document.querySelectorAll('[data-testid=results] img')].slice(0, 12)"
        ".every(i => i.complete && i.naturalWidth > 0)")


def shoot(browser: Any, url: str, docs: Path, extra: Path | None) -> None:
    for name, (width, height) in SCREENS.items():
        context = browser.new_context(viewport={"width": width, "height": height}, color_scheme="light")
        page = context.new_page()
        page.set_default_timeout(30_000)
        page.goto(url + "/")
        page.wait_for_selector("body[data-ready='true']", state="attached")
        page.fill("input[name=q]", QUERY)
        page.press("input[name=q]", "Enter")
        settled(page, 24)
        page.locator("input[name=q]").blur()
        page.screenshot(path=str(docs / ("ui.png" if name == "desktop" else "ui-phone.png")))
        if extra is not None:
            page.screenshot(path=str(extra / f"{name}-results.png"))
            page.click("[data-testid=filters-toggle]")
            page.select_option("select[name=sort]", "taken")
            page.fill("input[name=taken_after]", "2020-01-01")
            page.fill("input[name=taken_to]", "2019-12-31")  # reversed, to show its message
            page.wait_for_selector("[data-testid=taken_to-error]:not([hidden])")
            page.screenshot(path=str(extra / f"{name}-filters.png"))
            page.goto(url + "/?q=" + QUERY.replace(" ", "+"))
            page.wait_for_selector("body[data-ready='true']", state="attached")
            settled(page, 24)
            page.locator("[data-testid=results] [data-result-id]").nth(1).click()
            page.wait_for_function("() => { const i = document.querySelector('[data-testid=viewer-image]');"
                                   " return i.complete && i.naturalWidth > 0 && i.style.width; }")
            page.screenshot(path=str(extra / f"{name}-viewer.png"))
            page.goto(url + "/?q=" + QUERY.replace(" ", "+") + "&min_score=abc")
            page.wait_for_selector("[data-testid=min_score-error]:not([hidden])")
            page.screenshot(path=str(extra / f"{name}-bad-address.png"))
        context.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=Path, default=Path("/tmp/demo.idx"), help="the demo index (built if missing)")
    parser.add_argument("--docs", type=Path, default=REPO / "docs", help="where ui.png and ui-phone.png go")
    parser.add_argument("--extra", type=Path, help="also the filter panel, the viewer and a bad address, into this folder")
    parser.add_argument("--cache-dir", type=Path, default=Path("/tmp/clipsearch-screenshots-cache"))
    args = parser.parse_args(argv)

    from playwright.sync_api import sync_playwright

    chromium = shutil.which(os.environ.get("CLIPSEARCH_CHROMIUM") or "/usr/bin/chromium")
    if chromium is None:
        raise SystemExit("no Chromium: set CLIPSEARCH_CHROMIUM (scripts/ensure-chromium prints one)")
    if not (args.index / "manifest.json").exists():
        build_demo(args.index)
    if args.extra is not None:
        args.extra.mkdir(parents=True, exist_ok=True)
    with serve(args.index, args.cache_dir) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            shoot(browser, url, args.docs, args.extra)
        finally:
            browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
