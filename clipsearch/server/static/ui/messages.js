// The page's error line and status line.

import { el } from "./dom.js";

export function showError(message) {
  el.error.textContent = message;
  el.error.hidden = false;
}

export function clearError() {
  el.error.textContent = "";
  el.error.hidden = true;
}

export function setStatus(message) {
  el.status.textContent = message;
}
