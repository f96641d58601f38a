//! `relay ask`: invoke an agent, then follow its flight live ([`crate::views::ask`]).

use relay_protocol::api::Empty;
use relay_protocol::methods::call as m;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Args;
use relay_client::{Client, ClientError, Reconnect};
use relay_protocol::api::InvokeAccepted;
use relay_protocol::domain::{Flight, FlightChange, FlightState, FlightUpdate, InvokeRequest};

use super::{text_arg, Actor};
use crate::exit::Exit;
use crate::terminal::{errln, outln};
use crate::views::ask::{AskView, Status};
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
    /// Print the final flight record as JSON instead of the streamed reply.
    #[arg(long)]
    json: bool,
}

/// `relay ask`: invokes, then follows the flight (unless `--no-wait`); its exit code
/// says how the flight ended.
pub async fn run(client: &Client, args: AskArgs) -> anyhow::Result<Exit> {
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
    client.call::<m::Invoke>(&[], req).await
}

/// What [`follow`] reports as it follows a flight.
pub(crate) enum Followed<'a> {
    /// The next update, in order.
    Update(&'a FlightUpdate),
    /// The stream broke (the broker went away or stopped), for this reason: it is tried
    /// again.
    Lost(&'a str),
    /// Following again, from the update after the last one seen.
    Back,
}

/// How long [`follow`] tries to reach a broker that went away before it gives up.
const RECONNECT_FOR: Duration = Duration::from_secs(300);

/// Follows flight `id` over its SSE stream until its terminal update, calling `on` for
/// each update, then returns the flight as it ended. When the broker goes away (a
/// restart, even `kill -9`) it follows again from the update after the last one seen
/// (`Last-Event-ID`), through the data dir's api.json as it is then (the port may
/// change), for up to [`RECONNECT_FOR`]: nothing is missed or shown twice. Shared by
/// `relay ask` and the `ask` tool of `relay mcp`.
pub(crate) async fn follow(
    client: &Client,
    id: &str,
    mut on: impl FnMut(Followed<'_>),
) -> anyhow::Result<Flight> {
    let mut after = 0u64;
    let mut failure = None;
    let mut following = client.follow(
        &Client::path::<m::FlightStream>(&[id])?,
        &[],
        Reconnect {
            give_up_after: Some(RECONNECT_FOR),
            wait_for_first: true,
        },
    );
    let followed = following
        .run(|followed| {
            let sse = match followed {
                relay_client::Followed::Event(sse) => sse,
                relay_client::Followed::Lost(broke) => {
                    let why = match broke {
                        ClientError::Closed { source: None, .. } => "its stream ended".to_string(),
                        e => e.to_string(),
                    };
                    on(Followed::Lost(&why));
                    return true;
                }
                relay_client::Followed::Back => {
                    on(Followed::Back);
                    return true;
                }
            };
            if sse.event != "update" {
                failure = Some(sse.data.clone());
                return false;
            }
            let Ok(u) = serde_json::from_str::<FlightUpdate>(&sse.data) else {
                failure = Some(format!("bad update: {}", sse.data));
                return false;
            };
            if u.seq <= after {
                return true;
            }
            after = u.seq;
            let ended = matches!(&u.change, FlightChange::State { to, .. } if to.is_terminal());
            on(Followed::Update(&u));
            !ended
        })
        .await;
    if let Some(f) = failure {
        anyhow::bail!("the flight stream failed: {f}");
    }
    if let Err(e) = followed {
        if e.is_transient() {
            return Err(anyhow::Error::from(e).context(format!(
                "gave up following flight {id} after {} s without the broker (it goes on if the broker comes back: relay watch --flight {id})",
                RECONNECT_FOR.as_secs()
            )));
        }
        return Err(e.into());
    }
    // The flight as it ended; a broker that goes away at this moment is waited for too.
    let mut client = following.client().clone();
    let mut tries = 0;
    loop {
        match client.call::<m::FlightShow>(&[id], &Empty {}).await {
            Ok(f) => return Ok(f),
            Err(e) if e.is_transient() && tries < 50 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
                client = client.rediscover();
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// `relay ask`: invoke, then follow the flight's updates, printing deltas as they come.
/// Ctrl-C interrupts the flight (as Codex and Claude Code do) and says how to follow it;
/// a second Ctrl-C leaves it running and exits at once. Either way the exit is 130.
async fn ask(
    client: &Client,
    req: InvokeRequest,
    no_wait: bool,
    json: bool,
) -> anyhow::Result<Exit> {
    use std::io::IsTerminal;
    let accepted = invoke(client, &req).await?;
    let id = accepted.flight.id.clone();
    if no_wait {
        if json {
            print_json(&accepted.flight)?;
        } else {
            outln!("{id}");
        }
        return Ok(Exit::Ok);
    }
    let status = if std::io::stderr().is_terminal() {
        Status::Line
    } else {
        Status::Lines
    };
    let view = Arc::new(Mutex::new(AskView::new(
        &req.target,
        accepted.flight.state,
        status,
        !json,
    )));
    let with_view = |f: &mut dyn FnMut(&mut AskView)| {
        if let Ok(mut v) = view.lock() {
            f(&mut v)
        }
    };
    let spinner = (status == Status::Line).then(|| {
        let view = view.clone();
        tokio::spawn(async move {
            let frames = ['|', '/', '-', '\\'];
            for i in 0.. {
                tokio::time::sleep(Duration::from_millis(120)).await;
                let Ok(mut v) = view.lock() else { return };
                v.draw_status(frames[i % 4], crate::terminal::stderr_width());
            }
        })
    });
    let followed = follow(client, &id, |f| match f {
        Followed::Update(u) => with_view(&mut |v| v.apply(&u.change)),
        Followed::Lost(e) => with_view(&mut |v| {
            v.line(&format!(
                "lost the broker ({e}); following flight {id} again when it is back"
            ))
        }),
        Followed::Back => {
            with_view(&mut |v| v.line(&format!("the broker is back; following flight {id}")))
        }
    });
    tokio::pin!(followed);
    // One listener for the whole ask: a second Ctrl-C that comes while the first one's
    // interrupt is being sent is kept for the next turn of the loop, not lost.
    let mut ctrl_c = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut interrupted = false;
    let result = loop {
        tokio::select! {
            r = &mut followed => break r,
            _ = ctrl_c.recv() => {
                if interrupted {
                    with_view(&mut |v| { v.finish(); });
                    errln!("relay: left flight {id} running; follow it: relay watch --flight {id}; stop it: relay flight interrupt {id}");
                    return Ok(Exit::Interrupted);
                }
                interrupted = true;
                with_view(&mut |v| v.line(&format!(
                    "interrupting flight {id} (Ctrl-C again to leave it running; follow it: relay watch --flight {id})"
                )));
                let sent: Result<Flight, ClientError> = client
                    .call::<m::FlightInterrupt>(&[&id], &Empty {})
                    .await;
                if let Err(e) = sent {
                    with_view(&mut |v| v.line(&format!("cannot interrupt flight {id}: {e}")));
                }
            }
        }
    };
    if let Some(s) = spinner {
        s.abort();
    }
    let last = view.lock().ok().and_then(|mut v| v.finish());
    let flight = result?;
    if json {
        print_json(&flight)?;
    } else if let Some(output) = flight.output.as_deref().filter(|o| !o.trim().is_empty()) {
        match last {
            // Nothing streamed: the reply is all there is to show.
            None => outln!("{output}"),
            // What streamed last is not the final reply (a steered turn, several
            // messages): say what the reply is.
            Some(last) if last.trim() != output.trim() => outln!("\n[final reply]\n{output}"),
            _ => {}
        }
    }
    // On stderr: stdout stays the reply, for scripts.
    if let Some(c) = flight.commit.as_ref().filter(|_| !json) {
        errln!("relay: {} (relay diff {})", c.summary(), flight.id);
    }
    if flight.state != FlightState::Completed && !json {
        errln!(
            "relay: flight {} {}: {}",
            flight.id,
            flight.state,
            flight.error.as_deref().unwrap_or("no reason given")
        );
    }
    if interrupted {
        return Ok(Exit::Interrupted);
    }
    Ok(Exit::of_flight(flight.state))
}
