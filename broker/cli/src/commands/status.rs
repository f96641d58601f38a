//! `relay status`: the broker's state.

use relay_client::Client;
use relay_protocol::api::Empty;
use relay_protocol::api::Status;
use relay_protocol::methods::call as m;

use crate::terminal::outln;
use crate::views::{describe_nats, print_json};

/// `relay status`.
pub async fn run(client: &Client, json: bool) -> anyhow::Result<()> {
    let s: Status = client.call::<m::StatusShow>(&[], &Empty {}).await?;
    if json {
        print_json(&s)?;
    } else {
        outln!("relay {} at {}", s.version, client.url());
        outln!("data dir   {}", s.data_dir);
        outln!("events     {}", s.last_seq);
        outln!("agents     {}", s.agents);
        outln!("flights    {} ({} live)", s.flights, s.live_flights);
        outln!("nats       {}", describe_nats(&s.nats));
        outln!("uptime     {} s", s.uptime_ms / 1000);
        if let Some(d) = &s.disk {
            let mib = |b: u64| b as f64 / f64::from(1 << 20);
            if d.full {
                outln!(
                    "disk       FULL: {:.1} MiB free, under the {:.1} MiB reserve; writes are refused (storage_full) until space is freed",
                    mib(d.free_bytes),
                    mib(d.reserve_bytes)
                );
            } else {
                outln!(
                    "disk       {:.1} MiB free ({:.1} MiB kept in reserve)",
                    mib(d.free_bytes),
                    mib(d.reserve_bytes)
                );
            }
        }
    }
    Ok(())
}
