//! The dashboard in a real headless Chromium (Debian's, driven over WebDriver), served by
//! a real `relay up`, with the real pinned Codex CLI against the mock model:
//!
//! - the page takes a one-time login link, and nothing without it: no page, no data for
//!   a missing, spent or forged login, a wrong token gets nothing either;
//! - a flight asked with `relay ask` appears on the agents view, streams into the page,
//!   and the page's text is the flight's output;
//! - a pending approval raises the badge and the title, runs the notify command once,
//!   is accepted with a click and the turn goes on, recorded as decided by the login;
//!   a hostile command is shown as text (no script, no element, escapes visible) and is
//!   declined from the keyboard; an approval nobody answers is declined at its agent's
//!   timeout, recorded as decided by the timeout policy;
//! - 200 agents list, and many clients logging in at once each get a login of their
//!   own while a login link works exactly once.
//!
//! Screenshots of the agents view and of a live flight are saved under
//! `target/test-artifacts/` (see `relay_tests::browser::artifacts_dir`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use relay_tests::agents::{state, Env};
use relay_tests::browser::{ask_login_link, login_client, login_link, spend_login_link, Browser};
use relay_tests::{wait_until, RelayProcess};
use serde_json::{json, Value};

/// The page's URL now.
async fn location(b: &Browser) -> String {
    b.js("location.href").await.as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_page_takes_a_login_link_and_nothing_else_gets_data() {
    let tmp = tempfile::tempdir().unwrap();
    let relay = RelayProcess::start(&tmp.path().join("data")).unwrap();
    let cwd = tmp.path().display().to_string();
    relay.cli_ok(&[
        "agent",
        "add",
        "quiet-1",
        "--harness",
        "codex_app_server",
        "--cwd",
        &cwd,
        "--wake",
        "manual",
    ]);
    let origin = relay.api.url.clone();
    let b = Browser::start("dashboard-login").await.unwrap();

    // No link: the notice, no page, no data.
    b.goto(&format!("{origin}/")).await;
    let body = b.text("body").await;
    assert!(
        body.contains("not logged in") && body.contains("relay open"),
        "{body}"
    );
    assert!(!body.contains("quiet-1"), "{body}");
    assert_eq!(b.fetch_status("/v1/agents").await, 401);
    assert_eq!(b.fetch_status("/app.js").await, 401);
    // A forged login cookie gets nothing either.
    let port = origin.rsplit(':').next().unwrap();
    b.js(&format!(
        "(() => {{ document.cookie = 'relay_login_{port}=forged; path=/'; return 1; }})()"
    ))
    .await;
    assert_eq!(b.fetch_status("/v1/agents").await, 401);
    assert_eq!(b.fetch_status("/v1/watch?fleet=true").await, 401);

    // The link logs in: the page keeps `/`, never the code; it lists the agent live.
    let link = login_link(&relay, "tester");
    b.goto(&link).await;
    b.wait_js("document.body.dataset.live", |v| v == "true")
        .await;
    assert_eq!(location(&b).await, format!("{origin}/"));
    b.wait_for("tr[data-agent=\"quiet-1\"]").await;
    assert_eq!(b.fetch_status("/v1/agents").await, 200);
    let who = b.js("fetch('/v1/login').then(r => r.json())").await;
    assert_eq!(who["decided_by"], "tester@dashboard", "{who}");
    // The login cookie is not readable by script.
    let cookies = b.js("document.cookie").await;
    assert!(
        !cookies
            .as_str()
            .unwrap()
            .contains(&format!("relay_login_{port}=")),
        "{cookies}"
    );

    // A link works once: another browser gets the notice, and no login.
    let other = Browser::start("dashboard-login-spent").await.unwrap();
    other.goto(&link).await;
    let body = other.text("body").await;
    assert!(body.contains("does not work"), "{body}");
    assert_eq!(other.fetch_status("/v1/agents").await, 401);
    drop(other);

    // A dashboard login cannot mint links, nor write without the dashboard's header.
    let minted = b
        .js("fetch('/v1/login', {method: 'POST', headers: {'X-Relay-Dashboard': '1', 'Content-Type': 'application/json'}, body: '{}'}).then(r => r.status)")
        .await;
    assert_eq!(minted, 401);
    let bare = b
        .js("fetch('/v1/logout', {method: 'POST'}).then(r => r.status)")
        .await;
    assert_eq!(bare, 401);

    // A wrong or missing token gets nothing over HTTP.
    let http = relay.http();
    let (code, body) = http
        .clone()
        .with_token(Some("wrong"))
        .get("/v1/agents")
        .await;
    assert_eq!(code, 401, "{body}");
    let (code, body) = http.with_token(None).get("/v1/agents").await;
    assert_eq!(code, 401, "{body}");

    // Logging out ends the login: the page says so.
    let out = b
        .js("fetch('/v1/logout', {method: 'POST', headers: {'X-Relay-Dashboard': '1'}}).then(r => r.status)")
        .await;
    assert_eq!(out, 200);
    assert_eq!(b.fetch_status("/v1/agents").await, 401);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flight_asked_with_relay_ask_streams_into_the_page() {
    let env = Env::start().await;
    env.add_agent("cx-1", &[]);
    let b = Browser::logged_in(&env.relay, "dashboard-flight", "tester").await;
    b.wait_for("tr[data-agent=\"cx-1\"]").await;

    let words: Vec<String> = (1..=16).map(|i| format!("word{i}")).collect();
    let id = env.ask_no_wait("cx-1", &format!("slow: {}", words.join(" ")));
    // It appears on the agents view without a reload, as the agent's current flight.
    b.wait_text("tr[data-agent=\"cx-1\"] .flight", |t| t.contains(&id))
        .await;
    b.screenshot("agents").await;

    // An ACP agent shows the program it named itself as, beside its harness, once woken.
    env.add_acp("fk", env!("CARGO_BIN_EXE_relay-fake-acp"));
    env.relay.cli_ok(&["agent", "wake", "fk"]);
    b.wait_text("tr[data-agent=\"fk\"] .harness", |t| {
        t == "acp relay-fake-acp 0.0.1"
    })
    .await;

    b.click("tr[data-agent=\"cx-1\"] .flight a").await;
    b.wait_for(&format!("#flight[data-flight=\"{id}\"]")).await;
    // Mid-stream: some text, not all of it.
    b.wait_text("#flight-text", |t| {
        t.contains("word2") && !t.contains("word16")
    })
    .await;
    b.screenshot("live-flight").await;

    b.wait_js("document.querySelector('#flight').dataset.state", |v| {
        v == "completed"
    })
    .await;
    let f = env.wait_flight(&id, 60, |f| state(f) == "completed").await;
    let output = f["output"].as_str().unwrap();
    assert!(output.contains("word16"), "{f}");
    assert_eq!(
        shown_text(&b).await,
        output,
        "the page's text is the output"
    );
    b.screenshot("flight-completed").await;

    // The same turn read back: its replay, its tree, its conversation.
    let url = &env.relay.api.url;
    b.goto(&format!("{url}/#/replay/flight/{id}")).await;
    b.wait_text("main", |t| {
        t.contains("slow: word1") && t.contains("word16")
    })
    .await;
    b.screenshot("replay").await;
    b.goto(&format!("{url}/#/tree/{id}")).await;
    b.wait_text("#tree", |t| t.contains(&id) && t.contains("cx-1"))
        .await;
    let conversation = f["conversation"].as_str().unwrap();
    b.goto(&format!("{url}/#/conversation/{conversation}"))
        .await;
    b.wait_text("#messages", |t| {
        t.contains("slow: word1") && t.contains(output.trim())
    })
    .await;
}

/// The streamed text the flight view shows (`#flight-text`).
async fn shown_text(b: &Browser) -> String {
    let shown = b
        .js("document.querySelector('#flight-text').textContent")
        .await;
    shown.as_str().unwrap().to_string()
}

/// Waits until `flight` completed; checks its output holds `text`.
async fn completed_with(env: &Env, flight: &str, text: &str) -> Value {
    let f = env
        .wait_flight(flight, 60, |f| state(f) == "completed")
        .await;
    assert!(f["output"].as_str().unwrap().contains(text), "{f}");
    f
}

/// How the approval of `flight` was decided: (decision, decided_by).
fn decided(env: &Env, flight: &str) -> (String, String) {
    let a = env.approval_of(flight);
    let field = |k: &str| a[k].as_str().unwrap_or_default().to_string();
    (field("decision"), field("decided_by"))
}

/// The lines the notify command wrote: `agent|id|command` each.
fn notified(file: &Path) -> Vec<String> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn approvals_are_decided_on_the_page_notified_once_and_declined_at_their_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("notified.txt");
    let notify = format!(
        "printf '%s|%s|%s\\n' \"$RELAY_APPROVAL_AGENT\" \"$RELAY_APPROVAL_ID\" \"$RELAY_APPROVAL_COMMAND\" >> '{}'",
        file.display()
    );
    let env = Env::start_with(&["--notify-command", &notify]).await;
    env.add_agent("cx-1", &[]);
    env.add_agent("cx-2", &["--approval-timeout", "2"]);
    let b = Browser::logged_in(&env.relay, "dashboard-approvals", "tester").await;
    b.goto(&format!("{}/#/approvals", env.relay.api.url)).await;
    b.wait_js("document.body.dataset.live", |v| v == "true")
        .await;
    assert_eq!(b.title().await, "Relay");
    // Count the browser notifications the page makes (the fixture grants them).
    let permission = b
        .js("(() => { const N = window.Notification; window.__notes = []; \
             window.Notification = class extends N { constructor(t, o) { super(t, o); window.__notes.push(t); } }; \
             return N.permission; })()")
        .await;
    assert_eq!(permission, "granted");

    // Pending: the badge, the title, a browser notification and the notify command
    // (once) tell.
    let id = env.ask_no_wait("cx-1", "exec: echo relay-approved");
    let a = env.wait_approval(&id).await;
    let approval = a["id"].as_str().unwrap().to_string();
    b.wait_text("#badge", |t| t.trim() == "1").await;
    assert_eq!(b.title().await, "(1) Relay");
    let item = format!("li[data-approval=\"{approval}\"]");
    b.wait_text(&format!("{item} .command"), |t| {
        t.contains("echo relay-approved")
    })
    .await;
    b.screenshot("approval-pending").await;
    let notes = b
        .wait_js("window.__notes", |v| {
            v.as_array().is_some_and(|n| !n.is_empty())
        })
        .await;
    assert!(notes[0].as_str().unwrap().contains("cx-1"), "{notes}");
    let lines = wait_until(
        "the notify command's line",
        Duration::from_secs(30),
        || async {
            let lines = notified(&file);
            (!lines.is_empty()).then_some(lines)
        },
    )
    .await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with(&format!("cx-1|{approval}|"))
            && lines[0].contains("echo relay-approved"),
        "{lines:?}"
    );

    // Accepted with a click: the turn goes on, the record says who.
    b.click(&format!("{item} button.accept")).await;
    completed_with(&env, &id, "relay-approved").await;
    assert_eq!(
        decided(&env, &id),
        ("accept".into(), "tester@dashboard".into())
    );
    b.wait_js("document.title", |v| v == "Relay").await;
    b.wait_text(&format!("{item} .decided-by"), |t| {
        t.contains("tester@dashboard")
    })
    .await;

    // A hostile command is text: no script runs, no element is made, escapes show.
    let hostile = "echo '<script>window.pwned=1</script><img src=x onerror=window.pwned=2>' \u{1b}[31mred\u{1b}]0;owned\u{7}";
    let id2 = env.ask_no_wait("cx-1", &format!("exec: {hostile}"));
    let a2 = env.wait_approval(&id2).await;
    let approval2 = a2["id"].as_str().unwrap().to_string();
    let item2 = format!("li[data-approval=\"{approval2}\"]");
    let shown = b
        .wait_text(&format!("{item2} .command"), |t| t.contains("<script>"))
        .await;
    assert!(
        shown.contains("<script>window.pwned=1</script><img src=x onerror=window.pwned=2>"),
        "{shown}"
    );
    assert!(shown.contains("\\x1b[31mred\\x1b]0;owned\\x07"), "{shown}");
    assert!(!shown.contains('\u{1b}'), "{shown:?}");
    let made = b
        .js("document.querySelectorAll('#approvals script, #approvals img').length + (window.pwned ? 100 : 0)")
        .await;
    assert_eq!(made, 0);
    b.wait_text("#badge", |t| t.trim() == "1").await;
    // Declined from the keyboard: j moves to it (the one pending), d declines.
    b.key("j").await;
    b.wait_js(
        &format!(
            "document.activeElement.dataset.approval === {}",
            json!(approval2)
        ),
        |v| v == true,
    )
    .await;
    b.key("d").await;
    completed_with(&env, &id2, "rejected by user").await;
    assert_eq!(
        decided(&env, &id2),
        ("decline".into(), "tester@dashboard".into())
    );
    let line2 = wait_until(
        "the hostile approval's line",
        Duration::from_secs(30),
        || async { notified(&file).into_iter().find(|l| l.contains(&approval2)) },
    )
    .await;
    assert!(
        !line2.contains('\u{1b}') && line2.contains("\\x1b[31m"),
        "the notify command gets the command escaped: {line2:?}"
    );

    // Nobody answers cx-2's: its timeout declines it, recorded as the policy's.
    let id3 = env.ask_no_wait("cx-2", "exec: echo nobody-answers");
    let a3 = env.wait_approval(&id3).await;
    let approval3 = a3["id"].as_str().unwrap().to_string();
    completed_with(&env, &id3, "rejected by user").await;
    assert_eq!(
        decided(&env, &id3),
        ("decline".into(), "policy:timeout:2s".into())
    );
    b.wait_text(
        &format!("li[data-approval=\"{approval3}\"] .decided-by"),
        |t| t.contains("policy:timeout:2s"),
    )
    .await;
    b.wait_js("document.title", |v| v == "Relay").await;

    // Each approval was notified exactly once.
    let lines = notified(&file);
    for a in [&approval, &approval2, &approval3] {
        let n = lines.iter().filter(|l| l.contains(a.as_str())).count();
        assert_eq!(n, 1, "{a}: {lines:?}");
    }
    assert_eq!(lines.len(), 3, "{lines:?}");
    let notes = b.js("window.__notes.length").await;
    assert_eq!(notes, 3, "one browser notification per approval");
}

#[tokio::test(flavor = "multi_thread")]
async fn two_hundred_agents_list_and_many_clients_log_in_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let relay = RelayProcess::start(&tmp.path().join("data")).unwrap();
    let cwd = tmp.path().display().to_string();
    // 200 agents registered by 20 clients at once.
    let http = relay.http();
    let mut adds = Vec::new();
    for c in 0..20 {
        let (http, cwd) = (http.clone(), cwd.clone());
        adds.push(tokio::spawn(async move {
            for i in 0..10 {
                let spec = json!({"name": format!("ag-{c:02}-{i}"), "harness": "codex_app_server",
                    "cwd": cwd, "wake": "manual"});
                let (code, body) = http.post("/v1/agents", &spec).await;
                assert_eq!(code, 200, "{body}");
            }
        }));
    }
    for a in adds {
        a.await.unwrap();
    }
    let b = Browser::logged_in(&relay, "dashboard-fleet", "tester").await;
    let rows = b
        .wait_js(
            "document.querySelectorAll('#agents tr[data-agent]').length",
            |v| v == 200,
        )
        .await;
    assert_eq!(rows, 200);
    b.screenshot("agents-200").await;
    // One more appears live, without a reload.
    let (code, body) = http
        .post(
            "/v1/agents",
            &json!({"name": "late-1", "harness": "codex_app_server", "cwd": cwd, "wake": "manual"}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    b.wait_for("tr[data-agent=\"late-1\"]").await;

    // 24 clients each get a link and log in at once: 24 logins of their own.
    let client = login_client();
    let mut logins = Vec::new();
    for n in 0..24 {
        let (client, relay_url, token) = (
            client.clone(),
            relay.api.url.clone(),
            relay.api.token.clone(),
        );
        logins.push(tokio::spawn(async move {
            let link = ask_login_link(&client, &relay_url, &token, &format!("user{n}")).await;
            let cookie = spend_login_link(&client, &link).await.unwrap();
            let who: Value = client
                .get(format!("{relay_url}/v1/login"))
                .header("cookie", &cookie)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert_eq!(who["decided_by"], format!("user{n}@dashboard"), "{who}");
            cookie
        }));
    }
    let mut cookies = Vec::new();
    for l in logins {
        cookies.push(l.await.unwrap());
    }
    cookies.sort();
    cookies.dedup();
    assert_eq!(cookies.len(), 24, "every client has a login of its own");

    // One link spent by 16 clients at once: exactly one gets in.
    let link = login_link(&relay, "race");
    let mut tries = Vec::new();
    for _ in 0..16 {
        let (client, link) = (client.clone(), link.clone());
        tries.push(tokio::spawn(async move {
            spend_login_link(&client, &link).await
        }));
    }
    let mut won = 0;
    for t in tries {
        won += usize::from(t.await.unwrap().is_some());
    }
    assert_eq!(won, 1, "a login link works exactly once");
}

/// A flight streaming faster than 1,000 deltas a second (16 clients posting them) into
/// an open flight view: the page's text is every delta in order, and the page keeps
/// drawing frames. The frame gaps and the rate are printed (a measurement, not a
/// check of time); `relay_tests` benches are where speed is compared.
#[tokio::test(flavor = "multi_thread")]
async fn a_flight_streaming_thousands_of_deltas_renders_whole() {
    let env = Env::start().await;
    // A pane that never answers: its turn runs until it is answered here.
    env.add_tmux("pane-1", "sh", &[]);
    let b = Browser::logged_in(&env.relay, "dashboard-stream", "tester").await;
    let id = env.ask_no_wait("pane-1", "stream here");
    env.wait_flight(&id, 60, |f| state(f) == "running").await;
    b.goto(&format!("{}/#/flight/{id}", env.relay.api.url))
        .await;
    b.wait_for(&format!("#flight[data-flight=\"{id}\"]")).await;
    // Every frame's gap from the one before, from now on.
    b.js(
        "(() => { window.__gaps = []; let last = performance.now(); \
          const f = t => { window.__gaps.push(t - last); last = t; requestAnimationFrame(f); }; \
          requestAnimationFrame(f); return 1; })()",
    )
    .await;

    let (clients, each) = (16, 400);
    let rate = env
        .stream_deltas(&id, clients, each, |c, n| format!("<{c}.{n}>"))
        .await;
    let streamed: String = env
        .updates(&id)
        .await
        .iter()
        .filter(|u| u["kind"] == "delta")
        .map(|u| u["text"].as_str().unwrap().to_string())
        .collect();
    for c in 0..clients {
        assert!(
            streamed.contains(&format!("<{c}.{}>", each - 1)),
            "every delta stored"
        );
    }
    // While it runs the page shows every delta, in order; once it ended, the final
    // output in their place (the reply is shown once).
    // (The reply is rendered Markdown: the deltas' markers, in order, are the test.)
    let markers = |t: &str| -> Vec<String> {
        t.split('<')
            .filter_map(|p| p.split_once('>').map(|(m, _)| m.to_string()))
            .filter(|m| m.split('.').all(|n| n.parse::<u32>().is_ok()))
            .collect()
    };
    let want = markers(&streamed);
    b.wait_js("document.querySelector('#flight-text').textContent", |v| {
        v.as_str().is_some_and(|t| markers(t) == want)
    })
    .await;
    env.relay.cli_ok(&["reply", &id, "done"]);
    b.wait_js("document.querySelector('#flight').dataset.state", |v| {
        v == "completed"
    })
    .await;
    assert_eq!(
        shown_text(&b).await,
        "done",
        "the output replaces the stream"
    );
    let gaps = b.js("window.__gaps").await;
    let mut gaps: Vec<f64> = gaps
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_f64)
        .collect();
    assert!(gaps.len() > 10, "the page kept drawing frames: {gaps:?}");
    gaps.sort_by(f64::total_cmp);
    let p99 = gaps[gaps.len() * 99 / 100];
    println!(
        "measured: {} deltas at {rate:.0}/s; {} frames, gap p99 {p99:.1} ms, max {:.1} ms",
        clients * each,
        gaps.len(),
        gaps.last().unwrap()
    );
    b.screenshot("streamed").await;
}
