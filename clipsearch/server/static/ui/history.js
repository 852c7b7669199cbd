// History: back / forward / reload restore the search the address (and the history entry) holds.

import { fromUrl } from "./address.js";
import { cancelTyping } from "./controls.js";
import { el } from "./dom.js";
import { checkRefine, setAddressNotes, setFiltersOpen, showFieldErrors, showFilterCount, showRefine } from "./filters.js";
import { selectIndex, showQueryLanguages } from "./indexes.js";
import { clearError, showError } from "./messages.js";
import { loadPeople, peopleShownFor, showChosenPeople } from "./people.js";
import { clearSearch, startSearch, uploadedFile } from "./search.js";
import { state } from "./state.js";
import { dismissViewer } from "./viewer.js";

export function restore(historyState) {
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
