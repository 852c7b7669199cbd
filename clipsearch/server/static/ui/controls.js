// The search form wired up: a filter applies at once to the search on screen (a text filter once
// typing pauses), Enter searches, a new index applies, Load more, and the image chooser.

import { urlOf } from "./address.js";
import { el } from "./dom.js";
import { checkRefine, forgetAddressNote, readRefine, setAddressNotes, showFieldErrors, showFilterCount, showRefine } from "./filters.js";
import { chosenIndex, showQueryLanguages } from "./indexes.js";
import { setStatus, showError } from "./messages.js";
import { loadPeople, showChosenPeople } from "./people.js";
import { clearSearch, fieldName, loadMore, rerun, searchByFile, startSearch, terms } from "./search.js";
import { state, TEXT_FILTERS } from "./state.js";

const TYPING_PAUSE_MS = 600; // a text filter applies once typing pauses this long
let typingTimer = 0;

// A filter's pending apply is dropped (the search is submitted or restored meanwhile).
export function cancelTyping() {
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
export function wireControls() {
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
