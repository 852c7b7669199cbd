// clipsearch web UI: plain JavaScript over the HTTP API (GET/POST /api/search, /api/indexes,
// /api/thumbnails, /api/images, /api/people). No framework and nothing from a CDN, so it works offline and
// under the server's CSP (script-src 'self', no inline code). An ES module: the page's lower parts (the
// elements, the shared state, messages, dates, the API client, images, the index picker, the URL, the
// filters, the request) are modules in ui/ that import nothing above them; the calls that go up from
// them go through ui/hooks.js, filled in here.

import { fromUrl, urlOf } from "./ui/address.js";
import { api, hasToken, wireTokenForm } from "./ui/api.js";
import { dayWords, takenWords, wallClock } from "./ui/dates.js";
import { el } from "./ui/dom.js";
import { checkRefine, forgetAddressNote, readRefine, setAddressNotes, setFiltersOpen, showFieldErrors, showFilterCount, showRefine, wireFiltersToggle } from "./ui/filters.js";
import { hooks } from "./ui/hooks.js";
import { blobUrl, forgetThumbnails, imageUrl, observeThumbnail, thumbnailUrl } from "./ui/images.js";
import { chosenIndex, loadIndexes, selectIndex, showQueryLanguages } from "./ui/indexes.js";
import { clearError, setStatus, showError } from "./ui/messages.js";
import { hitPeople, peopleInfo, personLabel } from "./ui/names.js";
import { request } from "./ui/request.js";
import { DEFAULT_K, MAX_K, state, TEXT_FILTERS, THUMB_SIZE } from "./ui/state.js";
import { baseName, dateRangeWords, describe, folderOf, formatScore, SOURCE_NAMES, whyText } from "./ui/words.js";

// A time in a video as people write it: 01:23 (1:02:03 past an hour).
function clock(seconds) {
  const total = Math.max(0, Math.floor(seconds));
  const h = Math.floor(total / 3600), m = Math.floor((total % 3600) / 60), s = total % 60;
  const two = (n) => String(n).padStart(2, "0");
  return h ? `${h}:${two(m)}:${two(s)}` : `${two(m)}:${two(s)}`;
}

// A listing without a query (a person's photos) has no moment: the time of the frame it kept.
function momentText(result) {
  if (result.start === null || result.start === undefined) return clock(result.frame_time);
  return `${clock(result.start)}–${clock(Math.ceil(result.end))}`;
}

// The badge on a video's result: its best moment, and how many more it holds.
function momentBadge(result, button, rank) {
  const badge = document.createElement("span");
  badge.className = "moment";
  badge.dataset.testid = "moment";
  const more = Array.isArray(result.moments) && result.moments.length > 1 ? ` +${result.moments.length - 1}` : "";
  badge.textContent = `▶ ${momentText(result)}${more}`;
  badge.title = `Video: best frame at ${clock(result.frame_time)}` +
    (Array.isArray(result.moments) ? `\n${result.moments.map((m) => `${clock(m.start)}–${clock(Math.ceil(m.end))}`).join(", ")}` : "");
  button.setAttribute("aria-label", `${rank}. ${result.path}, video at ${momentText(result)}, score ${formatScore(result.score)}; open`);
  return badge;
}

function closeViewerVideo() {
  el.viewerStage.querySelector("video")?.remove();
  el.viewerStage.querySelector(".video-note")?.remove();
  el.viewerImage.hidden = false;
}

// The video from its best moment (the URL's #t=start,end); a codec this browser cannot play
// shows the moment's frame instead, with a note to download the file. keepUrl(url) is given the
// blob: URL it fetched (token mode), for the viewer to revoke when it closes.
async function playVideo(result, keepUrl) {
  const video = document.createElement("video");
  video.dataset.testid = "viewer-video";
  video.controls = true;
  video.muted = true; // browsers autoplay only muted videos
  video.autoplay = true;
  video.playsInline = true;
  video.preload = "metadata";
  const fragment = result.start === null || result.start === undefined ? `#t=${result.frame_time}` : `#t=${result.start},${result.end}`;
  const fallback = () => {
    if (!video.isConnected) return;
    video.remove();
    const note = document.createElement("p");
    note.className = "video-note";
    note.dataset.testid = "video-note";
    note.textContent = `This browser cannot play this video: the frame at ${clock(result.frame_time)} is shown; download it to watch.`;
    el.viewerStage.append(note);
    el.viewerImage.hidden = false;
    const frameUrl = thumbnailUrl(result).replace(/size=\d+/, "size=1024");
    if (hasToken()) blobUrl(frameUrl).then((u) => { keepUrl(u); el.viewerImage.src = u; }, () => {});
    else el.viewerImage.src = frameUrl;
  };
  video.addEventListener("error", fallback);
  el.viewerImage.hidden = true;
  el.viewerStage.append(video);
  if (hasToken()) {
    try {
      const objectUrl = await blobUrl(imageUrl(result));
      if (!video.isConnected) {
        URL.revokeObjectURL(objectUrl);
        return;
      }
      keepUrl(objectUrl);
      video.src = objectUrl + fragment;
    } catch (err) {
      showError(err.message || String(err));
    }
  } else {
    video.src = result.video_url || imageUrl(result) + fragment;
  }
}

function render(results, append) {
  if (!append) {
    forgetThumbnails();
    el.results.replaceChildren();
    state.results = [];
    state.lastDay = null;
  }
  const byDay = state.refine.sort === "taken" || state.mode === "people";
  const fragment = document.createDocumentFragment();
  for (const result of results) {
    state.results.push(result);
    if (byDay) {
      // Sorted by date: a heading wherever the day changes (undated photos come last).
      const t = wallClock(result.taken);
      const day = t ? t.date.toISOString().slice(0, 10) : "undated";
      if (day !== state.lastDay) {
        state.lastDay = day;
        const item = document.createElement("li");
        item.className = "day";
        item.dataset.testid = "day";
        const heading = document.createElement("h2");
        heading.className = "day-title";
        heading.textContent = t ? dayWords.format(t.date) : "No date taken";
        item.append(heading);
        fragment.append(item);
      }
    }
    fragment.append(resultItem(result, state.results.length));
  }
  el.results.append(fragment);
}

function resultItem(result, rank) {
  const item = document.createElement("li");
  const button = document.createElement("button");
  button.type = "button";
  button.className = "result";
  button.dataset.resultId = String(result.id);
  button.dataset.rank = String(rank);
  button.setAttribute("aria-label", `${rank}. ${result.path}, score ${formatScore(result.score)}; open`);
  button.title = result.path;

  const frame = document.createElement("span");
  frame.className = "thumb";
  const img = document.createElement("img");
  img.alt = "";
  img.decoding = "async";
  img.loading = "lazy";
  img.width = THUMB_SIZE;
  img.height = THUMB_SIZE;
  img.addEventListener("error", () => button.classList.add("no-thumb"));
  frame.append(img);

  const score = document.createElement("span");
  score.className = "score";
  score.textContent = formatScore(result.score);
  score.dataset.testid = "score";
  score.title = whyText(result);
  const path = document.createElement("span");
  path.className = "path";
  path.textContent = result.path;
  const taken = document.createElement("span");
  taken.className = "taken";
  taken.dataset.testid = "taken";
  if (typeof result.taken === "string" && result.taken) {
    // The date and time the camera recorded, as ISO 8601 gives them (no zone conversion).
    taken.textContent = result.taken.slice(0, 16).replace("T", " ");
    taken.title = `Taken ${takenWords(result.taken)}${result.camera ? ` with ${result.camera}` : ""}`;
  }

  const caption = document.createElement("span");
  caption.className = "caption";
  caption.dataset.testid = "caption";
  if (typeof result.caption === "string" && result.caption) {
    // The caption that came with the image in its WebDataset shard (text only, never HTML).
    caption.textContent = result.caption;
    caption.title = result.url ? `${result.caption}\n${result.url}` : result.caption;
    button.setAttribute("aria-label", `${rank}. ${result.caption} (${result.path}), score ${formatScore(result.score)}; open`);
  }

  // The query's words found in the picture's text (file name, keywords, text in the image).
  const matched = document.createElement("span");
  matched.className = "matched";
  matched.dataset.testid = "matched";
  const found = result.matched && typeof result.matched === "object" ? Object.entries(result.matched) : [];
  if (found.length) {
    const words = [...new Set(found.flatMap(([, w]) => (Array.isArray(w) ? w : [])))];
    const share = typeof result.keyword === "number" && result.keyword < 1 ? ` (${Math.round(result.keyword * 100)}%)` : "";
    matched.textContent = words.join(", ") + share;
    matched.title = found.map(([source, w]) => `${SOURCE_NAMES[source] || source}: ${w.join(", ")}`).join("\n") +
      `\n${whyText(result)}`;
  }

  // Who is in the photo (an index built with --faces): the people of its faces, by name.
  const who = document.createElement("span");
  who.className = "who";
  who.dataset.testid = "hit-people";
  const names = hitPeople(result);
  if (names.length) {
    who.textContent = names.join(", ");
    who.title = `With ${names.join(", ")}`;
  }

  button.append(frame, score, path, caption, taken, matched, who);
  if (result.media === "video") button.append(momentBadge(result, button, rank));
  button.addEventListener("click", () => hooks.openViewer(state.results.indexOf(result), button));
  item.append(button);

  const url = thumbnailUrl(result);
  if (hasToken()) {
    img.dataset.src = url;
    observeThumbnail(img);
  } else {
    img.src = url;
  }
  return item;
}

let previewUrl = null; // blob: URL of the uploaded query image's preview

// Uploaded files by history entry: a File cannot go in the URL, but back/forward within this
// page can still find it here (a reload cannot: the page says so).
const uploads = new Map();
let uploadSeq = 0;

// The file of an upload's history entry, if this page still holds it.
function uploadedFile(key) {
  return uploads.get(key);
}

// The arithmetic terms typed in the form (applied to text, image and "more like this" searches).
function terms() {
  return { add: el.add.value.trim(), subtract: el.subtract.value.trim() };
}

// A date filter left nothing: say whether the same search finds any dated photo at all, so
// "No results" on an index without dates does not read as "nothing matched the words".
async function explainNoDates(generation) {
  const refine = { ...state.refine, sort: "taken" };
  delete refine.taken_after;
  delete refine.taken_to;
  const [url, options] = request({ ...state, refine }, DEFAULT_K, 0);
  try {
    const data = await (await api(url, options)).json();
    // Stale (a newer search), or a filter is being corrected meanwhile (its message stays).
    if (generation !== state.generation || Object.keys(checkRefine(readRefine())).length) return;
    const results = Array.isArray(data.results) ? data.results : [];
    if (!results.length) return;
    const newest = results.find((r) => typeof r.taken === "string" && r.taken);
    setStatus(newest
      ? `No results ${dateRangeWords(state.refine)} for ${describe(state)}; the newest photo it finds was taken ${takenWords(newest.taken)}.`
      : `No results: none of the images this search finds has a date taken (no EXIF date), so a date filter leaves none.`);
  } catch (_) {
    // the plain "No results" stays
  }
}

async function fetchPage(append) {
  const generation = append ? state.generation : ++state.generation;
  // A restored address with pages=N asks for all N pages at once.
  const k = append ? state.k : Math.min(MAX_K, state.k * state.pages);
  const offset = append ? state.results.length : 0;
  const [url, options] = request(state, k, offset);
  el.results.setAttribute("aria-busy", "true");
  el.more.disabled = true;
  setStatus(append ? "Loading more…" : `Searching for ${describe(state)}…`);
  try {
    const resp = await api(url, options);
    const data = await resp.json();
    if (generation !== state.generation) return;
    const results = Array.isArray(data.results) ? data.results : [];
    render(results, append);
    state.done = results.length < k;
    if (append && results.length) {
      state.pages += 1;
      history.replaceState(history.state, "", urlOf(state));
    }
    const shown = state.results.length;
    const took = typeof data.took_ms === "number" ? ` in ${Math.round(data.took_ms)} ms` : "";
    if (shown === 0) {
      setStatus(`No results for ${describe(state)}.`);
      if (state.refine.taken_after || state.refine.taken_to) explainNoDates(generation);
    } else if (append && results.length === 0) {
      setStatus(`No more results: ${shown} shown.`);
    } else {
      setStatus(`${shown} result${shown === 1 ? "" : "s"} for ${describe(state)}${took}${state.done ? "" : " (more below)"}.`);
    }
  } catch (err) {
    if (generation !== state.generation) return;
    const message = err.message || String(err);
    if (append) {
      showError(message); // the page was not added: "Load more" asks for it again
    } else {
      render([], false);
      state.done = true;
      if (state.mode === "upload") {
        // The search by that file is over: its preview and "searching by" note go, and the
        // error names the user's file (the server calls every upload "upload").
        const name = state.file && state.file.name ? state.file.name : "the chosen image";
        Object.assign(state, { mode: null, file: null });
        showQueryContext();
        el.hint.hidden = false;
        showError(`Could not search by “${name}”: ${message.replace(/image 'upload'/g, "the image").replace(/'upload'/g, `“${name}”`)}`);
      } else {
        showError(message);
      }
    }
    setStatus("");
  } finally {
    if (generation === state.generation) {
      el.results.removeAttribute("aria-busy");
      el.more.disabled = false;
      el.more.hidden = state.done;
      hooks.updateViewerNav();
    }
  }
}

// Start a new search from `next` (a partial state). how: "push" a history entry, "replace" the
// current one (a text filter typed on), or "none" (restoring from the address).
function startSearch(next, { how = "push", edit = null } = {}) {
  clearError();
  Object.assign(state, { q: "", imageId: null, similarPath: null, file: null, add: "", subtract: "", pages: 1 }, next, { done: false });
  state.refine = readRefine();
  el.q.value = state.mode === "text" ? state.q : "";
  el.prefix.value = state.prefix;
  el.add.value = state.add;
  el.subtract.value = state.subtract;
  showQueryContext();
  hooks.showChosenPeople();
  showFilterCount(false);
  if (how !== "none") {
    if (state.mode === "upload") {
      const key = ++uploadSeq;
      uploads.set(key, state.file);
      history.pushState({ upload: key }, "", urlOf({ ...state, mode: null }));
    } else {
      // The same search again (Enter pressed twice) replaces its entry instead of adding one.
      const url = urlOf(state);
      const same = url === location.pathname + location.search && !(history.state && history.state.upload);
      history[same || how === "replace" ? "replaceState" : "pushState"]({ search: true, edit }, "", url);
    }
  }
  el.hint.hidden = true;
  const problems = checkRefine(state.refine);
  showFieldErrors(problems);
  if (Object.keys(problems).length) {
    // Never search with a filter left out unsaid: the marked field says what to correct.
    ++state.generation;
    render([], false);
    state.done = true;
    el.more.hidden = true;
    setFiltersOpen(true);
    setStatus(`Not searched yet: correct the marked filter (${Object.keys(problems).map(fieldName).join(", ")}).`);
    return Promise.resolve();
  }
  return fetchPage(false);
}

function fieldName(name) {
  const label = document.querySelector(`label[for="${name}"]`);
  return label ? label.textContent.trim() : name;
}

function showQueryContext() {
  if (previewUrl) {
    URL.revokeObjectURL(previewUrl);
    previewUrl = null;
  }
  if (state.mode === "upload") {
    previewUrl = URL.createObjectURL(state.file);
    el.queryPreview.src = previewUrl;
    el.queryImageNote.textContent = `Searching by the image you chose${state.file.name ? ` (${state.file.name})` : ""}. ` +
      "An uploaded image cannot be put in the address, so reload or a shared link will not bring this search back.";
    el.queryImage.hidden = false;
  } else {
    el.queryPreview.removeAttribute("src");
    el.queryImageNote.textContent = "";
    el.queryImage.hidden = true;
  }
  el.similarNote.hidden = state.mode !== "similar";
  el.similarNote.textContent = state.mode === "similar" ? `Showing images like ${state.similarPath ? state.similarPath : `image ${state.imageId}`}.` : "";
}

function clearSearch(message) {
  ++state.generation;
  Object.assign(state, { mode: null, q: "", imageId: null, file: null, pages: 1, done: true });
  render([], false);
  el.q.value = "";
  showQueryContext();
  el.more.hidden = true;
  el.hint.hidden = false;
  setStatus(message || "");
}

// The search on screen again, with the filters as they are now.
function rerun(how, edit) {
  startSearch({
    mode: state.mode, q: state.q, imageId: state.imageId, similarPath: state.similarPath, file: state.file,
    index: chosenIndex(), prefix: el.prefix.value.trim(), ...terms(), k: state.k,
  }, { how: state.mode === "upload" ? "push" : how, edit });
}

function loadMore() {
  if (state.done || !state.mode) return Promise.resolve();
  clearError();
  return fetchPage(true);
}

function searchByFile(file) {
  if (!file) return;
  if (file.type && !file.type.startsWith("image/")) {
    showError(`“${file.name}” is not an image (${file.type}).`);
    return;
  }
  startSearch({ mode: "upload", file, index: chosenIndex(), prefix: el.prefix.value.trim(), ...terms(), k: state.k });
}

const TYPING_PAUSE_MS = 600; // a text filter applies once typing pauses this long
let typingTimer = 0;

// A filter's pending apply is dropped (the search is submitted or restored meanwhile).
function cancelTyping() {
  clearTimeout(typingTimer);
}

// A filter changed: it applies at once to the search on screen. Typing on in the same text box
// replaces its history entry, so back steps over searches, not keystrokes.
function applyFilters(name) {
  clearTimeout(typingTimer);
  forgetAddressNote(name);
  const problems = checkRefine(readRefine());
  showFieldErrors(problems);
  showFilterCount(false);
  if (Object.keys(problems).length) {
    // Leave the results of the last good filters on screen; the field says what is wrong.
    if (state.mode) setStatus(`Still showing the last search: correct the marked filter (${Object.keys(problems).map(fieldName).join(", ")}) to search again.`);
    return;
  }
  if (state.mode) {
    const typingOn = TEXT_FILTERS.has(name) && history.state && history.state.edit === name;
    rerun(typingOn ? "replace" : "push", TEXT_FILTERS.has(name) ? name : null);
  } else {
    // No search yet: the address still keeps the filters, for a reload or a link.
    history.replaceState({ search: true }, "", urlOf({
      ...state, index: chosenIndex(), prefix: el.prefix.value.trim(), ...terms(), refine: readRefine(),
    }));
  }
}

// The search form's controls: the filters, Clear, the query, the index picker, Load more and the
// image chooser.
function wireControls() {
  for (const control of [el.prefix, el.add, el.subtract, el.minScore, el.queryLang]) {
    control.addEventListener("input", () => {
      clearTimeout(typingTimer);
      typingTimer = setTimeout(() => applyFilters(control.name), TYPING_PAUSE_MS);
    });
  }
  for (const control of [el.takenAfter, el.takenTo, el.sort, el.mode, el.media]) {
    control.addEventListener("change", () => applyFilters(control.name));
  }

  el.clearFilters.addEventListener("click", () => {
    if (state.people.length) {
      state.people = [];
      state.onlyPeople = false;
      showChosenPeople();
      if (state.mode === "people") {
        clearSearch();
        history.pushState({ search: true }, "", urlOf({ ...state, index: chosenIndex() }));
      }
    }
    showRefine({});
    el.prefix.value = el.add.value = el.subtract.value = "";
    setAddressNotes({});
    applyFilters("clear");
  });

  el.form.addEventListener("submit", (event) => {
    event.preventDefault();
    clearTimeout(typingTimer);
    const q = el.q.value.trim();
    if (!q && (state.mode === "similar" || state.mode === "upload")) {
      rerun("push", null); // Enter in a filter box: the image search on screen, filtered anew
      return;
    }
    if (!q && state.people.length) {
      startSearch({ mode: "people", index: chosenIndex(), prefix: el.prefix.value.trim(), k: state.k });
      return;
    }
    if (!q) {
      setStatus("");
      showError("Type something to search for, or choose an image to search by.");
      el.q.focus();
      return;
    }
    startSearch({ mode: "text", q, index: chosenIndex(), prefix: el.prefix.value.trim(), ...terms(), k: state.k });
  });

  // A new index applies to the search on screen. An image id belongs to one index, so "more like
  // this" does not carry over; a text query and an uploaded image do.
  el.index.addEventListener("change", () => {
    showQueryLanguages();
    // People are numbered per index: the chosen ones do not carry over.
    state.people = [];
    state.onlyPeople = false;
    showChosenPeople();
    if (state.mode === "people") clearSearch();
    loadPeople(chosenIndex());
    if (state.mode === "text" || state.mode === "upload") {
      startSearch({ mode: state.mode, q: state.q, file: state.file, index: chosenIndex(), prefix: state.prefix, add: state.add, subtract: state.subtract, k: state.k });
    } else if (state.mode === "similar") {
      clearSearch(`Index ${el.index.value} chosen: search it by text or by an image.`);
      history.pushState({ search: true }, "", urlOf({ ...state, index: chosenIndex() }));
    }
  });

  el.more.addEventListener("click", () => loadMore());

  el.file.addEventListener("change", () => {
    const file = el.file.files && el.file.files[0];
    searchByFile(file);
    el.file.value = ""; // choosing the same file again searches again
  });
}

let dragDepth = 0;
const carriesFiles = (event) => event.dataTransfer && [...event.dataTransfer.types].includes("Files");

function wireDrop() {
  window.addEventListener("dragenter", (event) => {
    if (!carriesFiles(event)) return;
    event.preventDefault();
    dragDepth += 1;
    el.dropOverlay.hidden = false;
  });
  window.addEventListener("dragover", (event) => {
    if (!carriesFiles(event)) return;
    event.preventDefault();
    event.dataTransfer.dropEffect = "copy";
  });
  window.addEventListener("dragleave", () => {
    dragDepth = Math.max(0, dragDepth - 1);
    if (dragDepth === 0) el.dropOverlay.hidden = true;
  });
  window.addEventListener("drop", (event) => {
    if (!carriesFiles(event)) return;
    event.preventDefault();
    dragDepth = 0;
    el.dropOverlay.hidden = true;
    searchByFile(event.dataTransfer.files[0]);
  });
}

const MAX_UPSCALE = 2; // the viewer never blows a small picture up past twice its own pixels

let viewerUrl = null; // blob: URL of the original in the viewer (token mode)
let viewerPos = -1; // the index in state.results of the picture in the viewer
let viewerOpener = null;
let viewerActual = false; // the viewer shows the picture at its own size (else fitted)
let swipeStart = null; // where a swipe began

const keepViewerUrl = (url) => {
  viewerUrl = url;
};

function closeViewerImage() {
  if (viewerUrl) {
    URL.revokeObjectURL(viewerUrl);
    viewerUrl = null;
  }
  el.viewerImage.removeAttribute("src");
  el.viewerImage.style.width = "";
  el.viewerImage.style.height = "";
}

// The picture fitted to the stage, but never past MAX_UPSCALE times its own pixels (a 128-px
// original blown up to fill a screen is a blur); or at its own size, to be scrolled.
function fitViewerImage() {
  const img = el.viewerImage;
  if (!img.naturalWidth) return;
  const box = el.viewerStage.getBoundingClientRect();
  const fit = Math.min(MAX_UPSCALE, box.width / img.naturalWidth, box.height / img.naturalHeight);
  const scale = viewerActual ? 1 : fit;
  img.style.width = `${Math.floor(img.naturalWidth * scale)}px`;
  img.style.height = `${Math.floor(img.naturalHeight * scale)}px`;
  el.viewerStage.classList.toggle("actual", viewerActual);
}

function gpsWords(gps) {
  const [lat, lon] = gps;
  return `${Math.abs(lat).toFixed(5)}° ${lat >= 0 ? "N" : "S"}, ${Math.abs(lon).toFixed(5)}° ${lon >= 0 ? "E" : "W"}`;
}

function updateViewerNav() {
  if (!el.viewer.open) return;
  const total = state.results.length;
  el.viewerPrev.disabled = viewerPos <= 0;
  el.viewerNext.disabled = viewerPos >= total - 1 && state.done;
  el.viewerPosition.textContent = `${viewerPos + 1} of ${total}${state.done ? "" : "+"}`;
}

async function openViewer(pos, opener) {
  const result = state.results[pos];
  if (!result) return;
  viewerPos = pos;
  if (opener) viewerOpener = opener;
  viewerActual = false;
  closeViewerImage();
  closeViewerVideo();
  el.viewerName.textContent = baseName(result.path);
  el.viewerFolder.textContent = folderOf(result.path);
  const when = typeof result.taken === "string" && result.taken ? `Taken ${takenWords(result.taken)}` : "";
  el.viewerTaken.textContent = when + (result.camera ? `${when ? " with" : "Taken with"} ${result.camera}` : "");
  el.viewerTaken.title = result.taken ? `${result.taken} (the camera's clock)` : "";
  const gps = Array.isArray(result.gps) && result.gps.length === 2 && result.gps.every(Number.isFinite) ? result.gps : null;
  el.viewerGps.hidden = !gps;
  el.viewerGps.replaceChildren();
  if (gps) {
    const [lat, lon] = gps;
    const link = document.createElement("a");
    link.href = `https://www.openstreetmap.org/?mlat=${lat}&mlon=${lon}#map=16/${lat}/${lon}`;
    link.target = "_blank";
    link.rel = "noopener";
    link.dataset.testid = "viewer-map";
    link.textContent = "show on a map";
    el.viewerGps.append(`At ${gpsWords(gps)} · `, link);
  }
  el.viewerScore.textContent = whyText(result);
  const withWhom = hitPeople(result);
  el.viewerExtra.textContent = [
    withWhom.length ? `With ${withWhom.join(", ")}` : "",
    result.width && result.height ? `${result.width} × ${result.height} pixels` : "",
    result.caption ? `“${result.caption}”` : "",
    result.url ? `from ${result.url}` : "",
  ].filter(Boolean).join(" · ");
  el.viewerImage.alt = result.caption || baseName(result.path);
  const url = imageUrl(result);
  el.viewerOriginal.href = url;
  el.viewerOriginal.download = baseName(result.path);
  el.copyPath.textContent = "Copy path";
  if (!el.viewer.open) {
    el.viewer.showModal();
    el.moreLikeThis.focus();
  }
  updateViewerNav();
  if (result.media === "video") {
    playVideo(result, keepViewerUrl);
    return;
  }
  if (hasToken()) {
    try {
      const objectUrl = await blobUrl(url);
      if (state.results[viewerPos] !== result || !el.viewer.open) {
        URL.revokeObjectURL(objectUrl);
        return;
      }
      viewerUrl = objectUrl;
      el.viewerImage.src = objectUrl;
      el.viewerOriginal.href = objectUrl;
    } catch (err) {
      showError(err.message || String(err));
    }
  } else {
    el.viewerImage.src = url;
  }
}

// Next past the last result shown loads the next page first, when there is one.
async function stepViewer(delta) {
  let pos = viewerPos + delta;
  if (pos < 0) return;
  if (pos >= state.results.length) {
    if (state.done) return;
    await loadMore();
    if (pos >= state.results.length) return;
  }
  openViewer(pos, null);
}

async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch (_) {
    // No clipboard API off a secure origin (http:// on a LAN address): the old way.
    const area = Object.assign(document.createElement("textarea"), { value: text, readOnly: true });
    area.style.position = "fixed";
    area.style.opacity = "0";
    el.viewer.append(area);
    area.select();
    let ok = false;
    try {
      ok = document.execCommand("copy");
    } catch (__) {
      ok = false;
    }
    area.remove();
    return ok;
  }
}

// The viewer closed for a restored search (back/forward): focus goes back to no card.
function dismissViewer() {
  if (el.viewer.open) {
    viewerOpener = null;
    viewerPos = -1;
    el.viewer.close();
  }
}

// The viewer's controls: the picture's size, previous/next (buttons, arrow keys, swipes), copy
// the path, close, and "more like this".
function wireViewer() {
  el.viewerImage.addEventListener("load", fitViewerImage);
  window.addEventListener("resize", () => { if (el.viewer.open) fitViewerImage(); });
  el.viewerImage.addEventListener("click", () => {
    viewerActual = !viewerActual;
    fitViewerImage();
  });

  el.viewerPrev.addEventListener("click", () => stepViewer(-1));
  el.viewerNext.addEventListener("click", () => stepViewer(1));
  el.viewer.addEventListener("keydown", (event) => {
    if (event.altKey || event.ctrlKey || event.metaKey) return;
    if (event.key === "ArrowLeft") {
      event.preventDefault();
      stepViewer(-1);
    } else if (event.key === "ArrowRight") {
      event.preventDefault();
      stepViewer(1);
    }
  });

  // Swipes (touch, pen or a mouse drag): a mostly horizontal move of 50 px or more.
  el.viewerStage.addEventListener("pointerdown", (event) => {
    swipeStart = viewerActual ? null : { x: event.clientX, y: event.clientY };
  });
  el.viewerStage.addEventListener("pointercancel", () => { swipeStart = null; });
  el.viewerStage.addEventListener("pointerup", (event) => {
    if (!swipeStart) return;
    const dx = event.clientX - swipeStart.x;
    const dy = event.clientY - swipeStart.y;
    swipeStart = null;
    if (Math.abs(dx) >= 50 && Math.abs(dx) > 1.5 * Math.abs(dy)) stepViewer(dx < 0 ? 1 : -1);
  });

  el.copyPath.addEventListener("click", async () => {
    const result = state.results[viewerPos];
    if (!result) return;
    const ok = await copyText(result.path);
    el.copyPath.textContent = ok ? "Copied" : "Copy failed";
    if (!ok) {
      // Select the path on screen, so Ctrl+C or a long press copies it.
      const range = document.createRange();
      range.selectNodeContents(el.viewerFolder.textContent ? el.viewerFolder : el.viewerName);
      getSelection().removeAllRanges();
      getSelection().addRange(range);
    }
  });

  el.viewer.addEventListener("close", () => {
    closeViewerImage();
    // Focus returns to the card of the picture last shown (previous/next may have moved on).
    const shown = state.results[viewerPos];
    const card = shown ? el.results.querySelector(`[data-result-id="${shown.id}"]`) : null;
    const target = card || viewerOpener;
    // After the dialog's own focus restoration (to the card it was opened from), not before it.
    if (target) setTimeout(() => target.isConnected && target.focus(), 0);
    viewerOpener = null;
  });
  el.viewerClose.addEventListener("click", () => el.viewer.close());

  el.moreLikeThis.addEventListener("click", () => {
    const result = state.results[viewerPos];
    if (!result) return;
    viewerPos = -1;
    viewerOpener = null;
    el.viewer.close();
    startSearch({ mode: "similar", imageId: result.id, similarPath: result.path, index: state.index, prefix: state.prefix, ...terms(), k: state.k });
    // The new results start at the top of the page, below the header, not scrolled under it.
    window.scrollTo({ top: 0 });
    el.results.focus({ preventScroll: true });
  });
}

let shownPeopleOf = null; // the index whose people the strip shows

function peopleShownFor() {
  return shownPeopleOf;
}

async function faceSrc(img, url) {
  if (!hasToken()) {
    img.src = url;
    return;
  }
  try {
    img.src = await blobUrl(url);
  } catch (_) {
    img.removeAttribute("src");
  }
}

async function loadPeople(index) {
  shownPeopleOf = index;
  const params = new URLSearchParams();
  if (index) params.set("index", index);
  let data;
  try {
    data = await (await api(`/api/people${params.size ? `?${params}` : ""}`)).json();
  } catch (_) {
    data = { faces: false, people: [] }; // an older server, or none: no strip
  }
  if (shownPeopleOf !== index) return;
  peopleInfo.clear();
  el.peopleStrip.replaceChildren();
  for (const person of Array.isArray(data.people) ? data.people : []) {
    peopleInfo.set(person.id, person);
    const item = document.createElement("li");
    const button = document.createElement("button");
    button.type = "button";
    button.className = "person";
    button.dataset.testid = "person";
    button.dataset.person = String(person.id);
    button.title = `${person.label}: ${person.images} photo${person.images === 1 ? "" : "s"}`;
    const img = document.createElement("img");
    img.alt = "";
    img.width = img.height = 64;
    faceSrc(img, person.face_url);
    const label = document.createElement("span");
    label.className = "person-label";
    label.textContent = person.label;
    button.append(img, label);
    button.addEventListener("click", () => togglePerson(person.id));
    item.append(button);
    el.peopleStrip.append(item);
  }
  el.people.hidden = peopleInfo.size === 0;
  showChosenPeople();
  if (state.mode) {
    // The names arrived after the search: say them.
    showPersonPage();
    if (state.results.length) setStatus(`${state.results.length} result${state.results.length === 1 ? "" : "s"} for ${describe(state)}.`);
  }
}

function showChosenPeople() {
  el.chosenList.replaceChildren();
  for (const id of state.people) {
    const chip = document.createElement("button");
    chip.type = "button";
    chip.className = "chip";
    chip.dataset.testid = "chosen-person";
    chip.textContent = `${personLabel(id)} ×`;
    chip.setAttribute("aria-label", `Remove ${personLabel(id)} from the search`);
    chip.addEventListener("click", () => togglePerson(id));
    el.chosenList.append(chip);
  }
  el.chosenPeople.hidden = state.people.length === 0;
  el.onlyPeople.checked = state.onlyPeople;
  for (const button of el.peopleStrip.querySelectorAll("button.person")) {
    button.setAttribute("aria-pressed", String(state.people.includes(Number(button.dataset.person))));
  }
  showPersonPage();
}

// One person chosen and no query: their page, with their name to edit in place.
function showPersonPage() {
  const id = state.mode === "people" && state.people.length === 1 ? state.people[0] : null;
  el.personPage.hidden = id === null;
  if (id === null) return;
  const info = peopleInfo.get(id);
  el.personTitle.textContent = personLabel(id);
  if (document.activeElement !== el.personName) el.personName.value = info && info.name ? info.name : "";
  el.personCount.textContent = info ? `${info.images} photo${info.images === 1 ? "" : "s"}, ${info.faces} face${info.faces === 1 ? "" : "s"}` : "";
  if (info && el.personFace.dataset.person !== String(id)) {
    el.personFace.dataset.person = String(id);
    faceSrc(el.personFace, info.face_url.replace(/size=\d+/, "size=256"));
  }
}

// A face in the strip or a chip: the person joins the search, or leaves it. Without a query the
// search is the people's photos; with one, the query is filtered to them.
function togglePerson(id) {
  const people = state.people.includes(id) ? state.people.filter((p) => p !== id) : [...state.people, id];
  state.people = people;
  if (!people.length) state.onlyPeople = false;
  if (state.mode && state.mode !== "people") {
    rerun("push", null);
  } else if (people.length) {
    startSearch({ mode: "people", index: chosenIndex(), prefix: el.prefix.value.trim(), k: state.k });
  } else {
    showChosenPeople();
    clearSearch();
    history.pushState({ search: true }, "", urlOf({ ...state, index: chosenIndex() }));
  }
}

// The "only them" box and renaming a person on their page.
function wirePeople() {
  el.onlyPeople.addEventListener("change", () => {
    state.onlyPeople = el.onlyPeople.checked;
    if (state.mode === "people") startSearch({ mode: "people", index: chosenIndex(), prefix: el.prefix.value.trim(), k: state.k });
    else if (state.mode) rerun("push", null);
  });

  el.personRename.addEventListener("submit", async (event) => {
    event.preventDefault();
    const id = state.people[0];
    const name = el.personName.value.trim();
    if (id === undefined) return;
    clearError();
    const params = new URLSearchParams();
    if (state.index) params.set("index", state.index);
    try {
      const resp = await api(`/api/people/${id}${params.size ? `?${params}` : ""}`, {
        method: "PATCH", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ name }),
      });
      const person = await resp.json();
      peopleInfo.set(id, { ...peopleInfo.get(id), ...person });
      const label = el.peopleStrip.querySelector(`button.person[data-person="${id}"] .person-label`);
      if (label) label.textContent = person.label;
      el.personName.blur();
      showChosenPeople();
      for (const result of state.results) {
        for (const face of Array.isArray(result.faces) ? result.faces : []) if (face.person === id) face.name = person.name;
      }
      for (const button of el.results.querySelectorAll("button.result")) {
        const result = state.results[Number(button.dataset.rank) - 1];
        const who = button.querySelector('[data-testid="hit-people"]');
        if (result && who && who.textContent) who.textContent = hitPeople(result).join(", ");
      }
      setStatus(`Named ${person.label}.`);
    } catch (err) {
      showError(err.message || String(err));
    }
  });
}

function restore(historyState) {
  dismissViewer();
  clearError();
  cancelTyping();
  const s = fromUrl();
  setAddressNotes(s.notes);
  selectIndex(s.index);
  showQueryLanguages();
  el.prefix.value = s.prefix;
  el.add.value = s.add;
  el.subtract.value = s.subtract;
  showRefine(s.refine);
  state.index = s.index;
  state.prefix = s.prefix;
  state.k = s.k;
  state.people = s.people;
  state.onlyPeople = s.onlyPeople;
  showChosenPeople();
  if (s.index !== peopleShownFor()) loadPeople(s.index);
  // Open the panel where a filter is set or an address value was not understood, or where the
  // index's model must be told the query's language and none is given.
  const anyFilter = Object.keys(s.refine).length || s.prefix || s.add || s.subtract || Object.keys(s.notes).length;
  setFiltersOpen(Boolean(anyFilter) || (!el.queryLangField.hidden && !el.queryLang.value));
  showFilterCount(false);
  if (historyState && historyState.upload) {
    const file = uploadedFile(historyState.upload);
    if (file) {
      startSearch({ mode: "upload", file, index: s.index, prefix: s.prefix, add: s.add, subtract: s.subtract, k: s.k }, { how: "none" });
    } else {
      clearSearch();
      showError("This search was by an uploaded image, which the address cannot hold: choose the image again.");
    }
    return;
  }
  if (s.badImageId) {
    clearSearch();
    showFieldErrors(checkRefine(s.refine));
    showError("The address names an image id that is not a number.");
  } else if (s.imageId !== null) {
    startSearch({ mode: "similar", imageId: s.imageId, similarPath: null, index: s.index, prefix: s.prefix, add: s.add, subtract: s.subtract, k: s.k, pages: s.pages }, { how: "none" });
  } else if (s.q.trim()) {
    startSearch({ mode: "text", q: s.q.trim(), index: s.index, prefix: s.prefix, add: s.add, subtract: s.subtract, k: s.k, pages: s.pages }, { how: "none" });
  } else if (s.people.length) {
    startSearch({ mode: "people", index: s.index, prefix: s.prefix, k: s.k, pages: s.pages }, { how: "none" });
  } else {
    clearSearch();
    showFieldErrors(checkRefine(s.refine));
  }
  if (s.problems.length) showError(s.problems.join(" "));
}

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
