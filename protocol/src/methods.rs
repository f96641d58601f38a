//! The method table: every operation of Relay's API, named once, with its request and
//! response types, its HTTP route, its NATS subject (where it has one) and who may call
//! it. In the spirit of codex-rs's `client_request_definitions!`: the HTTP router
//! (`broker/src/http`), the NATS service (`broker/src/nats/service.rs`), the client
//! crate (`relay-client`'s `call`) and the dashboard (`broker/web/api.gen.js`, generated
//! from this table by [`js::dashboard_constants`]) all read it, so a route is spelled
//! here and nowhere else.
//!
//! A method is a row of [`METHODS`] (data, for routers and generators) and a type in
//! [`call`] (its request and response as Rust types, for typed clients). Both come from
//! the one `methods!` list below.

pub mod js;

use serde::{Deserialize, Serialize};

use crate::api::{
    AfterQuery, AgentAdded, AgentDiff, AgentSettings, ApprovalsQuery, BudgetStatus, DecideApproval,
    Empty, FlightDiff, FlightTree, FlightsQuery, ForkRequest, InvokeAccepted, LoginInfo, LoginLink,
    LoginRequest, MessagePosted, MessagesQuery, Peek, PeekQuery, RemoveQuery, ReplayQuery,
    ReplyRequest, RulesQuery, Status, SteerRequest, UpdateFlight, UpdateResult, UsageQuery,
    UsageReport,
};
use crate::bus::{
    ApprovalAnswer, ApproveCommand, FlightAnswer, InterruptCommand, InvokeCommand, RevertCommand,
    RuleAnswer, RuleRemoveCommand, SteerCommand,
};
use crate::domain::{
    Agent, AgentSpec, Approval, Conversation, ConversationSpec, Flight, FlightUpdate,
    InvokeRequest, Message, PostMessage, Rule,
};
use crate::event::Event;
use crate::replay::{AgentReplay, ConversationReplay, TurnReplay};
use crate::watch::{SnapshotReply, WatchRequest};

/// Who may call a method.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Every caller: the operator's token, an agent's token, a dashboard login (an
    /// agent's token reads only what it asked or was asked: the broker's handlers scope it).
    Read,
    /// The operator, or an agent's token acting as that agent only (its messages, its
    /// asks, the flights it asked for or runs): the handler checks the actor.
    Agent,
    /// The operator's token or a dashboard login; never an agent's token.
    Operator,
}

impl Scope {
    /// Whether an agent's token may call a method of this scope (the handler may still
    /// refuse it an actor or a flight that is not its own).
    pub fn open_to_agents(self) -> bool {
        self != Scope::Operator
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Agent => "agent",
            Scope::Operator => "operator",
        }
    }
}

/// The HTTP method of a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verb {
    Get,
    Post,
    Delete,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "GET",
            Verb::Post => "POST",
            Verb::Delete => "DELETE",
        }
    }
}

/// How a method answers over HTTP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Answer {
    /// One JSON body (or the error body).
    Json,
    /// Server-sent events: each event's data is one response value, `id:` its seq.
    Stream,
}

/// A method's form on the bus: request/reply on a subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bus {
    /// The request subject; a last token `{name}` is a parameter (`relay.v1.invoke.{agent}`).
    pub subject: &'static str,
    /// The JSON request body's type (in protobuf, the message of `relay.proto` the
    /// subject takes; see `broker/README.md`, "The bus").
    pub request: &'static str,
    /// What the reply carries.
    pub response: &'static str,
}

impl Bus {
    /// The subject's parameter when `subject` is this method's (`Some("")` for a subject
    /// without one); `None` when it is another's.
    pub fn matches<'a>(&self, subject: &'a str) -> Option<&'a str> {
        match self.subject.rsplit_once('.') {
            Some((prefix, last)) if last.starts_with('{') => {
                let rest = subject.strip_prefix(prefix)?.strip_prefix('.')?;
                (!rest.is_empty() && !rest.contains('.')).then_some(rest)
            }
            _ => (subject == self.subject).then_some(""),
        }
    }
}

/// One operation of the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Method {
    pub id: MethodId,
    /// `noun.verb`, as the CLI's grammar says it (`flight.steer`): the dashboard's key.
    pub name: &'static str,
    pub verb: Verb,
    /// The HTTP route; `{name}` segments are parameters (`/v1/flights/{id}/steer`).
    pub route: &'static str,
    pub scope: Scope,
    pub answer: Answer,
    /// The request's type: the JSON body of a `POST`, the query of a `GET`.
    pub request: &'static str,
    /// The response's type (for a stream, each event's).
    pub response: &'static str,
    pub bus: Option<Bus>,
    /// What it does, in a line.
    pub doc: &'static str,
}

impl Method {
    /// The route's path segments with its parameters filled in from `params`, in order
    /// (not percent-encoded: a client's URL builder encodes each segment). An error names
    /// the method when `params` does not match the route's parameters in number.
    pub fn segments<'a>(&self, params: &[&'a str]) -> Result<Vec<&'a str>, String> {
        let wrong = || {
            format!(
                "{} ({}) takes {} parameter(s), {} given",
                self.name,
                self.route,
                self.params().count(),
                params.len()
            )
        };
        let mut given = params.iter();
        let mut out = Vec::new();
        for segment in self.route.trim_start_matches('/').split('/') {
            if segment.starts_with('{') {
                out.push(*given.next().ok_or_else(wrong)?);
            } else {
                out.push(segment);
            }
        }
        match given.next() {
            Some(_) => Err(wrong()),
            None => Ok(out),
        }
    }

    /// The names of the route's parameters, in order (`id`, `name`).
    pub fn params(&self) -> impl Iterator<Item = &'static str> {
        self.route
            .split('/')
            .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
    }
}

/// A method as a type: its request and response as Rust types, for typed clients.
pub trait Call {
    const ID: MethodId;
    /// The JSON body of a `POST`, the query of a `GET` ([`Empty`] for none).
    type Request: Serialize;
    /// The answer (for a stream, each event's data).
    type Response: for<'de> Deserialize<'de>;

    fn method() -> &'static Method {
        Self::ID.method()
    }
}

/// A method served on the bus, as a type: its JSON request and reply bodies.
pub trait BusCall: Call {
    const SUBJECT: &'static str;
    type Request: Serialize + for<'de> Deserialize<'de>;
    type Response: for<'de> Deserialize<'de>;
}

/// Declares the table: each entry `Id = "noun.verb": Verb "/route", Scope, Answer,
/// Request => Response [, bus "subject", BusRequest => BusResponse]; "what it does"`.
macro_rules! methods {
    ($(
        $id:ident = $name:literal: $verb:ident $route:literal, $scope:ident, $answer:ident,
            $req:ty => $resp:ty
            $(, bus $subject:literal, $breq:ty => $bresp:ty)?
            ; $doc:literal
    )+) => {
        /// Every method, by name.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum MethodId {
            $($id,)+
        }

        impl MethodId {
            /// Every method, in the table's order.
            pub const ALL: &'static [MethodId] = &[$(MethodId::$id,)+];

            /// Its row of [`METHODS`].
            pub fn method(self) -> &'static Method {
                &METHODS[self as usize]
            }
        }

        /// The table, one row per method, in the order of [`MethodId`].
        pub const METHODS: &[Method] = &[$(
            Method {
                id: MethodId::$id,
                name: $name,
                verb: Verb::$verb,
                route: $route,
                scope: Scope::$scope,
                answer: Answer::$answer,
                request: stringify!($req),
                response: stringify!($resp),
                bus: methods!(@bus $($subject, $breq, $bresp)?),
                doc: $doc,
            },
        )+];

        /// Each method as a type ([`Call`]), for typed clients.
        pub mod call {
            use super::*;
            $(
                #[doc = $doc]
                #[derive(Debug, Clone, Copy)]
                pub struct $id;
                impl Call for $id {
                    const ID: MethodId = MethodId::$id;
                    type Request = $req;
                    type Response = $resp;
                }
                $(
                    impl BusCall for $id {
                        const SUBJECT: &'static str = $subject;
                        type Request = $breq;
                        type Response = $bresp;
                    }
                )?
            )+
        }
    };
    (@bus) => { None };
    (@bus $subject:literal, $breq:ty, $bresp:ty) => {
        Some(Bus { subject: $subject, request: stringify!($breq), response: stringify!($bresp) })
    };
}

methods! {
    StatusShow = "status": Get "/v1/status", Read, Json, Empty => Status;
        "The broker's version, data dir, counts and NATS connection."
    AgentList = "agent.list": Get "/v1/agents", Read, Json, Empty => Vec<Agent>;
        "Every registered agent."
    AgentAdd = "agent.add": Post "/v1/agents", Operator, Json, AgentSpec => AgentAdded;
        "Registers an agent, after checking its cwd, program and credentials."
    AgentShow = "agent.show": Get "/v1/agents/{name}", Read, Json, Empty => Agent;
        "One agent."
    AgentRemove = "agent.remove": Delete "/v1/agents/{name}", Operator, Json, RemoveQuery => Agent;
        "Removes an agent, stops its session and removes its worktree (its branch stays)."
    AgentSet = "agent.set": Post "/v1/agents/{name}", Operator, Json,
        AgentSettings => Agent;
        "Changes an agent's settings: its budget."
    AgentBudget = "agent.budget": Get "/v1/agents/{name}/budget", Read, Json,
        Empty => BudgetStatus;
        "An agent's budget and what it used of it today."
    AgentWake = "agent.wake": Post "/v1/agents/{name}/wake", Operator, Json, Empty => Agent;
        "Starts an agent's session now."
    AgentFork = "agent.fork": Post "/v1/agents/{name}/fork", Operator, Json,
        ForkRequest => AgentAdded;
        "A new agent forked from this one's session at a flight, its worktree from that flight's commit."
    AgentDiffShow = "agent.diff": Get "/v1/agents/{name}/diff", Read, Json, Empty => AgentDiff;
        "An agent's branch against its base: files, lines and the patch."
    AgentPeek = "agent.peek": Get "/v1/agents/{name}/peek", Read, Json, PeekQuery => Peek;
        "What a tmux agent's pane shows now, as plain text."
    ConversationList = "conversation.list": Get "/v1/conversations", Read, Json,
        Empty => Vec<Conversation>;
        "Every conversation."
    ConversationAdd = "conversation.add": Post "/v1/conversations", Operator, Json,
        ConversationSpec => Conversation;
        "Creates a conversation."
    ConversationRead = "conversation.read": Get "/v1/conversations/{id}/messages", Read, Json,
        MessagesQuery => Vec<Message>;
        "A conversation's last messages, oldest first."
    MessagePost = "message.post": Post "/v1/messages", Agent, Json, PostMessage => MessagePosted,
        bus "relay.v1.cmd.post", PostMessage => MessagePosted;
        "Posts a message; each agent it @mentions is consulted."
    Invoke = "invocation.create": Post "/v1/invocations", Agent, Json,
        InvokeRequest => InvokeAccepted,
        bus "relay.v1.invoke.{agent}", InvokeCommand => InvokeAccepted;
        "Asks an agent: a new invocation and its flight."
    FlightList = "flight.list": Get "/v1/flights", Read, Json, FlightsQuery => Vec<Flight>;
        "Flights, newest last, by agent or state."
    FlightShow = "flight.show": Get "/v1/flights/{id}", Read, Json, Empty => Flight;
        "One flight."
    FlightUpdates = "flight.updates": Get "/v1/flights/{id}/updates", Read, Json,
        AfterQuery => Vec<FlightUpdate>;
        "A flight's updates after a per-flight seq."
    FlightWrite = "flight.update": Post "/v1/flights/{id}/updates", Operator, Json,
        UpdateFlight => UpdateResult;
        "Writes a flight update (a state change, a delta, a note)."
    FlightStream = "flight.stream": Get "/v1/flights/{id}/stream", Read, Stream,
        AfterQuery => FlightUpdate;
        "A flight's updates over SSE, until it ends."
    FlightDiffShow = "flight.diff": Get "/v1/flights/{id}/diff", Read, Json, Empty => FlightDiff;
        "What a flight changed: its commit(s) on its agent's branch, with the patch."
    FlightRevert = "flight.revert": Post "/v1/flights/{id}/revert", Operator, Json, Empty => Flight,
        bus "relay.v1.cmd.revert", RevertCommand => FlightAnswer;
        "Reverts a flight's changes with a commit on its agent's branch."
    FlightTreeShow = "flight.tree": Get "/v1/flights/{id}/tree", Read, Json,
        Empty => FlightTree;
        "The agent-to-agent tree a flight belongs to, from its root."
    FlightSteer = "flight.steer": Post "/v1/flights/{id}/steer", Agent, Json,
        SteerRequest => Flight,
        bus "relay.v1.cmd.steer", SteerCommand => FlightAnswer;
        "Adds input to a running flight's turn."
    FlightInterrupt = "flight.interrupt": Post "/v1/flights/{id}/interrupt", Agent, Json,
        Empty => Flight,
        bus "relay.v1.cmd.interrupt", InterruptCommand => FlightAnswer;
        "Interrupts a flight."
    FlightReply = "flight.reply": Post "/v1/flights/{id}/reply", Agent, Json,
        ReplyRequest => Flight;
        "An agent's answer to the flight it runs."
    ApprovalList = "approval.list": Get "/v1/approvals", Read, Json,
        ApprovalsQuery => Vec<Approval>;
        "Approvals, pending by default."
    ApprovalDecide = "approval.decide": Post "/v1/approvals/{id}", Operator, Json,
        DecideApproval => Approval,
        bus "relay.v1.cmd.approve", ApproveCommand => ApprovalAnswer;
        "Decides a pending approval, and can remember the decision as a rule."
    RuleList = "rule.list": Get "/v1/rules", Read, Json, RulesQuery => Vec<Rule>,
        bus "relay.v1.cmd.rules", RulesQuery => Vec<Rule>;
        "Remembered decisions, each with its scope, origin and how often it matched."
    RuleShow = "rule.show": Get "/v1/rules/{id}", Read, Json, Empty => Rule;
        "One remembered decision."
    RuleRemove = "rule.remove": Delete "/v1/rules/{id}", Operator, Json, Empty => Rule,
        bus "relay.v1.cmd.rule_remove", RuleRemoveCommand => RuleAnswer;
        "Removes a remembered decision: the next such request asks again."
    UsageShow = "usage": Get "/v1/usage", Read, Json, UsageQuery => UsageReport,
        bus "relay.v1.cmd.usage", UsageQuery => UsageReport;
        "Tokens and cost of flights, added up by agent, conversation, tree, day or node."
    EventList = "event.list": Get "/v1/events", Read, Json, AfterQuery => Vec<Event>;
        "The event log after a global seq."
    EventStream = "event.stream": Get "/v1/events/stream", Read, Stream, AfterQuery => Event;
        "Every committed event over SSE, from a seq or Last-Event-ID."
    Watch = "watch": Get "/v1/watch", Read, Stream, WatchRequest => Event,
        bus "relay.v1.cmd.snapshot", WatchRequest => SnapshotReply;
        "A snapshot of a flight, an agent, a conversation or the fleet, then its events."
    ReplayFlight = "replay.flight": Get "/v1/replay/flights/{id}", Read, Json,
        ReplayQuery => TurnReplay;
        "A flight read back from the log."
    ReplayAgent = "replay.agent": Get "/v1/replay/agents/{name}", Read, Json,
        ReplayQuery => AgentReplay;
        "An agent's session read back from the log."
    ReplayConversation = "replay.conversation": Get "/v1/replay/conversations/{id}", Read, Json,
        ReplayQuery => ConversationReplay;
        "A conversation read back from the log."
    LoginCreate = "login.create": Post "/v1/login", Operator, Json, LoginRequest => LoginLink;
        "A one-time link that logs a browser in to the dashboard."
    LoginShow = "login.show": Get "/v1/login", Read, Json, Empty => LoginInfo;
        "Who is calling, and the name its decisions are recorded under."
    LoginEnd = "login.end": Post "/v1/logout", Operator, Json, Empty => Empty;
        "Ends the dashboard login of the caller's cookie, for good."
    LoginRevokeAll = "login.revoke_all": Post "/v1/login/revoke", Operator, Json, Empty => Empty;
        "Rotates the dashboard's login key: every dashboard login and unused link ends."
}

/// The method `verb route` names (`route` as the router matched it, with its `{name}`
/// parameters).
pub fn by_route(verb: Verb, route: &str) -> Option<&'static Method> {
    METHODS.iter().find(|m| m.verb == verb && m.route == route)
}

/// The method served on `subject`, and the subject's parameter (an invoke's agent).
pub fn by_subject(subject: &str) -> Option<(&'static Method, &str)> {
    METHODS.iter().find_map(|m| {
        let bus = m.bus.as_ref()?;
        bus.matches(subject).map(|param| (m, param))
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::collections::HashSet;

    use super::*;
    use crate::bus::subjects;

    #[test]
    fn each_row_is_its_id_and_each_route_and_name_is_one_method() {
        for (i, id) in MethodId::ALL.iter().enumerate() {
            assert_eq!(METHODS[i].id, *id);
            assert_eq!(id.method().id, *id);
        }
        let mut routes = HashSet::new();
        let mut names = HashSet::new();
        for m in METHODS {
            assert!(routes.insert((m.verb, m.route)), "{} twice", m.route);
            assert!(names.insert(m.name), "{} twice", m.name);
            assert!(m.route.starts_with("/v1/"), "{}", m.route);
            // Reads are open to every caller (an agent's token scoped by the handlers).
            if m.verb == Verb::Get {
                assert_eq!(m.scope, Scope::Read, "{}", m.name);
            }
        }
        // What an agent's token may write: ask, send, steer, interrupt and reply as
        // itself; nothing else (the list the token guard had before the table).
        let agent_writes: Vec<&str> = METHODS
            .iter()
            .filter(|m| m.verb != Verb::Get && m.scope.open_to_agents())
            .map(|m| m.route)
            .collect();
        assert_eq!(
            agent_writes,
            [
                "/v1/messages",
                "/v1/invocations",
                "/v1/flights/{id}/steer",
                "/v1/flights/{id}/interrupt",
                "/v1/flights/{id}/reply",
            ]
        );
    }

    #[test]
    fn the_bus_subjects_are_the_bus_modules() {
        let subject = subjects::invoke("alice");
        let (m, agent) = by_subject(&subject).unwrap();
        assert_eq!((m.id, agent), (MethodId::Invoke, "alice"));
        assert!(by_subject("relay.v1.invoke.").is_none());
        assert!(by_subject("relay.v1.invoke.a.b").is_none());
        for (subject, id) in [
            (subjects::CMD_POST, MethodId::MessagePost),
            (subjects::CMD_STEER, MethodId::FlightSteer),
            (subjects::CMD_INTERRUPT, MethodId::FlightInterrupt),
            (subjects::CMD_APPROVE, MethodId::ApprovalDecide),
            (subjects::CMD_REVERT, MethodId::FlightRevert),
            (subjects::CMD_RULES, MethodId::RuleList),
            (subjects::CMD_RULE_REMOVE, MethodId::RuleRemove),
            (subjects::CMD_USAGE, MethodId::UsageShow),
            (subjects::CMD_SNAPSHOT, MethodId::Watch),
        ] {
            assert_eq!(by_subject(subject).unwrap().0.id, id, "{subject}");
        }
        assert!(by_subject("relay.v1.cmd.nope").is_none());
    }

    #[test]
    fn a_route_is_filled_in_with_its_parameters() {
        let steer = MethodId::FlightSteer.method();
        assert_eq!(steer.params().collect::<Vec<_>>(), ["id"]);
        assert_eq!(
            steer.segments(&["flt_1"]).unwrap(),
            ["v1", "flights", "flt_1", "steer"]
        );
        assert!(steer.segments(&[]).unwrap_err().contains("flight.steer"));
        assert!(steer.segments(&["a", "b"]).is_err());
        assert_eq!(
            MethodId::StatusShow.method().segments(&[]).unwrap(),
            ["v1", "status"]
        );
        assert_eq!(
            by_route(Verb::Post, "/v1/flights/{id}/steer").unwrap().id,
            MethodId::FlightSteer
        );
        assert!(by_route(Verb::Delete, "/v1/flights/{id}/steer").is_none());
    }
}
