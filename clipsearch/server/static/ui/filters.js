// The filter panel: its values read, checked and shown, the notes on the address's own values,
// the count on the Filters toggle, and the panel opened or closed.

import { isDay } from "./dates.js";
import { el } from "./dom.js";
import { REFINE } from "./state.js";

// Problems with the address's own values (a select or date input cannot hold a bad one, so the
// note beside it says what was asked and left out), by field; cleared when that field is edited.
let addressNotes = {};

export function setAddressNotes(notes) {
  addressNotes = notes;
}

export function forgetAddressNote(name) {
  delete addressNotes[name];
}

function refineControls() {
  return {
    taken_after: el.takenAfter, taken_to: el.takenTo, min_score: el.minScore, sort: el.sort, mode: el.mode, media: el.media,
    query_lang: el.queryLang,
  };
}

// The refine controls' values that differ from "no condition".
export function readRefine() {
  const out = {};
  for (const [name, control] of Object.entries(refineControls())) {
    const value = control.value.trim();
    if (value && !(name === "sort" && value === "score")) out[name] = value;
  }
  return out;
}

export function showRefine(refine) {
  for (const [name, control] of Object.entries(refineControls())) {
    control.value = (refine && refine[name]) || (name === "sort" ? "score" : "");
  }
}

// What is wrong with the filters as typed, by field, in words; {} when they can be searched.
export function checkRefine(refine) {
  const problems = {};
  for (const name of ["taken_after", "taken_to"]) {
    if (refine[name] && !isDay(refine[name])) problems[name] = `“${refine[name]}” is not a day like 2023-12-24.`;
  }
  if (refine.taken_after && refine.taken_to && !problems.taken_after && !problems.taken_to && refine.taken_after > refine.taken_to) {
    problems.taken_to = `The start date (${refine.taken_after}) is after the end date (${refine.taken_to}).`;
  }
  if (refine.min_score !== undefined) {
    const value = Number(refine.min_score);
    if (!/^\s*[-+]?(\d+\.?\d*|\.\d+)\s*$/.test(refine.min_score) || !(value >= -1 && value <= 1)) {
      problems.min_score = `Min score must be a number from -1 to 1, e.g. 0.25 (not “${refine.min_score}”).`;
    }
  }
  return problems;
}

export function showFieldErrors(problems) {
  for (const name of REFINE) {
    const box = document.getElementById(`${name}-error`);
    const control = refineControls()[name];
    const message = problems[name] || addressNotes[name] || "";
    if (box) {
      box.textContent = message;
      box.hidden = !message;
    }
    if (problems[name]) control.setAttribute("aria-invalid", "true");
    else control.removeAttribute("aria-invalid");
  }
}

// How many filters are set (on the toggle), and the panel opened where one is set or wrong.
export function showFilterCount(open) {
  const set = Object.keys(readRefine()).length + [el.prefix, el.add, el.subtract].filter((c) => c.value.trim()).length;
  el.filterCount.textContent = set ? String(set) : "";
  el.filtersToggle.setAttribute("aria-label", set ? `Filters (${set} set)` : "Filters");
  if (open) setFiltersOpen(true);
}

export function setFiltersOpen(open) {
  el.filters.hidden = !open;
  el.filtersToggle.setAttribute("aria-expanded", String(open));
  el.header.classList.toggle("filters-open", open);
}

export function wireFiltersToggle() {
  el.filtersToggle.addEventListener("click", () => {
    const open = el.filters.hidden;
    setFiltersOpen(open);
    if (open) el.takenAfter.focus();
  });
}
