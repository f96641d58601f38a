//! The dashboard's login across restarts, logouts and key rotations, in a real headless
//! Chromium against a real `relay up` (and the real pinned Codex CLI on the mock model):
//!
//! - a logged-in page survives a broker `kill -9` and a restart on the same data dir and
//!   port: it goes live again by itself (no new link), a flight asked after the restart
//!   streams into it, and its login still works for `/v1` calls;
//! - logging out ends that login for good: its cookie is refused, also after a restart;
//! - `relay open --revoke-all` ends every login (the page's and another client's), its
//!   open streams included, while the fresh link it prints works;
//! - many clients logging in at once with a revoke-all among them: each login that was
//!   made before the rotation ends, each made after works, each link spent across it is
//!   refused, and every answer stays the same after a restart.
//!
//! A screenshot of the page after the restart is saved under
//! `target/test-artifacts/dashboard_login/` (see `relay_tests::browser::artifacts_dir`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use relay_tests::agents::{state, Env};
use relay_tests::browser::{ask_login_link, login_client, login_link, spend_login_link, Browser};
use relay_tests::RelayProcess;
use serde_json::{json, Value};

/// The login cookie's name on `relay`'s port.
fn cookie_name(relay: &RelayProcess) -> String {
    format!(
        "relay_login_{}",
        relay
            .api
            .url
            .rsplit(':')
            .next()
            .unwrap()
            .trim_end_matches('/')
    )
}

/// The page's login cookie (`name=value`), read over WebDriver (script cannot: HttpOnly).
async fn page_cookie(b: &Browser, relay: &RelayProcess) -> String {
    let name = cookie_name(relay);
    let c = b.client().get_named_cookie(&name).await.unwrap();
    format!("{name}={}", c.value())
}

/// The status `GET /v1/login` answers a request with `cookie`, and who it says.
async fn whoami(client: &reqwest::Client, relay: &RelayProcess, cookie: &str) -> (u16, Value) {
    let resp = client
        .get(format!("{}/v1/login", relay.api.url))
        .header("Cookie", cookie)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_logged_in_page_survives_a_kill_9_and_restart_until_it_logs_out() {
    let mut env = Env::start().await;
    env.add_agent("cx-1", &[]);
    let b = Browser::logged_in(&env.relay, "dashboard_login", "tester").await;
    b.wait_for("tr[data-agent=\"cx-1\"]").await;
    let cookie = page_cookie(&b, &env.relay).await;
    let origin = env.relay.api.url.clone();

    // The broker dies: the page sees it, and waits.
    env.relay.kill9();
    b.wait_js("document.body.dataset.live", |v| v == "false")
        .await;
    env.relay.restart_same_port().unwrap();
    assert_eq!(env.relay.api.url, origin, "the same port");

    // Back: live again by itself, still logged in, no new link.
    b.wait_js("document.body.dataset.live", |v| v == "true")
        .await;
    assert_ne!(b.js("document.body.dataset.login").await, json!("ended"));
    assert_eq!(b.fetch_status("/v1/agents").await, 200);
    let who = b.js("fetch('/v1/login').then(r => r.json())").await;
    assert_eq!(who["decided_by"], "tester@dashboard", "{who}");

    // A flight asked after the restart streams into the page.
    let words: Vec<String> = (1..=12).map(|i| format!("word{i}")).collect();
    let id = env.ask_no_wait("cx-1", &format!("slow: {}", words.join(" ")));
    b.wait_text("tr[data-agent=\"cx-1\"] .flight", |t| t.contains(&id))
        .await;
    b.screenshot("after-restart").await;
    b.click("tr[data-agent=\"cx-1\"] .flight a").await;
    b.wait_for(&format!("#flight[data-flight=\"{id}\"]")).await;
    b.wait_js("document.querySelector('#flight').dataset.state", |v| {
        v == "completed"
    })
    .await;
    b.wait_text("main", |t| t.contains("word12")).await;
    let f = env.wait_flight(&id, 60, |f| state(f) == "completed").await;
    assert!(f["output"].as_str().unwrap().contains("word12"), "{f}");
    b.screenshot("flight-after-restart").await;

    // Logging out (the page's button) ends the login, for good.
    b.click("#logout").await;
    b.wait_js("document.body.dataset.login", |v| v == "ended")
        .await;
    let client = login_client();
    assert_eq!(whoami(&client, &env.relay, &cookie).await.0, 401);
    env.relay.restart_same_port().unwrap();
    let (status, body) = whoami(&client, &env.relay, &cookie).await;
    assert_eq!(status, 401, "a restart does not bring it back: {body}");
    // The page stays logged out; a fresh link logs in again.
    assert_eq!(b.fetch_status("/v1/agents").await, 401);
    let fresh = spend_login_link(&client, &login_link(&env.relay, "tester"))
        .await
        .unwrap();
    assert_eq!(whoami(&client, &env.relay, &fresh).await.0, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn revoke_all_ends_every_login_and_its_streams_and_a_fresh_link_works() {
    let tmp = tempfile::tempdir().unwrap();
    let mut relay = RelayProcess::start(&tmp.path().join("data")).unwrap();
    let b = Browser::logged_in(&relay, "dashboard_login_revoke", "tester").await;
    let client = login_client();
    let other = spend_login_link(&client, &login_link(&relay, "other"))
        .await
        .unwrap();
    assert_eq!(whoami(&client, &relay, &other).await.0, 200);
    let page = page_cookie(&b, &relay).await;
    let unused = login_link(&relay, "late");

    // The help says what it does.
    let help = relay.cli_ok(&["open", "--help"]);
    assert!(help.contains("--revoke-all"), "{help}");
    assert!(help.contains("End every dashboard login"), "{help}");
    // A dashboard login cannot end every login; nor can it over the page.
    let refused = b
        .js("fetch('/v1/login/revoke', {method: 'POST', headers: {'X-Relay-Dashboard': '1', 'Content-Type': 'application/json'}, body: '{}'}).then(r => r.status)")
        .await;
    assert_eq!(refused, 401);
    assert_eq!(whoami(&client, &relay, &other).await.0, 200);

    let out = relay.cli_json(&["open", "--revoke-all", "--as", "tester", "--json"]);
    assert_eq!(out["revoked"], true, "{out}");
    // Every login ends: the page's (its open stream ends too, and it says so) and the
    // other client's; the link made before is forgotten.
    b.wait_js("document.body.dataset.login", |v| v == "ended")
        .await;
    assert_eq!(b.text("#live").await, "logged out");
    assert_eq!(
        b.js("document.getElementById('login-ended').hidden").await,
        json!(false)
    );
    assert_eq!(whoami(&client, &relay, &page).await.0, 401);
    assert_eq!(whoami(&client, &relay, &other).await.0, 401);
    assert_eq!(spend_login_link(&client, &unused).await, None);
    // The fresh link works, in the same browser, and across a restart.
    b.goto(out["url"].as_str().unwrap()).await;
    b.wait_js("document.body.dataset.live", |v| v == "true")
        .await;
    let fresh = page_cookie(&b, &relay).await;
    assert_ne!(fresh, page);
    relay.restart_same_port().unwrap();
    assert_eq!(whoami(&client, &relay, &fresh).await.0, 200);
    assert_eq!(whoami(&client, &relay, &page).await.0, 401);
    assert_eq!(whoami(&client, &relay, &other).await.0, 401);
    b.wait_js("document.body.dataset.live", |v| v == "true")
        .await;
    // Text for a person too.
    let text = relay.cli(&["open", "--revoke-all", "--no-browser"]);
    assert!(text.status.success());
    let stderr = String::from_utf8_lossy(&text.stderr);
    assert!(stderr.contains("every dashboard login ended"), "{stderr}");
    assert!(String::from_utf8_lossy(&text.stdout).contains("/login?code="));
    assert_eq!(whoami(&client, &relay, &fresh).await.0, 401);
}

/// One client's login among many: the moments (of a shared counter) around it, and what
/// it got.
struct Attempt {
    asked_at: u64,
    link_at: u64,
    spend_at: u64,
    done_at: u64,
    cookie: Option<String>,
}

#[tokio::test(flavor = "multi_thread")]
async fn many_logins_at_once_with_a_revoke_all_among_them_stay_consistent() {
    let tmp = tempfile::tempdir().unwrap();
    let mut relay = RelayProcess::start(&tmp.path().join("data")).unwrap();
    let clock = Arc::new(AtomicU64::new(0));
    let tick = |c: &AtomicU64| c.fetch_add(1, Ordering::SeqCst);
    let url = relay.api.url.clone();
    let token = relay.api.token.clone();
    // How many logins are done: the revoke-all waits for some of the racing ones.
    let (done, mut done_rx) = tokio::sync::watch::channel(0usize);
    let done = Arc::new(done);

    let login = |i: usize| {
        let (clock, url, token, done) = (clock.clone(), url.clone(), token.clone(), done.clone());
        async move {
            let client = login_client();
            let asked_at = tick(&clock);
            let link = ask_login_link(&client, &url, &token, &format!("user{i}")).await;
            let link_at = tick(&clock);
            let spend_at = tick(&clock);
            let cookie = spend_login_link(&client, &link).await;
            let done_at = tick(&clock);
            done.send_modify(|n| *n += 1);
            Attempt {
                asked_at,
                link_at,
                spend_at,
                done_at,
                cookie,
            }
        }
    };
    let revoke = {
        let (clock, url, token) = (clock.clone(), url.clone(), token.clone());
        async move {
            // Once five of the twenty racing logins are in: some before it, most racing it.
            done_rx.wait_for(|n| *n >= 15).await.unwrap();
            let start = tick(&clock);
            let resp = login_client()
                .post(format!("{url}/v1/login/revoke"))
                .bearer_auth(&token)
                .json(&json!({}))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
            (start, tick(&clock))
        }
    };
    // Ten before, then twenty at once with the revoke-all among them, then five after.
    let before = futures::future::join_all((0..10).map(login)).await;
    let (during, (revoke_start, revoke_end)) =
        tokio::join!(futures::future::join_all((10..30).map(login)), revoke);
    let after = futures::future::join_all((30..35).map(login)).await;

    let client = login_client();
    let mut outcomes = Vec::new();
    for a in before.iter().chain(&during).chain(&after) {
        let status = match &a.cookie {
            Some(c) => Some(whoami(&client, &relay, c).await.0),
            None => None,
        };
        if a.done_at < revoke_start {
            assert!(a.cookie.is_some(), "a login before the rotation is made");
            assert_eq!(status, Some(401), "a login made before the rotation ends");
        }
        if a.asked_at > revoke_end {
            assert_eq!(status, Some(200), "a login made after the rotation works");
        }
        if a.link_at < revoke_start && a.spend_at > revoke_end {
            assert_eq!(
                a.cookie, None,
                "a link made before the rotation is forgotten"
            );
        }
        // Whatever raced the rotation: a login or a refusal, never a broken answer.
        assert!(matches!(status, None | Some(200) | Some(401)), "{status:?}");
        outcomes.push(status);
    }
    let count = |o: Option<u16>| outcomes[10..30].iter().filter(|s| **s == o).count();
    eprintln!(
        "racing the rotation: {} logins ended, {} kept, {} links refused",
        count(Some(401)),
        count(Some(200)),
        count(None)
    );
    assert!(before.iter().all(|a| a.cookie.is_some()));
    assert!(after.iter().all(|a| a.cookie.is_some()));
    // The same answers again, and after a restart: none changes.
    relay.restart_same_port().unwrap();
    for (a, was) in before.iter().chain(&during).chain(&after).zip(&outcomes) {
        let now = match &a.cookie {
            Some(c) => Some(whoami(&client, &relay, c).await.0),
            None => None,
        };
        assert_eq!(&now, was, "the same after a restart");
    }
}
