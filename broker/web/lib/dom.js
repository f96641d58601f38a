import { LIVE_FLIGHT_STATES } from "/api.gen.js";

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

/** Ctrl+Enter (Cmd+Enter on a Mac) in `field` submits `form`, as a chat box does. */
function submitOnCtrlEnter(field, form) {
  field.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      form.requestSubmit();
    }
  });
}

const enc = encodeURIComponent;
const link = (href, ...children) => h("a", { href }, ...children);
const flightHref = (id) => "#/flight/" + enc(id);
const flightLink = (id) => h("a", { href: flightHref(id), class: "mono" }, id);
// An agent's name links to its page (`#/agent/NAME`); its replay has a link of its own.
const agentHref = (name) => "#/agent/" + enc(name);
const replayAgentHref = (name) => "#/replay/agent/" + enc(name);
const conversationHref = (id) => "#/conversation/" + enc(id);
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

function loading(what) {
  return h("p", { class: "muted loading" }, `Loading ${what}…`);
}

export {
  agentHref,
  conversationHref,
  costText,
  defs,
  enc,
  errorNode,
  firstLine,
  flightHref,
  flightLink,
  h,
  inert,
  isLive,
  link,
  loading,
  muted,
  num,
  onFrame,
  placeInOrder,
  put,
  replayAgentHref,
  setText,
  showError,
  stateTag,
  submitOnCtrlEnter,
  text,
  timeEl,
  usageText,
  usd,
};
