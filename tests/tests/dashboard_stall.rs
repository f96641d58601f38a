//! The cause of a stall, in plain words, on the dashboard's flight page, in a real
//! headless Chromium against the REAL pinned codex whose model provider is a closed
//! port on 127.0.0.1 (retrying, so it streams "Reconnecting..." notes): while the turn
//! runs the page says the agent lost its connection to the model and is waiting for it;
//! once the broker's stall timeout fails the flight, it says the agent could not reach
//! its model and the turn was interrupted. The raw note stays in the page's history.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use relay_tests::agents::{state, Env};
use relay_tests::browser::Browser;

#[tokio::test(flavor = "multi_thread")]
async fn a_model_that_cannot_be_reached_is_said_in_plain_words_on_the_flight_page() {
    let env = Env::start_with(&["--turn-stall-timeout", "8"]).await;
    let add = env.add_unreachable_codex("lost-1");
    assert!(add.status.success(), "{add:?}");
    let b = Browser::logged_in(&env.relay, "dashboard_stall", "tester").await;
    let id = env.ask_no_wait("lost-1", "hello");
    b.goto(&format!("{}/#/flight/{id}", env.relay.api.url))
        .await;

    // While it runs: in plain words (codex 0.169 says "Reconnecting... waiting for
    // network" for a closed port, or "Reconnecting... N/5" between its retries).
    b.wait_text("#flight-cause", |t| {
        t.contains("The agent lost its connection to the model and is waiting for the network")
            || t.contains("The agent lost its connection to the model and is retrying")
    })
    .await;
    b.screenshot("retrying").await;

    // Once the stall timeout failed it: why, in plain words.
    env.wait_flight(&id, 90, |f| state(f) == "failed").await;
    let cause = b
        .wait_text("#flight-cause", |t| t.contains("could not reach its model"))
        .await;
    assert!(
        cause.contains("8 seconds") && cause.contains("interrupted"),
        "{cause}"
    );
    let history = b
        .js("document.querySelector('#flight-history').textContent")
        .await;
    assert!(
        history.as_str().unwrap().contains("Reconnecting..."),
        "{history}"
    );
    b.screenshot("failed").await;
}
