// Images: the thumbnail and original URLs of a result; plain <img src> without a token, blob: URLs
// fetched with the header (thumbnails lazily, as they scroll into view) with one.

import { api } from "./api.js";
import { state, THUMB_SIZE } from "./state.js";

let resultUrls = []; // blob: URLs of the thumbnails on screen (token mode), revoked on replace
let thumbObserver = null;

export async function blobUrl(url) {
  const resp = await api(url);
  return URL.createObjectURL(await resp.blob());
}

function revokeResultUrls() {
  resultUrls.forEach((url) => URL.revokeObjectURL(url));
  resultUrls = [];
}

// The grid is replaced: its thumbnails' blob: URLs go, and the lazy loader watches none of them.
export function forgetThumbnails() {
  revokeResultUrls();
  if (thumbObserver) thumbObserver.disconnect();
}

function loadThumbnail(img) {
  const url = img.dataset.src;
  if (!url || img.dataset.loading) {
    return;
  }
  img.dataset.loading = "1";
  blobUrl(url).then(
    (objectUrl) => {
      if (!img.isConnected) { // replaced by a newer search meanwhile
        URL.revokeObjectURL(objectUrl);
        return;
      }
      resultUrls.push(objectUrl);
      img.src = objectUrl;
    },
    () => img.closest(".result")?.classList.add("no-thumb"),
  );
}

export function observeThumbnail(img) {
  if (!("IntersectionObserver" in window)) {
    loadThumbnail(img);
    return;
  }
  if (thumbObserver === null) {
    thumbObserver = new IntersectionObserver(
      (entries) => {
        for (const entry of entries) {
          if (entry.isIntersecting) {
            thumbObserver.unobserve(entry.target);
            loadThumbnail(entry.target);
          }
        }
      },
      { rootMargin: "400px" },
    );
  }
  thumbObserver.observe(img);
}

export function thumbnailUrl(result) {
  if (typeof result.thumbnail_url === "string" && result.thumbnail_url) return result.thumbnail_url;
  const params = new URLSearchParams({ size: String(THUMB_SIZE) });
  if (state.index) params.set("index", state.index);
  return `/api/thumbnails/${result.id}?${params}`;
}

export function imageUrl(result) {
  if (typeof result.image_url === "string" && result.image_url) return result.image_url;
  const params = new URLSearchParams();
  if (state.index) params.set("index", state.index);
  return `/api/images/${result.id}${params.size ? `?${params}` : ""}`;
}
