//! `relay events`: the event log, a page of it or followed live.

use clap::Args;
use relay_client::{Client, Followed, Reconnect};
use relay_protocol::api::Status;
use relay_protocol::api::{AfterQuery, Empty};
use relay_protocol::event::Event;
use relay_protocol::methods::call as m;

use crate::terminal::{errln, jsonln, outln};
use crate::views::{describe_event, print_json};

#[derive(Args)]
pub struct EventsArgs {
    /// Only events after this global sequence number (0: from the start of the log).
    /// Without it, the last N events.
    #[arg(long, value_name = "SEQ")]
    since: Option<u64>,
    /// At most this many events (before following, with --follow).
    #[arg(short = 'n', default_value_t = 50)]
    n: usize,
    /// Keep following new events.
    #[arg(long, short = 'f')]
    follow: bool,
    /// Print JSON (machine-readable) instead of text.
    #[arg(long)]
    json: bool,
}

/// `relay events`.
pub async fn run(client: &Client, args: EventsArgs) -> anyhow::Result<()> {
    let EventsArgs {
        since,
        n,
        follow,
        json,
    } = args;
    let print = |e: &Event| -> anyhow::Result<()> {
        if json {
            jsonln!(&serde_json::to_string(e)?);
        } else {
            outln!("{:>8} {} {}", e.seq, e.body.type_name(), describe_event(e));
        }
        Ok(())
    };
    let since = match since {
        Some(seq) => seq,
        None => {
            let s: Status = client.call::<m::StatusShow>(&[], &Empty {}).await?;
            s.last_seq.saturating_sub(n as u64)
        }
    };
    if follow {
        // Followed across broker restarts (even `kill -9`), like `tail -F`: the stream
        // is opened again with the last event's id as Last-Event-ID, through the data
        // dir's api.json as it is then, so nothing is missed or printed twice.
        let mut after = since;
        let mut failed = None;
        let mut following = client.follow(
            &Client::path::<m::EventStream>(&[])?,
            &[("after", since.to_string())],
            Reconnect {
                give_up_after: None,
                wait_for_first: true,
            },
        );
        following
            .run(|followed| match followed {
                Followed::Event(sse) => match serde_json::from_str::<Event>(&sse.data) {
                    Ok(e) => {
                        after = e.seq;
                        print(&e).is_ok()
                    }
                    Err(e) => {
                        failed = Some(e);
                        false
                    }
                },
                Followed::Lost(_) => {
                    errln!(
                        "relay: lost the broker; following again after event {after} when it is back"
                    );
                    true
                }
                Followed::Back => {
                    errln!("relay: the broker is back");
                    true
                }
            })
            .await?;
        if let Some(e) = failed {
            anyhow::bail!("bad event from the broker: {e}");
        }
    } else {
        let events: Vec<Event> = client
            .call::<m::EventList>(
                &[],
                &AfterQuery {
                    after: Some(since),
                    limit: Some(n),
                },
            )
            .await?;
        if json {
            print_json(&events)?;
        } else {
            for e in &events {
                print(e)?;
            }
        }
        if let Some(last) = events.last().filter(|_| events.len() == n) {
            let s: Status = client.call::<m::StatusShow>(&[], &Empty {}).await?;
            if s.last_seq > last.seq {
                errln!(
                    "relay: {} more events; next page: relay events --since {} -n {n}",
                    s.last_seq - last.seq,
                    last.seq
                );
            }
        }
    }
    Ok(())
}
