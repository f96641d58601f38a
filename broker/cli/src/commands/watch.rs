//! `relay watch`: the fleet's, a flight's, an agent's or a conversation's snapshot, then its events
//! live, from `GET /v1/watch` (the broker makes the snapshot exact at a seq and follows
//! from there: nothing is missed or shown twice).

use std::process::ExitCode;

use clap::Args;
use relay_protocol::domain::FlightState;
use relay_protocol::event::{Event, EventBody};
use relay_protocol::watch::{Scope, Snapshot, View, WatchRequest, DEFAULT_MESSAGES};

use crate::client::Client;
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

/// `relay watch`.
pub async fn run(client: &Client, args: WatchArgs) -> anyhow::Result<ExitCode> {
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
        _ => anyhow::bail!("name a flight, an agent or a conversation to watch"),
    };
    let flight_scope = matches!(scope, Scope::Flight(_));
    let query = serde_json::to_value(WatchRequest::from(&scope))?;
    let query: Vec<(&str, String)> = query
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            let v = v.as_str().map_or_else(|| v.to_string(), str::to_string);
            (k.as_str(), v)
        })
        .collect();
    let mut view = WatchView::default();
    // The flight's state as last seen: the snapshot's, then each update's.
    let mut state: Option<FlightState> = None;
    let mut failure = None;
    client
        .sse(&["v1", "watch"], &query, |kind, data| {
            let shown = match kind {
                "snapshot" => serde_json::from_str::<Snapshot>(data).map(|s| {
                    if let View::Flight(v) = &s.view {
                        state = Some(v.flight.state);
                    }
                    show(json, data, || view.snapshot(&s));
                }),
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
                    show(json, data, || view.event(&scope, &e));
                }),
            };
            match shown {
                Ok(()) => true,
                Err(e) => {
                    failure = Some(format!("bad {kind} from the broker: {e}"));
                    false
                }
            }
        })
        .await?;
    view.end_line();
    if let Some(f) = failure {
        anyhow::bail!("the watch failed: {f}");
    }
    if !flight_scope {
        return Ok(ExitCode::SUCCESS);
    }
    match state {
        Some(FlightState::Completed) => Ok(ExitCode::SUCCESS),
        Some(s) if s.is_terminal() => {
            if !json {
                errln!("relay: the flight ended {s}");
            }
            Ok(ExitCode::FAILURE)
        }
        _ => anyhow::bail!("the broker ended the watch before the flight ended"),
    }
}

/// The JSON line as the broker sent it (one line: SSE data has no newline), or the text
/// view.
fn show(json: bool, data: &str, text: impl FnOnce()) {
    if json {
        jsonln!(data);
    } else {
        text();
    }
}
