// Drag and drop anywhere on the page: an image dropped is searched by, with an overlay while one
// is dragged over.

import { el } from "./dom.js";
import { searchByFile } from "./search.js";

let dragDepth = 0;
const carriesFiles = (event) => event.dataTransfer && [...event.dataTransfer.types].includes("Files");

export function wireDrop() {
  window.addEventListener("dragenter", (event) => {
    if (!carriesFiles(event)) return;
    event.preventDefault();
    dragDepth += 1;
    el.dropOverlay.hidden = false;
  });
  window.addEventListener("dragover", (event) => {
    if (!carriesFiles(event)) return;
    event.preventDefault();
    event.dataTransfer.dropEffect = "copy";
  });
  window.addEventListener("dragleave", () => {
    dragDepth = Math.max(0, dragDepth - 1);
    if (dragDepth === 0) el.dropOverlay.hidden = true;
  });
  window.addEventListener("drop", (event) => {
    if (!carriesFiles(event)) return;
    event.preventDefault();
    dragDepth = 0;
    el.dropOverlay.hidden = true;
    searchByFile(event.dataTransfer.files[0]);
  });
}
