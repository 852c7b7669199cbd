// The results grid: one card per hit (thumbnail, score, path, caption, date, matched words, people,
// a video's moment), with day headings when sorted by date. A card's click opens the viewer.

import { hasToken } from "./api.js";
import { dayWords, takenWords, wallClock } from "./dates.js";
import { el } from "./dom.js";
import { hooks } from "./hooks.js";
import { forgetThumbnails, observeThumbnail, thumbnailUrl } from "./images.js";
import { hitPeople } from "./names.js";
import { state, THUMB_SIZE } from "./state.js";
import { momentBadge } from "./video.js";
import { formatScore, SOURCE_NAMES, whyText } from "./words.js";

export function render(results, append) {
  if (!append) {
    forgetThumbnails();
    el.results.replaceChildren();
    state.results = [];
    state.lastDay = null;
  }
  const byDay = state.refine.sort === "taken" || state.mode === "people";
  const fragment = document.createDocumentFragment();
  for (const result of results) {
    state.results.push(result);
    if (byDay) {
      // Sorted by date: a heading wherever the day changes (undated photos come last).
      const t = wallClock(result.taken);
      const day = t ? t.date.toISOString().slice(0, 10) : "undated";
      if (day !== state.lastDay) {
        state.lastDay = day;
        const item = document.createElement("li");
        item.className = "day";
        item.dataset.testid = "day";
        const heading = document.createElement("h2");
        heading.className = "day-title";
        heading.textContent = t ? dayWords.format(t.date) : "No date taken";
        item.append(heading);
        fragment.append(item);
      }
    }
    fragment.append(resultItem(result, state.results.length));
  }
  el.results.append(fragment);
}

function resultItem(result, rank) {
  const item = document.createElement("li");
  const button = document.createElement("button");
  button.type = "button";
  button.className = "result";
  button.dataset.resultId = String(result.id);
  button.dataset.rank = String(rank);
  button.setAttribute("aria-label", `${rank}. ${result.path}, score ${formatScore(result.score)}; open`);
  button.title = result.path;

  const frame = document.createElement("span");
  frame.className = "thumb";
  const img = document.createElement("img");
  img.alt = "";
  img.decoding = "async";
  img.loading = "lazy";
  img.width = THUMB_SIZE;
  img.height = THUMB_SIZE;
  img.addEventListener("error", () => button.classList.add("no-thumb"));
  frame.append(img);

  const score = document.createElement("span");
  score.className = "score";
  score.textContent = formatScore(result.score);
  score.dataset.testid = "score";
  score.title = whyText(result);
  const path = document.createElement("span");
  path.className = "path";
  path.textContent = result.path;
  const taken = document.createElement("span");
  taken.className = "taken";
  taken.dataset.testid = "taken";
  if (typeof result.taken === "string" && result.taken) {
    // The date and time the camera recorded, as ISO 8601 gives them (no zone conversion).
    taken.textContent = result.taken.slice(0, 16).replace("T", " ");
    taken.title = `Taken ${takenWords(result.taken)}${result.camera ? ` with ${result.camera}` : ""}`;
  }

  const caption = document.createElement("span");
  caption.className = "caption";
  caption.dataset.testid = "caption";
  if (typeof result.caption === "string" && result.caption) {
    // The caption that came with the image in its WebDataset shard (text only, never HTML).
    caption.textContent = result.caption;
    caption.title = result.url ? `${result.caption}\n${result.url}` : result.caption;
    button.setAttribute("aria-label", `${rank}. ${result.caption} (${result.path}), score ${formatScore(result.score)}; open`);
  }

  // The query's words found in the picture's text (file name, keywords, text in the image).
  const matched = document.createElement("span");
  matched.className = "matched";
  matched.dataset.testid = "matched";
  const found = result.matched && typeof result.matched === "object" ? Object.entries(result.matched) : [];
  if (found.length) {
    const words = [...new Set(found.flatMap(([, w]) => (Array.isArray(w) ? w : [])))];
    const share = typeof result.keyword === "number" && result.keyword < 1 ? ` (${Math.round(result.keyword * 100)}%)` : "";
    matched.textContent = words.join(", ") + share;
    matched.title = found.map(([source, w]) => `${SOURCE_NAMES[source] || source}: ${w.join(", ")}`).join("\n") +
      `\n${whyText(result)}`;
  }

  // Who is in the photo (an index built with --faces): the people of its faces, by name.
  const who = document.createElement("span");
  who.className = "who";
  who.dataset.testid = "hit-people";
  const names = hitPeople(result);
  if (names.length) {
    who.textContent = names.join(", ");
    who.title = `With ${names.join(", ")}`;
  }

  button.append(frame, score, path, caption, taken, matched, who);
  if (result.media === "video") button.append(momentBadge(result, button, rank));
  button.addEventListener("click", () => hooks.openViewer(state.results.indexOf(result), button));
  item.append(button);

  const url = thumbnailUrl(result);
  if (hasToken()) {
    img.dataset.src = url;
    observeThumbnail(img);
  } else {
    img.src = url;
  }
  return item;
}
