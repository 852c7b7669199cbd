// A search, a score and a path in words: the status line's, the result cards' and the viewer's.

import { peopleWords } from "./names.js";

export function describe(s) {
  const terms = (s.add ? ` + “${s.add}”` : "") + (s.subtract ? ` − “${s.subtract}”` : "");
  const names = peopleWords(s.people || []);
  if (s.mode === "people") return `photos of ${names}${s.onlyPeople ? " alone" : ""}`;
  const withWhom = names ? ` with ${names}${s.onlyPeople ? " and nobody else" : ""}` : "";
  if (s.mode === "text") return `“${s.q}”${terms}${withWhom}`;
  if (s.mode === "similar") return `images like ${s.similarPath ? baseName(s.similarPath) : `image ${s.imageId}`}${terms}${withWhom}`;
  return `${s.file && s.file.name ? `“${s.file.name}”` : "the chosen image"}${terms}${withWhom}`;
}

export function dateRangeWords(refine) {
  if (refine.taken_after && refine.taken_to) return `taken from ${refine.taken_after} to ${refine.taken_to} (inclusive)`;
  if (refine.taken_after) return `taken on or after ${refine.taken_after}`;
  return `taken up to ${refine.taken_to} (inclusive)`;
}

// Why a hit stands where it does: its similarity and, where the query's words took part,
// the share of them its text matched and the fused score the list is ordered by.
export function whyText(result) {
  const parts = [`similarity ${formatScore(result.score)}`];
  if (typeof result.keyword === "number") parts.push(`words ${Math.round(result.keyword * 100)}%`);
  if (typeof result.fused === "number") parts.push(`fused ${result.fused.toFixed(2)}`);
  return parts.join(" · ");
}

export function formatScore(score) {
  return typeof score === "number" ? score.toFixed(3) : "";
}

export function baseName(path) {
  const parts = String(path).split("/");
  return parts[parts.length - 1] || String(path);
}

export function folderOf(path) {
  const cut = String(path).lastIndexOf("/");
  return cut > 0 ? String(path).slice(0, cut + 1) : "";
}

// How the sources of matched words are named in the UI.
export const SOURCE_NAMES = { path: "file name", embedded: "photo keywords", caption: "caption", ocr: "text in the image" };
