// Generated from relay_protocol::methods (protocol/src/methods.rs); do not edit.
// Regenerate: RELAY_REGENERATE=1 cargo test -p relay-broker --test method_table

/** Every API method: its HTTP verb and route (`{name}` is a parameter). */
export const METHODS = Object.freeze({
  "status": Object.freeze({ verb: "GET", route: "/v1/status", stream: false }),
  "agent.list": Object.freeze({ verb: "GET", route: "/v1/agents", stream: false }),
  "agent.add": Object.freeze({ verb: "POST", route: "/v1/agents", stream: false }),
  "agent.show": Object.freeze({ verb: "GET", route: "/v1/agents/{name}", stream: false }),
  "agent.remove": Object.freeze({ verb: "DELETE", route: "/v1/agents/{name}", stream: false }),
  "agent.set": Object.freeze({ verb: "POST", route: "/v1/agents/{name}", stream: false }),
  "agent.budget": Object.freeze({ verb: "GET", route: "/v1/agents/{name}/budget", stream: false }),
  "agent.wake": Object.freeze({ verb: "POST", route: "/v1/agents/{name}/wake", stream: false }),
  "agent.fork": Object.freeze({ verb: "POST", route: "/v1/agents/{name}/fork", stream: false }),
  "agent.diff": Object.freeze({ verb: "GET", route: "/v1/agents/{name}/diff", stream: false }),
  "agent.peek": Object.freeze({ verb: "GET", route: "/v1/agents/{name}/peek", stream: false }),
  "conversation.list": Object.freeze({ verb: "GET", route: "/v1/conversations", stream: false }),
  "conversation.add": Object.freeze({ verb: "POST", route: "/v1/conversations", stream: false }),
  "conversation.read": Object.freeze({ verb: "GET", route: "/v1/conversations/{id}/messages", stream: false }),
  "message.post": Object.freeze({ verb: "POST", route: "/v1/messages", stream: false }),
  "invocation.create": Object.freeze({ verb: "POST", route: "/v1/invocations", stream: false }),
  "flight.list": Object.freeze({ verb: "GET", route: "/v1/flights", stream: false }),
  "flight.show": Object.freeze({ verb: "GET", route: "/v1/flights/{id}", stream: false }),
  "flight.updates": Object.freeze({ verb: "GET", route: "/v1/flights/{id}/updates", stream: false }),
  "flight.update": Object.freeze({ verb: "POST", route: "/v1/flights/{id}/updates", stream: false }),
  "flight.stream": Object.freeze({ verb: "GET", route: "/v1/flights/{id}/stream", stream: true }),
  "flight.diff": Object.freeze({ verb: "GET", route: "/v1/flights/{id}/diff", stream: false }),
  "flight.revert": Object.freeze({ verb: "POST", route: "/v1/flights/{id}/revert", stream: false }),
  "flight.tree": Object.freeze({ verb: "GET", route: "/v1/flights/{id}/tree", stream: false }),
  "flight.steer": Object.freeze({ verb: "POST", route: "/v1/flights/{id}/steer", stream: false }),
  "flight.interrupt": Object.freeze({ verb: "POST", route: "/v1/flights/{id}/interrupt", stream: false }),
  "flight.reply": Object.freeze({ verb: "POST", route: "/v1/flights/{id}/reply", stream: false }),
  "approval.list": Object.freeze({ verb: "GET", route: "/v1/approvals", stream: false }),
  "approval.decide": Object.freeze({ verb: "POST", route: "/v1/approvals/{id}", stream: false }),
  "rule.list": Object.freeze({ verb: "GET", route: "/v1/rules", stream: false }),
  "rule.show": Object.freeze({ verb: "GET", route: "/v1/rules/{id}", stream: false }),
  "rule.remove": Object.freeze({ verb: "DELETE", route: "/v1/rules/{id}", stream: false }),
  "usage": Object.freeze({ verb: "GET", route: "/v1/usage", stream: false }),
  "event.list": Object.freeze({ verb: "GET", route: "/v1/events", stream: false }),
  "event.stream": Object.freeze({ verb: "GET", route: "/v1/events/stream", stream: true }),
  "watch": Object.freeze({ verb: "GET", route: "/v1/watch", stream: true }),
  "replay.flight": Object.freeze({ verb: "GET", route: "/v1/replay/flights/{id}", stream: false }),
  "replay.agent": Object.freeze({ verb: "GET", route: "/v1/replay/agents/{name}", stream: false }),
  "replay.conversation": Object.freeze({ verb: "GET", route: "/v1/replay/conversations/{id}", stream: false }),
  "login.create": Object.freeze({ verb: "POST", route: "/v1/login", stream: false }),
  "login.show": Object.freeze({ verb: "GET", route: "/v1/login", stream: false }),
  "login.end": Object.freeze({ verb: "POST", route: "/v1/logout", stream: false }),
  "login.revoke_all": Object.freeze({ verb: "POST", route: "/v1/login/revoke", stream: false }),
});

/** A flight's states. */
export const FLIGHT_STATES = Object.freeze(["queued", "waking", "running", "waiting", "completed", "failed", "cancelled"]);

/** The flight states that are not terminal. */
export const LIVE_FLIGHT_STATES = Object.freeze(["queued", "waking", "running", "waiting"]);

/** An agent's states. */
export const AGENT_STATES = Object.freeze(["offline", "starting", "idle", "busy", "failed"]);

/** An approval's states. */
export const APPROVAL_STATES = Object.freeze(["pending", "decided", "expired"]);

/** What an approval can be decided as. */
export const APPROVAL_DECISIONS = Object.freeze(["accept", "accept_for_session", "decline", "cancel"]);

/** The error codes every interface answers with. */
export const ERROR_CODES = Object.freeze(["invalid_request", "unauthorized", "payload_too_large", "unknown_agent", "unknown_conversation", "unknown_flight", "unknown_message", "unknown_approval", "agent_exists", "conversation_exists", "illegal_transition", "flight_terminal", "approval_closed", "overloaded", "unavailable", "depth_limit", "cycle", "not_found", "storage_full", "budget_exceeded", "unknown_rule", "internal"]);

/** The path of method `name` with its `{param}`s filled in from `params`, in order,
 * each percent-encoded. Throws on an unknown method or a wrong number of params. */
export function methodPath(name, ...params) {
  const m = METHODS[name];
  if (!m) throw new Error(`unknown method ${name}`);
  let i = 0;
  const path = m.route.replace(/\{[a-z_]+\}/g, () => {
    if (i >= params.length) throw new Error(`${name} takes more parameters`);
    return encodeURIComponent(params[i++]);
  });
  if (i !== params.length) throw new Error(`${name} takes ${i} parameters`);
  return path;
}
