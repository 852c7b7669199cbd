// clipsearch web UI: plain JavaScript over the HTTP API (GET/POST /api/search, /api/indexes,
// /api/thumbnails, /api/images, /api/people). No framework and nothing from a CDN, so it works offline and
// under the server's CSP (script-src 'self', no inline code).
"use strict";

(() => {
  const DEFAULT_K = 24;
  const MAX_K = 1000;
  const THUMB_SIZE = 256;
  const TOKEN_KEY = "clipsearch.token";
  const TYPING_PAUSE_MS = 600; // a text filter applies once typing pauses this long
  const MAX_UPSCALE = 2; // the viewer never blows a small picture up past twice its own pixels

  const $ = (selector) => document.querySelector(selector);
  const el = {
    header: $('[data-testid="header"]'),
    form: $('[data-testid="search-form"]'),
    q: $('input[name="q"]'),
    indexLabel: $(".index-picker"),
    index: $('select[name="index"]'),
    filtersToggle: $('[data-testid="filters-toggle"]'),
    filterCount: $('[data-testid="filter-count"]'),
    filters: $('[data-testid="filters"]'),
    clearFilters: $('[data-testid="clear-filters"]'),
    prefix: $('input[name="path_prefix"]'),
    add: $('input[name="add"]'),
    subtract: $('input[name="subtract"]'),
    takenAfter: $('input[name="taken_after"]'),
    takenTo: $('input[name="taken_to"]'),
    minScore: $('input[name="min_score"]'),
    queryLangField: $(".query-lang"),
    queryLang: $('input[name="query_lang"]'),
    queryLangs: $("#query-langs"),
    sort: $('select[name="sort"]'),
    mode: $('select[name="mode"]'),
    media: $('select[name="media"]'),
    file: $('input[name="image"]'),
    hint: $('[data-testid="hint"]'),
    queryImage: $('[data-testid="query-image"]'),
    queryPreview: $('[data-testid="query-image-preview"]'),
    queryImageNote: $('[data-testid="query-image-note"]'),
    similarNote: $('[data-testid="similar-note"]'),
    error: $('[data-testid="error"]'),
    status: $('[data-testid="status"]'),
    results: $('[data-testid="results"]'),
    more: $('[data-testid="load-more"]'),
    viewer: $('[data-testid="viewer"]'),
    viewerStage: $('[data-testid="viewer-stage"]'),
    viewerImage: $('[data-testid="viewer-image"]'),
    viewerPrev: $('[data-testid="viewer-prev"]'),
    viewerNext: $('[data-testid="viewer-next"]'),
    viewerName: $('[data-testid="viewer-name"]'),
    viewerFolder: $('[data-testid="viewer-folder"]'),
    viewerTaken: $('[data-testid="viewer-taken"]'),
    viewerGps: $('[data-testid="viewer-gps"]'),
    viewerScore: $('[data-testid="viewer-score"]'),
    viewerExtra: $('[data-testid="viewer-extra"]'),
    viewerPosition: $('[data-testid="viewer-position"]'),
    viewerOriginal: $('[data-testid="viewer-original"]'),
    copyPath: $('[data-testid="copy-path"]'),
    moreLikeThis: $('[data-testid="more-like-this"]'),
    viewerClose: $('[data-testid="viewer-close"]'),
    tokenDialog: $('[data-testid="token-dialog"]'),
    tokenForm: $('[data-testid="token-form"]'),
    tokenInput: $('[data-testid="token-input"]'),
    tokenError: $('[data-testid="token-error"]'),
    dropOverlay: $('[data-testid="drop-overlay"]'),
    people: $('[data-testid="people"]'),
    peopleStrip: $('[data-testid="people-strip"]'),
    chosenPeople: $('[data-testid="chosen-people"]'),
    chosenList: $('[data-testid="chosen-list"]'),
    onlyPeople: $('[data-testid="only-people"]'),
    personPage: $('[data-testid="person-page"]'),
    personFace: $('[data-testid="person-face"]'),
    personTitle: $('[data-testid="person-title"]'),
    personRename: $('[data-testid="person-rename"]'),
    personName: $('[data-testid="person-name"]'),
    personCount: $('[data-testid="person-count"]'),
  };

  // The filters by their address names. taken_to is the page's own: the last day included
  // (the API's taken_before is exclusive, so the page sends the next day's start).
  const REFINE = ["taken_after", "taken_to", "min_score", "sort", "mode", "media", "query_lang"];
  const TEXT_FILTERS = new Set(["path_prefix", "add", "subtract", "min_score", "query_lang"]);

  // The search on screen. mode: "text" (q), "similar" (imageId: more like this), "upload" (file)
  // or "people" (no query: the photos of the chosen people, newest first).
  const state = {
    people: [], // the person filter: the people's numbers (all of them must be in a photo)
    onlyPeople: false, // ... and nobody else
    mode: null,
    q: "",
    imageId: null,
    file: null,
    index: "",
    prefix: "",
    add: "", // query arithmetic: a term added to and one subtracted from any query
    subtract: "",
    k: DEFAULT_K,
    pages: 1, // pages loaded ("Load more"), kept in the address so a reload shows as many
    refine: {},
    done: true,
    generation: 0, // bumped by every new search, so a late answer to an old one is dropped
    results: [],
    lastDay: null, // the day heading the grid ends with (sorted by date)
  };
  let token = sessionStorage.getItem(TOKEN_KEY);
  let resultUrls = []; // blob: URLs of the thumbnails on screen (token mode), revoked on replace
  let viewerUrl = null; // blob: URL of the original in the viewer (token mode)
  let viewerPos = -1; // the index in state.results of the picture in the viewer
  let viewerOpener = null;
  let viewerActual = false; // the viewer shows the picture at its own size (else fitted)
  let previewUrl = null; // blob: URL of the uploaded query image's preview
  let thumbObserver = null;
  // Problems with the address's own values (a select or date input cannot hold a bad one, so the
  // note beside it says what was asked and left out), by field; cleared when that field is edited.
  let addressNotes = {};
  // Uploaded files by history entry: a File cannot go in the URL, but back/forward within this
  // page can still find it here (a reload cannot: the page says so).
  const uploads = new Map();
  let uploadSeq = 0;
  // The people of the chosen index (GET /api/people), by number.
  const peopleInfo = new Map();

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

  // ---- dates in words --------------------------------------------------------------------

  const ISO = /^(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2}))?(?:\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?$/;

  // The camera's own wall-clock time as a UTC Date, so formatting in UTC shows exactly what the
  // camera recorded (no shift into the viewer's time zone). null when not ISO 8601.
  function wallClock(iso) {
    const m = typeof iso === "string" ? ISO.exec(iso.trim()) : null;
    if (!m) return null;
    const date = new Date(Date.UTC(+m[1], +m[2] - 1, +m[3], +(m[4] || 0), +(m[5] || 0), +(m[6] || 0)));
    return { date, hasTime: m[4] !== undefined, offset: m[7] || "" };
  }

  const dayWords = new Intl.DateTimeFormat(undefined, { dateStyle: "full", timeZone: "UTC" });
  const dateWords = new Intl.DateTimeFormat(undefined, { dateStyle: "long", timeZone: "UTC" });
  const dateTimeWords = new Intl.DateTimeFormat(undefined, { dateStyle: "long", timeStyle: "short", timeZone: "UTC" });

  function takenWords(iso) {
    const t = wallClock(iso);
    if (!t) return iso || "";
    return (t.hasTime ? dateTimeWords : dateWords).format(t.date);
  }

  // A YYYY-MM-DD that is a real day (not 2023-02-30).
  function isDay(text) {
    const t = /^\d{4}-\d{2}-\d{2}$/.test(text) ? wallClock(text) : null;
    return Boolean(t) && t.date.toISOString().slice(0, 10) === text;
  }

  function nextDay(day) {
    const t = wallClock(day);
    return new Date(t.date.getTime() + 86400000).toISOString().slice(0, 10);
  }

  function previousDay(day) {
    const t = wallClock(day);
    return new Date(t.date.getTime() - 86400000).toISOString().slice(0, 10);
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
    el.queryLangField.hidden = codes.length === 0;
    el.queryLangs.replaceChildren(...codes.map((code) => Object.assign(document.createElement("option"), { value: code })));
    if (codes.length && !el.queryLang.value && codes.includes("eng_Latn")) el.queryLang.placeholder = "eng_Latn";
    // A model that must be told the query's language: its control in view until one is given.
    if (codes.length && !el.queryLang.value) setFiltersOpen(true);
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
    if (s.index) params.set("index", s.index);
    if (s.prefix) params.set("path_prefix", s.prefix);
    if (s.add) params.set("add", s.add);
    if (s.subtract) params.set("subtract", s.subtract);
    for (const [name, value] of Object.entries(s.refine || {})) params.set(name, value);
    for (const id of s.people || []) params.append("person", String(id));
    if (s.onlyPeople && (s.people || []).length) params.set("only_people", "true");
    if (s.k !== DEFAULT_K) params.set("k", String(s.k));
    if (s.mode && s.pages > 1) params.set("pages", String(s.pages));
    const query = params.toString();
    return query ? `${location.pathname}?${query}` : location.pathname;
  }

  const SORT_WORDS = { score: "best match", taken: "newest photo" };
  const MODE_WORDS = { "": "pictures and words", vector: "pictures only", keyword: "words only" };
  // The API's media filter: photos, videos (each at its best moments) or both (no filter).
  const MEDIA_WORDS = { "": "photos and videos", image: "photos only", video: "videos only" };

  // Read a search from the address (page load, reload, back/forward, a shared link). What cannot
  // be used is reported in `notes` (by field, beside its control) or `problems` (the page's error
  // line), never dropped silently.
  function fromUrl() {
    const params = new URLSearchParams(location.search);
    const notes = {};
    const problems = [];
    const whole = (name, low, high, fallback) => {
      const raw = params.get(name);
      if (raw === null) return fallback;
      if (/^\d+$/.test(raw) && Number(raw) >= low && Number(raw) <= high) return Number(raw);
      problems.push(`The address's ${name}=${raw} is not a whole number from ${low} to ${high}: ${fallback} used instead.`);
      return fallback;
    };
    const refine = {};
    for (const name of REFINE) {
      const raw = params.get(name);
      if (raw !== null && raw !== "") refine[name] = raw;
    }
    // An older address's taken_before (exclusive) is the day before, included.
    const before = params.get("taken_before");
    if (before && !refine.taken_to) {
      if (isDay(before)) refine.taken_to = previousDay(before);
      else refine.taken_to = before;
    }
    for (const name of ["taken_after", "taken_to"]) {
      if (refine[name] !== undefined && !isDay(refine[name])) {
        notes[name] = `The address's date “${refine[name]}” is not a day like 2023-12-24: left out.`;
        delete refine[name];
      }
    }
    if (refine.sort !== undefined && !(refine.sort in SORT_WORDS)) {
      notes.sort = `The address's sort “${refine.sort}” is not one of ${Object.keys(SORT_WORDS).join(", ")}: sorted by best match.`;
      delete refine.sort;
    }
    if (refine.media === "all") delete refine.media; // the API's word for no filter
    if (refine.media !== undefined && !(refine.media in MEDIA_WORDS)) {
      notes.media = `The address's media “${refine.media}” is not one of image, video, all: photos and videos shown.`;
      delete refine.media;
    }
    if (refine.mode !== undefined && !(refine.mode in MODE_WORDS)) {
      notes.mode = `The address's mode “${refine.mode}” is not one of vector, keyword: pictures and words used.`;
      delete refine.mode;
    }
    const imageId = params.get("image_id");
    return {
      q: params.get("q") || "",
      imageId: imageId !== null && /^\d+$/.test(imageId) ? Number(imageId) : null,
      badImageId: imageId !== null && !/^\d+$/.test(imageId),
      index: params.get("index") || "",
      prefix: params.get("path_prefix") || "",
      add: params.get("add") || "",
      subtract: params.get("subtract") || "",
      people: [...new Set(params.getAll("person").filter((v) => /^\d+$/.test(v)).map(Number))],
      onlyPeople: params.get("only_people") === "true",
      k: whole("k", 1, MAX_K, DEFAULT_K),
      pages: whole("pages", 1, 100, 1),
      refine,
      notes,
      problems,
    };
  }

  // ---- filters: read, checked, shown -----------------------------------------------------

  function refineControls() {
    return {
      taken_after: el.takenAfter, taken_to: el.takenTo, min_score: el.minScore, sort: el.sort, mode: el.mode, media: el.media,
      query_lang: el.queryLang,
    };
  }

  // The refine controls' values that differ from "no condition".
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

  // What is wrong with the filters as typed, by field, in words; {} when they can be searched.
  function checkRefine(refine) {
    const problems = {};
    for (const name of ["taken_after", "taken_to"]) {
      if (refine[name] && !isDay(refine[name])) problems[name] = `“${refine[name]}” is not a day like 2023-12-24.`;
    }
    if (refine.taken_after && refine.taken_to && !problems.taken_after && !problems.taken_to && refine.taken_after > refine.taken_to) {
      problems.taken_to = `The start date (${refine.taken_after}) is after the end date (${refine.taken_to}).`;
    }
    if (refine.min_score !== undefined) {
      const value = Number(refine.min_score);
      if (!/^\s*[-+]?(\d+\.?\d*|\.\d+)\s*$/.test(refine.min_score) || !(value >= -1 && value <= 1)) {
        problems.min_score = `Min score must be a number from -1 to 1, e.g. 0.25 (not “${refine.min_score}”).`;
      }
    }
    return problems;
  }

  function showFieldErrors(problems) {
    for (const name of REFINE) {
      const box = document.getElementById(`${name}-error`);
      const control = refineControls()[name];
      const message = problems[name] || addressNotes[name] || "";
      if (box) {
        box.textContent = message;
        box.hidden = !message;
      }
      if (problems[name]) control.setAttribute("aria-invalid", "true");
      else control.removeAttribute("aria-invalid");
    }
  }

  // How many filters are set (on the toggle), and the panel opened where one is set or wrong.
  function showFilterCount(open) {
    const set = Object.keys(readRefine()).length + [el.prefix, el.add, el.subtract].filter((c) => c.value.trim()).length;
    el.filterCount.textContent = set ? String(set) : "";
    el.filtersToggle.setAttribute("aria-label", set ? `Filters (${set} set)` : "Filters");
    if (open) setFiltersOpen(true);
  }

  function setFiltersOpen(open) {
    el.filters.hidden = !open;
    el.filtersToggle.setAttribute("aria-expanded", String(open));
    el.header.classList.toggle("filters-open", open);
  }

  el.filtersToggle.addEventListener("click", () => {
    const open = el.filters.hidden;
    setFiltersOpen(open);
    if (open) el.takenAfter.focus();
  });

  // ---- searching -------------------------------------------------------------------------

  // The API's names for the filters: taken_to (inclusive) becomes taken_before, the next day.
  function apiRefine(refine) {
    const out = { ...refine };
    delete out.taken_to;
    if (refine.taken_to) out.taken_before = nextDay(refine.taken_to);
    return out;
  }

  function request(s, k, offset) {
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

  function describe(s) {
    const terms = (s.add ? ` + “${s.add}”` : "") + (s.subtract ? ` − “${s.subtract}”` : "");
    const names = peopleWords(s.people || []);
    if (s.mode === "people") return `photos of ${names}${s.onlyPeople ? " alone" : ""}`;
    const withWhom = names ? ` with ${names}${s.onlyPeople ? " and nobody else" : ""}` : "";
    if (s.mode === "text") return `“${s.q}”${terms}${withWhom}`;
    if (s.mode === "similar") return `images like ${s.similarPath ? baseName(s.similarPath) : `image ${s.imageId}`}${terms}${withWhom}`;
    return `${s.file && s.file.name ? `“${s.file.name}”` : "the chosen image"}${terms}${withWhom}`;
  }

  function dateRangeWords(refine) {
    if (refine.taken_after && refine.taken_to) return `taken from ${refine.taken_after} to ${refine.taken_to} (inclusive)`;
    if (refine.taken_after) return `taken on or after ${refine.taken_after}`;
    return `taken up to ${refine.taken_to} (inclusive)`;
  }

  // The arithmetic terms typed in the form (applied to text, image and "more like this" searches).
  function terms() {
    return { add: el.add.value.trim(), subtract: el.subtract.value.trim() };
  }

  // A date filter left nothing: say whether the same search finds any dated photo at all, so
  // "No results" on an index without dates does not read as "nothing matched the words".
  async function explainNoDates(generation) {
    const refine = { ...state.refine, sort: "taken" };
    delete refine.taken_after;
    delete refine.taken_to;
    const [url, options] = request({ ...state, refine }, DEFAULT_K, 0);
    try {
      const data = await (await api(url, options)).json();
      // Stale (a newer search), or a filter is being corrected meanwhile (its message stays).
      if (generation !== state.generation || Object.keys(checkRefine(readRefine())).length) return;
      const results = Array.isArray(data.results) ? data.results : [];
      if (!results.length) return;
      const newest = results.find((r) => typeof r.taken === "string" && r.taken);
      setStatus(newest
        ? `No results ${dateRangeWords(state.refine)} for ${describe(state)}; the newest photo it finds was taken ${takenWords(newest.taken)}.`
        : `No results: none of the images this search finds has a date taken (no EXIF date), so a date filter leaves none.`);
    } catch (_) {
      // the plain "No results" stays
    }
  }

  async function fetchPage(append) {
    const generation = append ? state.generation : ++state.generation;
    // A restored address with pages=N asks for all N pages at once.
    const k = append ? state.k : Math.min(MAX_K, state.k * state.pages);
    const offset = append ? state.results.length : 0;
    const [url, options] = request(state, k, offset);
    el.results.setAttribute("aria-busy", "true");
    el.more.disabled = true;
    setStatus(append ? "Loading more…" : `Searching for ${describe(state)}…`);
    try {
      const resp = await api(url, options);
      const data = await resp.json();
      if (generation !== state.generation) return;
      const results = Array.isArray(data.results) ? data.results : [];
      render(results, append);
      state.done = results.length < k;
      if (append && results.length) {
        state.pages += 1;
        history.replaceState(history.state, "", urlOf(state));
      }
      const shown = state.results.length;
      const took = typeof data.took_ms === "number" ? ` in ${Math.round(data.took_ms)} ms` : "";
      if (shown === 0) {
        setStatus(`No results for ${describe(state)}.`);
        if (state.refine.taken_after || state.refine.taken_to) explainNoDates(generation);
      } else if (append && results.length === 0) {
        setStatus(`No more results: ${shown} shown.`);
      } else {
        setStatus(`${shown} result${shown === 1 ? "" : "s"} for ${describe(state)}${took}${state.done ? "" : " (more below)"}.`);
      }
    } catch (err) {
      if (generation !== state.generation) return;
      const message = err.message || String(err);
      if (append) {
        showError(message); // the page was not added: "Load more" asks for it again
      } else {
        render([], false);
        state.done = true;
        if (state.mode === "upload") {
          // The search by that file is over: its preview and "searching by" note go, and the
          // error names the user's file (the server calls every upload "upload").
          const name = state.file && state.file.name ? state.file.name : "the chosen image";
          Object.assign(state, { mode: null, file: null });
          showQueryContext();
          el.hint.hidden = false;
          showError(`Could not search by “${name}”: ${message.replace(/image 'upload'/g, "the image").replace(/'upload'/g, `“${name}”`)}`);
        } else {
          showError(message);
        }
      }
      setStatus("");
    } finally {
      if (generation === state.generation) {
        el.results.removeAttribute("aria-busy");
        el.more.disabled = false;
        el.more.hidden = state.done;
        updateViewerNav();
      }
    }
  }

  function render(results, append) {
    if (!append) {
      revokeResultUrls();
      if (thumbObserver) thumbObserver.disconnect();
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

  function baseName(path) {
    const parts = String(path).split("/");
    return parts[parts.length - 1] || String(path);
  }

  function folderOf(path) {
    const cut = String(path).lastIndexOf("/");
    return cut > 0 ? String(path).slice(0, cut + 1) : "";
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
    button.addEventListener("click", () => openViewer(state.results.indexOf(result), button));
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

  // How the sources of matched words are named in the UI.
  const SOURCE_NAMES = { path: "file name", embedded: "photo keywords", caption: "caption", ocr: "text in the image" };

  // Start a new search from `next` (a partial state). how: "push" a history entry, "replace" the
  // current one (a text filter typed on), or "none" (restoring from the address).
  function startSearch(next, { how = "push", edit = null } = {}) {
    clearError();
    Object.assign(state, { q: "", imageId: null, similarPath: null, file: null, add: "", subtract: "", pages: 1 }, next, { done: false });
    state.refine = readRefine();
    el.q.value = state.mode === "text" ? state.q : "";
    el.prefix.value = state.prefix;
    el.add.value = state.add;
    el.subtract.value = state.subtract;
    showQueryContext();
    showChosenPeople();
    showFilterCount(false);
    if (how !== "none") {
      if (state.mode === "upload") {
        const key = ++uploadSeq;
        uploads.set(key, state.file);
        history.pushState({ upload: key }, "", urlOf({ ...state, mode: null }));
      } else {
        // The same search again (Enter pressed twice) replaces its entry instead of adding one.
        const url = urlOf(state);
        const same = url === location.pathname + location.search && !(history.state && history.state.upload);
        history[same || how === "replace" ? "replaceState" : "pushState"]({ search: true, edit }, "", url);
      }
    }
    el.hint.hidden = true;
    const problems = checkRefine(state.refine);
    showFieldErrors(problems);
    if (Object.keys(problems).length) {
      // Never search with a filter left out unsaid: the marked field says what to correct.
      ++state.generation;
      render([], false);
      state.done = true;
      el.more.hidden = true;
      setFiltersOpen(true);
      setStatus(`Not searched yet: correct the marked filter (${Object.keys(problems).map(fieldName).join(", ")}).`);
      return Promise.resolve();
    }
    return fetchPage(false);
  }

  function fieldName(name) {
    const label = document.querySelector(`label[for="${name}"]`);
    return label ? label.textContent.trim() : name;
  }

  function showQueryContext() {
    if (previewUrl) {
      URL.revokeObjectURL(previewUrl);
      previewUrl = null;
    }
    if (state.mode === "upload") {
      previewUrl = URL.createObjectURL(state.file);
      el.queryPreview.src = previewUrl;
      el.queryImageNote.textContent = `Searching by the image you chose${state.file.name ? ` (${state.file.name})` : ""}. ` +
        "An uploaded image cannot be put in the address, so reload or a shared link will not bring this search back.";
      el.queryImage.hidden = false;
    } else {
      el.queryPreview.removeAttribute("src");
      el.queryImageNote.textContent = "";
      el.queryImage.hidden = true;
    }
    el.similarNote.hidden = state.mode !== "similar";
    el.similarNote.textContent = state.mode === "similar" ? `Showing images like ${state.similarPath ? state.similarPath : `image ${state.imageId}`}.` : "";
  }

  function clearSearch(message) {
    ++state.generation;
    Object.assign(state, { mode: null, q: "", imageId: null, file: null, pages: 1, done: true });
    render([], false);
    el.q.value = "";
    showQueryContext();
    el.more.hidden = true;
    el.hint.hidden = false;
    setStatus(message || "");
  }

  // The search on screen again, with the filters as they are now.
  function rerun(how, edit) {
    startSearch({
      mode: state.mode, q: state.q, imageId: state.imageId, similarPath: state.similarPath, file: state.file,
      index: chosenIndex(), prefix: el.prefix.value.trim(), ...terms(), k: state.k,
    }, { how: state.mode === "upload" ? "push" : how, edit });
  }

  // A filter changed: it applies at once to the search on screen. Typing on in the same text box
  // replaces its history entry, so back steps over searches, not keystrokes.
  function applyFilters(name) {
    clearTimeout(typingTimer);
    delete addressNotes[name];
    const problems = checkRefine(readRefine());
    showFieldErrors(problems);
    showFilterCount(false);
    if (Object.keys(problems).length) {
      // Leave the results of the last good filters on screen; the field says what is wrong.
      if (state.mode) setStatus(`Still showing the last search: correct the marked filter (${Object.keys(problems).map(fieldName).join(", ")}) to search again.`);
      return;
    }
    if (state.mode) {
      const typingOn = TEXT_FILTERS.has(name) && history.state && history.state.edit === name;
      rerun(typingOn ? "replace" : "push", TEXT_FILTERS.has(name) ? name : null);
    } else {
      // No search yet: the address still keeps the filters, for a reload or a link.
      history.replaceState({ search: true }, "", urlOf({
        ...state, index: chosenIndex(), prefix: el.prefix.value.trim(), ...terms(), refine: readRefine(),
      }));
    }
  }

  let typingTimer = 0;
  for (const control of [el.prefix, el.add, el.subtract, el.minScore, el.queryLang]) {
    control.addEventListener("input", () => {
      clearTimeout(typingTimer);
      typingTimer = setTimeout(() => applyFilters(control.name), TYPING_PAUSE_MS);
    });
  }
  for (const control of [el.takenAfter, el.takenTo, el.sort, el.mode, el.media]) {
    control.addEventListener("change", () => applyFilters(control.name));
  }

  el.clearFilters.addEventListener("click", () => {
    if (state.people.length) {
      state.people = [];
      state.onlyPeople = false;
      showChosenPeople();
      if (state.mode === "people") {
        clearSearch();
        history.pushState({ search: true }, "", urlOf({ ...state, index: chosenIndex() }));
      }
    }
    showRefine({});
    el.prefix.value = el.add.value = el.subtract.value = "";
    addressNotes = {};
    applyFilters("clear");
  });

  el.form.addEventListener("submit", (event) => {
    event.preventDefault();
    clearTimeout(typingTimer);
    const q = el.q.value.trim();
    if (!q && (state.mode === "similar" || state.mode === "upload")) {
      rerun("push", null); // Enter in a filter box: the image search on screen, filtered anew
      return;
    }
    if (!q && state.people.length) {
      startSearch({ mode: "people", index: chosenIndex(), prefix: el.prefix.value.trim(), k: state.k });
      return;
    }
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
    // People are numbered per index: the chosen ones do not carry over.
    state.people = [];
    state.onlyPeople = false;
    showChosenPeople();
    if (state.mode === "people") clearSearch();
    loadPeople(chosenIndex());
    if (state.mode === "text" || state.mode === "upload") {
      startSearch({ mode: state.mode, q: state.q, file: state.file, index: chosenIndex(), prefix: state.prefix, add: state.add, subtract: state.subtract, k: state.k });
    } else if (state.mode === "similar") {
      clearSearch(`Index ${el.index.value} chosen: search it by text or by an image.`);
      history.pushState({ search: true }, "", urlOf({ ...state, index: chosenIndex() }));
    }
  });

  function loadMore() {
    if (state.done || !state.mode) return Promise.resolve();
    clearError();
    return fetchPage(true);
  }

  el.more.addEventListener("click", () => loadMore());

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

  // ---- videos: a hit is its best moment; the viewer plays the file from it ---------------

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
  function momentBadge(result, button, rank) {
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

  function closeViewerVideo() {
    el.viewerStage.querySelector("video")?.remove();
    el.viewerStage.querySelector(".video-note")?.remove();
    el.viewerImage.hidden = false;
  }

  // The video from its best moment (the URL's #t=start,end); a codec this browser cannot play
  // shows the moment's frame instead, with a note to download the file.
  async function playVideo(result) {
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
      if (token) blobUrl(frameUrl).then((u) => { viewerUrl = u; el.viewerImage.src = u; }, () => {});
      else el.viewerImage.src = frameUrl;
    };
    video.addEventListener("error", fallback);
    el.viewerImage.hidden = true;
    el.viewerStage.append(video);
    if (token) {
      try {
        const objectUrl = await blobUrl(imageUrl(result));
        if (!video.isConnected) {
          URL.revokeObjectURL(objectUrl);
          return;
        }
        viewerUrl = objectUrl;
        video.src = objectUrl + fragment;
      } catch (err) {
        showError(err.message || String(err));
      }
    } else {
      video.src = result.video_url || imageUrl(result) + fragment;
    }
  }

  // ---- the viewer: one result on the whole screen, previous/next, "more like this" ---------

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

  el.viewerImage.addEventListener("load", fitViewerImage);
  window.addEventListener("resize", () => { if (el.viewer.open) fitViewerImage(); });
  el.viewerImage.addEventListener("click", () => {
    viewerActual = !viewerActual;
    fitViewerImage();
  });

  function gpsWords(gps) {
    const [lat, lon] = gps;
    return `${Math.abs(lat).toFixed(5)}° ${lat >= 0 ? "N" : "S"}, ${Math.abs(lon).toFixed(5)}° ${lon >= 0 ? "E" : "W"}`;
  }

  function updateViewerNav() {
    if (!el.viewer.open) return;
    const total = state.results.length;
    el.viewerPrev.disabled = viewerPos <= 0;
    el.viewerNext.disabled = viewerPos >= total - 1 && state.done;
    el.viewerPosition.textContent = `${viewerPos + 1} of ${total}${state.done ? "" : "+"}`;
  }

  async function openViewer(pos, opener) {
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
      playVideo(result);
      return;
    }
    if (token) {
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
  let swipeStart = null;
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

  // ---- history: back / forward / reload restore the search --------------------------------

  function restore(historyState) {
    if (el.viewer.open) {
      viewerOpener = null;
      viewerPos = -1;
      el.viewer.close();
    }
    clearError();
    clearTimeout(typingTimer);
    const s = fromUrl();
    addressNotes = s.notes;
    selectIndex(s.index);
    showQueryLanguages();
    el.prefix.value = s.prefix;
    el.add.value = s.add;
    el.subtract.value = s.subtract;
    showRefine(s.refine);
    state.index = s.index;
    state.prefix = s.prefix;
    state.k = s.k;
    state.people = s.people;
    state.onlyPeople = s.onlyPeople;
    showChosenPeople();
    if (s.index !== shownPeopleOf) loadPeople(s.index);
    // Open the panel where a filter is set or an address value was not understood, or where the
    // index's model must be told the query's language and none is given.
    const anyFilter = Object.keys(s.refine).length || s.prefix || s.add || s.subtract || Object.keys(s.notes).length;
    setFiltersOpen(Boolean(anyFilter) || (!el.queryLangField.hidden && !el.queryLang.value));
    showFilterCount(false);
    if (historyState && historyState.upload) {
      const file = uploads.get(historyState.upload);
      if (file) {
        startSearch({ mode: "upload", file, index: s.index, prefix: s.prefix, add: s.add, subtract: s.subtract, k: s.k }, { how: "none" });
      } else {
        clearSearch();
        showError("This search was by an uploaded image, which the address cannot hold: choose the image again.");
      }
      return;
    }
    if (s.badImageId) {
      clearSearch();
      showFieldErrors(checkRefine(s.refine));
      showError("The address names an image id that is not a number.");
    } else if (s.imageId !== null) {
      startSearch({ mode: "similar", imageId: s.imageId, similarPath: null, index: s.index, prefix: s.prefix, add: s.add, subtract: s.subtract, k: s.k, pages: s.pages }, { how: "none" });
    } else if (s.q.trim()) {
      startSearch({ mode: "text", q: s.q.trim(), index: s.index, prefix: s.prefix, add: s.add, subtract: s.subtract, k: s.k, pages: s.pages }, { how: "none" });
    } else if (s.people.length) {
      startSearch({ mode: "people", index: s.index, prefix: s.prefix, k: s.k, pages: s.pages }, { how: "none" });
    } else {
      clearSearch();
      showFieldErrors(checkRefine(s.refine));
    }
    if (s.problems.length) showError(s.problems.join(" "));
  }

  // ---- people: the strip of faces, the person filter, the person page, renaming in place ----

  let shownPeopleOf = null; // the index whose people the strip shows

  function personLabel(id) {
    const info = peopleInfo.get(id);
    return info ? info.label : `#${id}`;
  }

  function peopleWords(ids) {
    const labels = ids.map(personLabel);
    return labels.length > 1 ? `${labels.slice(0, -1).join(", ")} and ${labels[labels.length - 1]}` : labels.join("");
  }

  // The people of a hit's faces as the UI names them (faces of nobody and hidden people left out).
  function hitPeople(result) {
    const faces = Array.isArray(result.faces) ? result.faces : [];
    return faces.filter((f) => typeof f.person === "number").map((f) => f.name || personLabel(f.person));
  }

  async function faceSrc(img, url) {
    if (!token) {
      img.src = url;
      return;
    }
    try {
      img.src = await blobUrl(url);
    } catch (_) {
      img.removeAttribute("src");
    }
  }

  async function loadPeople(index) {
    shownPeopleOf = index;
    const params = new URLSearchParams();
    if (index) params.set("index", index);
    let data;
    try {
      data = await (await api(`/api/people${params.size ? `?${params}` : ""}`)).json();
    } catch (_) {
      data = { faces: false, people: [] }; // an older server, or none: no strip
    }
    if (shownPeopleOf !== index) return;
    peopleInfo.clear();
    el.peopleStrip.replaceChildren();
    for (const person of Array.isArray(data.people) ? data.people : []) {
      peopleInfo.set(person.id, person);
      const item = document.createElement("li");
      const button = document.createElement("button");
      button.type = "button";
      button.className = "person";
      button.dataset.testid = "person";
      button.dataset.person = String(person.id);
      button.title = `${person.label}: ${person.images} photo${person.images === 1 ? "" : "s"}`;
      const img = document.createElement("img");
      img.alt = "";
      img.width = img.height = 64;
      faceSrc(img, person.face_url);
      const label = document.createElement("span");
      label.className = "person-label";
      label.textContent = person.label;
      button.append(img, label);
      button.addEventListener("click", () => togglePerson(person.id));
      item.append(button);
      el.peopleStrip.append(item);
    }
    el.people.hidden = peopleInfo.size === 0;
    showChosenPeople();
    if (state.mode) {
      // The names arrived after the search: say them.
      showPersonPage();
      if (state.results.length) setStatus(`${state.results.length} result${state.results.length === 1 ? "" : "s"} for ${describe(state)}.`);
    }
  }

  function showChosenPeople() {
    el.chosenList.replaceChildren();
    for (const id of state.people) {
      const chip = document.createElement("button");
      chip.type = "button";
      chip.className = "chip";
      chip.dataset.testid = "chosen-person";
      chip.textContent = `${personLabel(id)} ×`;
      chip.setAttribute("aria-label", `Remove ${personLabel(id)} from the search`);
      chip.addEventListener("click", () => togglePerson(id));
      el.chosenList.append(chip);
    }
    el.chosenPeople.hidden = state.people.length === 0;
    el.onlyPeople.checked = state.onlyPeople;
    for (const button of el.peopleStrip.querySelectorAll("button.person")) {
      button.setAttribute("aria-pressed", String(state.people.includes(Number(button.dataset.person))));
    }
    showPersonPage();
  }

  // One person chosen and no query: their page, with their name to edit in place.
  function showPersonPage() {
    const id = state.mode === "people" && state.people.length === 1 ? state.people[0] : null;
    el.personPage.hidden = id === null;
    if (id === null) return;
    const info = peopleInfo.get(id);
    el.personTitle.textContent = personLabel(id);
    if (document.activeElement !== el.personName) el.personName.value = info && info.name ? info.name : "";
    el.personCount.textContent = info ? `${info.images} photo${info.images === 1 ? "" : "s"}, ${info.faces} face${info.faces === 1 ? "" : "s"}` : "";
    if (info && el.personFace.dataset.person !== String(id)) {
      el.personFace.dataset.person = String(id);
      faceSrc(el.personFace, info.face_url.replace(/size=\d+/, "size=256"));
    }
  }

  // A face in the strip or a chip: the person joins the search, or leaves it. Without a query the
  // search is the people's photos; with one, the query is filtered to them.
  function togglePerson(id) {
    const people = state.people.includes(id) ? state.people.filter((p) => p !== id) : [...state.people, id];
    state.people = people;
    if (!people.length) state.onlyPeople = false;
    if (state.mode && state.mode !== "people") {
      rerun("push", null);
    } else if (people.length) {
      startSearch({ mode: "people", index: chosenIndex(), prefix: el.prefix.value.trim(), k: state.k });
    } else {
      showChosenPeople();
      clearSearch();
      history.pushState({ search: true }, "", urlOf({ ...state, index: chosenIndex() }));
    }
  }

  el.onlyPeople.addEventListener("change", () => {
    state.onlyPeople = el.onlyPeople.checked;
    if (state.mode === "people") startSearch({ mode: "people", index: chosenIndex(), prefix: el.prefix.value.trim(), k: state.k });
    else if (state.mode) rerun("push", null);
  });

  el.personRename.addEventListener("submit", async (event) => {
    event.preventDefault();
    const id = state.people[0];
    const name = el.personName.value.trim();
    if (id === undefined) return;
    clearError();
    const params = new URLSearchParams();
    if (state.index) params.set("index", state.index);
    try {
      const resp = await api(`/api/people/${id}${params.size ? `?${params}` : ""}`, {
        method: "PATCH", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ name }),
      });
      const person = await resp.json();
      peopleInfo.set(id, { ...peopleInfo.get(id), ...person });
      const label = el.peopleStrip.querySelector(`button.person[data-person="${id}"] .person-label`);
      if (label) label.textContent = person.label;
      el.personName.blur();
      showChosenPeople();
      for (const result of state.results) {
        for (const face of Array.isArray(result.faces) ? result.faces : []) if (face.person === id) face.name = person.name;
      }
      for (const button of el.results.querySelectorAll("button.result")) {
        const result = state.results[Number(button.dataset.rank) - 1];
        const who = button.querySelector('[data-testid="hit-people"]');
        if (result && who && who.textContent) who.textContent = hitPeople(result).join(", ");
      }
      setStatus(`Named ${person.label}.`);
    } catch (err) {
      showError(err.message || String(err));
    }
  });

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
    await loadPeople(new URLSearchParams(location.search).get("index") || "");
    restore(history.state);
    document.body.dataset.ready = "true"; // for tests: the page has wired itself up
  }

  start();
})();
