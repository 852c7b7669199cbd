// People: the strip of faces, the person filter's chips, the person page, and renaming in place.

import { urlOf } from "./address.js";
import { api, hasToken } from "./api.js";
import { el } from "./dom.js";
import { blobUrl } from "./images.js";
import { chosenIndex } from "./indexes.js";
import { clearError, setStatus, showError } from "./messages.js";
import { hitPeople, peopleInfo, personLabel } from "./names.js";
import { clearSearch, rerun, startSearch } from "./search.js";
import { state } from "./state.js";
import { describe } from "./words.js";

let shownPeopleOf = null; // the index whose people the strip shows

export function peopleShownFor() {
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

export async function loadPeople(index) {
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

export function showChosenPeople() {
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
export function wirePeople() {
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
