// syncd's web page: search (recall), one memory, sync and settings. Served by a hub too
// (GET /ui/session says "kind": "hub"): there it signs in with a hub token and offers search,
// status and settings (the hub has no memory items, tools or sync routes).
//
// Rules:
//   * No frameworks, no build step, nothing fetched from elsewhere; the page works offline.
//   * The server's Content-Security-Policy allows only this origin's files: no inline scripts,
//     no inline event handlers, no style attributes in the HTML.
//   * Memory text never goes through innerHTML: every piece of data is set as textContent
//     (h() below), so a memory holding <script> shows as text.
//   * The page authenticates with the HttpOnly session cookie AND the session's key, sent as
//     X-CSRF-Token on every request, reads included: the cookie alone is refused, because the
//     browser also sends it to every other server on this host, whatever its port. Writes also
//     carry Content-Type: application/json.
//   * The key is handed out only at login: the daemon's login redirects to /#key=<key> (a
//     fragment never reaches a server), the hub's POST /ui/login answers it. The page keeps it
//     in this tab's sessionStorage (a reload keeps it; a duplicated tab gets a copy; a new tab
//     typed by hand has none and asks to log in again) and removes it from the address bar and
//     history at once (history.replaceState). It is forgotten on logout, a 401, or a 403
//     "csrf" (another tab logged in again, so the cookie now belongs to a newer session).
//   * On a hub, the token typed into the sign-in form is sent once (POST /ui/login) and then
//     dropped: never stored (no localStorage, sessionStorage or script-set cookie). Only the
//     session's key is stored, in sessionStorage, as above.
//   * A late answer never overwrites newer state: each view numbers its requests and applies
//     only the latest one's answer, and what a person typed is theirs: an answer that lands
//     after they edited a field (settings, a memory's importance) leaves that field as typed.
//     A status message belongs to the request it reports: a newer one (or opening the view
//     again) replaces it, and an older request's answer never writes over it.
"use strict";

(() => {
  const MEMORY_TYPES = ["fact", "decision", "preference", "learning", "procedure", "entity",
    "summary"];
  const COMPONENTS = ["rrf", "semantic", "keyword", "graph", "importance", "recency",
    "penalty"];
  const COMPONENT_HELP = {
    rrf: "reciprocal rank fusion of the semantic and keyword ranks",
    semantic: "cosine similarity to the query",
    keyword: "keyword (BM25) match",
    graph: "graph proximity to a direct match",
    importance: "the memory's importance",
    recency: "recency decay",
    penalty: "penalty (superseded)",
  };
  const REPLACES = new Set(["INVALIDATES", "SUPERSEDES"]);
  const HITL_MODES = ["auto", "post_hoc", "gate"];
  const VIEWS = {daemon: ["search", "memory", "sync", "settings"],
    hub: ["search", "status", "settings"]};

  const state = {
    kind: "daemon",  // "daemon" or "hub": from GET /ui/session (its 401 says it too)
    role: null,  // a hub session's token role: read, write or admin
    name: null,  // a hub session's token name, when known
    csrf: null,  // the session's key (rules): from the login, kept in sessionStorage
    lastMemory: null,
    settings: null,
    searchSeq: 0,
    memorySeq: 0,
    syncSeq: 0,
    statusSeq: 0,
    settingsSeq: 0,  // the latest settings request, a load or a save: only its answer applies
    saveSeq: 0,  // the latest save (or reopening of the view): only it writes #settings-message
    saving: null,  // the save in flight (a promise that never rejects): a load waits for it
    editSeq: 0,  // counts edits: an input's data-edited is the count at its last edit
    actionSeq: 0,  // the latest action on a memory: only it writes #memory-message
    syncRunSeq: 0,  // the latest sync pass (or reopening of the view): it owns #sync-message
    syncing: false,  // a pass is running: "Sync now" stays disabled whatever renders
    view: null,
    planeOpen: false,
    list: {realm: "", memory_type: "", tags: "", offset: 0},  // the Memory view's list
    listSeq: 0,
    deleted: null,  // [id, hard] of the memory just deleted, said once by the list  // the control-plane settings' disclosure, as the person left it
  };

  // ------------------------------------------------------------------ DOM helpers

  const $ = (selector, root = document) => root.querySelector(selector);

  /** An element with properties and children; strings become text nodes, never markup. */
  function h(tag, props, ...children) {
    const el = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") el.className = value;
      else if (key === "text") el.textContent = String(value);
      else if (key === "dataset") Object.assign(el.dataset, value);
      else if (key.startsWith("on")) {
        // handlers are functions, never attribute text (and the CSP would refuse those)
        if (typeof value !== "function") throw new TypeError(`h(): ${key} must be a function`);
        el.addEventListener(key.slice(2), value);
      } else if (typeof value === "boolean" || typeof value === "number") {
        if (key in el) el[key] = value;
        else el.setAttribute(key, String(value));
      } else el.setAttribute(key, String(value));
    }
    append(el, children);
    return el;
  }

  function append(el, children) {
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      el.append(child instanceof Node ? child : String(child));
    }
    return el;
  }

  function clear(el) {
    while (el.firstChild) el.removeChild(el.firstChild);
    return el;
  }

  function memoryHref(id) {
    return "#/memory/" + encodeURIComponent(id);
  }

  function shortId(id) {
    const text = String(id);
    const bare = text.startsWith("memory:") ? text.slice(7) : text;
    return bare.length > 13 ? (text.startsWith("memory:") ? "memory:" : "") + bare.slice(0, 8) + "…"
      : text;
  }

  /** A node id: a link when it names a memory, else plain (monospace) text. */
  function nodeRef(id, label) {
    if (typeof id === "string" && id.startsWith("memory:")) {
      const text = label || shortId(id);
      if (isHub()) {  // the hub has no memory view to link to
        return h("span", {class: text === id || !label ? "mono" : null, title: id}, text);
      }
      return h("a", {class: text === id || !label ? "mono" : null, href: memoryHref(id),
        title: id}, text);
    }
    return h("span", {class: "mono", title: String(id)}, String(id));
  }

  function isHub() {
    return state.kind === "hub";
  }

  /** "the daemon" or "the hub", for messages. */
  function serverName() {
    return isHub() ? "the hub" : "the daemon";
  }

  function setTitle(name) {
    document.title = name + (isHub() ? " · syncd hub" : " · syncd");
  }

  function badge(text, kind) {
    return h("span", {class: "badge" + (kind ? " badge-" + kind : "")}, text);
  }

  function num(value, digits = 3) {
    if (typeof value !== "number" || !Number.isFinite(value)) return "—";
    return value.toFixed(digits);
  }

  function parseTime(text) {
    if (typeof text !== "string" || !text) return null;
    const trimmed = text.replace(/(\.\d{3})\d+/, "$1");
    const ms = Date.parse(trimmed);
    return Number.isNaN(ms) ? null : new Date(ms);
  }

  function ago(date) {
    const secs = Math.round((Date.now() - date.getTime()) / 1000);
    const abs = Math.abs(secs);
    const [n, unit] = abs < 60 ? [abs, "s"] : abs < 3600 ? [Math.round(abs / 60), "min"]
      : abs < 86400 ? [Math.round(abs / 3600), "h"] : [Math.round(abs / 86400), "d"];
    return secs >= 0 ? `${n} ${unit} ago` : `in ${n} ${unit}`;
  }

  /** A timestamp as "2025-01-02 10:11:12 UTC · 3 min ago" (the exact value in the title). */
  function when(text, fallback = "—") {
    if (text === null || text === undefined || text === "") return h("span", {class: "muted"}, fallback);
    const date = parseTime(String(text));
    if (!date) return h("span", {class: "mono"}, String(text));
    const shown = date.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
    return h("time", {datetime: String(text), title: String(text)}, shown,
      h("span", {class: "muted"}, " · " + ago(date)));
  }

  function unixWhen(secs) {
    if (typeof secs !== "number" || !secs) return h("span", {class: "muted"}, "—");
    const date = new Date(secs * 1000);  // beyond ±8.64e12 s a Date is invalid: show the number
    if (Number.isNaN(date.getTime())) return h("span", {class: "mono"}, String(secs));
    return when(date.toISOString());
  }

  /** A definition list from [label, value] pairs; values may be nodes or text. */
  function kv(pairs, cls = "kv") {
    const dl = h("dl", {class: cls});
    for (const [label, value, key] of pairs) {
      const dd = h("dd", {dataset: key ? {key} : undefined});
      append(dd, [value === null || value === undefined || value === "" ?
        h("span", {class: "muted"}, "—") : value]);
      dl.append(h("div", {class: "kv-row"}, h("dt", {}, label), dd));
    }
    return dl;
  }

  function jsonText(value) {
    if (value === null || value === undefined) return null;
    if (typeof value === "string") return value;
    return JSON.stringify(value, null, 2);
  }

  function showMessage(el, text, kind) {
    el.hidden = !text;
    el.className = "message" + (kind ? " message-" + kind : "");
    el.textContent = text || "";
  }

  function splitList(text) {
    return String(text || "").split(",").map((s) => s.trim()).filter((s) => s);
  }

  // ------------------------------------------------------------------ API

  class ApiError extends Error {
    constructor(status, code, message, field) {
      super(message);
      this.status = status;
      this.code = code;
      this.field = field || null;
    }
  }

  /** ``keepSession``: a 401 is the caller's to show (the sign-in form's own request). */
  async function api(method, path, body, {keepSession = false} = {}) {
    const headers = {Accept: "application/json"};
    const init = {method, headers, credentials: "same-origin", cache: "no-store"};
    if (state.csrf) headers["X-CSRF-Token"] = state.csrf;  // every request (rules)
    if (method !== "GET" && method !== "HEAD") {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body === undefined ? {} : body);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (exc) {
      throw new ApiError(0, "network", isHub() ? "the hub did not answer" :
        "the daemon did not answer (is `syncd run` running?)");
    }
    let data = null;
    const text = await response.text();
    if (text) {
      try {
        data = JSON.parse(text);
      } catch (exc) {
        data = null;
      }
    }
    if (!response.ok) {
      const err = data && typeof data === "object" && data.error ? data.error : {};
      if (response.status === 401 && data && (data.kind === "hub" || data.kind === "daemon")) {
        state.kind = data.kind;  // which login this server offers
      }
      const stale = response.status === 403 && err.code === "csrf";  // another tab's login
      if ((response.status === 401 || stale) && !keepSession &&
          (state.csrf || document.body.dataset.session !== "")) {  // once, with its reason
        loggedOut(state.csrf ? (!stale && err.message) || "the session ended" : null);
      }  // loggedOut() forgets the key; a keepSession caller's own flow does that
      throw new ApiError(response.status, err.code || "http_" + response.status,
        err.message || `HTTP ${response.status}`, err.field);
    }
    return data;
  }

  function errorText(exc) {
    if (exc instanceof ApiError) {
      return exc.field ? `${exc.message} (field: ${exc.field})` : exc.message;
    }
    return String(exc && exc.message ? exc.message : exc);
  }

  // ------------------------------------------------------------------ session and routing

  const KEY_ITEM = "syncd-session-key";
  const KEY_FRAGMENT = "#key=";

  /** The session's key (rules): from the login redirect's fragment, which then leaves the
   * address bar and history, else from this tab's sessionStorage; null when neither has one. */
  function takeKey() {
    if (location.hash.startsWith(KEY_FRAGMENT)) {
      const key = location.hash.slice(KEY_FRAGMENT.length);
      history.replaceState(null, "", location.pathname + location.search);
      keepKey(key);
    }
    try {
      return sessionStorage.getItem(KEY_ITEM) || state.csrf;
    } catch (exc) {
      return state.csrf;  // storage disabled: this page load only
    }
  }

  function keepKey(key) {
    state.csrf = key || null;
    try {
      if (key) sessionStorage.setItem(KEY_ITEM, key);
    } catch (exc) {
      // storage disabled: the key lives as long as this page
    }
  }

  function forgetKey() {
    state.csrf = null;
    try {
      sessionStorage.removeItem(KEY_ITEM);
    } catch (exc) {
      // nothing was stored
    }
  }

  async function boot() {
    state.csrf = takeKey();  // before any await: the key leaves the URL at once
    fillTypeSelect();
    $("#search-form").addEventListener("submit", runSearch);
    $("#sync-now").addEventListener("click", syncNow);
    $("#sync-refresh").addEventListener("click", () => loadSync());
    $("#settings-form").addEventListener("submit", saveSettings);
    $("#settings-form").addEventListener("input", onSettingsInput);
    $("#settings-form").addEventListener("change", onSettingsInput);
    $("#settings-reset").addEventListener("click", () => {
      if (state.settings) renderSettings(state.settings);  // every edit goes
      showMessage($("#settings-message"), "");
    });
    $("#logout").addEventListener("click", logout);
    $("#hub-login-form").addEventListener("submit", hubLogin);
    $("#status-refresh").addEventListener("click", () => loadStatus());
    window.addEventListener("hashchange", route);
    let session;
    try {
      session = await api("GET", "/ui/session");
    } catch (exc) {
      if (!(exc instanceof ApiError && exc.status === 401)) {
        $("#booting").textContent = "Could not reach the daemon: " + errorText(exc);
        $("#booting").className = "error";
      }
      return;
    }
    state.kind = session.kind === "hub" ? "hub" : "daemon";
    state.role = session.role || null;
    state.name = session.name || null;
    loggedIn();
  }

  /** Show the views this server offers (a hub: search, status, settings). */
  function loggedIn() {
    const hub = isHub();
    $("#booting").hidden = true;
    $("#logged-out").hidden = true;
    $("#hub-login").hidden = true;
    for (const tab of document.querySelectorAll("#tabs a[data-only]")) {
      tab.hidden = tab.dataset.only !== state.kind;
    }
    if (hub) $("#logout").textContent = "Sign out";
    $("#tabs").hidden = false;
    $("#logout").hidden = false;
    document.body.dataset.session = "1";
    document.body.dataset.kind = state.kind;
    route();
  }

  /** No session (or it ended: ``message`` says why). A hub shows its token form. */
  function loggedOut(message) {
    forgetKey();
    document.body.dataset.session = "";
    for (const el of document.querySelectorAll(".view")) el.hidden = true;
    $("#booting").hidden = true;
    $("#tabs").hidden = true;
    $("#logout").hidden = true;
    if (!isHub()) {
      $("#logged-out").hidden = false;
      return;
    }
    state.role = null;
    state.name = null;
    document.body.dataset.kind = "hub";
    forgetData();
    $("#logged-out").hidden = true;
    $("#hub-login").hidden = false;
    showMessage($("#hub-login-message"), message ? "Not signed in — " + message : "",
      "error");
    $("#hub-token").focus();
  }

  /** A hub page that signed out keeps nothing of what the token could read. */
  function forgetData() {
    state.settings = null;
    state.searchSeq += 1;
    state.statusSeq += 1;
    state.settingsSeq += 1;  // a settings answer landing after this shows nothing
    state.saveSeq += 1;
    state.saving = null;
    delete $("#view-settings").dataset.state;
    clear($("#search-results"));
    clear($("#status-body"));
    clear($("#settings-form"));
    for (const id of ["#search-error", "#settings-message", "#settings-readonly"]) {
      $(id).hidden = true;
    }
  }

  /** The hub's sign-in form: the token goes out once, in the body of POST /ui/login. */
  async function hubLogin(event) {
    event.preventDefault();
    const input = $("#hub-token");
    const msg = $("#hub-login-message");
    const button = $("#hub-login-submit");
    input.classList.remove("invalid");
    if (!input.value.trim()) {
      showMessage(msg, "Paste a hub token first.", "error");
      input.classList.add("invalid");
      input.focus();
      return;
    }
    button.disabled = true;
    showMessage(msg, "Signing in…", "info");
    let answer;
    try {
      answer = await api("POST", "/ui/login", {token: input.value.trim()}, {keepSession: true});
    } catch (exc) {
      showMessage(msg, exc instanceof ApiError && exc.field === "token" ?
        "Hub token " + exc.message : errorText(exc), "error");
      input.classList.add("invalid");
      input.select();
      return;
    } finally {
      button.disabled = false;
    }
    input.value = "";  // the session cookie stands for it now
    showMessage(msg, "");
    state.kind = "hub";
    keepKey(answer.csrf);
    state.role = answer.role || null;
    state.name = answer.name || null;
    loggedIn();
  }

  async function logout() {
    try {
      await api("POST", "/ui/logout", {}, {keepSession: true});
    } catch (exc) {
      // logged out either way
    }
    loggedOut();
  }

  function route() {
    if (!state.csrf) return;
    const match = /^#\/([a-z]+)(?:\/(.*))?$/.exec(location.hash || "");
    const view = match && VIEWS[state.kind].includes(match[1]) ? match[1] : "search";
    for (const el of document.querySelectorAll(".view")) {
      el.hidden = el.dataset.view !== view;
    }
    for (const tab of document.querySelectorAll("#tabs a")) {
      if (tab.dataset.tab === view) tab.setAttribute("aria-current", "page");
      else tab.removeAttribute("aria-current");
    }
    state.view = view;
    document.body.dataset.view = view;
    if (view === "memory") {
      let id = match && match[2] ? match[2] : null;
      if (id) {
        try {
          id = decodeURIComponent(id);
        } catch (exc) {
          // keep it as typed
        }
      }
      openMemory(match && match[2] === "" ? null : id || state.lastMemory);  // "#/memory/": the list
    } else if (view === "sync") {
      if (!state.syncing) {  // opening the view again ends a finished pass's report
        state.syncRunSeq += 1;
        showMessage($("#sync-message"), "");
      }
      loadSync();
    } else if (view === "settings") {
      loadSettings();
    } else if (view === "status") {
      loadStatus();
    } else {
      setTitle("Search");
      if (!$("#search-results").firstChild) $("#q").focus();
    }
  }

  // ------------------------------------------------------------------ search

  function fillTypeSelect() {
    const select = $("#f-type");
    for (const kind of MEMORY_TYPES) select.append(h("option", {value: kind}, kind));
  }

  function clearFieldErrors(root) {
    for (const el of root.querySelectorAll(".field-error")) el.remove();
    for (const el of root.querySelectorAll(".invalid")) el.classList.remove("invalid");
  }

  function fieldError(root, field, message) {
    const base = String(field).replace(/(\[\d+\])+$/, "");  // "tags[2]" → the tags input
    const input = root.querySelector(`[data-field="${CSS.escape(field)}"]`) ||
      root.querySelector(`[data-field="${CSS.escape(base)}"]`);
    if (!input) return false;
    input.classList.add("invalid");
    const label = input.closest("label") || input;
    label.after(h("p", {class: "field-error", dataset: {for: field}}, message));
    return true;
  }

  function searchBody(form) {
    const errors = [];
    const body = {query: $("#q").value.trim()};
    const realms = splitList($("#f-realms").value);
    if (realms.length) body.realms = realms;
    const type = $("#f-type").value;
    if (type) body.memory_type = type;
    const tags = splitList($("#f-tags").value);
    if (tags.length) body.tags = tags;
    const asOf = $("#f-as-of").value.trim();
    if (asOf) body.as_of = asOf;  // the daemon checks it (422 with field "as_of")
    const limit = $("#f-limit").value.trim();
    if (limit) {
      const n = Number(limit);
      if (!Number.isInteger(n) || n < 1 || n > 100) errors.push(["limit", "a whole number 1–100"]);
      else body.limit = n;
    } else if ($("#f-limit").validity.badInput) {
      errors.push(["limit", "a whole number 1–100"]);
    }
    const hops = $("#f-hops").value;
    if (hops) body.expand_hops = Number(hops);
    if ($("#f-invalidated").checked) body.include_invalidated = true;
    for (const [field, message] of errors) fieldError(form, field, message);
    return errors.length ? null : body;
  }

  async function runSearch(event) {
    event.preventDefault();
    const form = $("#search-form");
    const errorEl = $("#search-error");
    clearFieldErrors(form);
    errorEl.hidden = true;
    const body = searchBody(form);
    if (!body) return;
    const seq = ++state.searchSeq;
    const results = $("#search-results");
    results.setAttribute("aria-busy", "true");
    $("#search-submit").disabled = true;
    try {
      const answer = await api("POST", "/v1/agent/memory/query", body);
      if (seq !== state.searchSeq) return;
      renderResults(answer);
    } catch (exc) {
      if (seq !== state.searchSeq) return;
      if (!(exc instanceof ApiError && exc.field && fieldError(form, exc.field, exc.message))) {
        errorEl.textContent = errorText(exc);
        errorEl.hidden = false;
      }
    } finally {
      if (seq === state.searchSeq) {
        results.removeAttribute("aria-busy");
        $("#search-submit").disabled = false;
      }
    }
  }

  function renderResults(answer) {
    const root = clear($("#search-results"));
    const memories = Array.isArray(answer.memories) ? answer.memories : [];
    const fallback = answer.fallback === true || (memories.length > 0 &&
      memories.every((m) => m.fallback));
    const summary = h("p", {class: "results-summary muted"},
      `${memories.length} ${memories.length === 1 ? "memory" : "memories"} · ${answer.took_ms} ms`);
    root.append(summary);
    if (fallback) {
      root.append(h("div", {class: "banner banner-fallback", id: "fallback-banner", role: "note"},
        h("strong", {}, "No match — most important recent memories"),
        h("span", {class: "muted"}, " (nothing matched the query; these are shown instead)")));
    }
    if (Array.isArray(answer.gated) && answer.gated.length) {
      root.append(h("div", {class: "banner banner-warn", role: "note"},
        `Paused: ${answer.gated.join(", ")}` +
        (answer.gate_reason ? ` (${answer.gate_reason})` : "") +
        " — graph expansion is off until the entitlement is back."));
    }
    if (!memories.length) {
      root.append(h("p", {class: "empty"}, "Nothing found."));
    }
    const rrfMax = Math.max(1e-9, ...memories.map((m) => (m.components ? m.components.rrf : 0)));
    const titles = new Map(memories.map((m) => [m.id, m.title || firstLine(m.content_preview)]));
    const list = h("ol", {class: "hits"});
    for (const memory of memories) list.append(hitCard(memory, rrfMax, titles));
    root.append(list);
    const linked = Array.isArray(answer.linked) ? answer.linked : [];
    if (linked.length) {
      root.append(h("section", {class: "card linked", id: "linked"},
        h("h2", {}, "Linked resources"),
        table(["Node", "Edge", "Depth", "Namespace"], linked.map((l) => [
          nodeRef(l.node_id, l.node_id), h("span", {class: "mono"}, l.edge_type),
          String(l.depth), l.target_namespace || "—"]))));
    }
    if (answer.context) {
      root.append(h("details", {class: "card context"},
        h("summary", {}, "Context block (what an agent receives)"),
        h("pre", {class: "pre"}, answer.context)));
    }
  }

  function hitCard(memory, rrfMax, titles) {
    const hub = isHub();
    const title = memory.title || firstLine(memory.content_preview) || "(empty)";
    const item = h("li", {class: "hit card" + (memory.invalid_at ? " is-invalid" : "") +
      (hub ? " hit-inline" : ""), dataset: {id: memory.id}});
    const head = h("div", {class: "hit-head"},
      hub ? h("span", {class: "hit-title"}, title) :
        h("a", {class: "hit-title", href: memoryHref(memory.id)}, title),
      h("span", {class: "score", title: "final score"},
        h("span", {class: "score-label"}, "score "), num(memory.score)));
    const meta = h("div", {class: "hit-meta"},
      badge(memory.memory_type || "?", "type"),
      memory.realm ? badge(memory.realm, "realm") : null,
      memory.fallback ? badge("fallback", "warn") : null,
      memory.superseded_by ? badge("superseded", "warn") : null,
      h("span", {class: "muted"}, "importance " + num(memory.importance, 2)),
      h("span", {class: "validity", title: "valid from → until"},
        "valid ", when(memory.valid_at, "always"), " → ",
        memory.invalid_at ? when(memory.invalid_at) : h("span", {class: "now"}, "now")));
    item.append(head, meta);
    if (memory.title && memory.content_preview) {
      item.append(h("p", {class: "preview"}, memory.content_preview));
    }
    if (memory.via) {
      item.append(h("p", {class: "via"}, "via graph: ",
        nodeRef(memory.via.seed, titles.get(memory.via.seed)),
        " → ", h("span", {class: "mono"}, memory.via.type), `, depth ${memory.via.depth}`));
    }
    if (memory.superseded_by) {
      item.append(h("p", {class: "via"}, "superseded by ", nodeRef(memory.superseded_by)));
    }
    if (memory.components) item.append(componentsView(memory.components, rrfMax));
    const details = hub ? hitDetails(memory, titles) : null;
    if (details) item.append(details);
    item.addEventListener("click", (event) => {
      if (event.target.closest("a")) return;
      if (window.getSelection && String(window.getSelection())) return;
      if (!details) {
        location.hash = memoryHref(memory.id);
      } else if (!event.target.closest("details")) {
        details.open = !details.open;  // the hub has no memory view: the card opens in place
      }
    });
    return item;
  }

  const HIT_KEYS = new Set(["id", "memory_type", "title", "content_preview", "score", "distance",
    "kw_score", "graph_proximity", "importance", "realm", "valid_at", "invalid_at", "via",
    "components", "fallback", "superseded_by"]);

  /** A hit's fields, expandable in its card (on a hub, which has no memory view). */
  function hitDetails(memory, titles) {
    const optional = (value) => (typeof value === "number" ? num(value) : null);
    const rows = [
      ["id", h("span", {class: "mono"}, memory.id), "id"],
      ["type", memory.memory_type, "memory_type"],
      ["realm", memory.realm, "realm"],
      ["title", memory.title, "title"],
      ["content", memory.content_preview ?
        h("div", {class: "content"}, memory.content_preview) : null, "content_preview"],
      ["score", num(memory.score), "score"],
      ["importance", num(memory.importance, 2), "importance"],
      ["valid from", when(memory.valid_at, "always"), "valid_at"],
      ["valid until", memory.invalid_at ? when(memory.invalid_at) :
        h("span", {class: "now"}, "now"), "invalid_at"],
      ["cosine distance", optional(memory.distance), "distance"],
      ["keyword score", optional(memory.kw_score), "kw_score"],
      ["graph proximity", optional(memory.graph_proximity), "graph_proximity"],
      ["superseded by", memory.superseded_by ? nodeRef(memory.superseded_by,
        titles.get(memory.superseded_by)) : null, "superseded_by"],
      ["via graph", memory.via ? h("span", {},
        nodeRef(memory.via.seed, titles.get(memory.via.seed)), " → ",
        h("span", {class: "mono"}, memory.via.type), `, depth ${memory.via.depth}`) : null,
      "via"],
      ["fallback", memory.fallback ? "yes (nothing matched the query)" : "no", "fallback"],
    ];
    for (const [key, value] of Object.entries(memory)) {  // a newer server's fields
      if (!HIT_KEYS.has(key)) rows.push([key, detailValue(key, value), key]);
    }
    return h("details", {class: "hit-details"}, h("summary", {}, "Details"),
      kv(rows, "kv hit-kv"));
  }

  function firstLine(text) {
    return String(text || "").split("\n").find((line) => line.trim()) || "";
  }

  function componentsView(components, rrfMax) {
    const grid = h("div", {class: "components", role: "table", "aria-label": "score components"});
    for (const name of COMPONENTS) {
      const value = typeof components[name] === "number" ? components[name] : 0;
      const scale = name === "rrf" ? rrfMax : 1;
      const fill = h("span", {class: "fill"});
      fill.style.width = `${Math.max(0, Math.min(1, value / scale)) * 100}%`;
      grid.append(h("div", {class: "comp comp-" + name, role: "row",
        dataset: {component: name}, title: COMPONENT_HELP[name]},
      h("span", {class: "comp-name", role: "cell"}, name),
      h("span", {class: "bar", role: "cell"}, fill),
      h("span", {class: "comp-value", role: "cell"}, num(value))));
    }
    return grid;
  }

  function table(headers, rows, cls = "table") {
    const thead = h("thead", {}, h("tr", {}, headers.map((t) => h("th", {}, t))));
    const tbody = h("tbody", {}, rows.map((cells) => h("tr", {},
      cells.map((c) => h("td", {}, c)))));
    return h("table", {class: cls}, thead, tbody);
  }

  // ------------------------------------------------------------------ one memory

  /** ``keepSince``: an importance typed into the view this replaces is kept when it was typed
   * after that edit count (0: any typed value; a save's answer passes the count at its start,
   * as what was typed before went into the save). */
  async function openMemory(id, message, keepSince = 0) {
    const root = $("#memory-body");
    const seq = ++state.memorySeq;
    if (!id) {
      document.title = "Memory · syncd";
      clear(root).append(memoryPicker());
      return;
    }
    state.lastMemory = id;
    $('#tabs a[data-tab="memory"]').setAttribute("href", memoryHref(id));
    if (!root.firstChild || root.dataset.id !== id) {
      clear(root).append(h("p", {class: "muted"}, "Loading…"));
    }
    let memory;
    try {
      memory = await api("GET", "/v1/agent/memory/items/" + encodeURIComponent(id));
    } catch (exc) {
      if (seq !== state.memorySeq) return;
      root.dataset.id = "";
      clear(root).append(memoryPicker(),
        h("p", {class: "error", role: "alert"}, errorText(exc)));
      return;
    }
    if (seq !== state.memorySeq) return;
    const typed = root.dataset.id === id ? $("#memory-importance", root) : null;
    const focused = typed !== null && document.activeElement === typed;
    root.dataset.id = id;
    clear(root).append(memoryView(memory, message));
    if (typed && Number(typed.dataset.edited || 0) > keepSince) {  // typed while this loaded
      const importance = $("#memory-importance", root);
      importance.value = typed.value;
      importance.dataset.edited = typed.dataset.edited;
      if (focused) importance.focus();
    }
    document.title = (memory.title || firstLine(memory.content || "") || memory.memory_type) +
      " · syncd";
    const history = $("#history-body", root);
    loadHistory(memory, history, seq);
    loadVersions(id, $("#versions-body", root), seq);
  }

  const LIST_PAGE = 20;

  /** The Memory view without an id: every memory, newest first (the ``list_memories`` tool,
   * which validates the filters and names a bad one), a page at a time, and a box to open one
   * by its id. The filters and page are kept while the page is open. */
  function memoryPicker() {
    const q = state.list;
    const realm = h("input", {type: "text", id: "list-realm", value: q.realm,
      placeholder: "all", "data-field": "realm"});
    const type = h("select", {id: "list-type", "data-field": "memory_type"},
      h("option", {value: ""}, "any"), MEMORY_TYPES.map((t) => h("option", {value: t}, t)));
    type.value = q.memory_type;
    const tags = h("input", {type: "text", id: "list-tags", value: q.tags,
      placeholder: "comma-separated", "data-field": "tags"});
    const filters = h("form", {class: "card search-form", id: "memory-list-form"},
      h("div", {class: "view-head"}, h("h1", {}, "Memories"),
        h("button", {type: "submit", class: "primary", id: "list-submit"}, "List")),
      h("div", {class: "filters"},
        h("label", {}, "Realm", realm), h("label", {}, "Type", type),
        h("label", {}, "Tags", tags)),
      h("p", {id: "list-error", class: "error", role: "alert", hidden: true}));
    const list = h("div", {id: "memory-list", "aria-live": "polite"});
    filters.addEventListener("submit", (event) => {
      event.preventDefault();
      state.list = {realm: realm.value.trim(), memory_type: type.value, tags: tags.value,
        offset: 0};
      loadList(list, filters);
    });
    const input = h("input", {type: "text", id: "memory-id", placeholder: "memory:…",
      "aria-label": "memory id"});
    const open = h("form", {class: "card picker"},
      h("p", {}, "Or open a memory by its id:"),
      h("div", {class: "search-row"}, input, h("button", {type: "submit"}, "Open")));
    open.addEventListener("submit", (event) => {
      event.preventDefault();
      const id = input.value.trim();
      if (id) location.hash = memoryHref(id);
    });
    loadList(list, filters);
    const done = state.deleted;
    state.deleted = null;
    const note = done ? h("p", {class: "message message-ok", id: "memory-deleted",
      role: "status"}, (done[1] ? "Purged " : "Deleted ") + done[0]) : null;
    return h("div", {}, note, filters, list, open);
  }

  async function loadList(root, form) {
    const q = state.list;
    const seq = ++state.listSeq;
    const body = {limit: LIST_PAGE + 1, offset: q.offset};  // one more: is there a next page
    if (q.realm) body.realm = q.realm;
    if (q.memory_type) body.memory_type = q.memory_type;
    const tags = splitList(q.tags);
    if (tags.length) body.tags = tags;
    const errorEl = $("#list-error", form);
    clearFieldErrors(form);
    if (!root.firstChild) root.append(h("p", {class: "muted"}, "Loading…"));
    let answer;
    try {
      answer = await api("POST", "/v1/agent/memory/tools/list_memories", body);
    } catch (exc) {
      if (seq !== state.listSeq) return;
      errorEl.textContent = errorText(exc);
      errorEl.hidden = false;
      if (exc.field) fieldError(form, exc.field, exc.message);
      clear(root);
      return;
    }
    if (seq !== state.listSeq) return;
    errorEl.hidden = true;
    renderList(root, form, answer.rows || []);
  }

  function renderList(root, form, rows) {
    const q = state.list;
    const more = rows.length > LIST_PAGE;
    const shown = rows.slice(0, LIST_PAGE);
    clear(root);
    if (!shown.length) {
      root.append(h("p", {class: "empty", id: "memory-list-empty"},
        q.offset ? "No more memories." : "No memories match."));
    }
    root.append(h("ul", {class: "hits", id: "memory-list-rows"}, shown.map((row) => {
      const tags = Array.isArray(row.tags) ? row.tags : splitList(row.tags || "");
      return h("li", {class: "card hit list-row", dataset: {id: row.id}},
        h("div", {class: "hit-head"},
          h("a", {class: "hit-title", href: memoryHref(row.id)},
            row.title || firstLine(row.content_preview || "") || row.id),
          h("span", {class: "muted small"}, when(row.created_at))),
        h("div", {class: "hit-meta"}, badge(row.memory_type || "?", "type"),
          row.realm ? badge(row.realm, "realm") : null,
          row.status && row.status !== "active" ? badge(row.status, "warn") : null,
          tags.map((t) => h("span", {class: "tag"}, t))));
    })));
    const prev = h("button", {type: "button", id: "list-prev", disabled: q.offset === 0},
      "Newer");
    const next = h("button", {type: "button", id: "list-next", disabled: !more}, "Older");
    const page = (delta) => {
      state.list = {...state.list, offset: Math.max(0, q.offset + delta)};
      loadList(root, form);
    };
    prev.addEventListener("click", () => page(-LIST_PAGE));
    next.addEventListener("click", () => page(LIST_PAGE));
    root.append(h("div", {class: "pager"}, prev,
      h("span", {class: "muted small", id: "list-range"}, shown.length ?
        `${q.offset + 1}–${q.offset + shown.length}` : ""), next));
  }

  function memoryView(memory, message) {
    const id = memory.id;
    const edges = Array.isArray(memory.edges) ? memory.edges : [];
    const archived = memory.status === "archived";
    const wrap = h("article", {class: "memory", dataset: {id}});
    wrap.append(h("div", {class: "memory-head"},
      h("a", {href: "#/memory/", id: "memory-back", class: "small"}, "← All memories"),
      h("h1", {id: "memory-title"}, memory.title || firstLine(memory.content || "") ||
        `(${memory.memory_type || "memory"} with no text)`),
      h("div", {class: "hit-meta"},
        badge(memory.memory_type || "?", "type"),
        memory.realm ? badge(memory.realm, "realm") : null,
        h("span", {id: "memory-status", class: "badge badge-status status-" + memory.status},
          memory.status),
        memory.invalid_at ? badge("invalidated", "warn") : null,
        h("span", {class: "muted"}, "importance " + num(memory.importance, 2)),
        h("span", {class: "validity"}, "valid ", when(memory.valid_at, "always"), " → ",
          memory.invalid_at ? when(memory.invalid_at) : h("span", {class: "now"}, "now")))));
    if (Array.isArray(memory.tags) && memory.tags.length) {
      wrap.append(h("div", {class: "tags", id: "memory-tags"},
        memory.tags.map((t) => h("span", {class: "tag"}, t))));
    }
    wrap.append(h("div", {class: "content card", id: "memory-content"}, memory.content || ""));

    // actions
    const msg = h("p", {class: "message", id: "memory-message", role: "status", hidden: true});
    const toggle = h("button", {type: "button", id: "memory-archive"},
      archived ? "Unarchive" : "Archive");
    toggle.addEventListener("click", () => memoryAction(id, "update_memory_status",
      {memory_id: id, status: archived ? "active" : "archived"}, msg,
      archived ? "Unarchived: status active" : "Archived: status archived", toggle, 0));
    const importance = h("input", {type: "number", id: "memory-importance", min: "0",
      max: "1", step: "0.05", value: String(memory.importance ?? ""),
      "aria-label": "importance", "data-field": "importance"});
    const save = h("button", {type: "button", id: "memory-importance-save"}, "Save");
    save.addEventListener("click", () => {
      const value = Number(importance.value);
      if (importance.value.trim() === "" || !Number.isFinite(value) || value < 0 || value > 1) {
        showMessage(msg, "Importance must be a number from 0 to 1", "error");
        importance.classList.add("invalid");
        return;
      }
      importance.classList.remove("invalid");
      memoryAction(id, "update_memory_importance", {memory_id: id, importance: value}, msg,
        `Saved: importance ${value}`, save, state.editSeq);
    });
    importance.addEventListener("input", () => {
      importance.dataset.edited = String(++state.editSeq);
    });
    importance.addEventListener("keydown", (event) => {
      if (event.key === "Enter") save.click();
    });
    wrap.append(h("section", {class: "card actions"},
      h("div", {class: "action"}, h("span", {class: "action-label"}, "Status"),
        h("strong", {}, memory.status), toggle),
      h("div", {class: "action"}, h("label", {for: "memory-importance", class: "action-label"},
        "Importance"), importance, save),
      msg));
    if (message) showMessage(msg, message[0], message[1]);
    wrap.append(editForm(memory, msg), deleteBox(id));

    // history
    wrap.append(h("section", {class: "card", id: "memory-history"},
      h("h2", {}, "Supersession history"), h("div", {id: "history-body"},
        h("p", {class: "muted"}, "Loading…"))));

    // versions (local_store/versions.py): earlier and conflicting versions, restorable
    wrap.append(h("section", {class: "card", id: "memory-versions"},
      h("h2", {}, "Versions"), h("div", {id: "versions-body"},
        h("p", {class: "muted"}, "Loading…"))));

    // edges
    const out = edges.filter((e) => e.src === id);
    const inc = edges.filter((e) => e.dst === id && e.src !== id);
    wrap.append(h("section", {class: "card", id: "memory-edges"},
      h("h2", {}, `Edges (${edges.length})`),
      h("h3", {}, `Outgoing (${out.length})`),
      out.length ? edgeTable(out, "dst", "To") : h("p", {class: "muted"}, "none"),
      h("h3", {}, `Incoming (${inc.length})`),
      inc.length ? edgeTable(inc, "src", "From") : h("p", {class: "muted"}, "none")));

    // every other field
    const shown = new Set(["content", "title", "edges", "tags", "content_preview"]);
    const details = [];
    const order = ["id", "memory_type", "realm", "status", "importance", "provenance",
      "created_at", "updated_at", "valid_at", "invalid_at", "superseded_by"];
    const keys = order.filter((k) => k in memory).concat(
      Object.keys(memory).filter((k) => !order.includes(k) && !shown.has(k)));
    for (const key of keys) details.push([key, detailValue(key, memory[key]), key]);
    details.splice(3, 0, ["tags", (memory.tags || []).join(", "), "tags"]);
    wrap.append(h("section", {class: "card", id: "memory-details"}, h("h2", {}, "Details"),
      kv(details)));
    return wrap;
  }

  /** Title, content, tags and importance, saved as one edit (``PATCH …/items/{id}``, a new
   * version that syncs): only the fields that differ from what was loaded are sent. */
  function editForm(memory, msg) {
    const id = memory.id;
    const tagsText = (memory.tags || []).join(", ");
    const title = h("input", {type: "text", id: "edit-title", value: memory.title || "",
      "data-field": "title", placeholder: "(none: the first line heads it)"});
    const content = h("textarea", {id: "edit-content", rows: 6, "data-field": "content"});
    content.value = memory.content || "";
    const tags = h("input", {type: "text", id: "edit-tags", value: tagsText,
      "data-field": "tags", placeholder: "comma-separated"});
    const importance = h("input", {type: "number", id: "edit-importance", min: "0", max: "1",
      step: "0.05", value: String(memory.importance ?? ""), "data-field": "importance"});
    const save = h("button", {type: "submit", class: "primary", id: "edit-save"}, "Save edit");
    const form = h("form", {class: "card edit-form", id: "memory-edit", novalidate: true},
      h("h2", {}, "Edit"),
      h("label", {}, "Title", title), h("label", {}, "Content", content),
      h("div", {class: "filters"}, h("label", {}, "Tags", tags),
        h("label", {}, "Importance (0–1)", importance)), h("div", {}, save));
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      clearFieldErrors(form);
      const body = {};
      if (title.value.trim() !== (memory.title || "")) body.title = title.value.trim() || null;
      if (content.value !== (memory.content || "")) body.content = content.value;
      if (splitList(tags.value).join(",") !== (memory.tags || []).join(",")) {
        body.tags = splitList(tags.value);
      }
      if (importance.value.trim() !== String(memory.importance ?? "")) {
        const value = Number(importance.value);
        if (importance.value.trim() === "" || !Number.isFinite(value) || value < 0 ||
            value > 1) {
          fieldError(form, "importance", "a number from 0 to 1");
          showMessage(msg, "Not saved: importance must be a number from 0 to 1", "error");
          return;
        }
        body.importance = value;
      }
      if (!Object.keys(body).length) {
        showMessage(msg, "Nothing changed.", "info");
        return;
      }
      save.disabled = true;
      showMessage(msg, "Saving…", "info");
      try {
        await api("PATCH", "/v1/agent/memory/items/" + encodeURIComponent(id), body);
      } catch (exc) {
        save.disabled = false;
        if (exc.field) fieldError(form, exc.field, exc.message);
        showMessage(msg, "Not saved: " + errorText(exc), "error");
        return;
      }
      if (state.view === "memory" && state.lastMemory === id) {
        await openMemory(id, ["Saved: " + Object.keys(body).join(", "), "ok"]);
      }
    });
    return form;
  }

  /** Delete, after a confirmation: soft (hidden, synced as deleted) or hard (its text purged
   * from this store too). */
  function deleteBox(id) {
    const ask = h("button", {type: "button", id: "memory-delete"}, "Delete…");
    const hard = h("input", {type: "checkbox", id: "delete-hard"});
    const confirmButton = h("button", {type: "button", class: "danger", id: "delete-confirm"},
      "Delete");
    const cancel = h("button", {type: "button", id: "delete-cancel"}, "Cancel");
    const msg = h("p", {class: "message", id: "delete-message", role: "status", hidden: true});
    const confirmRow = h("div", {class: "confirm", id: "delete-confirmation", hidden: true},
      h("p", {}, "Delete this memory? It is hidden here and the deletion syncs."),
      h("label", {class: "check"}, hard,
        "Also purge its text from this store (hard delete; cannot be undone)"),
      h("div", {class: "actions-inline"}, confirmButton, cancel));
    ask.addEventListener("click", () => { confirmRow.hidden = false; ask.hidden = true; });
    cancel.addEventListener("click", () => {
      confirmRow.hidden = true;
      ask.hidden = false;
      hard.checked = false;
    });
    confirmButton.addEventListener("click", async () => {
      confirmButton.disabled = true;
      const path = "/v1/agent/memory/items/" + encodeURIComponent(id) +
        (hard.checked ? "?hard=true" : "");
      try {
        await api("DELETE", path);
      } catch (exc) {
        confirmButton.disabled = false;
        showMessage(msg, "Not deleted: " + errorText(exc), "error");
        return;
      }
      state.lastMemory = null;
      state.deleted = [id, hard.checked];
      $('#tabs a[data-tab="memory"]').setAttribute("href", "#/memory");
      if (location.hash === "#/memory") route();
      else location.hash = "#/memory";
    });
    return h("section", {class: "card", id: "memory-delete-box"},
      h("h2", {}, "Delete"), ask, confirmRow, msg);
  }

  function detailValue(key, value) {
    if (value === null || value === undefined || value === "") return null;
    if (key === "superseded_by") return nodeRef(value, value);
    if (/_at$/.test(key)) return when(value);
    if (typeof value === "object") return h("pre", {class: "pre small"}, jsonText(value));
    if (key === "id") return h("span", {class: "mono"}, value);
    return String(value);
  }

  function edgeTable(edges, otherKey, otherLabel) {
    return table(["Type", otherLabel, "Props", "Realm", "Updated"], edges.map((e) => [
      h("span", {class: "mono edge-type"}, e.type),
      nodeRef(e[otherKey], e[otherKey]),
      e.props === null || e.props === undefined ? h("span", {class: "muted"}, "—") :
        h("code", {class: "props"}, jsonText(e.props)),
      e.realm || "—",
      when(e.updated_at || e.created_at)]), "table edges");
  }

  async function fetchMemory(id) {
    try {
      return await api("GET", "/v1/agent/memory/items/" + encodeURIComponent(id));
    } catch (exc) {
      return {id, _error: errorText(exc)};
    }
  }

  function reason(edges, src, dst) {
    const edge = edges.find((e) => REPLACES.has(e.type) && e.src === src && e.dst === dst);
    if (!edge || edge.props === null || edge.props === undefined) return null;
    const props = edge.props;
    if (props && typeof props === "object" && props.reason) return String(props.reason);
    return jsonText(props);
  }

  async function loadHistory(memory, root, seq) {
    const id = memory.id;
    const edges = memory.edges || [];
    const parts = [];

    // what replaced it: follow superseded_by (and MERGED_INTO) as a chain
    const chain = [];
    const seen = new Set([id]);
    let current = memory;
    while (chain.length < 20) {
      let next = current.superseded_by;
      let how = "superseded";
      if (!next) {
        const merged = (current.edges || []).find((e) => e.type === "MERGED_INTO" &&
          e.src === current.id);
        if (merged) {
          next = merged.dst;
          how = "merged into";
        }
      }
      if (!next || seen.has(next)) break;
      seen.add(next);
      const successor = await fetchMemory(next);
      if (seq !== state.memorySeq) return;
      chain.push({from: current, to: successor, how,
        why: reason(successor.edges || [], next, current.id)});
      if (successor._error) break;
      current = successor;
    }
    if (chain.length) {
      const list = h("ol", {class: "chain", id: "replaced-by"});
      for (const step of chain) {
        const to = step.to;
        list.append(h("li", {},
          h("span", {class: "chain-how"}, step.how === "superseded" ? "replaced by " : "merged into "),
          nodeRef(to.id, to._error ? to.id : (to.title || firstLine(to.content_preview ||
            to.content) || to.id)),
          to.memory_type ? badge(to.memory_type, "type") : null,
          h("span", {class: "muted"}, " · when: "),
          step.from.invalid_at ? when(step.from.invalid_at) : h("span", {class: "muted"},
            step.how === "superseded" ? "not recorded" : "—"),
          h("span", {class: "muted"}, " · why: "),
          step.why ? h("span", {class: "why"}, step.why) :
            h("span", {class: "muted"}, "no reason recorded"),
          to._error ? h("span", {class: "error"}, " (" + to._error + ")") : null));
      }
      parts.push(h("h3", {}, "Replaced by"), list);
    } else {
      parts.push(h("p", {id: "history-current"}, memory.invalid_at ?
        "Invalidated, with no successor recorded." : "Current: nothing has replaced it."));
    }

    // what it replaced: INVALIDATES/SUPERSEDES edges from it, MERGED_INTO edges into it
    const replaced = [];
    for (const e of edges) {
      if (REPLACES.has(e.type) && e.src === id && e.dst !== id) {
        replaced.push({other: e.dst, how: e.type.toLowerCase(), edge: e});
      } else if (e.type === "MERGED_INTO" && e.dst === id && e.src !== id) {
        replaced.push({other: e.src, how: "merged in", edge: e});
      }
    }
    if (replaced.length) {
      const olds = await Promise.all(replaced.map((r) => fetchMemory(r.other)));
      if (seq !== state.memorySeq) return;
      const list = h("ul", {class: "chain", id: "replaced"});
      replaced.forEach((r, i) => {
        const old = olds[i];
        const why = r.edge.props && typeof r.edge.props === "object" && r.edge.props.reason ?
          String(r.edge.props.reason) : jsonText(r.edge.props);
        list.append(h("li", {},
          h("span", {class: "chain-how"}, r.how + " "),
          nodeRef(r.other, old._error ? r.other : (old.title || firstLine(old.content_preview ||
            old.content) || r.other)),
          old.memory_type ? badge(old.memory_type, "type") : null,
          h("span", {class: "muted"}, " · when: "),
          old.invalid_at ? when(old.invalid_at) : when(r.edge.created_at),
          h("span", {class: "muted"}, " · why: "),
          why ? h("span", {class: "why"}, why) : h("span", {class: "muted"}, "no reason recorded")));
      });
      parts.push(h("h3", {}, "Replaced"), list);
    }
    clear(root).append(...parts);
  }

  // ------------------------------------------------------------------ versions

  function versionsPath(id, n, action) {
    const base = "/v1/agent/memory/items/" + encodeURIComponent(id) + "/versions";
    return n === undefined ? base : `${base}/${encodeURIComponent(n)}/${action}`;
  }

  async function loadVersions(id, root, seq) {
    let answer;
    try {
      answer = await api("GET", versionsPath(id));
    } catch (exc) {
      if (seq !== state.memorySeq) return;
      clear(root).append(h("p", {class: "muted"}, "Versions unavailable: " + errorText(exc)));
      return;
    }
    if (seq !== state.memorySeq) return;
    const versions = Array.isArray(answer.versions) ? answer.versions : [];
    if (versions.length <= 1) {
      clear(root).append(h("p", {class: "muted", id: "versions-none"},
        "No earlier versions: this one is the first this store holds."));
      return;
    }
    const msg = h("p", {class: "message", id: "versions-message", role: "status", hidden: true});
    const after = (text) => openMemory(id, [text, "ok"]);
    const rows = versions.map((v) => {
      const open = v.reason === "conflict" && !v.reviewed;
      return [
        v.n === null ? "current" : "#" + v.n,
        badge(v.reason + (v.reviewed ? " (reviewed)" : ""), open ? "warn" : "type"),
        h("div", {class: "version-text"}, v.title ? h("strong", {}, v.title) : null,
          h("div", {}, v.content || "")),
        `${num(v.importance, 2)} · ${v.status}`,
        when(v.updated_at),
        h("span", {class: "mono"}, (v.origin || "the plane").slice(0, 8)),
        v.n === null ? h("span", {class: "muted"}, "—") : h("span", {class: "version-actions"},
          versionButton(id, v.n, "restore", "Restore", msg, after),
          open ? versionButton(id, v.n, "dismiss", "Dismiss", msg, after) : null),
      ];
    });
    clear(root).append(table(["#", "Reason", "Text", "Importance · status", "Written", "By",
      ""], rows, "table versions"), msg);
  }

  /** A restore (a new edit, which syncs) or a dismiss of version ``n``; ``after(text)`` shows
   * the outcome (it reloads the view the button is on). */
  function versionButton(id, n, action, label, msg, after) {
    const button = h("button", {type: "button", class: "version-" + action,
      dataset: {n: String(n), memory: id}}, label);
    button.addEventListener("click", async () => {
      button.disabled = true;
      showMessage(msg, action === "restore" ? "Restoring…" : "Dismissing…", "info");
      try {
        await api("POST", versionsPath(id, n, action));
      } catch (exc) {
        button.disabled = false;
        showMessage(msg, "Error: " + errorText(exc), "error");
        return;
      }
      await after(action === "restore" ? `Restored version ${n}: it is current, and syncs`
        : `Dismissed conflict ${n}`);
    });
    return button;
  }

  function conflictsView(status) {
    const items = Array.isArray(status.conflict_versions) ? status.conflict_versions : [];
    const msg = h("p", {class: "message", id: "conflicts-message", role: "status",
      hidden: true});
    const after = async (text) => {
      await loadSync();
      const shown = $("#conflicts-message");
      if (shown) showMessage(shown, text, "ok");
    };
    const card = h("section", {class: "card", id: "sync-conflicts"},
      h("h2", {}, "Conflicts ", status.conflicts ? badge(String(status.conflicts), "warn") :
        badge("none", "ok")));
    if (!items.length) {
      card.append(h("p", {class: "muted"}, "No conflict waiting: when two machines edit one " +
        "memory apart, the version that lost is kept here for you to restore or dismiss."), msg);
      return card;
    }
    card.append(table(["Memory", "Lost version", "Written", "By", ""], items.map((c) => [
      nodeRef(c.memory_id, c.title || c.memory_id),
      h("div", {class: "version-text"}, c.content_preview || ""),
      when(c.updated_at),
      h("span", {class: "mono"}, (c.origin || "the plane").slice(0, 8)),
      h("span", {class: "version-actions"},
        versionButton(c.memory_id, c.n, "restore", "Restore", msg, after),
        versionButton(c.memory_id, c.n, "dismiss", "Dismiss", msg, after)),
    ]), "table conflicts"), msg);
    if (status.conflicts > items.length) {
      card.append(h("p", {class: "muted"}, `The newest ${items.length} of ` +
        `${status.conflicts} are listed.`));
    }
    return card;
  }

  /** An action's answer shows in the memory's view only while it still shows that memory
   * (the person may have opened another meanwhile), and its message only when no newer action
   * started since. ``keepSince``: see openMemory. */
  async function memoryAction(id, tool, body, msg, success, button, keepSince) {
    const seq = ++state.actionSeq;
    const shown = () => state.view === "memory" && state.lastMemory === id;
    button.disabled = true;
    showMessage(msg, "Saving…", "info");
    try {
      await api("POST", "/v1/agent/memory/tools/" + tool, body);
    } catch (exc) {
      button.disabled = false;
      if (seq === state.actionSeq && shown()) {
        showMessage($("#memory-message") || msg, "Error: " + errorText(exc), "error");
      }
      return;
    }
    if (!shown()) return;
    await openMemory(id, seq === state.actionSeq ? [success, "ok"] : null, keepSince);
  }

  // ------------------------------------------------------------------ sync

  async function loadSync() {
    const root = $("#sync-body");
    const seq = ++state.syncSeq;
    document.title = "Sync · syncd";
    if (!root.firstChild) root.append(h("p", {class: "muted"}, "Loading…"));
    let status;
    try {
      status = await api("GET", "/v1/agent/sync/status");
    } catch (exc) {
      if (seq !== state.syncSeq) return;
      clear(root).append(h("p", {class: "error", role: "alert"}, errorText(exc)));
      return;
    }
    if (seq !== state.syncSeq) return;
    renderSync(status);
  }

  function renderSync(status) {
    const root = clear($("#sync-body"));
    const ent = status.entitlement;
    $("#sync-now").disabled = status.configured === false || state.syncing;
    const cards = h("div", {class: "grid"});
    if (status.configured === false) {
      cards.append(h("section", {class: "card"}, h("h2", {}, "Control plane"),
        h("p", {}, "Sync is off: ", status.reason || "no control plane configured")));
    } else {
      const lastPass = status.last_pass;
      cards.append(h("section", {class: "card", id: "sync-plane"}, h("h2", {}, "Control plane"),
        kv([
          ["URL", h("span", {class: "mono"}, status.url), "url"],
          ["Realm", status.realm || "all", "realm"],
          ["Cursor", status.cursor ? h("span", {class: "mono"}, status.cursor) : null, "cursor"],
          ["Plane store", status.plane_store_id, "plane_store_id"],
          ["Plane model", status.plane_model, "plane_model"],
          ["Interval", status.interval_secs ? `${status.interval_secs} s` : null,
            "interval_secs"],
        ])));
      const stateBadge = status.gated ? badge("paused: " + status.gated, "warn") :
        status.auth_blocked ? badge("token refused", "bad") :
          status.consecutive_failures ? badge("failing", "bad") :
            status.last_success ? badge("ok", "ok") : badge("not yet synced", "warn");
      cards.append(h("section", {class: "card", id: "sync-health"},
        h("h2", {}, "Health ", stateBadge),
        kv([
          ["Last success", when(status.last_success, "never"), "last_success"],
          ["Last error", lastErrorView(status), "last_error"],
          ["Last error at", status.last_error ? when(status.last_error_at) : null,
            "last_error_at"],
          ["Outbox depth", String(status.outbox ?? "—"), "outbox"],
          ["Clock offset", typeof status.clock_offset_ms === "number" ?
            `${status.clock_offset_ms.toFixed(0)} ms` : null, "clock_offset_ms"],
          ["Passes", `${status.passes ?? 0} (${status.failures ?? 0} failed, ` +
            `${status.consecutive_failures ?? 0} in a row)`, "passes"],
          ["Backoff", status.next_attempt_in_secs > 0 ?
            `next attempt in ${Math.round(status.next_attempt_in_secs)} s` : "none",
          "next_attempt_in_secs"],
          ["Future rows", String(status.future_rows ?? 0), "future_rows"],
          ["Drift rejections", String(status.drift_rejections ?? 0), "drift_rejections"],
          ["Egress refusals", String(status.egress_refusals ?? 0), "egress_refusals"],
          ["Skipped rows", (status.skipped_rows || []).length ?
            (status.skipped_rows || []).join(", ") : "0", "skipped_rows"],
          ["Too large to push", (status.too_large_rows || []).length ?
            (status.too_large_rows || []).join(", ") : "0", "too_large_rows"],
          ["Waiting for a plane-model vector", String(status.awaiting_vector ?? 0),
            "awaiting_vector"],
        ])));
      cards.append(h("section", {class: "card", id: "sync-last-pass"},
        h("h2", {}, "Last pass"), lastPass ? passView(lastPass) :
          h("p", {class: "muted"}, "No pass yet since the daemon started.")));
    }
    if (typeof status.conflicts === "number") cards.append(conflictsView(status));
    cards.append(h("section", {class: "card", id: "sync-gate"}, h("h2", {}, "Entitlement"),
      ent ? gateView(ent) : h("p", {class: "muted"}, "This daemon has no entitlement gate.")));
    root.append(cards);
    if (status.totals && Object.keys(status.totals).length) {
      root.append(h("section", {class: "card", id: "sync-totals"},
        h("h2", {}, "Totals since the daemon started"),
        h("dl", {class: "kv compact totals"}, Object.entries(status.totals).map(([k, v]) =>
          h("div", {class: "kv-row", dataset: {key: k}}, h("dt", {}, k.replace(/_/g, " ")),
            h("dd", {}, String(v)))))));
    }
  }

  const PHASES = [
    ["Pull", [["nodes", "pulled_nodes"], ["edges", "pulled_edges"], ["pages", "pull_pages"],
      ["problems", "pull_problems"]]],
    ["Push", [["nodes", "pushed_nodes"], ["edges", "pushed_edges"],
      ["requests", "push_requests"], ["splits", "push_splits"],
      ["row errors", "push_row_errors"]]],
    ["Repair", [["requeued", "requeued"], ["future rows", "future_rows"],
      ["anti-entropy", "anti_entropy"], ["reset", "reset"], ["clock rewound", "clock_rewound"]]],
    ["Wire", [["requests", "requests"], ["bytes in", "bytes_in"], ["bytes out", "bytes_out"]]],
  ];

  /** The last error, in red while it stands; once a later pass succeeded it is shown as
   * resolved, with that pass's time (the daemon keeps the error's text for the record). */
  function lastErrorView(status) {
    if (!status.last_error) return null;
    const failed = parseTime(status.last_error_at);
    const succeeded = parseTime(status.last_success);
    if (failed && succeeded && succeeded > failed) {
      return h("span", {class: "resolved", id: "sync-error-resolved"},
        badge("resolved", "ok"), " ", h("span", {class: "muted"}, status.last_error),
        h("span", {class: "resolved-at"}, " · resolved by the pass at ",
          when(status.last_success)));
    }
    return h("span", {class: "error-text", id: "sync-error-open"}, status.last_error);
  }

  function passView(pass) {
    const box = h("div", {class: "pass"});
    box.append(h("p", {},
      pass.ok ? badge("ok", "ok") : badge("failed", "bad"), " ",
      h("span", {class: "muted"}, `${pass.trigger || "?"} · `), when(pass.started_at),
      h("span", {class: "muted"}, ` · ${num(pass.took_ms, 0)} ms`)));
    if (pass.error) {
      box.append(h("p", {class: "error-text"}, (pass.error_kind ? pass.error_kind + ": " : "") +
        pass.error));
    }
    const phases = h("div", {class: "phases"});
    for (const [phase, counters] of PHASES) {
      const rows = counters.filter(([, key]) => key in pass).map(([label, key]) => {
        const value = pass[key];
        const shown = value === true ? "yes" : value === false ? "no" :
          value === null || value === undefined ? "—" : String(value);
        return h("div", {class: "kv-row", dataset: {key}}, h("dt", {}, label),
          h("dd", {}, shown));
      });
      phases.append(h("div", {class: "phase", dataset: {phase: phase.toLowerCase()}},
        h("h3", {}, phase), h("dl", {class: "kv compact"}, rows)));
    }
    box.append(phases);
    return box;
  }

  function gateView(ent) {
    const features = Array.isArray(ent.features) ? ent.features.join(", ") : null;
    const gates = h("span", {},
      badge("sync: " + (ent.sync || "?"), ent.sync === "on" ? "ok" : "warn"), " ",
      badge("graph: " + (ent.graph || "?"), ent.graph === "on" ? "ok" : "warn"));
    return kv([
      ["State", ent.entitled ? badge("entitled", "ok") :
        badge("paused" + (ent.reason ? ": " + ent.reason : ""), "warn"), "entitled"],
      ["Reason", ent.reason, "reason"],
      ["Gates", gates, "gates"],
      ["Plan", ent.plan, "plan"],
      ["Features", features, "features"],
      ["Expires", ent.exp ? unixWhen(ent.exp) : null, "exp"],
      ["Source", ent.source, "source"],
      ["Checked", ent.checked_at ? unixWhen(ent.checked_at) : null, "checked_at"],
      ["Online error", ent.last_online_error, "last_online_error"],
      ["Device", ent.device_id ? h("span", {class: "mono"}, ent.device_id) : null, "device_id"],
    ]);
  }

  async function syncNow() {
    const button = $("#sync-now");
    const msg = $("#sync-message");
    const seq = ++state.syncRunSeq;
    state.syncing = true;
    button.disabled = true;
    showMessage(msg, "Syncing…", "info");
    let report;
    try {
      report = await api("POST", "/v1/agent/sync/run", {});
    } catch (exc) {
      state.syncing = false;
      button.disabled = false;
      if (seq === state.syncRunSeq) showMessage(msg, "Sync failed: " + errorText(exc), "error");
      return;
    }
    state.syncing = false;
    button.disabled = false;
    const text = report.ok ?
      `Pass done in ${num(report.took_ms, 0)} ms: pulled ${report.pulled_nodes} memories and ` +
      `${report.pulled_edges} edges, pushed ${report.pushed_nodes} memories and ` +
      `${report.pushed_edges} edges.` :
      `Pass failed: ${report.error_kind ? report.error_kind + ": " : ""}${report.error || "?"}`;
    await loadSync();
    // the report, unless the view was opened again since (that ended it)
    if (seq === state.syncRunSeq) showMessage(msg, text, report.ok ? "ok" : "error");
  }

  // ------------------------------------------------------------------ status (a hub)

  const STATUS_FIELDS = [["version", "Version"], ["role", "Server role"], ["store", "Store"],
    ["store_id", "Store id"], ["cursor", "Feed cursor"], ["embedding_model", "Embedding model"]];
  // The hub's status has one shape (docs/hub.md): a count its store does not keep is null (—).
  const STATUS_COUNTS = [["memories", "Memories"], ["tombstones", "Tombstones"],
    ["edges", "Edges"], ["outbox", "Outbox"], ["indexed_vectors", "Indexed vectors"]];

  async function loadStatus() {
    setTitle("Status");
    const root = $("#status-body");
    const seq = ++state.statusSeq;
    if (!root.firstChild) root.append(h("p", {class: "muted"}, "Loading…"));
    let status;
    let session = null;
    try {
      [status, session] = await Promise.all([api("GET", "/v1/agent/status"),
        api("GET", "/ui/session", undefined, {keepSession: true}).catch((exc) => {
          if (exc instanceof ApiError && exc.status === 401) throw exc;
          return null;  // the status alone is still worth showing
        })]);
    } catch (exc) {
      if (seq !== state.statusSeq) return;
      clear(root).append(h("p", {class: "error", role: "alert"}, errorText(exc)));
      return;
    }
    if (seq !== state.statusSeq) return;
    if (session) {
      state.role = session.role || state.role;
      state.name = session.name || state.name;
    }
    renderStatus(status, session);
  }

  function statusValue(key, value) {
    if (value === null || value === undefined || value === "") return null;
    if (typeof value === "object") return h("pre", {class: "pre small"}, jsonText(value));
    if (/_at$/.test(key)) return when(value);
    if (key === "store_id" || key === "embedding_model" || key === "version") {
      return h("span", {class: "mono"}, String(value));
    }
    return String(value);
  }

  function renderStatus(status, session) {
    const root = clear($("#status-body"));
    const known = new Set([...STATUS_FIELDS, ...STATUS_COUNTS].map(([key]) => key));
    const extra = Object.entries(status).filter(([key]) => !known.has(key));
    const counts = STATUS_COUNTS.filter(([key]) => key in status)
      .concat(extra.filter(([, v]) => typeof v === "number").map(([key]) => [key,
        key.replace(/_/g, " ")]));
    const fields = STATUS_FIELDS.map(([key, label]) => [label, statusValue(key, status[key]),
      key]).concat(extra.filter(([, v]) => typeof v !== "number").map(([key, value]) =>
      [key.replace(/_/g, " "), statusValue(key, value), key]));
    const role = state.role;
    const expires = session && typeof session.expires_in === "number" ?
      when(new Date(Date.now() + session.expires_in * 1000).toISOString()) : null;
    root.append(h("div", {class: "grid"},
      h("section", {class: "card", id: "status-hub"}, h("h2", {}, "Hub"), kv(fields)),
      h("div", {},
        h("section", {class: "card", id: "status-session"}, h("h2", {}, "Signed in"), kv([
          ["Token", state.name ? h("span", {class: "mono"}, state.name) :
            h("span", {class: "muted"}, "(name not reported; sign in again to see it)"), "name"],
          ["Role", role ? badge(role, role === "read" ? "warn" : "ok") : null, "role"],
          ["Can change settings", role ? (role === "read" ? "no (read-only token)" : "yes") :
            null, "can_write"],
          ["Session ends", expires, "expires_in"],
        ])),
        h("section", {class: "card", id: "status-counts"}, h("h2", {}, "Contents"),
          kv(counts.map(([key, label]) => [label, statusValue(key, status[key]), key]))))));
  }

  // ------------------------------------------------------------------ settings

  const W = {kind: "float", min: 0, max: 10};
  const SETTINGS_SCHEMA = {
    w_rrf: {...W, group: "weights", help: "reciprocal rank fusion"},
    w_semantic: {...W, group: "weights", help: "meaning (cosine)"},
    w_keyword: {...W, group: "weights", help: "keywords (BM25)"},
    w_graph: {...W, group: "weights", help: "graph proximity"},
    w_importance: {...W, group: "weights", help: "importance"},
    w_recency: {...W, group: "weights", help: "recency"},
    w_reinforcement: {...W, group: "weights", help: "reinforcement"},
    default_limit: {kind: "int", min: 1, max: 100, group: "defaults",
      help: "memories per recall"},
    default_expand_hops: {kind: "int", min: 0, max: 2, group: "defaults",
      help: "graph hops (0–2)"},
    ann_threshold: {kind: "float", min: 0, max: 1, group: "defaults",
      help: "semantic floor (0–1)"},
    half_life_days: {kind: "float", min: 0, exclusiveMin: true, max: 36500, group: "defaults",
      help: "recency half-life, days"},
    rrf_k: {kind: "float", min: 0, exclusiveMin: true, max: 100000, group: "defaults",
      help: "RRF k"},
    extraction_enabled: {kind: "bool", group: "extraction"},
    min_events: {kind: "int", min: 0, max: 1000000, group: "extraction"},
    embedding_model: {kind: "str", nullable: true, group: "extraction",
      help: "the hub's embedding model (empty = none)"},
    dreaming: {kind: "group", fields: {
      enabled: {kind: "bool"},
      interval_secs: {kind: "int", min: 1, max: 31536000, help: "seconds"},
      mode: {kind: "enum", options: ["full", "housekeeping_only", "sources"]},
      realm_scope: {kind: "list", help: "comma-separated; empty = all"},
      max_tool_calls: {kind: "int", min: 0, max: 1000000},
      wall_clock_secs: {kind: "int", min: 1, max: 604800, help: "seconds"},
      data_source_read_budget: {kind: "int", min: 0, max: 1000000},
      data_source_read_max_bytes: {kind: "int", min: 0, max: 1073741824, help: "bytes"},
      mutation_cap: {kind: "int", min: 0, max: 1000000},
    }},
    // The current plane's blocks (docs/kyma-current-surface.md §3): stored and served, not
    // used by syncd's own recall.
    reinforcement: {kind: "group", fields: {
      enabled: {kind: "bool"},
      hit_weight: {kind: "float", min: 0, max: 10},
      miss_penalty: {kind: "float", min: 0, max: 10},
      half_life_days: {kind: "float", min: 0, exclusiveMin: true, max: 36500, help: "days"},
    }},
    precedent: {kind: "group", fields: {
      enabled: {kind: "bool"},
      max_distance: {kind: "float", min: 0, max: 2},
      memory_limit: {kind: "int", min: 0, max: 1000000},
    }},
    mmr: {kind: "group", fields: {
      enabled: {kind: "bool"},
      lambda: {kind: "float", min: 0, max: 1},
      pool_multiplier: {kind: "int", min: 1, max: 1000},
    }},
    validity_gate: {kind: "group", fields: {
      enabled: {kind: "bool"},
      llm_escalation_enabled: {kind: "bool"},
      min_confidence: {kind: "float", min: 0, max: 1},
      min_content_chars: {kind: "int", min: 0, max: 1000000},
    }},
    schema_induction: {kind: "group", fields: {
      enabled: {kind: "bool"},
      min_examples: {kind: "int", min: 0, max: 1000000},
      interval_days: {kind: "int", min: 0, max: 36500, help: "days"},
    }},
    default_visibility: {kind: "enum", options: ["public", "private"], group: "other"},
    hitl: {kind: "group", fields: {
      enabled: {kind: "bool"},
      ops: {kind: "group", fields: Object.fromEntries(["add", "update", "invalidate", "merge",
        "archive", "link_entity_cross_realm", "relationship_write", "promote_file_candidate"]
        .map((k) => [k, {kind: "enum", options: HITL_MODES}]))},
      confidence_threshold: {kind: "float", min: 0, max: 1},
      realm_scope: {kind: "list", help: "comma-separated; empty = all"},
      type_scope: {kind: "list", help: "comma-separated; empty = all"},
    }},
  };
  const GROUPS = [
    ["weights", "Recall weights", "How much each signal counts in a memory's score."],
    ["defaults", "Recall defaults", "Used when a query does not say."],
    ["extraction", "Extraction", null],
    ["other", "Other", null],
  ];

  // The settings view and late answers (rules). The form shown stays editable while the view
  // loads again; the answer, when it is the latest settings request's (state.settingsSeq),
  // updates the fields in place, except the ones edited since that request went out (a load:
  // any edit not saved yet), which keep what was typed and are compared with the new value
  // (data-initial) instead. A save sends only the fields that differ from the last answer, so
  // a form older than the daemon's settings never writes its old values back. #view-settings
  // says where it is in data-state: "loading", "saving", "ready" (or "error": not loaded).

  function settingsState(name) {
    $("#view-settings").dataset.state = name;
    const form = $("#settings-form");
    if (name === "loading" || name === "saving") form.setAttribute("aria-busy", "true");
    else form.removeAttribute("aria-busy");
  }

  async function loadSettings() {
    setTitle("Settings");
    const msg = $("#settings-message");
    const seq = ++state.settingsSeq;
    const saving = state.saving;
    if (!saving) {  // opening the view again ends a finished save's message (one running reports)
      state.saveSeq += 1;
      showMessage(msg, "");
    }
    settingsState("loading");
    settingsAccess();
    try {
      if (saving) await saving;  // then read what it stored
      const settings = await api("GET", "/v1/agent/memory/settings");
      if (seq !== state.settingsSeq) return;  // a newer load or a save answers instead
      applySettings(settings, 0);
      settingsState("ready");
    } catch (exc) {
      if (seq !== state.settingsSeq || sessionEnded()) return;
      settingsState(state.settings ? "ready" : "error");
      showMessage(msg, "Could not load the settings: " + errorText(exc), "error");
    }
  }

  /** A hub page whose session just ended (a 401): it shows the sign-in form instead. */
  function sessionEnded() {
    return isHub() && !state.csrf;
  }

  function readOnlySettings() {
    return isHub() && state.role === "read";
  }

  /** A hub session with a read token sees the settings but cannot edit them. */
  function settingsAccess() {
    if (!isHub()) return;
    const readOnly = readOnlySettings();
    $("#settings-readonly").hidden = !readOnly;
    $("#settings-save").disabled = readOnly || Boolean(state.saving);
    $("#settings-reset").disabled = readOnly;
    for (const input of $("#settings-form").querySelectorAll("[data-path]")) {
      if (readOnly || input.dataset.locked === "1") input.disabled = true;
    }
  }

  /** The schema of a value the page does not know (a newer daemon's key). */
  function guessSpec(value) {
    if (typeof value === "boolean") return {kind: "bool"};
    if (typeof value === "number") return {kind: "float"};
    if (Array.isArray(value) && value.every((v) => typeof v === "string")) return {kind: "list"};
    if (value && typeof value === "object") return {kind: "json"};
    return {kind: "str", nullable: value === null};
  }

  /** The form anew from ``settings`` (Revert): what was typed goes. */
  function renderSettings(settings) {
    clear($("#settings-form")).append(...settingsFields(settings).childNodes);
    settingsAccess();
  }

  /** What the inputs are: their paths, kinds and choices (an answer may add or drop keys). */
  function formShape(root) {
    return [...root.querySelectorAll("[data-path]")].map((input) => [input.dataset.path,
      input.dataset.kind, input.dataset.locked || "",
      input.tagName === "SELECT" ? [...input.options].map((o) => o.value).join("|") : ""]
      .join(" ")).join("\n");
  }

  /** An answer's ``settings`` into the form, but not over a field edited after ``since`` (an
   * edit count: such a field keeps its value, now compared with the answer's). The same fields
   * are updated in place, so focus and caret stay where the person has them. */
  function applySettings(settings, since) {
    state.settings = settings;
    const form = $("#settings-form");
    const fresh = settingsFields(settings);
    const typed = (input) => Number(input.dataset.edited || 0) > since;
    if (formShape(form) === formShape(fresh)) {
      for (const input of fresh.querySelectorAll("[data-path]")) {
        const path = input.dataset.path;
        const field = form.querySelector(`[data-path="${CSS.escape(path)}"]`);
        field.dataset.initial = input.dataset.initial;
        if (!typed(field)) {
          if (field.dataset.kind === "bool") field.checked = input.checked;
          else field.value = input.value;
          delete field.dataset.edited;
          setFieldError(path, null);
        }
        field.closest(".field").classList.toggle("changed", isChanged(field));
      }
    } else {
      const active = document.activeElement;
      const kept = [...form.querySelectorAll("[data-path]")].filter(typed);
      clear(form).append(...fresh.childNodes);
      for (const old of kept) {
        const input = form.querySelector(`[data-path="${CSS.escape(old.dataset.path)}"]`);
        if (!input || input.dataset.kind !== old.dataset.kind) continue;  // gone, or changed
        if (input.tagName === "SELECT" &&
            ![...input.options].some((o) => o.value === old.value)) continue;  // not a choice
        if (input.dataset.kind === "bool") input.checked = old.checked;
        else input.value = old.value;
        input.dataset.edited = old.dataset.edited;
        setFieldError(input.dataset.path, readField(input)[1]);
        input.closest(".field").classList.toggle("changed", isChanged(input));
        if (old === active) input.focus();
      }
    }
    settingsAccess();
  }

  /** The settings' fieldsets, in a detached element. */
  function settingsFields(settings) {
    const form = h("div");
    const groups = Object.fromEntries(GROUPS.map(([key, title, help]) => [key,
      h("fieldset", {class: "card settings-group", dataset: {group: key}},
        h("legend", {}, title), help ? h("p", {class: "muted small"}, help) : null,
        h("div", {class: "fields"}))]));
    const nested = [];
    for (const [key, value] of Object.entries(settings)) {
      const spec = SETTINGS_SCHEMA[key] || guessSpec(value);
      if (spec.kind === "group" && value && typeof value === "object") {
        nested.push(groupFieldset(key, key, spec, value));
      } else {
        $(".fields", groups[spec.group || "other"]).append(settingField(key, key, spec, value));
      }
    }
    for (const [key] of GROUPS) {
      if ($(".fields", groups[key]).firstChild) form.append(groups[key]);
    }
    if (nested.length) form.append(planeSettings(nested));
    return form;
  }

  /** The sections only the control plane acts on (dreaming, HITL, reinforcement…), folded
   * away: the daemon stores and serves them for the plane, its own recall never reads them.
   * Kept open once opened, across the form's re-renders. */
  function planeSettings(fieldsets) {
    const details = h("details", {class: "plane-settings", id: "settings-plane"},
      h("summary", {}, `Control-plane settings (${fieldsets.length} sections)`),
      h("p", {class: "muted small", id: "settings-plane-note"}, isHub() ? "These are the " +
        "control plane's settings: this hub stores and serves them to the laptops; syncd's " +
        "recall does not use them." : "These are the control plane's settings: this daemon " +
        "stores and serves them, but the laptop's recall does not use them."), ...fieldsets);
    details.open = state.planeOpen;
    details.addEventListener("toggle", () => { state.planeOpen = details.open; });
    return details;
  }

  function groupFieldset(path, label, spec, value) {
    const fieldset = h("fieldset", {class: "card settings-group", dataset: {group: path}},
      h("legend", {}, label));
    const fields = h("div", {class: "fields"});
    const subgroups = [];
    for (const [key, sub] of Object.entries(value)) {
      const subSpec = (spec.fields || {})[key] || guessSpec(sub);
      const subPath = path + "." + key;
      if (subSpec.kind === "group" && sub && typeof sub === "object") {
        subgroups.push(groupFieldset(subPath, key, subSpec, sub));
      } else {
        fields.append(settingField(subPath, key, subSpec, sub));
      }
    }
    fieldset.append(fields, ...subgroups);
    return fieldset;
  }

  function rangeHint(spec) {
    if (spec.kind !== "int" && spec.kind !== "float") return spec.help || null;
    const lo = spec.min === undefined ? null : (spec.exclusiveMin ? `> ${spec.min}` : `${spec.min}`);
    const range = lo !== null && spec.max !== undefined && !spec.exclusiveMin ?
      `${spec.min}–${spec.max}` : lo !== null ? lo : "";
    return [spec.help, range, spec.kind === "int" ? "whole number" : null]
      .filter((s) => s).join(" · ");
  }

  function settingField(path, label, spec, value) {
    const id = "s-" + path.replace(/[^A-Za-z0-9_-]/g, "-");
    const common = {id, name: path, "data-field": path, "data-path": path, "data-kind": spec.kind};
    let input;
    if (spec.kind === "bool") {
      input = h("input", {...common, type: "checkbox"});
      input.checked = Boolean(value);
      input.dataset.initial = String(Boolean(value));
    } else if (spec.kind === "enum") {
      const options = spec.options.includes(value) ? spec.options : [...spec.options, value];
      input = h("select", common, options.map((o) => h("option", {value: o}, o)));
      input.value = value;
      input.dataset.initial = String(value);
    } else if (spec.kind === "json") {
      input = h("textarea", {...common, rows: 3});
      input.value = JSON.stringify(value);
      input.dataset.initial = input.value;
    } else {
      const numeric = spec.kind === "int" || spec.kind === "float";
      input = h("input", {...common, type: numeric ? "number" : "text",
        step: spec.kind === "int" ? "1" : numeric ? "any" : null,
        min: numeric && spec.min !== undefined ? String(spec.min) : null,
        max: numeric && spec.max !== undefined ? String(spec.max) : null,
        inputmode: numeric ? "decimal" : null});
      input.value = spec.kind === "list" ? (value || []).join(", ") :
        value === null || value === undefined ? "" : String(value);
      input.dataset.initial = input.value;
    }
    let hint = rangeHint(spec);
    if (isHub() && path === "embedding_model") {  // the hub reports its embedder's model
      input.dataset.locked = "1";
      hint = "the hub's embedder (not editable here)";
    }
    const control = spec.kind === "bool" ?
      h("label", {class: "check", for: id}, input, h("span", {class: "field-name"}, label)) :
      h("label", {class: "field-name", for: id}, label);
    return h("div", {class: "field" + (spec.kind === "bool" ? " field-bool" : ""),
      dataset: {setting: path}},
    control, spec.kind === "bool" ? null : input,
    hint ? h("span", {class: "hint"}, hint) : null,
    h("p", {class: "field-error", dataset: {for: path}, hidden: true}));
  }

  /** [value, error] for one settings input, by its data-kind. */
  function readField(input) {
    const spec = specFor(input.dataset.path);
    const kind = input.dataset.kind;
    const raw = input.value;
    if (kind === "bool") return [input.checked, null];
    if (kind === "enum" || kind === "text") return [raw, null];
    if (kind === "list") return [splitList(raw), null];
    if (kind === "str") return [raw.trim() === "" && spec.nullable ? null : raw.trim(), null];
    if (kind === "json") {
      try {
        return [JSON.parse(raw), null];
      } catch (exc) {
        return [null, "must be valid JSON"];
      }
    }
    if (kind === "int" || kind === "float") {
      if (raw.trim() === "") {
        return [null, input.validity && input.validity.badInput ? "must be a number" :
          "required"];
      }
      const n = Number(raw);
      if (!Number.isFinite(n)) return [null, "must be a number"];
      if (kind === "int" && !Number.isInteger(n)) return [null, "must be a whole number"];
      if (spec.min !== undefined) {
        if (spec.exclusiveMin && n <= spec.min) return [null, `must be more than ${spec.min}`];
        if (!spec.exclusiveMin && n < spec.min) return [null, `must be at least ${spec.min}`];
      }
      if (spec.max !== undefined && n > spec.max) return [null, `must be at most ${spec.max}`];
      return [n, null];
    }
    return [raw, null];
  }

  function specFor(path) {
    let spec = {fields: SETTINGS_SCHEMA};
    for (const part of String(path).split(".")) {
      spec = spec && spec.fields ? spec.fields[part] : undefined;
    }
    return spec || {};
  }

  function setFieldError(path, message) {
    const form = $("#settings-form");
    const field = form.querySelector(`.field[data-setting="${CSS.escape(path)}"]`);
    if (!field) return false;
    const input = field.querySelector("[data-path]");
    const error = field.querySelector(".field-error");
    field.classList.toggle("has-error", Boolean(message));
    if (input) {
      input.classList.toggle("invalid", Boolean(message));
      if (message) input.setAttribute("aria-invalid", "true");
      else input.removeAttribute("aria-invalid");
    }
    error.textContent = message || "";
    error.hidden = !message;
    return true;
  }

  function isChanged(input) {
    if (input.dataset.kind === "bool") return String(input.checked) !== input.dataset.initial;
    return input.value !== input.dataset.initial;
  }

  function onSettingsInput(event) {
    const input = event.target.closest("[data-path]");
    if (!input) return;
    const [, error] = readField(input);
    setFieldError(input.dataset.path, error);
    input.dataset.edited = String(++state.editSeq);  // the person's now (applySettings)
    input.closest(".field").classList.toggle("changed", isChanged(input));
    showMessage($("#settings-message"), "");
  }

  function setPath(target, path, value) {
    const parts = path.split(".");
    let node = target;
    for (const part of parts.slice(0, -1)) {
      if (!node[part] || typeof node[part] !== "object") node[part] = {};
      node = node[part];
    }
    node[parts[parts.length - 1]] = value;
  }

  async function saveSettings(event) {
    event.preventDefault();
    const mine = ++state.saveSeq;  // an older save's answer no longer writes the message
    const form = $("#settings-form");
    const msg = $("#settings-message");
    const body = {};
    const hub = isHub();
    let errors = 0;
    let first = null;
    for (const input of form.querySelectorAll("[data-path]")) {
      if (input.disabled) continue;
      const [value, error] = readField(input);
      setFieldError(input.dataset.path, error);
      if (error) {
        errors += 1;
        first = first || input;
      } else if (isChanged(input)) {
        setPath(body, input.dataset.path, value);  // only what changed: a patch
      }
    }
    if (errors) {
      showMessage(msg, `Not saved: ${errors} field${errors === 1 ? "" : "s"} to fix.`, "error");
      first.focus();
      return;
    }
    const seq = ++state.settingsSeq;  // a load still running answers too late: dropped
    const since = state.editSeq;  // edits from now on are not in this save
    $("#settings-save").disabled = true;
    settingsState("saving");
    showMessage(msg, "Saving…", "info");
    const run = putSettings(body, hub, seq, mine, since);
    state.saving = run;
    await run;
    if (state.saving === run) {  // no newer save runs (nor did the hub session end)
      state.saving = null;
      $("#settings-save").disabled = readOnlySettings();
    }
  }

  /** A save's request and its answer; it never rejects (a load waiting for it reads after). */
  async function putSettings(body, hub, seq, mine, since) {
    const form = $("#settings-form");
    const msg = $("#settings-message");
    const latest = () => mine === state.saveSeq;
    try {
      let settings = await api("PUT", "/v1/agent/memory/settings", body);
      if (hub) {
        // what the hub serves now (its GET reports the embedder's model, its PUT the stored one)
        settings = await api("GET", "/v1/agent/memory/settings").catch(() => settings);
      }
      if (seq === state.settingsSeq) {
        applySettings(settings, since);
        settingsState("ready");
      } else {  // a load waiting for this save answers instead: what was saved is no edit now
        for (const input of form.querySelectorAll("[data-edited]")) {
          if (Number(input.dataset.edited) <= since) delete input.dataset.edited;
        }
      }
      if (latest()) showMessage(msg, "Saved.", "ok");
    } catch (exc) {
      if (sessionEnded()) return;
      if (seq === state.settingsSeq) settingsState("ready");  // the form is as it was
      if (!latest()) return;
      if (exc instanceof ApiError && exc.field && setFieldError(exc.field, exc.message)) {
        showMessage(msg, `Not saved: ${serverName()} refused ${exc.field}.`, "error");
        const input = form.querySelector(`[data-path="${CSS.escape(exc.field)}"]`);
        if (input) input.focus();
      } else {
        showMessage(msg, "Not saved: " + errorText(exc), "error");
      }
    }
  }

  document.addEventListener("DOMContentLoaded", boot);
})();
