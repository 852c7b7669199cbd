// The search in the address bar: a search written as a URL (urlOf), and read back with what
// could not be used said in words (fromUrl).

import { isDay, previousDay } from "./dates.js";
import { DEFAULT_K, MAX_K, REFINE } from "./state.js";

export function urlOf(s) {
  const params = new URLSearchParams();
  if (s.mode === "text") {
    params.set("q", s.q);
  } else if (s.mode === "similar") {
    params.set("image_id", String(s.imageId));
  }
  if (s.index) params.set("index", s.index);
  if (s.prefix) params.set("path_prefix", s.prefix);
  if (s.add) params.set("add", s.add);
  if (s.subtract) params.set("subtract", s.subtract);
  for (const [name, value] of Object.entries(s.refine || {})) params.set(name, value);
  for (const id of s.people || []) params.append("person", String(id));
  if (s.onlyPeople && (s.people || []).length) params.set("only_people", "true");
  if (s.k !== DEFAULT_K) params.set("k", String(s.k));
  if (s.mode && s.pages > 1) params.set("pages", String(s.pages));
  const query = params.toString();
  return query ? `${location.pathname}?${query}` : location.pathname;
}

const SORT_WORDS = { score: "best match", taken: "newest photo" };
const MODE_WORDS = { "": "pictures and words", vector: "pictures only", keyword: "words only" };
// The API's media filter: photos, videos (each at its best moments) or both (no filter).
const MEDIA_WORDS = { "": "photos and videos", image: "photos only", video: "videos only" };

// Read a search from the address (page load, reload, back/forward, a shared link). What cannot
// be used is reported in `notes` (by field, beside its control) or `problems` (the page's error
// line), never dropped silently.
export function fromUrl() {
  const params = new URLSearchParams(location.search);
  const notes = {};
  const problems = [];
  const whole = (name, low, high, fallback) => {
    const raw = params.get(name);
    if (raw === null) return fallback;
    if (/^\d+$/.test(raw) && Number(raw) >= low && Number(raw) <= high) return Number(raw);
    problems.push(`The address's ${name}=${raw} is not a whole number from ${low} to ${high}: ${fallback} used instead.`);
    return fallback;
  };
  const refine = {};
  for (const name of REFINE) {
    const raw = params.get(name);
    if (raw !== null && raw !== "") refine[name] = raw;
  }
  // An older address's taken_before (exclusive) is the day before, included.
  const before = params.get("taken_before");
  if (before && !refine.taken_to) {
    if (isDay(before)) refine.taken_to = previousDay(before);
    else refine.taken_to = before;
  }
  for (const name of ["taken_after", "taken_to"]) {
    if (refine[name] !== undefined && !isDay(refine[name])) {
      notes[name] = `The address's date “${refine[name]}” is not a day like 2023-12-24: left out.`;
      delete refine[name];
    }
  }
  if (refine.sort !== undefined && !(refine.sort in SORT_WORDS)) {
    notes.sort = `The address's sort “${refine.sort}” is not one of ${Object.keys(SORT_WORDS).join(", ")}: sorted by best match.`;
    delete refine.sort;
  }
  if (refine.media === "all") delete refine.media; // the API's word for no filter
  if (refine.media !== undefined && !(refine.media in MEDIA_WORDS)) {
    notes.media = `The address's media “${refine.media}” is not one of image, video, all: photos and videos shown.`;
    delete refine.media;
  }
  if (refine.mode !== undefined && !(refine.mode in MODE_WORDS)) {
    notes.mode = `The address's mode “${refine.mode}” is not one of vector, keyword: pictures and words used.`;
    delete refine.mode;
  }
  const imageId = params.get("image_id");
  return {
    q: params.get("q") || "",
    imageId: imageId !== null && /^\d+$/.test(imageId) ? Number(imageId) : null,
    badImageId: imageId !== null && !/^\d+$/.test(imageId),
    index: params.get("index") || "",
    prefix: params.get("path_prefix") || "",
    add: params.get("add") || "",
    subtract: params.get("subtract") || "",
    people: [...new Set(params.getAll("person").filter((v) => /^\d+$/.test(v)).map(Number))],
    onlyPeople: params.get("only_people") === "true",
    k: whole("k", 1, MAX_K, DEFAULT_K),
    pages: whole("pages", 1, 100, 1),
    refine,
    notes,
    problems,
  };
}
