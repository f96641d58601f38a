//! `relay watch`: the fleet's, a flight's, an agent's or a conversation's snapshot, then its events
//! live, from `GET /v1/watch` (the broker makes the snapshot exact at a seq and follows
//! from there: nothing is missed or shown twice).

use relay_protocol::methods::call as m;
use std::time::Duration;

use clap::Args;
use relay_client::{Client, Followed, Reconnect};
use relay_protocol::domain::FlightState;
use relay_protocol::event::{Event, EventBody};
use relay_protocol::watch::{Scope, Snapshot, View, WatchRequest, DEFAULT_MESSAGES};

use crate::exit::Exit;
use crate::terminal::{errln, jsonln};
use crate::views::watch::WatchView;

#[derive(Args)]
#[command(group(clap::ArgGroup::new("scope").required(true).args(["fleet", "flight", "agent", "conversation"])))]
pub struct WatchArgs {
    /// Watch the whole fleet (what the dashboard shows): every agent, the flights not
    /// ended and the approvals waiting, then each change of state, new flight and
    /// approval (not the streamed text) until interrupted.
    #[arg(long)]
    fleet: bool,
    /// Watch one flight: its record and every update so far, then each new update;
    /// ends with the flight (exit 0 when it completed, 1 when it failed or was
    /// cancelled).
    #[arg(long, value_name = "ID")]
    flight: Option<String>,
    /// Watch an agent: its record and its flights not yet ended (with their updates so
    /// far), then its events (state, new flights, their updates) until interrupted.
    #[arg(long, value_name = "NAME")]
    agent: Option<String>,
    /// Watch a conversation: its last messages, then each new one until interrupted.
    #[arg(long, value_name = "ID")]
    conversation: Option<String>,
    /// With --conversation: how many of its last messages the snapshot shows.
    #[arg(short = 'n', long, value_name = "N", requires = "conversation", default_value_t = DEFAULT_MESSAGES)]
    limit: usize,
    /// JSON lines: first the snapshot (`seq` = the event seq it is valid at), then each
    /// event with its `seq`.
    #[arg(long)]
    json: bool,
}

/// `relay watch`. When the broker goes away (a restart, even `kill -9`), the watch goes
/// on from the last event it showed (`Last-Event-ID`), through the data dir's api.json as it is
/// then, saying so on stderr: nothing is missed or shown twice.
pub async fn run(client: &Client, args: WatchArgs) -> anyhow::Result<Exit> {
    let WatchArgs {
        fleet,
        flight,
        agent,
        conversation,
        limit,
        json,
    } = args;
    let scope = match (flight, agent, conversation) {
        _ if fleet => Scope::Fleet,
        (Some(f), _, _) => Scope::Flight(f),
        (_, Some(a), _) => Scope::Agent(a),
        (_, _, Some(id)) => Scope::Conversation { id, limit },
        _ => crate::exit::usage!("name a flight, an agent or a conversation to watch"),
    };
    let flight_scope = matches!(scope, Scope::Flight(_));
    let request = WatchRequest::from(&scope);
    let mut view = WatchView::default();
    // The flight's state as last seen: the snapshot's, then each update's.
    let mut state: Option<FlightState> = None;
    // The seq of the last event shown (the snapshot's at first).
    let mut seen: Option<u64> = None;
    let query = serde_json::to_value(&request)?;
    let query: Vec<(&str, String)> = query
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            let v = v.as_str().map_or_else(|| v.to_string(), str::to_string);
            (k.as_str(), v)
        })
        .collect();
    // A broken watch is opened again with Last-Event-ID, the seq of the last event
    // shown: the broker resumes it after that seq (`event: resumed`, no snapshot).
    let mut following = client.follow(
        &Client::path::<m::Watch>(&[])?,
        &query,
        Reconnect {
            give_up_after: Some(RECONNECT_FOR),
            wait_for_first: false,
        },
    );
    let mut failure = None;
    let followed = following
        .run(|followed| {
            let sse = match followed {
                Followed::Event(sse) => sse,
                Followed::Lost(_) => {
                    view.end_line();
                    errln!(
                        "relay: lost the broker; watching again from event {} when it is back",
                        seen.unwrap_or(0)
                    );
                    return true;
                }
                Followed::Back => {
                    errln!("relay: the broker is back; watching on");
                    return true;
                }
            };
            let (kind, data) = (sse.event.as_str(), sse.data.as_str());
            let shown = match kind {
                "snapshot" => serde_json::from_str::<Snapshot>(data).map(|s| {
                    if let View::Flight(v) = &s.view {
                        state = Some(v.flight.state);
                    }
                    seen = Some(s.seq);
                    show(json, data, || view.snapshot(&s));
                }),
                "resumed" => return true,
                "error" => {
                    failure = Some(data.to_string());
                    return false;
                }
                _ => serde_json::from_str::<Event>(data).map(|e| {
                    if let EventBody::FlightUpdated { flight, .. } = &e.body {
                        if flight_scope {
                            state = Some(flight.state);
                        }
                    }
                    seen = Some(e.seq);
                    show(json, data, || view.event(&scope, &e));
                }),
            };
            match shown {
                Ok(()) => !(flight_scope && state.is_some_and(|s| s.is_terminal())),
                Err(e) => {
                    failure = Some(format!("bad {kind} from the broker: {e}"));
                    false
                }
            }
        })
        .await;
    if let Some(f) = failure {
        view.end_line();
        anyhow::bail!("the watch failed: {f}");
    }
    if let Err(e) = followed {
        view.end_line();
        if e.is_transient() {
            // Unavailable (exit 5), with the last reason the broker could not be had.
            return Err(anyhow::Error::from(e).context(format!(
                "gave up after {} s without the broker; watch again when it is back",
                RECONNECT_FOR.as_secs()
            )));
        }
        return Err(e.into());
    }
    view.end_line();
    match state {
        Some(FlightState::Completed) => Ok(Exit::Ok),
        Some(s) if s.is_terminal() => {
            if !json {
                errln!("relay: the flight ended {s}");
            }
            Ok(Exit::of_flight(s))
        }
        _ => Ok(Exit::Ok),
    }
}

/// How long a watch tries to reach a broker that went away before it gives up.
const RECONNECT_FOR: Duration = Duration::from_secs(300);

/// The JSON line as the broker sent it (one line: SSE data has no newline), or the text
/// view.
fn show(json: bool, data: &str, text: impl FnOnce()) {
    if json {
        jsonln!(data);
    } else {
        text();
    }
}
