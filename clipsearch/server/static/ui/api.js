// The HTTP API client: fetch with the token when the server asks for one (the token form), and
// the server's error in words.

import { el } from "./dom.js";

const TOKEN_KEY = "clipsearch.token";
let token = sessionStorage.getItem(TOKEN_KEY);

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function errorMessage(resp) {
  let text = "";
  try {
    text = await resp.text();
    const body = JSON.parse(text);
    if (body && typeof body.error === "string" && body.error) {
      return body.error;
    }
  } catch (_) {
    // not JSON: fall through to the status line
  }
  const line = text && text.length < 200 && !text.includes("<") ? `: ${text.trim()}` : "";
  return `The server answered ${resp.status} ${resp.statusText || ""}`.trim() + line;
}

let tokenWaiters = null; // one token form at a time, however many requests asked for it

function askForToken(refused) {
  if (tokenWaiters === null) {
    tokenWaiters = [];
    el.tokenError.hidden = !refused;
    el.tokenError.textContent = refused ? "That token was refused. Try again." : "";
    el.tokenInput.value = "";
    if (!el.tokenDialog.open) {
      el.tokenDialog.showModal();
    }
    el.tokenInput.focus();
  }
  return new Promise((resolve) => tokenWaiters.push(resolve));
}

// Whether requests carry a token (images are then fetched as blob: URLs, not by <img src>).
export function hasToken() {
  return Boolean(token);
}

// The token form: it answers every request waiting for a token.
export function wireTokenForm() {
  el.tokenForm.addEventListener("submit", (event) => {
    event.preventDefault();
    const value = el.tokenInput.value.trim();
    if (!value) {
      el.tokenError.textContent = "Enter the token.";
      el.tokenError.hidden = false;
      return;
    }
    token = value;
    sessionStorage.setItem(TOKEN_KEY, token);
    el.tokenDialog.close();
    const waiters = tokenWaiters || [];
    tokenWaiters = null;
    waiters.forEach((resolve) => resolve());
  });

  // The token form cannot be dismissed with Escape: nothing works without the token.
  el.tokenDialog.addEventListener("cancel", (event) => event.preventDefault());
}

export async function api(path, options = {}) {
  for (;;) {
    const headers = new Headers(options.headers || {});
    const sent = token;
    if (sent) {
      headers.set("Authorization", `Bearer ${sent}`);
    }
    let resp;
    try {
      resp = await fetch(path, { ...options, headers });
    } catch (err) {
      throw new ApiError(0, `Could not reach the server (${err.message}).`);
    }
    if (resp.status !== 401) {
      if (!resp.ok) {
        throw new ApiError(resp.status, await errorMessage(resp));
      }
      return resp;
    }
    // 401: ask once (another request may already have been given a new token meanwhile).
    if (token && token !== sent) {
      continue;
    }
    const refused = Boolean(sent);
    if (refused) {
      token = null;
      sessionStorage.removeItem(TOKEN_KEY);
    }
    await askForToken(refused);
  }
}
