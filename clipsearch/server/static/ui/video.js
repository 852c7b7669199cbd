// Videos: a hit is its best moment (the badge on its card); the viewer plays the file from it.

import { hasToken } from "./api.js";
import { el } from "./dom.js";
import { blobUrl, imageUrl, thumbnailUrl } from "./images.js";
import { showError } from "./messages.js";
import { formatScore } from "./words.js";

// A time in a video as people write it: 01:23 (1:02:03 past an hour).
function clock(seconds) {
  const total = Math.max(0, Math.floor(seconds));
  const h = Math.floor(total / 3600), m = Math.floor((total % 3600) / 60), s = total % 60;
  const two = (n) => String(n).padStart(2, "0");
  return h ? `${h}:${two(m)}:${two(s)}` : `${two(m)}:${two(s)}`;
}

// A listing without a query (a person's photos) has no moment: the time of the frame it kept.
function momentText(result) {
  if (result.start === null || result.start === undefined) return clock(result.frame_time);
  return `${clock(result.start)}–${clock(Math.ceil(result.end))}`;
}

// The badge on a video's result: its best moment, and how many more it holds.
export function momentBadge(result, button, rank) {
  const badge = document.createElement("span");
  badge.className = "moment";
  badge.dataset.testid = "moment";
  const more = Array.isArray(result.moments) && result.moments.length > 1 ? ` +${result.moments.length - 1}` : "";
  badge.textContent = `▶ ${momentText(result)}${more}`;
  badge.title = `Video: best frame at ${clock(result.frame_time)}` +
    (Array.isArray(result.moments) ? `\n${result.moments.map((m) => `${clock(m.start)}–${clock(Math.ceil(m.end))}`).join(", ")}` : "");
  button.setAttribute("aria-label", `${rank}. ${result.path}, video at ${momentText(result)}, score ${formatScore(result.score)}; open`);
  return badge;
}

export function closeViewerVideo() {
  el.viewerStage.querySelector("video")?.remove();
  el.viewerStage.querySelector(".video-note")?.remove();
  el.viewerImage.hidden = false;
}

// The video from its best moment (the URL's #t=start,end); a codec this browser cannot play
// shows the moment's frame instead, with a note to download the file. keepUrl(url) is given the
// blob: URL it fetched (token mode), for the viewer to revoke when it closes.
export async function playVideo(result, keepUrl) {
  const video = document.createElement("video");
  video.dataset.testid = "viewer-video";
  video.controls = true;
  video.muted = true; // browsers autoplay only muted videos
  video.autoplay = true;
  video.playsInline = true;
  video.preload = "metadata";
  const fragment = result.start === null || result.start === undefined ? `#t=${result.frame_time}` : `#t=${result.start},${result.end}`;
  const fallback = () => {
    if (!video.isConnected) return;
    video.remove();
    const note = document.createElement("p");
    note.className = "video-note";
    note.dataset.testid = "video-note";
    note.textContent = `This browser cannot play this video: the frame at ${clock(result.frame_time)} is shown; download it to watch.`;
    el.viewerStage.append(note);
    el.viewerImage.hidden = false;
    const frameUrl = thumbnailUrl(result).replace(/size=\d+/, "size=1024");
    if (hasToken()) blobUrl(frameUrl).then((u) => { keepUrl(u); el.viewerImage.src = u; }, () => {});
    else el.viewerImage.src = frameUrl;
  };
  video.addEventListener("error", fallback);
  el.viewerImage.hidden = true;
  el.viewerStage.append(video);
  if (hasToken()) {
    try {
      const objectUrl = await blobUrl(imageUrl(result));
      if (!video.isConnected) {
        URL.revokeObjectURL(objectUrl);
        return;
      }
      keepUrl(objectUrl);
      video.src = objectUrl + fragment;
    } catch (err) {
      showError(err.message || String(err));
    }
  } else {
    video.src = result.video_url || imageUrl(result) + fragment;
  }
}
