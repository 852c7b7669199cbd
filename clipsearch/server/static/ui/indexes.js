// The index picker: the served indexes (GET /api/indexes), the one chosen, and the query-language
// control for a model that needs one.

import { api } from "./api.js";
import { el } from "./dom.js";
import { setFiltersOpen } from "./filters.js";

// Each served index's query languages (NLLB-CLIP's FLORES-200 codes; none for most models).
const queryLanguages = new Map();

// The language control shows where the chosen index's model needs one, with its codes.
export function showQueryLanguages() {
  const codes = queryLanguages.get(el.index.value) || [];
  el.queryLangField.hidden = codes.length === 0;
  el.queryLangs.replaceChildren(...codes.map((code) => Object.assign(document.createElement("option"), { value: code })));
  if (codes.length && !el.queryLang.value && codes.includes("eng_Latn")) el.queryLang.placeholder = "eng_Latn";
  // A model that must be told the query's language: its control in view until one is given.
  if (codes.length && !el.queryLang.value) setFiltersOpen(true);
}

export async function loadIndexes() {
  const resp = await api("/api/indexes");
  const indexes = await resp.json();
  el.index.replaceChildren();
  queryLanguages.clear();
  for (const info of indexes) {
    queryLanguages.set(info.name, Array.isArray(info.query_languages) ? info.query_languages : []);
    const option = document.createElement("option");
    option.value = info.name;
    option.textContent = typeof info.count === "number" ? `${info.name} (${info.count} images)` : info.name;
    el.index.append(option);
  }
  el.indexLabel.hidden = indexes.length <= 1;
  showQueryLanguages();
}

export function selectIndex(name) {
  if (!name) {
    el.index.selectedIndex = el.index.options.length ? 0 : -1;
    return;
  }
  if (![...el.index.options].some((option) => option.value === name)) {
    // An index named in a link but not served: keep it, so the server's 404 says so.
    const option = document.createElement("option");
    option.value = name;
    option.textContent = name;
    el.index.append(option);
  }
  el.index.value = name;
}

// The index to send: none when the server serves one (its default), else the picked one.
export function chosenIndex() {
  return el.index.options.length > 1 ? el.index.value : "";
}
