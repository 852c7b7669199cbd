// clipsearch web UI: plain JavaScript over the HTTP API (GET/POST /api/search, /api/indexes,
// /api/thumbnails, /api/images). No framework and nothing from a CDN, so it works offline and
// under the server's CSP (script-src 'self', no inline code).
"use strict";

(() => {
  const DEFAULT_K = 24;
  const MAX_K = 1000;
  const THUMB_SIZE = 256;
  const TOKEN_KEY = "clipsearch.token";

  const $ = (selector) => document.querySelector(selector);
  const el = {
    form: $('[data-testid="search-form"]'),
    q: $('input[name="q"]'),
    indexLabel: $(".index-picker"),
    index: $('select[name="index"]'),
    prefix: $('input[name="path_prefix"]'),
    add: $('input[name="add"]'),
    subtract: $('input[name="subtract"]'),
    takenAfter: $('input[name="taken_after"]'),
    takenBefore: $('input[name="taken_before"]'),
    minScore: $('input[name="min_score"]'),
    queryLangLabel: $(".query-lang"),
    queryLang: $('input[name="query_lang"]'),
    queryLangs: $("#query-langs"),
    sort: $('select[name="sort"]'),
    mode: $('select[name="mode"]'),
    file: $('input[name="image"]'),
    hint: $('[data-testid="hint"]'),
    queryImage: $('[data-testid="query-image"]'),
    queryPreview: $('[data-testid="query-image-preview"]'),
    similarNote: $('[data-testid="similar-note"]'),
    error: $('[data-testid="error"]'),
    status: $('[data-testid="status"]'),
    results: $('[data-testid="results"]'),
    more: $('[data-testid="load-more"]'),
    viewer: $('[data-testid="viewer"]'),
    viewerImage: $('[data-testid="viewer-image"]'),
    viewerPath: $('[data-testid="viewer-path"]'),
    viewerScore: $('[data-testid="viewer-score"]'),
    viewerOriginal: $('[data-testid="viewer-original"]'),
    moreLikeThis: $('[data-testid="more-like-this"]'),
    viewerClose: $('[data-testid="viewer-close"]'),
    tokenDialog: $('[data-testid="token-dialog"]'),
    tokenForm: $('[data-testid="token-form"]'),
    tokenInput: $('[data-testid="token-input"]'),
    tokenError: $('[data-testid="token-error"]'),
    dropOverlay: $('[data-testid="drop-overlay"]'),
  };

  // The search on screen. mode: "text" (q), "similar" (imageId: more like this) or "upload" (file).
  const state = {
    mode: null,
    q: "",
    imageId: null,
    file: null,
    index: "",
    prefix: "",
    add: "", // query arithmetic: a term added to and one subtracted from any query
    subtract: "",
    k: DEFAULT_K,
    // Date filters, the relevance cut-off and the order, by their API names (from the form).
    refine: {},
    offset: 0,
    done: true,
    generation: 0, // bumped by every new search, so a late answer to an old one is dropped
    results: [],
  };
  let token = sessionStorage.getItem(TOKEN_KEY);
  let resultUrls = []; // blob: URLs of the thumbnails on screen (token mode), revoked on replace
  let viewerUrl = null; // blob: URL of the original in the viewer (token mode)
  let viewerResult = null;
  let viewerOpener = null;
  let previewUrl = null; // blob: URL of the uploaded query image's preview
  let thumbObserver = null;
  // Uploaded files by history entry: a File cannot go in the URL, but back/forward within this
  // page can still find it here (a reload cannot: the page says so).
  const uploads = new Map();
  let uploadSeq = 0;

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  // ---- messages -------------------------------------------------------------------------

  function showError(message) {
    el.error.textContent = message;
    el.error.hidden = false;
  }

  function clearError() {
    el.error.textContent = "";
    el.error.hidden = true;
  }

  function setStatus(message) {
    el.status.textContent = message;
  }

  // ---- the API, with the token when one is needed ---------------------------------------

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

  async function api(path, options = {}) {
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

  // ---- images: plain <img src> without a token, blob: URLs fetched with the header with one ----

  async function blobUrl(url) {
    const resp = await api(url);
    return URL.createObjectURL(await resp.blob());
  }

  function revokeResultUrls() {
    resultUrls.forEach((url) => URL.revokeObjectURL(url));
    resultUrls = [];
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

  function observeThumbnail(img) {
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

  // ---- the index picker ----------------------------------------------------------------

  // Each served index's query languages (NLLB-CLIP's FLORES-200 codes; none for most models).
  const queryLanguages = new Map();

  // The language control shows where the chosen index's model needs one, with its codes.
  function showQueryLanguages() {
    const codes = queryLanguages.get(el.index.value) || [];
    el.queryLangLabel.hidden = codes.length === 0;
    el.queryLangs.replaceChildren(...codes.map((code) => Object.assign(document.createElement("option"), { value: code })));
    if (codes.length && !el.queryLang.value && codes.includes("eng_Latn")) el.queryLang.placeholder = "eng_Latn";
  }

  async function loadIndexes() {
    const resp = await api("/api/indexes");
    const indexes = await resp.json();
    el.index.replaceChildren();
    queryLanguages.clear();
    for (const info of indexes) {
      queryLanguages.set(info.name, Array.isArray(info.query_languages) ? info.query_languages : []);
      const option = document.createElement("option");
      option.value = info.name;
      option.textContent = typeof info.count === "number" ? `${info.name} (${info.count} images)` : info.name;
      el.index.append(option);
    }
    el.indexLabel.hidden = indexes.length <= 1;
    showQueryLanguages();
  }

  function selectIndex(name) {
    if (!name) {
      el.index.selectedIndex = el.index.options.length ? 0 : -1;
      return;
    }
    if (![...el.index.options].some((option) => option.value === name)) {
      // An index named in a link but not served: keep it, so the server's 404 says so.
      const option = document.createElement("option");
      option.value = name;
      option.textContent = name;
      el.index.append(option);
    }
    el.index.value = name;
  }

  // The index to send: none when the server serves one (its default), else the picked one.
  function chosenIndex() {
    return el.index.options.length > 1 ? el.index.value : "";
  }

  // ---- the URL ---------------------------------------------------------------------------

  function urlOf(s) {
    const params = new URLSearchParams();
    if (s.mode === "text") {
      params.set("q", s.q);
    } else if (s.mode === "similar") {
      params.set("image_id", String(s.imageId));
    }
    if (s.index) {
      params.set("index", s.index);
    }
    if (s.prefix) {
      params.set("path_prefix", s.prefix);
    }
    if (s.add) params.set("add", s.add);
    if (s.subtract) params.set("subtract", s.subtract);
    for (const [name, value] of Object.entries(s.refine || {})) params.set(name, value);
    if (s.k !== DEFAULT_K) {
      params.set("k", String(s.k));
    }
    const query = params.toString();
    return query ? `${location.pathname}?${query}` : location.pathname;
  }

  // Read a search from the address (page load, reload, back/forward, a shared link).
  function fromUrl() {
    const params = new URLSearchParams(location.search);
    const k = Number.parseInt(params.get("k") || "", 10);
    const imageId = params.get("image_id");
    return {
      q: params.get("q") || "",
      imageId: imageId !== null && /^\d+$/.test(imageId) ? Number(imageId) : null,
      badImageId: imageId !== null && !/^\d+$/.test(imageId),
      index: params.get("index") || "",
      prefix: params.get("path_prefix") || "",
      add: params.get("add") || "",
      subtract: params.get("subtract") || "",
      k: Number.isInteger(k) && k >= 1 && k <= MAX_K ? k : DEFAULT_K,
      refine: Object.fromEntries(REFINE.map((name) => [name, params.get(name) || ""])),
    };
  }

  // ---- date filters, cut-off, order ------------------------------------------------------

  // How the sources of matched words are named in the UI.
  const SOURCE_NAMES = { path: "file name", embedded: "photo keywords", caption: "caption", ocr: "text in the image" };

  const REFINE = ["taken_after", "taken_before", "min_score", "sort", "mode", "query_lang"];

  function refineControls() {
    return {
      taken_after: el.takenAfter, taken_before: el.takenBefore, min_score: el.minScore, sort: el.sort, mode: el.mode, query_lang: el.queryLang,
    };
  }

  // The refine controls' values that differ from "no condition" (the server checks them).
  function readRefine() {
    const out = {};
    for (const [name, control] of Object.entries(refineControls())) {
      const value = control.value.trim();
      if (value && !(name === "sort" && value === "score")) out[name] = value;
    }
    return out;
  }

  function showRefine(refine) {
    for (const [name, control] of Object.entries(refineControls())) {
      control.value = (refine && refine[name]) || (name === "sort" ? "score" : "");
    }
  }

  // ---- searching -------------------------------------------------------------------------

  function request(s) {
    const refine = s.refine || {};
    const filters = s.prefix ? { path_prefix: [s.prefix] } : {};
    if (refine.taken_after) filters.taken_after = refine.taken_after;
    if (refine.taken_before) filters.taken_before = refine.taken_before;
    if (s.mode === "text") {
      const params = new URLSearchParams({ q: s.q, k: String(s.k), offset: String(s.offset) });
      if (s.index) params.set("index", s.index);
      if (s.prefix) params.set("path_prefix", s.prefix);
      if (s.add) params.set("add", s.add);
      if (s.subtract) params.set("subtract", s.subtract);
      for (const [name, value] of Object.entries(refine)) params.set(name, value);
      return [`/api/search?${params}`, { method: "GET" }];
    }
    if (s.mode === "similar") {
      const body = { image_id: s.imageId, k: s.k, offset: s.offset };
      if (s.index) body.index = s.index;
      if (Object.keys(filters).length) body.filters = filters;
      // A cut-off the server cannot read as a number is sent as text: its 4xx says why.
      if (refine.min_score) body.min_score = Number.isFinite(Number(refine.min_score)) ? Number(refine.min_score) : refine.min_score;
      if (refine.sort) body.sort = refine.sort;
      if (refine.query_lang) body.query_lang = refine.query_lang;
      if (s.add) body.add = [s.add];
      if (s.subtract) body.subtract = [s.subtract];
      return ["/api/search", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) }];
    }
    const form = new FormData();
    form.append("image", s.file, s.file.name || "query-image");
    form.append("k", String(s.k));
    form.append("offset", String(s.offset));
    if (s.index) form.append("index", s.index);
    if (s.prefix) form.append("path_prefix", s.prefix);
    if (s.add) form.append("add", s.add);
    if (s.subtract) form.append("subtract", s.subtract);
    // An image query ranks by the picture alone: the text mode is not sent with it.
    for (const [name, value] of Object.entries(refine)) if (name !== "mode") form.append(name, value);
    return ["/api/search", { method: "POST", body: form }];
  }

  function describe(s) {
    const terms = (s.add ? ` + “${s.add}”` : "") + (s.subtract ? ` − “${s.subtract}”` : "");
    if (s.mode === "text") return `“${s.q}”${terms}`;
    if (s.mode === "similar") return `images like image ${s.imageId}${terms}`;
    return `the chosen image${terms}`;
  }

  // The arithmetic terms typed in the form (applied to text, image and "more like this" searches).
  function terms() {
    return { add: el.add.value.trim(), subtract: el.subtract.value.trim() };
  }

  async function fetchPage(append) {
    const generation = append ? state.generation : ++state.generation;
    const [url, options] = request(state);
    el.results.setAttribute("aria-busy", "true");
    el.more.disabled = true;
    setStatus(append ? "Loading more…" : `Searching for ${describe(state)}…`);
    try {
      const resp = await api(url, options);
      const data = await resp.json();
      if (generation !== state.generation) return;
      const results = Array.isArray(data.results) ? data.results : [];
      render(results, append);
      state.done = results.length < state.k;
      const shown = state.results.length;
      const took = typeof data.took_ms === "number" ? ` in ${Math.round(data.took_ms)} ms` : "";
      if (shown === 0) {
        setStatus(`No results for ${describe(state)}.`);
      } else if (append && results.length === 0) {
        setStatus(`No more results: ${shown} shown.`);
      } else {
        setStatus(`${shown} result${shown === 1 ? "" : "s"} for ${describe(state)}${took}${state.done ? "" : " (more below)"}.`);
      }
    } catch (err) {
      if (generation !== state.generation) return;
      if (append) {
        state.offset -= state.k; // the page was not added: "Load more" asks for it again
      } else {
        render([], false);
        state.done = true;
      }
      setStatus("");
      showError(err.message || String(err));
    } finally {
      if (generation === state.generation) {
        el.results.removeAttribute("aria-busy");
        el.more.disabled = false;
        el.more.hidden = state.done;
      }
    }
  }

  function render(results, append) {
    if (!append) {
      revokeResultUrls();
      if (thumbObserver) thumbObserver.disconnect();
      el.results.replaceChildren();
      state.results = [];
    }
    const fragment = document.createDocumentFragment();
    for (const result of results) {
      state.results.push(result);
      fragment.append(resultItem(result, state.results.length));
    }
    el.results.append(fragment);
  }

  function thumbnailUrl(result) {
    if (typeof result.thumbnail_url === "string" && result.thumbnail_url) return result.thumbnail_url;
    const params = new URLSearchParams({ size: String(THUMB_SIZE) });
    if (state.index) params.set("index", state.index);
    return `/api/thumbnails/${result.id}?${params}`;
  }

  function imageUrl(result) {
    if (typeof result.image_url === "string" && result.image_url) return result.image_url;
    const params = new URLSearchParams();
    if (state.index) params.set("index", state.index);
    return `/api/images/${result.id}${params.size ? `?${params}` : ""}`;
  }

  // Why a hit stands where it does: its similarity and, where the query's words took part,
  // the share of them its text matched and the fused score the list is ordered by.
  function whyText(result) {
    const parts = [`similarity ${formatScore(result.score)}`];
    if (typeof result.keyword === "number") parts.push(`words ${Math.round(result.keyword * 100)}%`);
    if (typeof result.fused === "number") parts.push(`fused ${result.fused.toFixed(2)}`);
    return parts.join(" · ");
  }

  function formatScore(score) {
    return typeof score === "number" ? score.toFixed(3) : "";
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
      taken.title = `Taken ${result.taken}${result.camera ? ` with ${result.camera}` : ""}`;
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

    button.append(frame, score, path, caption, taken, matched);
    button.addEventListener("click", () => openViewer(result, button));
    item.append(button);

    const url = thumbnailUrl(result);
    if (token) {
      img.dataset.src = url;
      observeThumbnail(img);
    } else {
      img.src = url;
    }
    return item;
  }

  // Start a new search from `next` (a partial state); push it to history unless restoring.
  function startSearch(next, { push = true } = {}) {
    clearError();
    Object.assign(state, { q: "", imageId: null, similarPath: null, file: null, add: "", subtract: "" }, next, { offset: 0, done: false });
    state.refine = readRefine();
    el.q.value = state.mode === "text" ? state.q : "";
    el.prefix.value = state.prefix;
    el.add.value = state.add;
    el.subtract.value = state.subtract;
    showQueryContext();
    if (push) {
      if (state.mode === "upload") {
        const key = ++uploadSeq;
        uploads.set(key, state.file);
        history.pushState({ upload: key }, "", urlOf({ ...state, mode: null }));
      } else {
        // The same search again (Enter pressed twice) replaces its entry instead of adding one.
        const url = urlOf(state);
        const same = url === location.pathname + location.search && !(history.state && history.state.upload);
        history[same ? "replaceState" : "pushState"]({ search: true }, "", url);
      }
    }
    el.hint.hidden = true;
    return fetchPage(false);
  }

  function showQueryContext() {
    if (previewUrl) {
      URL.revokeObjectURL(previewUrl);
      previewUrl = null;
    }
    if (state.mode === "upload") {
      previewUrl = URL.createObjectURL(state.file);
      el.queryPreview.src = previewUrl;
      el.queryImage.hidden = false;
    } else {
      el.queryPreview.removeAttribute("src");
      el.queryImage.hidden = true;
    }
    el.similarNote.hidden = state.mode !== "similar";
    el.similarNote.textContent = state.mode === "similar" ? `Showing images like image ${state.imageId}${state.similarPath ? ` (${state.similarPath})` : ""}.` : "";
  }

  function clearSearch(message) {
    ++state.generation;
    Object.assign(state, { mode: null, q: "", imageId: null, file: null, offset: 0, done: true });
    render([], false);
    el.q.value = "";
    showQueryContext();
    el.more.hidden = true;
    el.hint.hidden = false;
    setStatus(message || "");
  }

  el.form.addEventListener("submit", (event) => {
    event.preventDefault();
    const q = el.q.value.trim();
    if (!q) {
      setStatus("");
      showError("Type something to search for, or choose an image to search by.");
      el.q.focus();
      return;
    }
    startSearch({ mode: "text", q, index: chosenIndex(), prefix: el.prefix.value.trim(), ...terms(), k: state.k });
  });

  // A new index applies to the search on screen. An image id belongs to one index, so "more like
  // this" does not carry over; a text query and an uploaded image do.
  el.index.addEventListener("change", () => {
    showQueryLanguages();
    if (state.mode === "text" || state.mode === "upload") {
      startSearch({ mode: state.mode, q: state.q, file: state.file, index: chosenIndex(), prefix: state.prefix, add: state.add, subtract: state.subtract, k: state.k });
    } else if (state.mode === "similar") {
      clearSearch(`Index ${el.index.value} chosen: search it by text or by an image.`);
      history.pushState({ search: true }, "", urlOf({ ...state, index: chosenIndex() }));
    }
  });

  el.more.addEventListener("click", () => {
    if (state.done || !state.mode) return;
    clearError();
    state.offset += state.k;
    fetchPage(true);
  });

  function searchByFile(file) {
    if (!file) return;
    if (file.type && !file.type.startsWith("image/")) {
      showError(`“${file.name}” is not an image (${file.type}).`);
      return;
    }
    startSearch({ mode: "upload", file, index: chosenIndex(), prefix: el.prefix.value.trim(), ...terms(), k: state.k });
  }

  el.file.addEventListener("change", () => {
    const file = el.file.files && el.file.files[0];
    searchByFile(file);
    el.file.value = ""; // choosing the same file again searches again
  });

  // ---- drag and drop anywhere on the page -------------------------------------------------

  let dragDepth = 0;
  const carriesFiles = (event) => event.dataTransfer && [...event.dataTransfer.types].includes("Files");
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

  // ---- the viewer: one result large, with "more like this" --------------------------------

  function closeViewerImage() {
    if (viewerUrl) {
      URL.revokeObjectURL(viewerUrl);
      viewerUrl = null;
    }
    el.viewerImage.removeAttribute("src");
  }

  async function openViewer(result, opener) {
    viewerResult = result;
    viewerOpener = opener;
    closeViewerImage();
    el.viewerPath.textContent = result.path;
    el.viewerScore.textContent = `${whyText(result)} · image ${result.id}` +
      (result.width && result.height ? ` · ${result.width}×${result.height}` : "") +
      (result.taken ? ` · taken ${result.taken}` : "") + (result.camera ? ` · ${result.camera}` : "") +
      (result.caption ? ` · “${result.caption}”` : "") + (result.url ? ` · from ${result.url}` : "");
    el.viewerImage.alt = result.path;
    const url = imageUrl(result);
    el.viewerOriginal.href = url;
    if (!el.viewer.open) el.viewer.showModal();
    el.moreLikeThis.focus();
    if (token) {
      try {
        const objectUrl = await blobUrl(url);
        if (viewerResult !== result || !el.viewer.open) {
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

  el.viewer.addEventListener("close", () => {
    closeViewerImage();
    if (viewerOpener && viewerOpener.isConnected) viewerOpener.focus();
    viewerOpener = null;
  });
  el.viewerClose.addEventListener("click", () => el.viewer.close());
  // A click on the backdrop (outside the dialog's box) closes it too.
  el.viewer.addEventListener("click", (event) => {
    if (event.target === el.viewer) el.viewer.close();
  });

  el.moreLikeThis.addEventListener("click", () => {
    const result = viewerResult;
    if (!result) return;
    viewerOpener = null;
    el.viewer.close();
    startSearch({ mode: "similar", imageId: result.id, similarPath: result.path, index: state.index, prefix: state.prefix, ...terms(), k: state.k });
    el.results.focus();
  });

  // ---- history: back / forward / reload restore the search --------------------------------

  function restore(historyState) {
    if (el.viewer.open) {
      viewerOpener = null;
      el.viewer.close();
    }
    clearError();
    if (historyState && historyState.upload) {
      const file = uploads.get(historyState.upload);
      if (file) {
        const s = fromUrl();
        selectIndex(s.index);
        showRefine(s.refine);
        startSearch({ mode: "upload", file, index: s.index, prefix: s.prefix, add: s.add, subtract: s.subtract, k: s.k }, { push: false });
      } else {
        clearSearch();
        showError("This search was by an uploaded image, which the address cannot hold: choose the image again.");
      }
      return;
    }
    const s = fromUrl();
    selectIndex(s.index);
    el.prefix.value = s.prefix;
    el.add.value = s.add;
    el.subtract.value = s.subtract;
    showRefine(s.refine);
    state.index = s.index;
    state.prefix = s.prefix;
    state.k = s.k;
    if (s.badImageId) {
      clearSearch();
      showError("The address names an image id that is not a number.");
    } else if (s.imageId !== null) {
      startSearch({ mode: "similar", imageId: s.imageId, similarPath: null, index: s.index, prefix: s.prefix, add: s.add, subtract: s.subtract, k: s.k }, { push: false });
    } else if (s.q.trim()) {
      startSearch({ mode: "text", q: s.q.trim(), index: s.index, prefix: s.prefix, add: s.add, subtract: s.subtract, k: s.k }, { push: false });
    } else {
      clearSearch();
    }
  }

  window.addEventListener("popstate", (event) => restore(event.state));

  window.addEventListener("unhandledrejection", (event) => {
    const reason = event.reason;
    showError(reason && reason.message ? reason.message : String(reason));
  });

  async function start() {
    try {
      await loadIndexes();
    } catch (err) {
      showError(err.message || String(err));
    }
    restore(history.state);
    document.body.dataset.ready = "true"; // for tests: the page has wired itself up
  }

  start();
})();
