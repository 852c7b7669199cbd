// clipsearch web UI: plain JavaScript over the HTTP API (GET/POST /api/search, /api/indexes,
// /api/thumbnails, /api/images, /api/people). No framework and nothing from a CDN, so it works offline and
// under the server's CSP (script-src 'self', no inline code). This entry point wires the modules in
// ui/ together and starts the page; the modules import only those below them, and the calls that go
// up (a result opens the viewer, a search shows the chosen people) go through the hooks filled here.

import { wireTokenForm } from "./ui/api.js";
import { wireControls } from "./ui/controls.js";
import { wireDrop } from "./ui/drop.js";
import { wireFiltersToggle } from "./ui/filters.js";
import { restore } from "./ui/history.js";
import { hooks } from "./ui/hooks.js";
import { loadIndexes } from "./ui/indexes.js";
import { showError } from "./ui/messages.js";
import { loadPeople, showChosenPeople, wirePeople } from "./ui/people.js";
import { openViewer, updateViewerNav, wireViewer } from "./ui/viewer.js";

hooks.openViewer = openViewer;
hooks.updateViewerNav = updateViewerNav;
hooks.showChosenPeople = showChosenPeople;

wireTokenForm();
wireFiltersToggle();
wireControls();
wireDrop();
wireViewer();
wirePeople();

window.addEventListener("popstate", (event) => restore(event.state));

window.addEventListener("unhandledrejection", (event) => {
  const reason = event.reason;
  showError(reason && reason.message ? reason.message : String(reason));
});

async function start() {
  try {
    await loadIndexes();
  } catch (err) {
    showError(err.message || String(err));
  }
  await loadPeople(new URLSearchParams(location.search).get("index") || "");
  restore(history.state);
  document.body.dataset.ready = "true"; // for tests: the page has wired itself up
}

start();
