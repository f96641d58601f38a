//! `relay ask`: invoke an agent, then follow its flight live ([`crate::views::ask`]).

use std::process::ExitCode;

use clap::Args;
use relay_protocol::api::InvokeAccepted;
use relay_protocol::domain::{Flight, FlightState, FlightUpdate, InvokeRequest};

use super::{text_arg, Actor};
use crate::client::{Client, ClientError};
use crate::terminal::{errln, outln};
use crate::views::ask::AskView;
use crate::views::print_json;

#[derive(Args)]
pub struct AskArgs {
    /// The agent's name.
    agent: String,
    /// The task. `-` (or nothing, with a pipe on stdin) reads it from stdin.
    text: Vec<String>,
    #[command(flatten)]
    actor: Actor,
    /// Conversation to post in (default: a direct one with the agent).
    #[arg(long)]
    conversation: Option<String>,
    /// The flight this ask is made from (agent-to-agent). Inside an agent's session
    /// (RELAY_TOKEN is the agent's) the broker links the ask to the flight the agent is
    /// running; this may name only a live flight of that agent.
    #[arg(long, env = "RELAY_FLIGHT")]
    parent_flight: Option<String>,
    /// Fail the flight after this many seconds.
    #[arg(long)]
    timeout: Option<u64>,
    /// Print the flight id and return at once.
    #[arg(long)]
    no_wait: bool,
    /// Print only the final flight record as JSON.
    /// Print JSON (machine-readable) instead of text.
    #[arg(long)]
    json: bool,
}

/// `relay ask`: invokes, then follows the flight (unless `--no-wait`); its exit code
/// says how the flight ended.
pub async fn run(client: &Client, args: AskArgs) -> anyhow::Result<ExitCode> {
    let AskArgs {
        agent,
        text,
        actor,
        conversation,
        parent_flight,
        timeout,
        no_wait,
        json,
    } = args;
    ask(
        client,
        InvokeRequest {
            target: agent,
            task: text_arg(text)?,
            requester: actor.name(),
            action: Default::default(),
            conversation,
            parent_flight,
            timeout_ms: timeout.map(|s| s * 1000),
        },
        no_wait,
        json,
    )
    .await
}

/// Asks: posts the invocation (refused with the broker's typed error: an unknown agent,
/// a self-ask, a cycle, a chain too deep, a token acting as someone else).
pub(crate) async fn invoke(
    client: &Client,
    req: &InvokeRequest,
) -> Result<InvokeAccepted, ClientError> {
    client.post(&["v1", "invocations"], req).await
}

/// Follows flight `id` over its SSE stream until its terminal update, calling `on_update`
/// for each, then returns the flight as it ended. Shared by `relay ask` and the `ask`
/// tool of `relay mcp`.
pub(crate) async fn follow(
    client: &Client,
    id: &str,
    mut on_update: impl FnMut(&FlightUpdate),
) -> anyhow::Result<Flight> {
    let mut failure = None;
    client
        .sse(&["v1", "flights", id, "stream"], &[], |kind, data| {
            if kind != "update" {
                failure = Some(data.to_string());
                return false;
            }
            let Ok(u) = serde_json::from_str::<FlightUpdate>(data) else {
                failure = Some(format!("bad update: {data}"));
                return false;
            };
            on_update(&u);
            true
        })
        .await?;
    if let Some(f) = failure {
        anyhow::bail!("the flight stream failed: {f}");
    }
    Ok(client.get(&["v1", "flights", id]).await?)
}

/// `relay ask`: invoke, then follow the flight's updates, printing deltas as they come.
async fn ask(
    client: &Client,
    req: InvokeRequest,
    no_wait: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    use std::io::IsTerminal;
    let accepted = invoke(client, &req).await?;
    let id = accepted.flight.id.clone();
    if no_wait {
        if json {
            print_json(&accepted.flight)?;
        } else {
            outln!("{id}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let status_line = !json && std::io::stderr().is_terminal();
    let shared = std::sync::Arc::new(std::sync::Mutex::new(AskView::new(accepted.flight.state)));
    let spinner = status_line.then(|| {
        let shared = shared.clone();
        let agent = req.target.clone();
        tokio::spawn(async move {
            let frames = ['|', '/', '-', '\\'];
            for i in 0.. {
                tokio::time::sleep(std::time::Duration::from_millis(120)).await;
                let Ok(mut v) = shared.lock() else { return };
                v.draw_status(&agent, frames[i % 4]);
            }
        })
    });
    let followed = follow(client, &id, |u| {
        if let Ok(mut v) = shared.lock() {
            v.apply(&u.change, !json);
        }
    })
    .await;
    if let Some(s) = spinner {
        s.abort();
    }
    let view = shared.lock().map(|mut v| {
        v.clear_status();
        v.finish()
    });
    let flight = followed?;
    if json {
        print_json(&flight)?;
    } else if let Some(output) = flight.output.as_deref().filter(|o| !o.trim().is_empty()) {
        match view {
            // Nothing streamed: the reply is all there is to show.
            Ok(None) => outln!("{output}"),
            // What streamed last is not the final reply (a steered turn, several
            // messages): say what the reply is.
            Ok(Some(last)) if last.trim() != output.trim() => {
                outln!("\n[final reply]\n{output}")
            }
            _ => {}
        }
    }
    if flight.state == FlightState::Completed {
        Ok(ExitCode::SUCCESS)
    } else {
        if !json {
            errln!(
                "relay: flight {} {}: {}",
                flight.id,
                flight.state,
                flight.error.as_deref().unwrap_or("no reason given")
            );
        }
        Ok(ExitCode::FAILURE)
    }
}
