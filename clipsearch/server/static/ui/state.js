// The search on screen and the constants every part of the page shares: nothing here touches
// the page or the network.

export const DEFAULT_K = 24;
export const MAX_K = 1000;
export const THUMB_SIZE = 256;

// The filters by their address names. taken_to is the page's own: the last day included
// (the API's taken_before is exclusive, so the page sends the next day's start).
export const REFINE = ["taken_after", "taken_to", "min_score", "sort", "mode", "media", "query_lang"];
export const TEXT_FILTERS = new Set(["path_prefix", "add", "subtract", "min_score", "query_lang"]);

// The search on screen. mode: "text" (q), "similar" (imageId: more like this), "upload" (file)
// or "people" (no query: the photos of the chosen people, newest first).
export const state = {
  people: [], // the person filter: the people's numbers (all of them must be in a photo)
  onlyPeople: false, // ... and nobody else
  mode: null,
  q: "",
  imageId: null,
  file: null,
  index: "",
  prefix: "",
  add: "", // query arithmetic: a term added to and one subtracted from any query
  subtract: "",
  k: DEFAULT_K,
  pages: 1, // pages loaded ("Load more"), kept in the address so a reload shows as many
  refine: {},
  done: true,
  generation: 0, // bumped by every new search, so a late answer to an old one is dropped
  results: [],
  lastDay: null, // the day heading the grid ends with (sorted by date)
};
