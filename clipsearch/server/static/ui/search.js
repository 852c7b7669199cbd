// Searching: a new search started (its history entry, its filters checked), its pages fetched and
// shown, the query's context (the uploaded image, "images like"), and the search cleared.

import { urlOf } from "./address.js";
import { api } from "./api.js";
import { takenWords } from "./dates.js";
import { el } from "./dom.js";
import { checkRefine, readRefine, setFiltersOpen, showFieldErrors, showFilterCount } from "./filters.js";
import { hooks } from "./hooks.js";
import { chosenIndex } from "./indexes.js";
import { clearError, setStatus, showError } from "./messages.js";
import { request } from "./request.js";
import { render } from "./results.js";
import { DEFAULT_K, MAX_K, state } from "./state.js";
import { dateRangeWords, describe } from "./words.js";

let previewUrl = null; // blob: URL of the uploaded query image's preview

// Uploaded files by history entry: a File cannot go in the URL, but back/forward within this
// page can still find it here (a reload cannot: the page says so).
const uploads = new Map();
let uploadSeq = 0;

// The file of an upload's history entry, if this page still holds it.
export function uploadedFile(key) {
  return uploads.get(key);
}

// The arithmetic terms typed in the form (applied to text, image and "more like this" searches).
export function terms() {
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
export function startSearch(next, { how = "push", edit = null } = {}) {
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

export function fieldName(name) {
  const label = document.querySelector(`label[for="${name}"]`);
  return label ? label.textContent.trim() : name;
}

export function showQueryContext() {
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

export function clearSearch(message) {
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
export function rerun(how, edit) {
  startSearch({
    mode: state.mode, q: state.q, imageId: state.imageId, similarPath: state.similarPath, file: state.file,
    index: chosenIndex(), prefix: el.prefix.value.trim(), ...terms(), k: state.k,
  }, { how: state.mode === "upload" ? "push" : how, edit });
}

export function loadMore() {
  if (state.done || !state.mode) return Promise.resolve();
  clearError();
  return fetchPage(true);
}

export function searchByFile(file) {
  if (!file) return;
  if (file.type && !file.type.startsWith("image/")) {
    showError(`“${file.name}” is not an image (${file.type}).`);
    return;
  }
  startSearch({ mode: "upload", file, index: chosenIndex(), prefix: el.prefix.value.trim(), ...terms(), k: state.k });
}
