// Relay's dashboard: plain ES2020 modules, no framework, no build step.
//
// This file is the entry: the router (hash routes, one view at a time), the keyboard
// and start-up. The rest, each file served as it is (`broker/src/http/web.rs` embeds
// the fixed list):
// - lib/dom.js      inert text (the one way broker text reaches the DOM), DOM helpers,
//                   formatting, the per-frame scheduler;
// - lib/api.js      the API client, the login's state and SSE streams with resume;
// - lib/fleet.js    the fleet model (one fleet watch) and the header (badge, title,
//                   live indicator, notifications);
// - lib/table.js    a keyed table updated in place; lib/labels.js: shared labels;
// - views/*.js      one module per view (agents, flights, flight, approvals, rules,
//                   usage, conversations, replay and tree).
//
// Every text from the broker goes in through `text()` (text nodes, never innerHTML);
// the page runs under a CSP that allows no inline script or style.
//
// Every route and enum value it uses comes from `api.gen.js`, generated from the
// method table (`relay_protocol::methods`): the page spells no route of its own.

import { h, link } from "/lib/dom.js";
import { freshDirty, setupHeader, setView, startFleet, updateBadge } from "/lib/fleet.js";
import { approvalsView } from "/views/approvals.js";
import { agentsView } from "/views/agents.js";
import { flightsView } from "/views/flights.js";
import { flightView } from "/views/flight.js";
import { rulesView } from "/views/rules.js";
import { usageView } from "/views/usage.js";
import { conversationsView, conversationView } from "/views/conversations.js";
import { replayAgentView, replayFlightView, treeView } from "/views/replay.js";

function notFoundView(path) {
  return { el: h("section", { class: "view" }, h("h1", null, "Not found"), h("p", null, "No view for ", h("code", null, path), ". "), link("#/agents", "Agents")) };
}

// ---------------------------------------------------------------------------------
// The router: hash routes, one view at a time.

let current = null;
let currentName = "";

/** The hash as [path, query]: `#/flights?q=x` is ["/flights", "q=x"]. */
function splitHash(hash) {
  const full = hash.replace(/^#/, "") || "/agents";
  const at = full.indexOf("?");
  return at < 0 ? [full, ""] : [full.slice(0, at) || "/agents", full.slice(at + 1)];
}

function route() {
  // A view's filters ride in the hash's query: `#/flights?agent=a&state=running`.
  const [path, query] = splitHash(location.hash);
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
  else if (name === "flights" && !a) view = flightsView(new URLSearchParams(query));
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
  setView(view);
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
// Keyboard: `/` focuses the view's search box (Flights); j/k or the arrows move among
// approvals, `a` accepts and `d` declines the focused one. On the approvals view the
// keys always work; elsewhere once an approval has focus.

function onKey(e) {
  if (e.defaultPrevented || e.altKey || e.ctrlKey || e.metaKey) return;
  const t = e.target;
  if (t && t.closest && t.closest("input, textarea, select, [contenteditable]")) return;
  // `/` goes to the view's search box, where it has one.
  const search = e.key === "/" && document.querySelector("#view [data-search]");
  if (search) {
    e.preventDefault();
    search.focus();
    search.select();
    return;
  }
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