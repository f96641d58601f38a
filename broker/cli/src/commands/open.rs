//! `relay open`: a one-time login link to the dashboard, opened in the browser on a
//! desktop. The link logs one browser in (an `HttpOnly` cookie; the page never holds
//! the API token) and then works no more; see `broker/src/http/web.rs`.

use clap::Args;
use relay_client::Client;
use relay_protocol::api::{LoginLink, LoginRequest};
use relay_protocol::methods::call as m;

use crate::terminal::{errln, outln};
use crate::views::print_json;

#[derive(Args)]
#[command(
    after_help = "The link works once, within two minutes; run `relay open` again for \
another browser, or after `relay up` restarted (logins end with it)."
)]
pub struct OpenArgs {
    /// Who will use the page: approvals decided there are recorded as decided by
    /// NAME@dashboard [default: $USER, else operator].
    #[arg(long = "as", value_name = "NAME")]
    name: Option<String>,
    /// Print the link only; do not start a browser.
    #[arg(long)]
    no_browser: bool,
    /// Print JSON (`url`, `dashboard`, `expires_in_secs`) instead of text; starts no
    /// browser.
    #[arg(long)]
    json: bool,
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
    let link: LoginLink = client
        .call::<m::LoginCreate>(&[], &LoginRequest { name })
        .await?;
    if args.json {
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
