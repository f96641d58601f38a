import { METHODS, methodPath } from "/api.gen.js";

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

function setLive(live) {
  document.body.dataset.live = live ? "true" : "false";
  const el = document.getElementById("live");
  el.textContent = live ? "live" : login.ended ? "logged out" : "disconnected";
  el.dataset.live = live ? "true" : "false";
}

export {
  api,
  call,
  login,
  loginEnded,
  openStream,
  setLive,
  withQuery,
};
