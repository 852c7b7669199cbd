// A search as the HTTP request that asks for one page of it: GET with the query in the URL, POST
// with JSON (more like this) or a form (an uploaded image).

import { nextDay } from "./dates.js";

// The API's names for the filters: taken_to (inclusive) becomes taken_before, the next day.
function apiRefine(refine) {
  const out = { ...refine };
  delete out.taken_to;
  if (refine.taken_to) out.taken_before = nextDay(refine.taken_to);
  return out;
}

export function request(s, k, offset) {
  const refine = apiRefine(s.refine || {});
  const people = (s.people || []).map(String);
  const only = s.onlyPeople && people.length;
  if (s.mode === "people") {
    // No query: the photos of the chosen people, newest first (no score, so no cut-off or mode).
    const params = new URLSearchParams({ k: String(k), offset: String(offset) });
    if (s.index) params.set("index", s.index);
    if (s.prefix) params.set("path_prefix", s.prefix);
    for (const id of people) params.append("person", id);
    if (only) params.set("only_people", "true");
    for (const name of ["taken_after", "taken_before", "media"]) if (refine[name]) params.set(name, refine[name]);
    return [`/api/search?${params}`, { method: "GET" }];
  }
  if (s.mode === "text") {
    const params = new URLSearchParams({ q: s.q, k: String(k), offset: String(offset) });
    if (s.index) params.set("index", s.index);
    if (s.prefix) params.set("path_prefix", s.prefix);
    if (s.add) params.set("add", s.add);
    if (s.subtract) params.set("subtract", s.subtract);
    for (const [name, value] of Object.entries(refine)) params.set(name, value);
    for (const id of people) params.append("person", id);
    if (only) params.set("only_people", "true");
    return [`/api/search?${params}`, { method: "GET" }];
  }
  if (s.mode === "similar") {
    const filters = s.prefix ? { path_prefix: [s.prefix] } : {};
    if (refine.taken_after) filters.taken_after = refine.taken_after;
    if (refine.taken_before) filters.taken_before = refine.taken_before;
    if (refine.media) filters.media = refine.media;
    if (people.length) filters.person = people;
    if (only) filters.only_people = true;
    const body = { image_id: s.imageId, k, offset };
    if (s.index) body.index = s.index;
    if (Object.keys(filters).length) body.filters = filters;
    if (refine.min_score) body.min_score = Number(refine.min_score);
    if (refine.sort) body.sort = refine.sort;
    if (refine.query_lang) body.query_lang = refine.query_lang;
    if (s.add) body.add = [s.add];
    if (s.subtract) body.subtract = [s.subtract];
    return ["/api/search", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) }];
  }
  const form = new FormData();
  form.append("image", s.file, s.file.name || "query-image");
  form.append("k", String(k));
  form.append("offset", String(offset));
  if (s.index) form.append("index", s.index);
  if (s.prefix) form.append("path_prefix", s.prefix);
  if (s.add) form.append("add", s.add);
  if (s.subtract) form.append("subtract", s.subtract);
  for (const id of people) form.append("person", id);
  if (only) form.append("only_people", "true");
  // An image query ranks by the picture alone: the text mode is not sent with it.
  for (const [name, value] of Object.entries(refine)) if (name !== "mode") form.append(name, value);
  return ["/api/search", { method: "POST", body: form }];
}
