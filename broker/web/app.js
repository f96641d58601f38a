// Relay's dashboard: plain ES2020, no framework, no build step.
//
// Parts, top to bottom: inert text (the one way broker text reaches the DOM), DOM
// helpers, the per-frame scheduler, the API client and its streams, the fleet model
// (one fleet watch), the header (badge, title, live indicator,
// notifications), reusable pieces (keyed table, approval items, replay entries), the
// views, the router and the keyboard.
//
// Every text from the broker goes in through `text()` (text nodes, never innerHTML);
// the page runs under a CSP that allows no inline script or style.
//
// Every route and enum value it uses comes from `api.gen.js`, generated from the
// method table (`relay_protocol::methods`): the page spells no route of its own.

import { METHODS, LIVE_FLIGHT_STATES, methodPath } from "/api.gen.js";

// ---------------------------------------------------------------------------------
// Inert text: control characters (C0 but \n and \t, DEL, C1) and invisible format
// characters (bidi overrides, zero-width, separators, BOM) are shown escaped, `\x1b`
// or `\u{202e}`, the same rule as the CLI's `broker/cli/src/terminal.rs` `inert`.

const CTL =
  /[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u2069\ufeff]/;
const CTL_ALL = new RegExp(CTL.source, "g");

function escapeChar(c) {
  const n = c.codePointAt(0);
  return n < 0x80 ? "\\x" + n.toString(16).padStart(2, "0") : "\\u{" + n.toString(16) + "}";
}

/** `s` as a plain string with control characters escaped (for attributes, titles). */
function inert(s) {
  return String(s ?? "").replace(CTL_ALL, escapeChar);
}

/** `s` as DOM nodes: text, with each escaped character in a `span.ctl`. */
function text(s) {
  s = s == null ? "" : String(s);
  if (!CTL.test(s)) return document.createTextNode(s);
  const frag = document.createDocumentFragment();
  let last = 0;
  for (const m of s.matchAll(CTL_ALL)) {
    if (m.index > last) frag.append(document.createTextNode(s.slice(last, m.index)));
    const span = document.createElement("span");
    span.className = "ctl";
    span.textContent = escapeChar(m[0]);
    frag.append(span);
    last = m.index + m[0].length;
  }
  if (last < s.length) frag.append(document.createTextNode(s.slice(last)));
  return frag;
}

/** Replaces the content of `el` with inert `s`. */
function setText(el, s) {
  el.replaceChildren(text(s));
}

// ---------------------------------------------------------------------------------
// DOM helpers.

/**
 * `h("a", {href, class, dataset}, ...children)`: an element. Strings among the
 * children go in through `text()`; `on<event>` props add listeners.
 */
function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v == null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "hidden" || k === "disabled") el[k] = true;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  put(el, children);
  return el;
}

function put(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c == null || c === false) continue;
    el.append(c instanceof Node ? c : text(c));
  }
  return el;
}

const enc = encodeURIComponent;
const link = (href, ...children) => h("a", { href }, ...children);
const flightHref = (id) => "#/flight/" + enc(id);
const flightLink = (id) => h("a", { href: flightHref(id), class: "mono" }, id);
const agentHref = (name) => "#/replay/agent/" + enc(name);
const muted = (s) => h("span", { class: "muted" }, s);
const LIVE_STATES = new Set(LIVE_FLIGHT_STATES);
const isLive = (state) => LIVE_STATES.has(state);

function stateTag(state) {
  return h("span", { class: "state", dataset: { state: state || "" } }, state || "?");
}

function timeEl(ms) {
  if (!ms) return muted("—");
  const d = new Date(ms);
  const today = new Date().toDateString() === d.toDateString();
  return h("time", { datetime: d.toISOString(), title: d.toLocaleString() },
    today ? d.toLocaleTimeString() : d.toLocaleString());
}

function firstLine(s, max = 140) {
  s = String(s ?? "");
  const nl = s.indexOf("\n");
  let line = nl >= 0 ? s.slice(0, nl) + " …" : s;
  if (line.length > max) line = line.slice(0, max) + "…";
  return line;
}

function num(n) {
  return typeof n === "number" ? n.toLocaleString() : String(n ?? "");
}

/** Millionths of a dollar as `$0.012300` (exact: integer arithmetic, as the CLI). */
function usd(micros) {
  const m = Math.max(0, Math.trunc(Number(micros) || 0));
  return "$" + Math.floor(m / 1e6) + "." + String(m % 1e6).padStart(6, "0");
}

/** A total's cost: `?` when none of its flights has a known cost, `+?` when some lack one. */
function costText(t) {
  const without = t.flights_without_cost || 0;
  if (without === 0) return usd(t.cost_micro_usd);
  if (without >= (t.flights || 0)) return "?";
  return usd(t.cost_micro_usd) + "+?";
}

/** A flight's usage on one line, as `relay flight show` says it. */
function usageText(u) {
  let s = `${num(u.input_tokens)} input`;
  if (u.cached_input_tokens) s += ` (${num(u.cached_input_tokens)} cached)`;
  s += ` + ${num(u.output_tokens)} output`;
  if (u.reasoning_tokens) s += ` (${num(u.reasoning_tokens)} reasoning)`;
  s += ` = ${num((u.input_tokens || 0) + (u.output_tokens || 0))} tokens, `;
  if (u.cost_micro_usd == null) s += "cost unknown";
  else s += usd(u.cost_micro_usd) + ({ harness: " (from the harness)", prices: " (from the price table)" }[u.cost_source] || "");
  if (u.model) s += ", model " + u.model;
  return s;
}

/** A `dl` of [label, value] pairs; pairs whose value is null are left out. */
function defs(pairs) {
  const dl = h("dl", { class: "defs" });
  for (const [k, v] of pairs) {
    if (v == null || v === "") continue;
    dl.append(h("dt", null, k), h("dd", null, v));
  }
  return dl;
}

/** Puts `nodes` as the children of `parent` in this order, moving only what is out of place. */
function placeInOrder(parent, nodes) {
  let i = 0;
  for (const node of nodes) {
    const at = parent.children[i];
    if (at !== node) parent.insertBefore(node, at || null);
    i++;
  }
  while (parent.children.length > nodes.length) parent.lastElementChild.remove();
}

function errorNode(err) {
  const p = h("p", { class: "error", role: "alert" });
  showError(p, err);
  return p;
}

function showError(p, err) {
  const code = err && err.code ? ` (${err.code})` : "";
  setText(p, (err && err.message ? err.message : String(err)) + code);
  p.hidden = false;
}

// ---------------------------------------------------------------------------------
// One DOM write per animation frame: jobs are keyed, so a job asked for many times
// between two frames runs once.

const frameJobs = new Map();
let frameId = 0;

function onFrame(key, fn) {
  frameJobs.set(key, fn);
  if (!frameId) frameId = requestAnimationFrame(runFrame);
}

function runFrame() {
  frameId = 0;
  const jobs = [...frameJobs.values()];
  frameJobs.clear();
  for (const fn of jobs) {
    try {
      fn();
    } catch (e) {
      console.error(e);
    }
  }
}

// ---------------------------------------------------------------------------------
// The API: every call sends `X-Relay-Dashboard: 1` and the login cookie; an error is
// the broker's `{"error":{"code","message"}}`; a 401 ends the login.

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** `path` with the `query` object's entries as its query string. */
function withQuery(path, query) {
  const q = query ? new URLSearchParams(query).toString() : "";
  return q ? path + "?" + q : path;
}

/** Calls the API method `name` (api.gen.js) with its route's `params`, a `query` object
 * and a JSON `body`. */
function call(name, params = [], { query, body } = {}) {
  return api(withQuery(methodPath(name, ...params), query), { method: METHODS[name].verb, body });
}

async function api(path, { method = "GET", body } = {}) {
  const headers = { "X-Relay-Dashboard": "1", Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let res;
  try {
    res = await fetch(path, {
      method,
      headers,
      credentials: "same-origin",
      cache: "no-store",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (e) {
    throw new ApiError(0, "network", "The broker did not answer: " + e.message);
  }
  const raw = await res.text();
  let data = null;
  try {
    data = raw ? JSON.parse(raw) : null;
  } catch {
    data = null;
  }
  if (!res.ok) {
    if (res.status === 401) loginEnded();
    const e = data && data.error;
    throw new ApiError(res.status, e?.code || "http_" + res.status,
      e?.message || `${res.status} ${res.statusText}`);
  }
  return data;
}

const login = { name: null, ended: false };
const streams = new Set();

function loginEnded() {
  if (login.ended) return;
  login.ended = true;
  document.body.dataset.login = "ended";
  setLive(false);
  document.getElementById("login-ended").hidden = false;
  for (const s of [...streams]) s.close();
}

/** True unless the broker says the login is gone (a 401). */
async function loginAlive() {
  try {
    await call("login.show");
    return true;
  } catch (e) {
    return e.status !== 401;
  }
}

/**
 * An EventSource on `url`; `handlers` maps event types to functions of the parsed JSON.
 * The browser reconnects by itself after a network error, with the last event's id as
 * Last-Event-ID (a watch then sends `resumed` instead of a snapshot); a stream the
 * browser gave up on (a non-200 answer) is opened again, from a snapshot, after checking
 * the login is alive.
 */
function openStream(url, handlers, { onError } = {}) {
  let es = null;
  let timer = 0;
  let closed = false;
  const ctl = {
    close() {
      closed = true;
      clearTimeout(timer);
      if (es) es.close();
      streams.delete(ctl);
    },
  };
  const start = () => {
    if (closed || login.ended) return;
    es = new EventSource(url);
    for (const [type, fn] of Object.entries(handlers)) {
      es.addEventListener(type, (ev) => {
        if (closed) return;
        let data;
        try {
          data = JSON.parse(ev.data);
        } catch {
          return;
        }
        fn(data, ev);
      });
    }
    es.onerror = () => {
      if (closed) return;
      if (onError) onError();
      if (es.readyState === EventSource.CLOSED) {
        loginAlive().then((alive) => {
          if (alive && !closed) timer = setTimeout(start, 2000);
        });
      }
    };
  };
  streams.add(ctl);
  start();
  return ctl;
}

// ---------------------------------------------------------------------------------
// The fleet: agents, live flights and pending approvals from one watch, replaced on
// every snapshot (a reconnect sends a fresh one), then kept by the events. Views read
// it; what changed is collected in `dirty` and handed to the view once per frame.

const fleet = {
  ready: false,
  snapshots: 0,
  agents: new Map(), // name -> Agent
  live: new Map(), // id -> Flight (queued, waking, running, waiting)
  pending: new Map(), // id -> Approval
  decided: new Map(), // id -> Approval decided or expired while the page watched
  seen: new Map(), // id -> Flight: every flight the watch showed, newest last
};
const MAX_SEEN = 500;
let dirty = freshDirty(true);

function freshDirty(all) {
  return { all, agents: new Set(), flights: new Set(), approvals: all };
}

function touch() {
  onFrame("view", () => {
    const d = dirty;
    dirty = freshDirty(false);
    if (current && current.update) current.update(d);
  });
}

function putAgent(agent) {
  fleet.agents.set(agent.name, agent);
  dirty.agents.add(agent.name);
  touch();
}

function putFlight(f) {
  if (isLive(f.state)) fleet.live.set(f.id, f);
  else fleet.live.delete(f.id);
  fleet.seen.delete(f.id);
  fleet.seen.set(f.id, f);
  if (fleet.seen.size > MAX_SEEN) fleet.seen.delete(fleet.seen.keys().next().value);
  dirty.agents.add(f.agent);
  dirty.flights.add(f.id);
  touch();
}

function putApproval(a, fresh) {
  if (a.state === "pending") {
    fleet.pending.set(a.id, a);
    if (fresh) notify(a);
  } else {
    fleet.pending.delete(a.id);
    fleet.decided.set(a.id, a);
    if (fleet.decided.size > MAX_SEEN) fleet.decided.delete(fleet.decided.keys().next().value);
  }
  dirty.approvals = true;
  dirty.flights.add(a.flight);
  updateBadge();
  touch();
}

function startFleet() {
  openStream(withQuery(methodPath("watch"), { fleet: true }), {
    snapshot(s) {
      fleet.agents = new Map((s.agents || []).map((a) => [a.name, a]));
      fleet.live = new Map((s.flights || []).map((f) => [f.id, f]));
      for (const f of fleet.live.values()) fleet.seen.set(f.id, f);
      const pending = s.approvals || [];
      // The first snapshot's approvals are on the page already: no notification.
      for (const a of pending) (fleet.snapshots === 0 ? notified.add(a.id) : notify(a));
      fleet.pending = new Map(pending.map((a) => [a.id, a]));
      fleet.ready = true;
      fleet.snapshots++;
      dirty = freshDirty(true);
      setLive(true);
      updateBadge();
      touch();
    },
    // The browser reconnected with Last-Event-ID: the broker goes on after the last
    // event this page got instead of sending a snapshot, so what it holds stays whole.
    resumed: () => setLive(true),
    agent_registered: (e) => putAgent(e.agent),
    agent_updated: (e) => putAgent(e.agent),
    agent_removed(e) {
      fleet.agents.delete(e.name);
      dirty.agents.add(e.name);
      touch();
    },
    invocation_created: (e) => putFlight(e.flight),
    flight_updated: (e) => putFlight(e.flight),
    approval_requested: (e) => putApproval(e.approval, true),
    approval_decided: (e) => putApproval(e.approval, false),
    thread_lost(e) {
      dirty.agents.add(e.agent);
      touch();
    },
  }, { onError: () => setLive(false) });
}

// ---------------------------------------------------------------------------------
// The header: live indicator, badge and title, notifications, login.

function setLive(live) {
  document.body.dataset.live = live ? "true" : "false";
  const el = document.getElementById("live");
  el.textContent = live ? "live" : login.ended ? "logged out" : "disconnected";
  el.dataset.live = live ? "true" : "false";
}

function updateBadge() {
  const n = fleet.pending.size;
  const badge = document.getElementById("badge");
  badge.textContent = String(n);
  badge.hidden = n === 0;
  document.getElementById("badge-label").textContent = n === 1 ? " approval pending" : " approvals pending";
  document.title = n > 0 ? `(${n}) Relay` : "Relay";
}

const notified = new Set();

function notify(a) {
  if (notified.has(a.id)) return;
  notified.add(a.id);
  if (!("Notification" in window) || Notification.permission !== "granted") return;
  try {
    const n = new Notification(`Relay: ${inert(a.agent)} is waiting for an approval`, {
      body: inert(firstLine(a.detail, 200)),
      tag: "relay-approval-" + a.id,
    });
    n.onclick = () => {
      window.focus();
      location.hash = "#/approvals";
      n.close();
    };
  } catch (e) {
    console.warn("notification failed", e);
  }
}

function setupHeader() {
  const button = document.getElementById("notify");
  const paint = () => {
    if (!("Notification" in window)) {
      button.textContent = "Notifications unavailable";
      button.disabled = true;
    } else if (Notification.permission === "granted") {
      button.textContent = "Notifications on";
      button.setAttribute("aria-pressed", "true");
    } else if (Notification.permission === "denied") {
      button.textContent = "Notifications blocked";
      button.title = "The browser blocks this page's notifications: allow them in its site settings";
    } else {
      button.textContent = "Enable notifications";
    }
  };
  paint();
  button.addEventListener("click", async () => {
    if (!("Notification" in window)) return;
    try {
      await Notification.requestPermission();
    } finally {
      paint();
    }
  });

  document.getElementById("logout").addEventListener("click", async () => {
    try {
      await call("login.end");
    } catch {
      // The login may already be gone; either way it ends here.
    }
    loginEnded();
  });

  call("login.show").then((s) => {
    login.name = s.name;
    setText(document.getElementById("login-name"), s.name);
    for (const el of document.querySelectorAll(".login-name")) setText(el, s.name);
  }, (e) => {
    setText(document.getElementById("login-name"), "?");
    console.warn("login", e);
  });
}

// ---------------------------------------------------------------------------------
// A table whose rows are keyed and updated in place: each column gives a value per
// record and paints its cell only when that value changed.

class KeyedTable {
  constructor({ id, caption, keyAttr, columns }) {
    this.keyAttr = keyAttr;
    this.columns = columns;
    this.rows = new Map();
    this.tbody = h("tbody");
    this.el = h("table", { id, class: "grid" },
      h("caption", { class: "sr-only" }, caption),
      h("thead", null, h("tr", null, columns.map((c) => h("th", { scope: "col", class: c.cls }, c.head)))),
      this.tbody);
  }

  has(key) {
    return this.rows.has(key);
  }

  upsert(key, rec) {
    let row = this.rows.get(key);
    if (!row) {
      const tr = h("tr");
      tr.dataset[this.keyAttr] = key;
      const cells = this.columns.map((c) =>
        tr.appendChild(c.rowHeader ? h("th", { scope: "row", class: c.cls }) : h("td", { class: c.cls })));
      row = { tr, cells, vals: [] };
      this.rows.set(key, row);
    }
    this.columns.forEach((c, i) => {
      const v = c.value(rec);
      if (row.vals[i] !== v) {
        row.vals[i] = v;
        if (c.paint) c.paint(row.cells[i], rec, v);
        else setText(row.cells[i], v);
      }
    });
  }

  remove(key) {
    const row = this.rows.get(key);
    if (row) {
      row.tr.remove();
      this.rows.delete(key);
    }
  }

  order(keys) {
    placeInOrder(this.tbody, keys.map((k) => this.rows.get(k).tr));
  }
}

// ---------------------------------------------------------------------------------
// Approval items, shared by the approvals view and a flight's view: the exact command
// as text, accept and decline, the outcome and who decided, an error in the item.

function approvalItem(initial) {
  let a = initial;
  let busy = false;
  const agent = h("span", { class: "agent" });
  const flight = h("a", { class: "flight mono" });
  const kind = h("span", { class: "kind" });
  const when = h("span", { class: "when" });
  const command = h("pre", { class: "command" });
  const reason = h("p", { class: "reason" });
  const accept = h("button", { type: "button", class: "accept" }, "Accept");
  const decline = h("button", { type: "button", class: "decline" }, "Decline");
  // Accept and remember: a rule (`relay rule list`) then decides the same request
  // within the chosen scope. Only commands and file changes can be remembered.
  const scope = h("select", { class: "remember-scope", "aria-label": "Remember for" },
    REMEMBER_SCOPES.map(([value, label]) => h("option", { value }, label)));
  scope.value = "agent";
  const remember = h("button", { type: "button", class: "remember" }, "Accept and remember");
  const rememberBox = h("span", { class: "remember-box" }, remember, " for ", scope);
  const buttons = [accept, decline, remember];
  const actions = h("div", { class: "actions" }, accept, decline, rememberBox);
  const decision = h("span", { class: "decision" });
  const decidedBy = h("span", { class: "decided-by" });
  const decidedAt = h("span", { class: "when" });
  const rememberedAs = h("span", { class: "remembered" });
  const outcome = h("p", { class: "outcome" }, decision, " by ", decidedBy, " ", decidedAt, rememberedAs);
  const error = h("p", { class: "error", role: "alert", hidden: true });
  const li = h("li", { class: "approval", tabindex: "0", dataset: { approval: a.id } },
    h("div", { class: "approval-head" }, agent, " wants ", kind, " in ", flight, " ", when),
    command, reason, actions, outcome, error);

  async function decide(choice, rememberScope) {
    if (busy || a.state !== "pending") return false;
    busy = true;
    for (const b of buttons) b.disabled = true;
    li.setAttribute("aria-busy", "true");
    error.hidden = true;
    const body = { decision: choice };
    if (rememberScope) body.remember = { scope: rememberScope };
    try {
      const got = await call("approval.decide", [a.id], { body });
      if (got && got.id) {
        update(got);
        putApproval(got, false);
      }
      return true;
    } catch (e) {
      showError(error, e);
      return false;
    } finally {
      busy = false;
      li.removeAttribute("aria-busy");
      for (const b of buttons) b.disabled = a.state !== "pending";
    }
  }

  function update(next) {
    a = next;
    li.dataset.state = a.state;
    setText(agent, a.agent);
    flight.href = flightHref(a.flight);
    setText(flight, a.flight);
    setText(kind, { command: "to run a command", file_change: "to change files" }[a.kind] || a.kind);
    when.replaceChildren(timeEl(a.created_at));
    setText(command, a.detail);
    setText(reason, a.reason ? "Reason: " + a.reason : "");
    reason.hidden = !a.reason;
    const pending = a.state === "pending";
    actions.hidden = !pending;
    for (const b of buttons) b.disabled = busy || !pending;
    rememberBox.hidden = !(a.kind === "command" || a.kind === "file_change");
    outcome.hidden = pending;
    rememberedAs.replaceChildren();
    if (a.remembered) put(rememberedAs, [", remembered as rule ", h("a", { href: "#/rules", class: "mono" }, a.remembered)]);
    setText(decision, a.state === "expired" ? "expired" : a.decision || a.state);
    decision.dataset.decision = a.state === "expired" ? "expired" : a.decision || "";
    setText(decidedBy, a.decided_by || "nobody");
    decidedAt.replaceChildren(a.decided_at ? timeEl(a.decided_at) : "");
    li.setAttribute("aria-label", inert(`${a.kind} approval for ${a.agent}, ${a.state}`));
  }

  accept.addEventListener("click", () => decide("accept"));
  decline.addEventListener("click", () => decide("decline"));
  remember.addEventListener("click", () => decide("accept", scope.value));
  update(a);
  li._approval = { decide, get state() { return a.state; } };
  return { li, update, decide, get approval() { return a; } };
}

/** The scopes a decision can be remembered for, and how the select names them. */
const REMEMBER_SCOPES = [
  ["session", "this session"],
  ["agent", "this agent"],
  ["project", "this project"],
  ["everywhere", "every agent"],
];

/** Approval items by id, kept across renders so focus and pending requests survive. */
class ApprovalItems {
  constructor() {
    this.items = new Map();
  }

  nodes(approvals) {
    return approvals.map((a) => {
      let it = this.items.get(a.id);
      if (!it) {
        it = approvalItem(a);
        this.items.set(a.id, it);
      } else if (it.approval !== a && !(it.approval.state !== "pending" && a.state === "pending")) {
        it.update(a);
      }
      return it.li;
    });
  }

  prune(keep) {
    for (const id of this.items.keys()) if (!keep.has(id)) this.items.delete(id);
  }
}

const byCreated = (x, y) => (x.created_at || 0) - (y.created_at || 0);
const byDecidedDesc = (x, y) => (y.decided_at || y.created_at || 0) - (x.decided_at || x.created_at || 0);

// ---------------------------------------------------------------------------------
// Views. Each is `{el, update?(dirty), destroy?()}`; `update` runs once per frame with
// what changed in the fleet since the last one.

function loading(what) {
  return h("p", { class: "muted loading" }, `Loading ${what}…`);
}

// Agents ---------------------------------------------------------------------------

function agentIndex() {
  const idx = new Map();
  for (const f of fleet.live.values()) {
    let e = idx.get(f.agent);
    if (!e) idx.set(f.agent, (e = { current: null, queued: 0 }));
    if (f.state === "queued") e.queued++;
    else if (!e.current || f.created_at < e.current.created_at) e.current = f;
  }
  return idx;
}

/** "commit 1a2b3c4d5e6f on relay/a: 2 files, +10 -3": a flight's commit (`FlightCommit::summary`). */
function commitLabel(c) {
  if (!c) return "";
  const short = (id) => String(id || "").slice(0, 12);
  const files = (c.files || []).length;
  let line = (c.commit ? "commit " + short(c.commit) : "commits up to " + short(c.head)) +
    " on " + c.branch + ": " + files + (files === 1 ? " file" : " files") +
    ", +" + (c.added || 0) + " -" + (c.removed || 0);
  if ((c.agent_commits || []).length) line += " (" + c.agent_commits.length + " made by the agent)";
  return line;
}

/** "reverted by commit 1a2b3c4d5e6f (operator)" (`Revert::summary`). */
function revertLabel(r) {
  return r ? "reverted by commit " + String(r.commit || "").slice(0, 12) + " (" + r.by + ")" : "";
}

/** "relay/a +2 -0": an agent's branch and how far it is ahead of and behind its base. */
function branchLabel(a) {
  const w = a.worktree_state;
  if (w) return w.branch + " +" + (w.ahead || 0) + " -" + (w.behind || 0);
  return a.worktree ? "relay/" + a.name : "";
}

/** "gemini-cli 0.61.0": an agent's program (name and version), or "" without one. */
function programLabel(p) {
  return p ? [p.name, p.version].filter(Boolean).join(" ") : "";
}

function agentsView() {
  const table = new KeyedTable({
    id: "agents",
    caption: "Agents",
    keyAttr: "agent",
    columns: [
      { cls: "name", head: "Agent", rowHeader: true, value: (r) => r.agent.name },
      {
        // An ACP agent's program as it named itself at `initialize` (`relay agent show`).
        cls: "harness", head: "Harness",
        value: (r) => [r.agent.harness, programLabel(r.agent.program)].join(" ").trim(),
        paint: (td, r) => td.replaceChildren(text(r.agent.harness),
          ...(r.agent.program ? [" ", muted(programLabel(r.agent.program))] : [])),
      },
      {
        cls: "state", head: "State", value: (r) => r.agent.state,
        paint: (td, r) => td.replaceChildren(stateTag(r.agent.state)),
      },
      {
        cls: "node", head: "Node", value: (r) => r.agent.node || r.agent.endpoint?.node || "",
        paint: (td, r, v) => td.replaceChildren(v ? text(v) : muted("local")),
      },
      {
        // Its worktree's branch (`relay agent add --worktree`), ahead/behind its base.
        cls: "branch", head: "Branch", value: (r) => branchLabel(r.agent),
        paint: (td, r, v) => td.replaceChildren(v ? h("span", { class: "mono" }, v) : muted("—")),
      },
      {
        cls: "session", head: "Session",
        value: (r) => r.agent.session_id || r.agent.endpoint?.session_id || "",
        paint: (td, r, v) => td.replaceChildren(v ? text(v) : muted("—")),
      },
      {
        cls: "flight", head: "Current flight",
        value: (r) => (r.current ? r.current.id + " " + r.current.state : ""),
        paint: (td, r) => td.replaceChildren(...(r.current
          ? [flightLink(r.current.id), " ", stateTag(r.current.state)]
          : [muted("—")])),
      },
      { cls: "queue num", head: "Queue", value: (r) => String(r.queued) },
      {
        cls: "links", head: "Replay", value: (r) => r.agent.name,
        paint: (td, r) => td.replaceChildren(h("a", { href: agentHref(r.agent.name), "aria-label": inert("Replay of " + r.agent.name) }, "replay")),
      },
    ],
  });
  const count = h("p", { class: "muted count" });
  const empty = h("p", { class: "muted empty", hidden: true },
    "No agents yet. Add one with ", h("code", null, "relay agent add NAME --harness …"), ".");
  const waiting = loading("agents");
  const el = h("section", { class: "view agents-view", "aria-labelledby": "agents-title" },
    h("div", { class: "view-head" }, h("h1", { id: "agents-title" }, "Agents"), count),
    waiting, empty, table.el);

  const sorted = () => [...fleet.agents.keys()].sort((x, y) => x.localeCompare(y));

  return {
    el,
    update(d) {
      if (!fleet.ready) return;
      waiting.hidden = true;
      const idx = agentIndex();
      const rec = (a) => ({ agent: a, ...(idx.get(a.name) || { current: null, queued: 0 }) });
      let structure = false;
      if (d.all) {
        for (const a of fleet.agents.values()) table.upsert(a.name, rec(a));
        for (const name of [...table.rows.keys()]) if (!fleet.agents.has(name)) table.remove(name);
        structure = true;
      } else {
        for (const name of d.agents) {
          const a = fleet.agents.get(name);
          if (a) {
            if (!table.has(name)) structure = true;
            table.upsert(name, rec(a));
          } else if (table.has(name)) {
            table.remove(name);
          }
        }
      }
      if (structure) table.order(sorted());
      const n = fleet.agents.size;
      setText(count, n === 1 ? "1 agent" : `${n} agents`);
      empty.hidden = n > 0;
      table.el.hidden = n === 0;
    },
  };
}

// Flights --------------------------------------------------------------------------

function flightsView() {
  const recent = new Map();
  let fetchedAt = -1;
  let error = null;
  const table = new KeyedTable({
    id: "flights",
    caption: "Flights",
    keyAttr: "flight",
    columns: [
      {
        cls: "id", head: "Flight", rowHeader: true, value: (f) => f.id,
        paint: (td, f) => td.replaceChildren(flightLink(f.id)),
      },
      {
        cls: "agent", head: "Agent", value: (f) => f.agent,
        paint: (td, f) => td.replaceChildren(link(agentHref(f.agent), f.agent)),
      },
      { cls: "state", head: "State", value: (f) => f.state, paint: (td, f) => td.replaceChildren(stateTag(f.state)) },
      {
        cls: "summary", head: "Summary",
        value: (f) => firstLine(f.error || (isLive(f.state) ? f.summary : f.output ?? f.summary) || ""),
      },
      { cls: "when", head: "Asked", value: (f) => String(f.created_at), paint: (td, f) => td.replaceChildren(timeEl(f.created_at)) },
      { cls: "when", head: "Updated", value: (f) => String(f.updated_at), paint: (td, f) => td.replaceChildren(timeEl(f.updated_at)) },
    ],
  });
  const count = h("p", { class: "muted count" });
  const errBox = h("p", { class: "error", role: "alert", hidden: true });
  const el = h("section", { class: "view flights-view", "aria-labelledby": "flights-title" },
    h("div", { class: "view-head" }, h("h1", { id: "flights-title" }, "Flights"), count),
    errBox, table.el);

  function refetch() {
    fetchedAt = fleet.snapshots;
    call("flight.list", [], { query: { limit: 100 } }).then((list) => {
      for (const f of list || []) recent.set(f.id, f);
      errBox.hidden = true;
      dirty.all = true;
      touch();
    }, (e) => {
      error = e;
      showError(errBox, error);
    });
  }

  return {
    el,
    update(d) {
      if (d.all && fetchedAt !== fleet.snapshots) refetch();
      // The newer record of each flight: the fleet's (live) or the list's.
      const all = new Map(recent);
      for (const f of fleet.seen.values()) {
        const old = all.get(f.id);
        if (!old || (f.update_seq ?? 0) >= (old.update_seq ?? 0)) all.set(f.id, f);
      }
      for (const f of fleet.live.values()) all.set(f.id, f);
      const list = [...all.values()]
        .sort((x, y) => (isLive(y.state) - isLive(x.state)) || (y.created_at - x.created_at))
        .slice(0, 300);
      const keys = new Set(list.map((f) => f.id));
      for (const id of [...table.rows.keys()]) if (!keys.has(id)) table.remove(id);
      for (const f of list) table.upsert(f.id, f);
      table.order(list.map((f) => f.id));
      const live = list.filter((f) => isLive(f.state)).length;
      setText(count, `${live} live, ${list.length} shown`);
    },
  };
}

// One flight, live ------------------------------------------------------------------

const ITEM_KINDS = {
  command_execution: "command",
  file_change: "file change",
  tool_call: "tool call",
  agent_message: "message",
  user_message: "user message",
  reasoning: "reasoning",
  plan: "plan",
};

function flightView(id) {
  let flight = null;
  let lastSeq = 0;
  let stream = null;
  let destroyed = false;
  const textBuf = [];
  const items = new Map(); // item_id -> {li, head, body, out, buf}
  const outPending = new Set();

  const title = h("h1", null, "Flight ", h("span", { class: "mono" }, id));
  const stateEl = h("span", { class: "state-now" });
  const meta = h("div", { class: "meta" });
  const interrupt = h("button", { type: "button", id: "flight-interrupt", class: "danger", hidden: true }, "Interrupt");
  const actionError = h("p", { class: "error", role: "alert", hidden: true });
  const links = h("p", { class: "links" },
    link("#/tree/" + enc(id), "Tree"), " · ", link("#/replay/flight/" + enc(id), "Replay"), " ", interrupt);
  const errorEl = h("p", { id: "flight-error", class: "error", hidden: true });
  const approvalsList = h("ul", { class: "approvals" });
  const approvalsBox = h("section", { class: "inline-approvals", hidden: true, "aria-label": "Approvals of this flight" },
    h("h2", null, "Approvals"), approvalsList);
  const textEl = h("pre", { id: "flight-text", class: "stream", tabindex: "0", "aria-label": "Streamed text" });
  const itemsEl = h("ol", { id: "flight-items", class: "items" });
  const itemsEmpty = h("p", { class: "muted" }, "No items yet.");
  const planEl = h("pre", { id: "flight-plan", class: "block" });
  const planBox = h("section", { hidden: true }, h("h2", null, "Plan"), planEl);
  const diffEl = h("pre", { id: "flight-diff", class: "block" });
  const diffBox = h("section", { hidden: true }, h("h2", null, "Diff"), diffEl);
  const usageEl = h("p", { id: "flight-usage" }, muted("no usage reported yet"));
  const outputEl = h("pre", { id: "flight-output", class: "block" });
  const outputBox = h("section", { hidden: true }, h("h2", null, "Output"), outputEl);
  const history = h("ol", { id: "flight-history", class: "history" });
  const status = h("p", { class: "muted" }, "Connecting…");
  const fetchError = h("p", { class: "error", role: "alert", hidden: true });

  const el = h("section", { id: "flight", class: "view flight-view", dataset: { flight: id } },
    h("div", { class: "view-head" }, title, stateEl), meta, links, actionError, status, fetchError, errorEl,
    approvalsBox,
    h("section", null, h("h2", null, "Text"), textEl),
    h("section", null, h("h2", null, "Items"), itemsEmpty, itemsEl),
    planBox, diffBox,
    h("section", null, h("h2", null, "Usage"), usageEl),
    outputBox,
    h("section", null, h("h2", null, "History"), history));

  interrupt.addEventListener("click", async () => {
    interrupt.disabled = true;
    actionError.hidden = true;
    try {
      const f = await call("flight.interrupt", [id]);
      if (f && f.id === id && (f.update_seq ?? 0) >= (flight?.update_seq ?? 0)) applyFlight(f);
    } catch (e) {
      showError(actionError, e);
    } finally {
      interrupt.disabled = false;
    }
  });

  function flushText() {
    if (destroyed || textBuf.length === 0) return;
    const chunk = textBuf.join("");
    textBuf.length = 0;
    const atEnd = textEl.scrollTop + textEl.clientHeight >= textEl.scrollHeight - 8;
    textEl.append(text(chunk));
    if (atEnd) textEl.scrollTop = textEl.scrollHeight;
  }

  function flushOutputs() {
    if (destroyed) return;
    for (const it of outPending) {
      const atEnd = it.out.scrollTop + it.out.clientHeight >= it.out.scrollHeight - 8;
      it.out.hidden = false;
      it.out.append(text(it.buf.join("")));
      it.buf.length = 0;
      if (atEnd) it.out.scrollTop = it.out.scrollHeight;
    }
    outPending.clear();
  }

  function item(itemId, kind) {
    let it = items.get(itemId);
    if (!it) {
      const head = h("div", { class: "item-head" });
      const body = h("pre", { class: "item-text", hidden: true });
      const out = h("pre", { class: "item-output", hidden: true, "aria-label": "Output" });
      const li = h("li", { class: "item", dataset: { item: itemId, kind: kind || "", phase: "started" } }, head, body, out);
      it = { li, head, body, out, buf: [], kind: kind || "command_execution" };
      items.set(itemId, it);
      itemsEl.append(li);
      itemsEmpty.hidden = true;
    }
    return it;
  }

  function paintItemHead(it, u) {
    it.head.replaceChildren(
      h("span", { class: "item-kind" }, ITEM_KINDS[it.kind] || it.kind),
      " ",
      h("span", { class: "phase", dataset: { phase: u.phase } }, u.phase === "completed" ? "done" : "running…"),
      " ", timeEl(u.at), " ", muted(u.item_id));
  }

  function historyEntry(u, ...content) {
    history.append(h("li", { dataset: { kind: u.kind } }, timeEl(u.at), " ", ...content));
  }

  function applyUpdate(u) {
    if (u.seq <= lastSeq) return; // a reconnect's snapshot repeats what we have
    lastSeq = u.seq;
    switch (u.kind) {
      case "delta":
        textBuf.push(u.text);
        onFrame("flight-text", flushText);
        break;
      case "item": {
        const it = item(u.item_id, u.item_kind);
        it.kind = u.item_kind;
        it.li.dataset.kind = u.item_kind;
        it.li.dataset.phase = u.phase;
        paintItemHead(it, u);
        if (u.text != null && u.text !== "") {
          setText(it.body, u.text);
          it.body.hidden = false;
        }
        break;
      }
      case "command_output": {
        const it = item(u.item_id, null);
        if (!it.head.firstChild) paintItemHead(it, { ...u, phase: "started" });
        it.buf.push(u.text);
        outPending.add(it);
        onFrame("flight-items-out", flushOutputs);
        break;
      }
      case "state":
        historyEntry(u, "→ ", stateTag(u.to), u.reason ? [": ", h("span", { class: "reason" }, u.reason)] : null);
        if (u.output != null && u.output !== paintedOutput) {
          paintedOutput = u.output;
          setText(outputEl, u.output);
          outputBox.hidden = false;
        }
        break;
      case "plan":
        setText(planEl, u.text);
        planBox.hidden = false;
        break;
      case "diff":
        setText(diffEl, u.text);
        diffBox.hidden = false;
        break;
      case "usage":
        // The flight record's usage (its cost filled in by the broker) wins once painted.
        if (!flight?.usage) setText(usageEl, usageText(u));
        break;
      case "session":
        historyEntry(u, "session ", u.thread_id ? ["thread ", h("span", { class: "mono" }, u.thread_id)] : null,
          u.turn_id ? [" turn ", h("span", { class: "mono" }, u.turn_id)] : null);
        break;
      case "note":
        historyEntry(u, h("span", { class: "note" }, u.text));
        break;
      case "commit":
        historyEntry(u, h("span", { class: "mono" }, commitLabel(u.commit)));
        break;
      case "reverted":
        historyEntry(u, h("span", { class: "mono" }, revertLabel(u.revert)));
        break;
      default:
        historyEntry(u, u.kind);
    }
  }

  // Many records arrive per second while text streams: keep the last, paint it once a frame.
  function applyFlight(f) {
    flight = f;
    if (!isLive(f.state) && stream) {
      // A finished flight's watch ends; do not let the browser reconnect it.
      stream.close();
      stream = null;
    }
    onFrame("flight-record", paintFlight);
  }

  function paintFlight() {
    if (destroyed || !flight) return;
    const f = flight;
    el.dataset.state = f.state;
    stateEl.replaceChildren(stateTag(f.state));
    const key = [f.state, f.updated_at, f.thread_id, f.turn_id, f.parent_flight,
      commitLabel(f.commit), revertLabel(f.commit?.reverted_by)].join("|");
    if (key !== paintedKey) {
      paintedKey = key;
      meta.replaceChildren(defs([
        ["Agent", link(agentHref(f.agent), f.agent)],
        ["Conversation", link("#/conversation/" + enc(f.conversation), f.conversation)],
        ["Parent flight", f.parent_flight ? flightLink(f.parent_flight) : null],
        ["Asked", timeEl(f.created_at)],
        ["Updated", timeEl(f.updated_at)],
        ["Thread", f.thread_id ? h("span", { class: "mono" }, f.thread_id) : null],
        ["Turn", f.turn_id ? h("span", { class: "mono" }, f.turn_id) : null],
        // What it changed in its agent's worktree, and its revert (`relay diff`, `relay revert`).
        ["Commit", f.commit ? h("span", { class: "mono" }, commitLabel(f.commit)) : null],
        ["Reverted", f.commit?.reverted_by ? h("span", { class: "mono" }, revertLabel(f.commit.reverted_by)) : null],
      ]));
    }
    if (f.usage) setText(usageEl, usageText(f.usage));
    setText(errorEl, f.error ? "Error: " + f.error : "");
    errorEl.hidden = !f.error;
    if (f.output != null && f.output !== paintedOutput) {
      paintedOutput = f.output;
      setText(outputEl, f.output);
      outputBox.hidden = false;
    }
    interrupt.hidden = !isLive(f.state);
    if (!isLive(f.state)) {
      status.hidden = false;
      setText(status, "Finished.");
    }
  }
  let paintedKey = "";
  let paintedOutput = null;

  function renderApprovals() {
    const mine = [...fleet.pending.values(), ...fleet.decided.values()]
      .filter((a) => a.flight === id)
      .sort(byCreated);
    approvalsBox.hidden = mine.length === 0;
    placeInOrder(approvalsList, approvalItems.nodes(mine));
  }
  const approvalItems = new ApprovalItems();

  stream = openStream(withQuery(methodPath("watch"), { flight: id }), {
    snapshot(s) {
      status.hidden = true;
      fetchError.hidden = true;
      for (const u of s.updates || []) applyUpdate(u);
      applyFlight(s.flight);
    },
    // A reconnection resumed after the last event seen (Last-Event-ID): no snapshot.
    resumed() {
      status.hidden = true;
    },
    flight_updated(e) {
      if (e.update) applyUpdate(e.update);
      if (e.flight) applyFlight(e.flight);
    },
  }, {
    onError() {
      if (!flight) {
        // No snapshot: find out why (an unknown flight says so).
        call("flight.show", [id]).then(() => setText(status, "Reconnecting…"), (e) => {
          showError(fetchError, e);
          status.hidden = true;
          if (e.status === 404 && stream) {
            stream.close();
            stream = null;
          }
        });
      } else if (isLive(flight.state)) {
        status.hidden = false;
        setText(status, "Disconnected: reconnecting…");
      }
    },
  });

  return {
    el,
    update(d) {
      if (d.all || d.approvals) renderApprovals();
    },
    destroy() {
      destroyed = true;
      if (stream) stream.close();
    },
  };
}

// Approvals ------------------------------------------------------------------------

const RECENT_APPROVALS = 100;

function approvalsView() {
  const recent = new Map();
  const items = new ApprovalItems();
  const pendingList = h("ul", { class: "approvals pending-list", "aria-labelledby": "pending-title" });
  const decidedList = h("ul", { class: "approvals decided-list", "aria-labelledby": "decided-title" });
  const pendingTitle = h("h2", { id: "pending-title" }, "Waiting");
  const noneWaiting = h("p", { class: "muted empty" }, "Nothing is waiting for you.");
  const noneDecided = h("p", { class: "muted empty" }, "None yet.");
  const errBox = h("p", { class: "error", role: "alert", hidden: true });
  const el = h("section", { class: "view approvals-view", "aria-labelledby": "approvals-title" },
    h("div", { class: "view-head" }, h("h1", { id: "approvals-title" }, "Approvals"),
      h("p", { class: "muted keys" }, h("kbd", null, "j"), "/", h("kbd", null, "k"), " or arrows move, ",
        h("kbd", null, "a"), " accepts, ", h("kbd", null, "d"), " declines")),
    errBox,
    h("div", { id: "approvals" },
      pendingTitle, noneWaiting, pendingList,
      h("h2", { id: "decided-title" }, "Decided"), noneDecided, decidedList));

  call("approval.list", [], { query: { state: "all" } }).then((list) => {
    for (const a of list || []) if (a.state !== "pending") recent.set(a.id, a);
    dirty.approvals = true;
    touch();
  }, (e) => showError(errBox, e));

  return {
    el,
    update(d) {
      if (!(d.all || d.approvals)) return;
      const pending = [...fleet.pending.values()].sort(byCreated);
      const decidedMap = new Map(recent);
      for (const a of fleet.decided.values()) decidedMap.set(a.id, a);
      for (const a of pending) decidedMap.delete(a.id);
      const decided = [...decidedMap.values()].sort(byDecidedDesc).slice(0, RECENT_APPROVALS);
      const focused = document.activeElement;
      placeInOrder(pendingList, items.nodes(pending));
      placeInOrder(decidedList, items.nodes(decided));
      items.prune(new Set([...pending, ...decided].map((a) => a.id)));
      if (focused && focused !== document.activeElement && focused.isConnected) focused.focus();
      setText(pendingTitle, `Waiting (${pending.length})`);
      noneWaiting.hidden = pending.length > 0;
      noneDecided.hidden = decided.length > 0;
    },
  };
}

// Rules: remembered decisions ------------------------------------------------------

function ruleScopeText(r) {
  switch (r.scope) {
    case "session": return `session ${r.agent ?? "?"}/${r.session ?? "?"}`;
    case "agent": return `agent ${r.agent ?? "?"}`;
    case "project": return `project ${r.project ?? "?"}`;
    default: return r.scope;
  }
}

function rulesView() {
  const errBox = h("p", { class: "error", role: "alert", hidden: true });
  const empty = h("p", { class: "muted empty", hidden: true },
    "No remembered decisions. “Accept and remember” on an approval makes one.");
  const count = h("p", { class: "muted count" });
  let rules = new Map();
  const table = new KeyedTable({
    id: "rules",
    caption: "Remembered decisions",
    keyAttr: "rule",
    columns: [
      { cls: "id mono", head: "Rule", rowHeader: true, value: (r) => r.id },
      { cls: "decision", head: "Decision", value: (r) => r.decision },
      { cls: "kind", head: "Kind", value: (r) => r.kind },
      { cls: "pattern mono", head: "Pattern", value: (r) => r.pattern },
      { cls: "scope", head: "Scope", value: ruleScopeText },
      {
        cls: "origin", head: "Origin", value: (r) => r.origin || "",
        paint: (td, r) => td.replaceChildren(r.origin ? h("span", { class: "mono" }, r.origin) : muted("—"),
          text(" by " + r.created_by)),
      },
      { cls: "num matched", head: "Matched", value: (r) => String(r.matched ?? 0) },
      {
        cls: "when", head: "Last matched", value: (r) => String(r.last_matched_at || 0),
        paint: (td, r) => td.replaceChildren(timeEl(r.last_matched_at)),
      },
      {
        cls: "remove", head: "", value: (r) => r.id,
        paint: (td, r) => td.replaceChildren(h("button", {
          type: "button", class: "danger remove-rule", "aria-label": inert(`Remove rule ${r.id}`),
          onclick: (e) => remove(r.id, e.currentTarget),
        }, "Remove")),
      },
    ],
  });
  const el = h("section", { class: "view rules-view", "aria-labelledby": "rules-title" },
    h("div", { class: "view-head" }, h("h1", { id: "rules-title" }, "Rules"), count),
    h("p", { class: "muted" }, "Decisions remembered from approvals: each decides the same request " +
      "(the same command, word for word) within its scope, recorded as decided by rule:ID."),
    errBox, empty, table.el);
  let gone = false;

  function render(list) {
    rules = new Map(list.map((r) => [r.id, r]));
    for (const id of [...table.rows.keys()]) if (!rules.has(id)) table.remove(id);
    for (const r of list) table.upsert(r.id, r);
    table.order(list.map((r) => r.id));
    empty.hidden = list.length > 0;
    setText(count, `${list.length} rules`);
  }

  function refetch() {
    call("rule.list").then((list) => {
      if (gone) return;
      errBox.hidden = true;
      render(list || []);
    }, (e) => { if (!gone) showError(errBox, e); });
  }

  async function remove(id, button) {
    button.disabled = true;
    errBox.hidden = true;
    try {
      await call("rule.remove", [id]);
      rules.delete(id);
      render([...rules.values()]);
    } catch (e) {
      showError(errBox, e);
      button.disabled = false;
    }
  }

  refetch();
  return {
    el,
    // A decision (by a person or a rule) may have made or matched a rule.
    update(d) {
      if (!d.all && d.approvals) refetch();
    },
    destroy: () => { gone = true; },
  };
}

// Usage ----------------------------------------------------------------------------

function usageTable(report, keyHead) {
  const numCell = (v) => h("td", { class: "num" }, num(v));
  const row = (key, t, total) => h("tr", { class: total ? "total" : null },
    h("th", { scope: "row", class: "mono" }, key),
    numCell(t.flights), numCell(t.input_tokens), numCell(t.cached_input_tokens),
    numCell(t.output_tokens), numCell(t.reasoning_tokens), numCell(t.tokens),
    h("td", { class: "num cost" }, costText(t)));
  const rows = (report.rows || []).map((r) => row(r.key, r, false));
  if (rows.length > 1) rows.push(row("total", report.total || {}, true));
  return h("table", { class: "grid usage" },
    h("caption", { class: "sr-only" }, "Usage by " + keyHead),
    h("thead", null, h("tr", null, [keyHead, "Flights", "Input", "Cached", "Output", "Reasoning", "Tokens", "Cost"]
      .map((c, i) => h("th", { scope: "col", class: i ? "num" : null }, c)))),
    h("tbody", null, rows.length ? rows : h("tr", null, h("td", { colspan: "8", class: "muted" }, "No flight reported usage."))));
}

function usageView() {
  const byAgent = h("div", { id: "usage-by-agent" }, loading("usage"));
  const byDay = h("div", { id: "usage-by-day" }, loading("usage"));
  const el = h("section", { class: "view usage-view", "aria-labelledby": "usage-title" },
    h("div", { class: "view-head" }, h("h1", { id: "usage-title" }, "Usage")),
    h("p", { class: "muted" }, "Tokens and cost of flights (input includes cached, output includes reasoning; " +
      "a flight counts in the UTC day it was created). Cost is ? where unknown: no cost from the harness " +
      "and no price for the model (relay up --prices)."),
    h("h2", null, "By agent"), byAgent,
    h("h2", null, "By day (UTC)"), byDay);
  let gone = false;
  for (const [by, box, head] of [["agent", byAgent, "Agent"], ["day", byDay, "Day"]]) {
    call("usage", [], { query: { by } }).then((r) => {
      if (!gone) box.replaceChildren(usageTable(r || {}, head));
    }, (e) => { if (!gone) box.replaceChildren(errorNode(e)); });
  }
  return { el, destroy: () => { gone = true; } };
}

// Conversations --------------------------------------------------------------------

function conversationsView() {
  const table = new KeyedTable({
    id: "conversations",
    caption: "Conversations",
    keyAttr: "conversation",
    columns: [
      {
        cls: "id", head: "Conversation", rowHeader: true, value: (c) => c.id,
        paint: (td, c) => td.replaceChildren(h("a", { href: "#/conversation/" + enc(c.id), class: "mono" }, c.id)),
      },
      { cls: "kind", head: "Kind", value: (c) => c.kind },
      { cls: "title", head: "Title", value: (c) => c.title || "" },
      { cls: "participants", head: "Participants", value: (c) => (c.participants || []).join(", ") },
      { cls: "num", head: "Messages", value: (c) => num(c.message_count) },
      { cls: "when", head: "Created", value: (c) => String(c.created_at), paint: (td, c) => td.replaceChildren(timeEl(c.created_at)) },
    ],
  });
  const waiting = loading("conversations");
  const refresh = h("button", { type: "button" }, "Refresh");
  const errBox = h("p", { class: "error", role: "alert", hidden: true });
  const el = h("section", { class: "view", "aria-labelledby": "conv-title" },
    h("div", { class: "view-head" }, h("h1", { id: "conv-title" }, "Conversations"), refresh),
    waiting, errBox, table.el);

  function load() {
    call("conversation.list").then((list) => {
      waiting.hidden = true;
      errBox.hidden = true;
      list = (list || []).slice().sort((x, y) => y.created_at - x.created_at);
      for (const c of list) table.upsert(c.id, c);
      table.order(list.map((c) => c.id));
    }, (e) => {
      waiting.hidden = true;
      showError(errBox, e);
    });
  }
  refresh.addEventListener("click", load);
  load();
  return { el };
}

function messageItem(m) {
  const meta = m.meta || {};
  return h("li", { class: "message", dataset: { message: m.id, class: m.class || "agent" } },
    h("div", { class: "message-head" },
      h("span", { class: "author" }, m.author), " ",
      m.class && m.class !== "agent" ? [h("span", { class: "tag" }, m.class), " "] : null,
      timeEl(m.created_at), " ", muted("#" + m.index),
      meta.flight ? [" · flight ", flightLink(meta.flight)] : null,
      m.reply_to ? [" · reply to ", muted(m.reply_to)] : null),
    h("pre", { class: "body" }, m.body));
}

/** Why a mention asked nobody (`skipped[].reason` of a post's answer). */
const SKIP_REASONS = {
  author: "it wrote the message",
  code: "the mention is inside code",
  quote: "the mention is on a quoted line",
  repeated: "the message this answers mentioned it already",
};

function conversationView(id) {
  const msgs = new Map(); // id -> {index, li}
  const list = h("ol", { id: "messages", class: "messages" });
  const header = h("div", { class: "meta" });
  const status = h("p", { class: "muted" }, "Connecting…");
  const errBox = h("p", { class: "error", role: "alert", hidden: true });
  const body = h("textarea", { id: "compose-body", rows: "3", required: true, placeholder: "Write a message; @agent asks that agent" });
  const author = h("span", { class: "login-name" }, login.name || "…");
  const send = h("button", { type: "submit" }, "Post");
  const result = h("div", { class: "post-result", "aria-live": "polite" });
  const form = h("form", { class: "compose" },
    h("label", { for: "compose-body" }, "Message as ", author), body, h("div", { class: "row" }, send, muted(" Ctrl+Enter posts")), result);

  const el = h("section", { class: "view conversation-view", dataset: { conversation: id } },
    h("div", { class: "view-head" }, h("h1", null, "Conversation ", h("span", { class: "mono" }, id))),
    header, status, errBox, list, form);

  function add(m) {
    if (msgs.has(m.id)) return;
    const li = messageItem(m);
    msgs.set(m.id, { index: m.index, li });
    // Messages come in index order; one older than the last goes in its place.
    let before = null;
    for (let node = list.lastElementChild; node; node = node.previousElementSibling) {
      const other = msgs.get(node.dataset.message);
      if (!other || other.index < m.index) break;
      before = node;
    }
    list.insertBefore(li, before);
  }

  const stream = openStream(withQuery(methodPath("watch"), { conversation: id, limit: 200 }), {
    snapshot(s) {
      status.hidden = true;
      errBox.hidden = true;
      const c = s.conversation || {};
      header.replaceChildren(defs([
        ["Kind", c.kind],
        ["Title", c.title],
        ["Participants", (c.participants || []).join(", ")],
        ["Messages", c.message_count != null ? num(c.message_count) : null],
      ]));
      const atEnd = window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;
      for (const m of s.messages || []) add(m);
      if (atEnd && msgs.size) list.lastElementChild.scrollIntoView({ block: "end" });
    },
    message_posted(e) {
      const atEnd = window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;
      add(e.message);
      if (atEnd) list.lastElementChild.scrollIntoView({ block: "end" });
    },
  }, {
    onError() {
      if (msgs.size === 0) {
        call("conversation.read", [id], { query: { limit: 1 } }).catch((e) => {
          status.hidden = true;
          showError(errBox, e);
          if (e.status === 404) stream.close();
        });
      }
    },
  });

  body.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      form.requestSubmit();
    }
  });
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const textValue = body.value;
    if (!textValue.trim()) return;
    send.disabled = true;
    result.replaceChildren();
    try {
      const got = await call("message.post", [], {
        body: { conversation: id, author: login.name || "operator", body: textValue },
      });
      body.value = "";
      if (got && got.message) add(got.message);
      const flights = got?.flights || [];
      if (flights.length) {
        result.append(h("p", null, "Asked: ",
          flights.map((f, i) => [i ? ", " : "", flightLink(f.id), " (", f.agent, ")"])));
      }
      for (const r of got?.refused || []) {
        result.append(h("p", { class: "error" }, `@${r.agent} was not asked: `, r.error?.message || "", ` (${r.error?.code || "?"})`));
      }
      for (const s of got?.skipped || []) {
        result.append(h("p", null, `@${s.name} was not asked: `, SKIP_REASONS[s.reason] || s.reason));
      }
      for (const name of got?.unknown || []) {
        result.append(h("p", { class: "error" }, `@${name} is not an agent (see Agents)`));
      }
    } catch (err) {
      result.append(errorNode(err));
    } finally {
      send.disabled = false;
    }
  });

  return { el, destroy: () => stream.close() };
}

// Replay ---------------------------------------------------------------------------

function seqLabel(e) {
  return h("span", { class: "seq", title: "event seq" }, "#" + e.seq + (e.last_seq ? "–" + e.last_seq : ""));
}

/** One turn entry (a flight update or an approval step), every kind readable. */
function entryNode(e) {
  const body = [];
  let label = e.kind;
  switch (e.kind) {
    case "delta":
      label = "text";
      body.push(h("pre", { class: "block" }, e.text));
      break;
    case "item":
      label = `${ITEM_KINDS[e.item_kind] || e.item_kind} ${e.phase}`;
      body.push(muted("item " + e.item_id));
      if (e.text) body.push(h("pre", { class: "block" }, e.text));
      break;
    case "command_output":
      label = "command output";
      body.push(muted("item " + e.item_id), h("pre", { class: "block output" }, e.text));
      break;
    case "state":
      label = "state";
      body.push(h("p", null, "→ ", stateTag(e.to), e.reason ? [": ", e.reason] : null));
      if (e.output != null) body.push(h("pre", { class: "block" }, e.output));
      break;
    case "plan":
    case "diff":
      body.push(h("pre", { class: "block" }, e.text));
      break;
    case "usage":
      body.push(h("p", null, `${num(e.input_tokens)} input tokens, ${num(e.output_tokens)} output tokens`));
      break;
    case "session":
      body.push(h("p", null, e.thread_id ? ["thread ", h("span", { class: "mono" }, e.thread_id)] : null,
        e.turn_id ? [" turn ", h("span", { class: "mono" }, e.turn_id)] : null));
      break;
    case "note":
      body.push(h("p", { class: "note" }, e.text));
      break;
    case "approval_requested":
      label = "approval asked";
      body.push(h("p", null, ({ command: "run a command", file_change: "change files" })[e.approval_kind] || e.approval_kind,
        " ", muted(e.approval)),
      h("pre", { class: "command" }, e.detail),
      e.reason ? h("p", { class: "reason" }, "Reason: ", e.reason) : null);
      break;
    case "approval_decided":
      label = "approval " + (e.state === "expired" ? "expired" : "decided");
      body.push(h("p", null, muted(e.approval), " ",
        e.decision ? h("span", { class: "decision", dataset: { decision: e.decision } }, e.decision) : null,
        e.decided_by ? [" by ", h("span", { class: "decided-by" }, e.decided_by)] : null));
      break;
    default: {
      const rest = { ...e };
      delete rest.seq;
      delete rest.last_seq;
      delete rest.at;
      body.push(h("pre", { class: "block" }, JSON.stringify(rest, null, 2)));
    }
  }
  return h("li", { class: "entry", dataset: { kind: e.kind } },
    h("div", { class: "entry-head" }, seqLabel(e), " ", timeEl(e.at), " ", h("span", { class: "entry-kind" }, label)),
    body);
}

/** A whole turn: who asked what, then its entries in order. */
function turnNode(t) {
  const inv = t.invocation || {};
  return h("div", { class: "turn" },
    defs([
      ["Flight", flightLink(t.flight)],
      ["Agent", link(agentHref(t.agent), t.agent)],
      ["Asked by", inv.requester],
      ["Action", inv.action],
      ["Conversation", inv.conversation ? link("#/conversation/" + enc(inv.conversation), inv.conversation) : null],
      ["Parent flight", inv.parent_flight ? flightLink(inv.parent_flight) : null],
      ["Depth", inv.depth ? String(inv.depth) : null],
      ["Asked", [seqLabel(t), " ", timeEl(t.at)]],
      ["State", stateTag(t.state)],
      ["Error", t.error],
      ["Usage", t.usage ? `${num(t.usage.input_tokens)} input, ${num(t.usage.output_tokens)} output tokens` : null],
      ["Thread", t.thread_id ? h("span", { class: "mono" }, t.thread_id) : null],
      ["Turn", t.turn_id ? h("span", { class: "mono" }, t.turn_id) : null],
      ["Links", [link("#/tree/" + enc(t.flight), "tree"), " · ", link(flightHref(t.flight), "live view")]],
    ]),
    h("h3", null, "Task"),
    h("pre", { class: "block task" }, inv.task ?? ""),
    h("h3", null, `Entries (${(t.entries || []).length})`),
    h("ol", { class: "entries" }, (t.entries || []).map(entryNode)));
}

function fetchedView(titleNodes, path, render) {
  const body = h("div", null, loading("replay"));
  const el = h("section", { class: "view replay-view" }, h("div", { class: "view-head" }, h("h1", null, titleNodes)), body);
  let gone = false;
  api(path).then((data) => {
    if (!gone) body.replaceChildren(render(data));
  }, (e) => {
    if (!gone) body.replaceChildren(errorNode(e));
  });
  return { el, destroy: () => { gone = true; } };
}

function replayFlightView(id) {
  return fetchedView(["Replay of flight ", h("span", { class: "mono" }, id)], methodPath("replay.flight", id), turnNode);
}

function replayAgentView(name) {
  return fetchedView(["Replay of agent ", h("span", { class: "mono" }, name)], methodPath("replay.agent", name), (r) => {
    const entries = r.entries || [];
    if (!entries.length) return h("p", { class: "muted" }, "Nothing recorded for this agent.");
    const turns = entries.filter((e) => e.kind === "turn").length;
    return h("div", null,
      h("p", { class: "muted" }, `${entries.length} entries, ${turns} turns, oldest first.`),
      h("ol", { class: "agent-entries" }, entries.map((e, i) => {
        switch (e.kind) {
          case "registered":
            return h("li", { class: "entry", dataset: { kind: e.kind } },
              h("div", { class: "entry-head" }, seqLabel(e), " ", timeEl(e.at), " ", h("span", { class: "entry-kind" }, "registered")),
              defs([["Harness", e.harness], ["Directory", e.cwd], ["Model", e.model], ["Node", e.node]]));
          case "removed":
            return h("li", { class: "entry", dataset: { kind: e.kind } },
              h("div", { class: "entry-head" }, seqLabel(e), " ", timeEl(e.at), " ", h("span", { class: "entry-kind" }, "removed")));
          case "thread_lost":
            return h("li", { class: "entry", dataset: { kind: e.kind } },
              h("div", { class: "entry-head" }, seqLabel(e), " ", timeEl(e.at), " ", h("span", { class: "entry-kind" }, "session lost")),
              h("p", null, "Thread ", h("span", { class: "mono" }, e.old_thread_id), " could not be resumed; a new one, ",
                h("span", { class: "mono" }, e.new_thread_id), ", replaced it: ", e.reason));
          case "turn":
            return h("li", { class: "entry", dataset: { kind: e.kind } },
              h("details", { open: i >= entries.length - 3 ? true : null },
                h("summary", null, seqLabel(e), " ", timeEl(e.at), " ", h("span", { class: "entry-kind" }, "turn"), " ",
                  h("span", { class: "mono" }, e.flight), " ", stateTag(e.state), " ",
                  h("span", { class: "task-line" }, firstLine(e.invocation?.task, 100))),
                turnNode(e)));
          default:
            return entryNode(e);
        }
      })));
  });
}

// Tree -----------------------------------------------------------------------------

function treeView(id) {
  const node = (t) => {
    const f = t.flight;
    const here = f.id === id;
    return h("li", { class: here ? "current" : null, dataset: { flight: f.id } },
      h("div", { class: "tree-node" },
        h("a", { href: flightHref(f.id), class: "mono", "aria-current": here ? "true" : null }, f.id), " ",
        link(agentHref(f.agent), f.agent), " ", stateTag(f.state), " ",
        h("span", { class: "summary" }, firstLine(f.error || f.summary || f.output || "", 100))),
      t.children && t.children.length ? h("ul", null, t.children.map(node)) : null);
  };
  return fetchedView(["Flight tree of ", h("span", { class: "mono" }, id)], methodPath("flight.tree", id),
    (tree) => h("ul", { class: "tree", id: "tree" }, node(tree)));
}

function notFoundView(path) {
  return { el: h("section", { class: "view" }, h("h1", null, "Not found"), h("p", null, "No view for ", h("code", null, path), ". "), link("#/agents", "Agents")) };
}

// ---------------------------------------------------------------------------------
// The router: hash routes, one view at a time.

let current = null;
let currentName = "";

function route() {
  const path = location.hash.replace(/^#/, "") || "/agents";
  const parts = path.split("/").filter(Boolean).map((p) => {
    try {
      return decodeURIComponent(p);
    } catch {
      return p;
    }
  });
  const [name, a, b] = parts;
  let view;
  if (name === "agents" && !a) view = agentsView();
  else if (name === "flights" && !a) view = flightsView();
  else if (name === "flight" && a) view = flightView(a);
  else if (name === "approvals" && !a) view = approvalsView();
  else if (name === "conversations" && !a) view = conversationsView();
  else if (name === "rules" && !a) view = rulesView();
  else if (name === "usage" && !a) view = usageView();
  else if (name === "conversation" && a) view = conversationView(a);
  else if (name === "replay" && a === "flight" && b) view = replayFlightView(b);
  else if (name === "replay" && a === "agent" && b) view = replayAgentView(b);
  else if (name === "tree" && a) view = treeView(a);
  else view = notFoundView(path);

  if (current && current.destroy) current.destroy();
  current = view;
  const previous = currentName;
  currentName = name || "agents";
  const main = document.getElementById("view");
  main.replaceChildren(view.el);
  const navName = { flight: "flights", replay: "", tree: "flights", conversation: "conversations" }[currentName] ?? currentName;
  for (const el of document.querySelectorAll("nav [data-nav]")) {
    if (el.dataset.nav === navName) el.setAttribute("aria-current", "page");
    else el.removeAttribute("aria-current");
  }
  if (view.update) view.update(freshDirty(true));
  if (previous) {
    const heading = main.querySelector("h1");
    if (heading) {
      heading.tabIndex = -1;
      heading.focus({ preventScroll: true });
    }
    window.scrollTo(0, 0);
  }
}

// ---------------------------------------------------------------------------------
// Keyboard: j/k or the arrows move among approvals, `a` accepts and `d` declines the
// focused one. On the approvals view the keys always work; elsewhere once an approval
// has focus.

function onKey(e) {
  if (e.defaultPrevented || e.altKey || e.ctrlKey || e.metaKey) return;
  const t = e.target;
  if (t && t.closest && t.closest("input, textarea, select, [contenteditable]")) return;
  const main = document.getElementById("view");
  const items = [...main.querySelectorAll("li[data-approval]")];
  if (!items.length) return;
  const cur = document.activeElement?.closest?.("li[data-approval]") || null;
  if (!cur && currentName !== "approvals") return;
  const i = cur ? items.indexOf(cur) : -1;
  const move = (to) => {
    e.preventDefault();
    const target = items[Math.max(0, Math.min(items.length - 1, to))];
    target.focus();
    target.scrollIntoView({ block: "nearest" });
  };
  switch (e.key) {
    case "j":
    case "ArrowDown":
      move(i + 1);
      break;
    case "k":
    case "ArrowUp":
      move(i < 0 ? 0 : i - 1);
      break;
    case "a":
    case "d": {
      if (!cur || !cur._approval || cur._approval.state !== "pending") return;
      e.preventDefault();
      const pendings = items.filter((li) => li._approval?.state === "pending");
      const next = pendings[pendings.indexOf(cur) + 1] || pendings[pendings.indexOf(cur) - 1] || null;
      cur._approval.decide(e.key === "a" ? "accept" : "decline").then((ok) => {
        if (ok && next && next.isConnected && document.activeElement?.closest?.("li[data-approval]") === cur) next.focus();
      });
      break;
    }
    default:
  }
}

// ---------------------------------------------------------------------------------

function main() {
  document.body.dataset.live = "false";
  updateBadge();
  setupHeader();
  window.addEventListener("hashchange", route);
  document.addEventListener("keydown", onKey);
  route();
  startFleet();
}

main();
