import { methodPath } from "/api.gen.js";
import { firstLine, inert, isLive, onFrame, setText } from "/lib/dom.js";
import { call, login, loginEnded, openStream, setLive, withQuery } from "/lib/api.js";

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
  asked: new Map(), // flight id -> {task, requester}, from the watch's invocation_created
};
const MAX_SEEN = 500;
let dirty = freshDirty(true);

function freshDirty(all) {
  return { all, agents: new Set(), flights: new Set(), approvals: all, rules: all, ended: false };
}

function touch() {
  onFrame("view", () => {
    const d = dirty;
    dirty = freshDirty(false);
    if (view && view.update) view.update(d);
  });
}

function putAgent(agent) {
  fleet.agents.set(agent.name, agent);
  dirty.agents.add(agent.name);
  touch();
}

// An agent is busy while a flight of its runs a turn (running, or waiting for an
// answer): Relay derives it from the flights and does not store it, so the page does the
// same from the live flights it holds (a stored "busy", from an older broker, is idle).
function agentState(a) {
  if (a.state !== "idle" && a.state !== "busy") return a.state;
  for (const f of fleet.live.values()) {
    if (f.agent === a.name && (f.state === "running" || f.state === "waiting")) return "busy";
  }
  return "idle";
}

function putFlight(f) {
  // A flight that just ended (usage views add it up then).
  const prev = fleet.seen.get(f.id);
  if (!isLive(f.state) && (!prev || isLive(prev.state))) dirty.ended = true;
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
    invocation_created(e) {
      if (e.invocation && typeof e.invocation.task === "string") {
        fleet.asked.set(e.flight.id, { task: e.invocation.task, requester: e.invocation.requester || "" });
        if (fleet.asked.size > MAX_SEEN) fleet.asked.delete(fleet.asked.keys().next().value);
      }
      putFlight(e.flight);
    },
    flight_updated: (e) => putFlight(e.flight),
    approval_requested: (e) => putApproval(e.approval, true),
    approval_decided: (e) => putApproval(e.approval, false),
    // A rule remembered or removed anywhere (the page, the CLI, the bus).
    rule_added() {
      dirty.rules = true;
      touch();
    },
    rule_removed() {
      dirty.rules = true;
      touch();
    },
    thread_lost(e) {
      dirty.agents.add(e.agent);
      touch();
    },
  }, { onError: () => setLive(false) });
}

// ---------------------------------------------------------------------------------
// The header: live indicator, badge and title, notifications, login.

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

// The view on screen (the router's), handed what changed once per frame.
let view = null;

/** Makes `v` the view `touch()` updates. */
function setView(v) {
  view = v;
}

/** Marks `what` (`{all}`, `{approvals}` or `{rules}`) changed and updates the view on the next frame. */
function invalidate(what) {
  if (what.all) dirty.all = true;
  if (what.approvals) dirty.approvals = true;
  if (what.rules) dirty.rules = true;
  touch();
}

// ---------------------------------------------------------------------------------
// What each flight was asked: a flight record has no task. The watch's
// invocation_created says it (`fleet.asked`) and `flight.list`'s rows bring it
// ([`rememberAsked`]); for the other flights (live before the page opened) it is asked
// once of `replay.flight` (with `from_seq` past the end: the invocation, no entries), a
// few at a time. Kept across views: an invocation never changes.

const askedFetched = new Map(); // flight id -> {task, requester, unknown}; null while asked
const askedWanted = new Map(); // flight id -> what to call once it is known
let askedBusy = 0;
const ASKED_AT_ONCE = 4;

/**
 * Flight `id`'s `{task, requester}` if known (`unknown: true`, the task empty, when the
 * broker would not say: gone, or not this login's to read); else `null` or `undefined`.
 */
function askedOf(id) {
  return fleet.asked.get(id) || askedFetched.get(id);
}

/** Keeps what flight `id` was asked, as a list of flights gave it. */
function rememberAsked(id, task, requester) {
  askedFetched.set(id, { task, requester: requester || "" });
}

/**
 * Asks for what the flights `ids` were asked where it is not known nor being asked, a
 * few at a time; calls `then()` as each answer (or refusal) comes, once per flight.
 */
function fetchAsked(ids, then) {
  for (const id of ids) if (!askedOf(id) && !askedFetched.has(id) && !askedWanted.has(id)) askedWanted.set(id, then);
  while (askedBusy < ASKED_AT_ONCE && askedWanted.size) {
    const [id, done] = askedWanted.entries().next().value;
    askedWanted.delete(id);
    askedFetched.set(id, null);
    askedBusy++;
    call("replay.flight", [id], { query: { from_seq: Number.MAX_SAFE_INTEGER } }).then((r) => {
      const inv = r?.invocation;
      askedFetched.set(id, { task: inv?.task ?? "", requester: inv?.requester ?? "", unknown: !inv });
    }, () => {
      askedFetched.set(id, { task: "", requester: "", unknown: true });
    }).finally(() => {
      askedBusy--;
      if (done) done();
      fetchAsked([]);
    });
  }
}

export {
  agentState,
  askedOf,
  fetchAsked,
  fleet,
  freshDirty,
  invalidate,
  putApproval,
  rememberAsked,
  setupHeader,
  setView,
  startFleet,
  updateBadge,
};
