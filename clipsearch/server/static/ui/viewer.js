// The viewer: one result on the whole screen (fitted, or at its own size), its details,
// previous/next, copy the path, and "more like this".

import { hasToken } from "./api.js";
import { takenWords } from "./dates.js";
import { el } from "./dom.js";
import { blobUrl, imageUrl } from "./images.js";
import { showError } from "./messages.js";
import { hitPeople } from "./names.js";
import { loadMore, startSearch, terms } from "./search.js";
import { state } from "./state.js";
import { closeViewerVideo, playVideo } from "./video.js";
import { baseName, folderOf, whyText } from "./words.js";

const MAX_UPSCALE = 2; // the viewer never blows a small picture up past twice its own pixels

let viewerUrl = null; // blob: URL of the original in the viewer (token mode)
let viewerPos = -1; // the index in state.results of the picture in the viewer
let viewerOpener = null;
let viewerActual = false; // the viewer shows the picture at its own size (else fitted)
let swipeStart = null; // where a swipe began

const keepViewerUrl = (url) => {
  viewerUrl = url;
};

function closeViewerImage() {
  if (viewerUrl) {
    URL.revokeObjectURL(viewerUrl);
    viewerUrl = null;
  }
  el.viewerImage.removeAttribute("src");
  el.viewerImage.style.width = "";
  el.viewerImage.style.height = "";
}

// The picture fitted to the stage, but never past MAX_UPSCALE times its own pixels (a 128-px
// original blown up to fill a screen is a blur); or at its own size, to be scrolled.
function fitViewerImage() {
  const img = el.viewerImage;
  if (!img.naturalWidth) return;
  const box = el.viewerStage.getBoundingClientRect();
  const fit = Math.min(MAX_UPSCALE, box.width / img.naturalWidth, box.height / img.naturalHeight);
  const scale = viewerActual ? 1 : fit;
  img.style.width = `${Math.floor(img.naturalWidth * scale)}px`;
  img.style.height = `${Math.floor(img.naturalHeight * scale)}px`;
  el.viewerStage.classList.toggle("actual", viewerActual);
}

function gpsWords(gps) {
  const [lat, lon] = gps;
  return `${Math.abs(lat).toFixed(5)}° ${lat >= 0 ? "N" : "S"}, ${Math.abs(lon).toFixed(5)}° ${lon >= 0 ? "E" : "W"}`;
}

export function updateViewerNav() {
  if (!el.viewer.open) return;
  const total = state.results.length;
  el.viewerPrev.disabled = viewerPos <= 0;
  el.viewerNext.disabled = viewerPos >= total - 1 && state.done;
  el.viewerPosition.textContent = `${viewerPos + 1} of ${total}${state.done ? "" : "+"}`;
}

export async function openViewer(pos, opener) {
  const result = state.results[pos];
  if (!result) return;
  viewerPos = pos;
  if (opener) viewerOpener = opener;
  viewerActual = false;
  closeViewerImage();
  closeViewerVideo();
  el.viewerName.textContent = baseName(result.path);
  el.viewerFolder.textContent = folderOf(result.path);
  const when = typeof result.taken === "string" && result.taken ? `Taken ${takenWords(result.taken)}` : "";
  el.viewerTaken.textContent = when + (result.camera ? `${when ? " with" : "Taken with"} ${result.camera}` : "");
  el.viewerTaken.title = result.taken ? `${result.taken} (the camera's clock)` : "";
  const gps = Array.isArray(result.gps) && result.gps.length === 2 && result.gps.every(Number.isFinite) ? result.gps : null;
  el.viewerGps.hidden = !gps;
  el.viewerGps.replaceChildren();
  if (gps) {
    const [lat, lon] = gps;
    const link = document.createElement("a");
    link.href = `https://www.openstreetmap.org/?mlat=${lat}&mlon=${lon}#map=16/${lat}/${lon}`;
    link.target = "_blank";
    link.rel = "noopener";
    link.dataset.testid = "viewer-map";
    link.textContent = "show on a map";
    el.viewerGps.append(`At ${gpsWords(gps)} · `, link);
  }
  el.viewerScore.textContent = whyText(result);
  const withWhom = hitPeople(result);
  el.viewerExtra.textContent = [
    withWhom.length ? `With ${withWhom.join(", ")}` : "",
    result.width && result.height ? `${result.width} × ${result.height} pixels` : "",
    result.caption ? `“${result.caption}”` : "",
    result.url ? `from ${result.url}` : "",
  ].filter(Boolean).join(" · ");
  el.viewerImage.alt = result.caption || baseName(result.path);
  const url = imageUrl(result);
  el.viewerOriginal.href = url;
  el.viewerOriginal.download = baseName(result.path);
  el.copyPath.textContent = "Copy path";
  if (!el.viewer.open) {
    el.viewer.showModal();
    el.moreLikeThis.focus();
  }
  updateViewerNav();
  if (result.media === "video") {
    playVideo(result, keepViewerUrl);
    return;
  }
  if (hasToken()) {
    try {
      const objectUrl = await blobUrl(url);
      if (state.results[viewerPos] !== result || !el.viewer.open) {
        URL.revokeObjectURL(objectUrl);
        return;
      }
      viewerUrl = objectUrl;
      el.viewerImage.src = objectUrl;
      el.viewerOriginal.href = objectUrl;
    } catch (err) {
      showError(err.message || String(err));
    }
  } else {
    el.viewerImage.src = url;
  }
}

// Next past the last result shown loads the next page first, when there is one.
async function stepViewer(delta) {
  let pos = viewerPos + delta;
  if (pos < 0) return;
  if (pos >= state.results.length) {
    if (state.done) return;
    await loadMore();
    if (pos >= state.results.length) return;
  }
  openViewer(pos, null);
}

async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch (_) {
    // No clipboard API off a secure origin (http:// on a LAN address): the old way.
    const area = Object.assign(document.createElement("textarea"), { value: text, readOnly: true });
    area.style.position = "fixed";
    area.style.opacity = "0";
    el.viewer.append(area);
    area.select();
    let ok = false;
    try {
      ok = document.execCommand("copy");
    } catch (__) {
      ok = false;
    }
    area.remove();
    return ok;
  }
}

// The viewer closed for a restored search (back/forward): focus goes back to no card.
export function dismissViewer() {
  if (el.viewer.open) {
    viewerOpener = null;
    viewerPos = -1;
    el.viewer.close();
  }
}

// The viewer's controls: the picture's size, previous/next (buttons, arrow keys, swipes), copy
// the path, close, and "more like this".
export function wireViewer() {
  el.viewerImage.addEventListener("load", fitViewerImage);
  window.addEventListener("resize", () => { if (el.viewer.open) fitViewerImage(); });
  el.viewerImage.addEventListener("click", () => {
    viewerActual = !viewerActual;
    fitViewerImage();
  });

  el.viewerPrev.addEventListener("click", () => stepViewer(-1));
  el.viewerNext.addEventListener("click", () => stepViewer(1));
  el.viewer.addEventListener("keydown", (event) => {
    if (event.altKey || event.ctrlKey || event.metaKey) return;
    if (event.key === "ArrowLeft") {
      event.preventDefault();
      stepViewer(-1);
    } else if (event.key === "ArrowRight") {
      event.preventDefault();
      stepViewer(1);
    }
  });

  // Swipes (touch, pen or a mouse drag): a mostly horizontal move of 50 px or more.
  el.viewerStage.addEventListener("pointerdown", (event) => {
    swipeStart = viewerActual ? null : { x: event.clientX, y: event.clientY };
  });
  el.viewerStage.addEventListener("pointercancel", () => { swipeStart = null; });
  el.viewerStage.addEventListener("pointerup", (event) => {
    if (!swipeStart) return;
    const dx = event.clientX - swipeStart.x;
    const dy = event.clientY - swipeStart.y;
    swipeStart = null;
    if (Math.abs(dx) >= 50 && Math.abs(dx) > 1.5 * Math.abs(dy)) stepViewer(dx < 0 ? 1 : -1);
  });

  el.copyPath.addEventListener("click", async () => {
    const result = state.results[viewerPos];
    if (!result) return;
    const ok = await copyText(result.path);
    el.copyPath.textContent = ok ? "Copied" : "Copy failed";
    if (!ok) {
      // Select the path on screen, so Ctrl+C or a long press copies it.
      const range = document.createRange();
      range.selectNodeContents(el.viewerFolder.textContent ? el.viewerFolder : el.viewerName);
      getSelection().removeAllRanges();
      getSelection().addRange(range);
    }
  });

  el.viewer.addEventListener("close", () => {
    closeViewerImage();
    // Focus returns to the card of the picture last shown (previous/next may have moved on).
    const shown = state.results[viewerPos];
    const card = shown ? el.results.querySelector(`[data-result-id="${shown.id}"]`) : null;
    const target = card || viewerOpener;
    // After the dialog's own focus restoration (to the card it was opened from), not before it.
    if (target) setTimeout(() => target.isConnected && target.focus(), 0);
    viewerOpener = null;
  });
  el.viewerClose.addEventListener("click", () => el.viewer.close());

  el.moreLikeThis.addEventListener("click", () => {
    const result = state.results[viewerPos];
    if (!result) return;
    viewerPos = -1;
    viewerOpener = null;
    el.viewer.close();
    startSearch({ mode: "similar", imageId: result.id, similarPath: result.path, index: state.index, prefix: state.prefix, ...terms(), k: state.k });
    // The new results start at the top of the page, below the header, not scrolled under it.
    window.scrollTo({ top: 0 });
    el.results.focus({ preventScroll: true });
  });
}
