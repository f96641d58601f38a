//! The browser fixture itself ([`relay_tests::browser`]), on a real headless Chromium and
//! a page served here on 127.0.0.1:
//!
//! - a page is opened, a button clicked, the page's late change waited for, keys typed,
//!   text, title and script values read, notifications allowed without a prompt, and a
//!   screenshot saved as a PNG under the artifacts dir;
//! - dropping the guard kills chromedriver, every Chromium process in its process group
//!   and the crash handler outside it, and removes the browser's directory;
//! - a test that panics mid-way (a wait that never comes, which names what it waited for
//!   and what it saw) leaves no browser process either.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use axum::http::header::CONTENT_TYPE;
use axum::response::Html;
use axum::routing::get;
use axum::Router;
use fantoccini::key::Key;
use relay_tests::browser::{artifacts_dir, Browser};
use relay_tests::procs;
use relay_tests::wait::wait_until;
use serde_json::json;

const INDEX: &str = r#"<!doctype html>
<html>
<head><title>Fixture</title><script src="/app.js" defer></script></head>
<body>
<h1 id="greeting">Before</h1>
<button id="go">Go</button>
<p id="keys"></p>
<p id="hidden" hidden>secret</p>
</body>
</html>
"#;

/// The title once the script ran; a click changes the greeting and the title a little
/// later (the test has to wait for it); each key pressed is written down.
const APP_JS: &str = r#"
document.title = "Fixture ready";
let clicks = 0;
document.getElementById("go").addEventListener("click", () => {
  clicks += 1;
  setTimeout(() => {
    document.getElementById("greeting").textContent = "Clicked " + clicks;
    document.title = "(" + clicks + ") Fixture";
  }, 200);
});
document.addEventListener("keydown", (e) => {
  const keys = document.getElementById("keys");
  keys.textContent = keys.textContent ? keys.textContent + " " + e.key : e.key;
});
"#;

/// Serves the page on 127.0.0.1 (for as long as the test's runtime runs); its URL.
async fn serve_page() -> String {
    let app = Router::new()
        .route("/", get(|| async { Html(INDEX) }))
        .route(
            "/app.js",
            get(|| async { ([(CONTENT_TYPE, "text/javascript")], APP_JS) }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

fn argv0(pid: u32) -> String {
    procs::cmdline(pid)
        .and_then(|c| c.into_iter().next())
        .unwrap_or_default()
}

/// Asserts that none of `pids`, nothing in group `pgid` and nothing naming `dir` runs,
/// and that `dir` is gone.
fn assert_all_gone(pids: &[u32], pgid: u32, dir: &Path) {
    let left: Vec<_> = pids.iter().copied().filter(|&p| procs::alive(p)).collect();
    assert!(left.is_empty(), "still running: {left:?} of {pids:?}");
    assert_eq!(procs::group_members(pgid), Vec::<u32>::new());
    assert_eq!(procs::mentioning(&dir.to_string_lossy()), Vec::<u32>::new());
    assert!(!dir.exists(), "{} is left", dir.display());
}

#[tokio::test]
async fn a_page_is_opened_clicked_typed_into_read_and_screenshotted() {
    let url = serve_page().await;
    let shot = artifacts_dir().join("browser_fixture_page/page.png");
    let _ = std::fs::remove_file(&shot);
    let b = Browser::start("browser_fixture_page").await.unwrap();

    b.goto(&url).await;
    assert_eq!(
        b.wait_js("document.title", |t| t == "Fixture ready").await,
        "Fixture ready"
    );
    assert_eq!(b.title().await, "Fixture ready");
    assert_eq!(b.text("#greeting").await, "Before");

    b.click("#go").await;
    assert_eq!(
        b.wait_text("#greeting", |t| t != "Before").await,
        "Clicked 1"
    );
    assert_eq!(b.title().await, "(1) Fixture");

    b.key(&format!("ja{}", Key::Down)).await;
    assert_eq!(
        b.wait_text("#keys", |t| t.ends_with("ArrowDown")).await,
        "j a ArrowDown"
    );

    // `text` is what a user sees; `js` reads the DOM.
    assert_eq!(b.text("#hidden").await, "");
    assert_eq!(
        b.js("document.getElementById('hidden').textContent").await,
        "secret"
    );
    assert_eq!(b.js("[1 + 2, 'x']").await, json!([3, "x"]));
    assert_eq!(b.wait_for("#go").await.text().await.unwrap(), "Go");

    // The dashboard's alerts: allowed without a prompt, and a page can fire one.
    assert_eq!(b.js("Notification.permission").await, "granted");
    assert_eq!(
        b.js("(() => { new Notification('Relay'); return true; })()")
            .await,
        true
    );

    let saved = b.screenshot("page").await;
    assert_eq!(saved, shot);
    let png = tokio::fs::read(&saved).await.unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    // The IHDR chunk: the width, then the height, of the window (--window-size).
    let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
    assert_eq!(width, 1280);
}

#[tokio::test]
async fn dropping_the_browser_kills_chromedriver_and_every_chromium_process() {
    let url = serve_page().await;
    let b = Browser::start("browser_fixture_drop").await.unwrap();
    b.goto(&url).await;
    b.wait_text("#greeting", |t| t == "Before").await;

    let pgid = b.driver_pid();
    let dir = b.dir().to_path_buf();
    let profile = format!("--user-data-dir={}", dir.join("profile").display());
    // chromedriver leads its own group, Chromium (browser, renderers...) runs in it.
    assert_eq!(procs::stat(pgid).map(|s| s.pgrp), Some(pgid));
    assert_eq!(argv0(pgid), "/usr/bin/chromedriver");
    let in_group = procs::group_members(pgid);
    let chromium: Vec<_> = in_group
        .iter()
        .copied()
        // Chromium's children rewrite their command line into one string: a substring.
        .filter(|&p| procs::cmdline(p).is_some_and(|c| c.iter().any(|a| a.contains(&profile))))
        .collect();
    assert!(
        chromium.len() >= 2,
        "Chromium and its children in the group: {in_group:?}"
    );
    // Debian's crash handler leaves the group; it names the browser's directory.
    let all = wait_until(
        "the crash handler, outside chromedriver's group",
        Duration::from_secs(30),
        || async {
            let all = b.processes();
            let outside = all
                .iter()
                .any(|&p| !in_group.contains(&p) && argv0(p).ends_with("chrome_crashpad_handler"));
            if outside {
                Ok(all)
            } else {
                Err(format!("{all:?}"))
            }
        },
    )
    .await;

    drop(b);
    assert_all_gone(&all, pgid, &dir);
}

#[test]
fn a_test_that_panics_mid_way_leaves_no_browser_process() {
    let (tx, rx) = std::sync::mpsc::channel();
    // A test of its own, on a thread: its panic unwinds through its runtime, dropping the
    // browser as it goes, as a failing `#[tokio::test]` does.
    let failing = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let mut b = Browser::start("browser_fixture_panic").await.unwrap();
            b.goto("data:text/html,<h1 id=greeting>Before</h1>").await;
            b.wait_text("#greeting", |t| t == "Before").await;
            tx.send((b.processes(), b.driver_pid(), b.dir().to_path_buf()))
                .unwrap();
            b.set_wait(Duration::from_millis(300));
            b.wait_text("#greeting", |t| t == "After").await;
        })
    });
    let panic = failing.join().expect_err("the wait fails");
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert_eq!(
        message,
        "timed out after 300ms waiting for the text of #greeting to be as expected; \
         last seen: \"Before\""
    );
    let (pids, pgid, dir) = rx.recv().unwrap();
    assert!(pids.contains(&pgid) && pids.len() > 2, "{pids:?}");
    assert_all_gone(&pids, pgid, &dir);
}
