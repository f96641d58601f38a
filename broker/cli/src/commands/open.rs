//! `relay open`: a one-time login link to the dashboard, opened in the browser on a
//! desktop. The link logs one browser in (an `HttpOnly` cookie, signed with a key kept
//! in the data dir: it survives a restart of `relay up`, for 30 days; the page never
//! holds the API token) and then works no more; see `broker/src/http/web.rs`.
//! `--revoke-all` first rotates that key (`login.revoke_all`): every browser logged in
//! and every unused link ends, then a fresh link is made as without it.

use clap::Args;
use relay_client::Client;
use relay_protocol::api::{Empty, LoginLink, LoginRequest};
use relay_protocol::methods::call as m;

use crate::terminal::{errln, outln};
use crate::views::print_json;

#[derive(Args)]
#[command(
    after_help = "The link works once, within two minutes; run `relay open` again for \
another browser. A browser stays logged in for 30 days, across restarts of `relay up`, \
until it logs out (the page's Log out) or `relay open --revoke-all` ends every login."
)]
pub struct OpenArgs {
    /// Who will use the page: what it does there (asks, steers, decisions, agent
    /// changes) is recorded as NAME@dashboard [default: $USER, else operator].
    #[arg(long = "as", value_name = "NAME")]
    name: Option<String>,
    /// Print the link only; do not start a browser.
    #[arg(long)]
    no_browser: bool,
    /// Print JSON (`url`, `dashboard`, `expires_in_secs`, and `revoked` with
    /// --revoke-all) instead of text; starts no browser.
    #[arg(long)]
    json: bool,
    /// End every dashboard login first (a new login key: every browser logged in and
    /// every unused link stops working), then make a fresh link.
    #[arg(long)]
    revoke_all: bool,
}

/// `relay open`.
pub async fn run(client: &Client, args: OpenArgs) -> anyhow::Result<()> {
    let name = args.name.or_else(|| {
        std::env::var("USER").ok().filter(|u| {
            !u.is_empty()
                && u.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        })
    });
    if args.revoke_all {
        client.call::<m::LoginRevokeAll>(&[], &Empty {}).await?;
        if !args.json {
            errln!("relay: every dashboard login ended (a new login key)");
        }
    }
    let link: LoginLink = client
        .call::<m::LoginCreate>(&[], &LoginRequest { name })
        .await?;
    if args.json {
        if args.revoke_all {
            let mut value = serde_json::to_value(&link)?;
            if let Some(map) = value.as_object_mut() {
                map.insert("revoked".into(), serde_json::Value::Bool(true));
            }
            return print_json(&value);
        }
        return print_json(&link);
    }
    outln!("{}", link.url);
    errln!(
        "relay: a one-time login link to the dashboard ({}), valid for {} s",
        link.dashboard,
        link.expires_in_secs
    );
    if !args.no_browser && desktop() {
        open_browser(&link.url);
    }
    Ok(())
}

/// A graphical session to open a browser in.
fn desktop() -> bool {
    cfg!(target_os = "macos")
        || ["DISPLAY", "WAYLAND_DISPLAY"]
            .iter()
            .any(|v| std::env::var_os(v).is_some_and(|v| !v.is_empty()))
}

/// Starts the desktop's URL opener, detached; a failure is only reported.
fn open_browser(url: &str) {
    let opener = if cfg!(target_os = "macos") {
        "open"
    } else {
        "xdg-open"
    };
    let started = std::process::Command::new(opener)
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    match started {
        // The opener hands the URL over and exits; reap it without waiting here.
        Ok(mut child) => {
            std::thread::spawn(move || child.wait());
        }
        Err(e) => errln!("relay: could not start {opener} ({e}); open the link yourself"),
    }
}
