//! The `relay` command line on bad input: arguments it refuses itself (a usage error,
//! exit 2, before any broker is asked), input the broker refuses (exit 2 when invalid,
//! 3 when it names nothing known, with the error's code), and an `api.json` that does
//! not lead to a broker (exit 5). Nothing refused is written.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use relay_client::{Client, ClientError, DataDir};
use relay_tests::{relay_cmd, RelayProcess};

/// A command line of words without spaces in them.
fn words(line: &str) -> Vec<String> {
    line.split(' ').map(str::to_string).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_arguments_are_refused_with_their_reason_and_write_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let relay = RelayProcess::start(&tmp.path().join("data")).unwrap();
    let last_seq = || async {
        relay.http().get("/v1/status").await.1["last_seq"]
            .as_u64()
            .unwrap()
    };
    let seq0 = last_seq().await;
    // `agent add NAME --harness codex_app_server --cwd /tmp EXTRA...`
    let add_as = |name: &str, extra: &[&str]| {
        let mut args = vec!["agent".to_string(), "add".into(), name.into()];
        args.extend(words("--harness codex_app_server --cwd /tmp"));
        args.extend(extra.iter().map(|a| a.to_string()));
        args
    };
    let add = |extra: &[&str]| add_as("a1", extra);
    // (what, arguments, exit code, what stderr says)
    let cases: Vec<(&str, Vec<String>, i32, &str)> = vec![
        (
            "--env without =",
            add(&["--env", "FOO"]),
            2,
            r#"expected K=V, got "FOO""#,
        ),
        (
            "--env without a name",
            add(&["--env", "=value"]),
            2,
            r#"expected K=V, got "=value""#,
        ),
        (
            "an empty --env",
            add(&["--env", ""]),
            2,
            r#"expected K=V, got """#,
        ),
        (
            "an unknown harness",
            words("agent add a1 --harness vim --cwd /tmp"),
            2,
            "invalid value 'vim' for '--harness",
        ),
        (
            "an unknown wake policy",
            add(&["--wake", "sometimes"]),
            2,
            "invalid value 'sometimes' for '--wake",
        ),
        (
            "--secret of a variable that is not set",
            add(&["--secret", "RELAY_TEST_NOT_SET_ANYWHERE"]),
            2,
            "--secret RELAY_TEST_NOT_SET_ANYWHERE: RELAY_TEST_NOT_SET_ANYWHERE is not set",
        ),
        (
            "an empty agent name",
            add_as("", &[]),
            2,
            "(invalid_request)",
        ),
        (
            "an agent name over 64 bytes",
            add_as(&"a".repeat(65), &[]),
            2,
            "(invalid_request)",
        ),
        (
            "an empty message",
            vec!["send".into(), String::new()],
            2,
            "(invalid_request)",
        ),
        (
            "a message to an unknown conversation",
            words("send --to nope hi"),
            3,
            "(unknown_conversation)",
        ),
    ];
    for (what, args, code, says) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = relay.cli(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{what}: {stderr}");
        assert!(stderr.contains(says), "{what}: {stderr}");
        assert!(out.stdout.is_empty(), "{what}");
    }
    assert_eq!(last_seq().await, seq0, "nothing was written");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_api_json_that_leads_nowhere_is_a_typed_error_and_the_broker_replaces_it() {
    let tmp = tempfile::tempdir().unwrap();
    // (what, api.json: its text, or None for no file, or a directory in its place)
    let cases: Vec<(&str, Option<&str>)> = vec![
        ("no api.json", None),
        ("an empty api.json", Some("")),
        (
            "api.json cut short",
            Some(r#"{"url": "http://127.0.0.1:1", "tok"#),
        ),
        (
            "api.json without a token",
            Some(r#"{"url": "http://127.0.0.1:1"}"#),
        ),
        ("api.json of another shape", Some("[1, 2, 3]")),
        ("a directory named api.json", Some("/")),
    ];
    for (i, (what, text)) in cases.into_iter().enumerate() {
        let dir = tmp.path().join(format!("data-{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        match text {
            None => {}
            Some("/") => std::fs::create_dir(dir.join("api.json")).unwrap(),
            Some(text) => std::fs::write(dir.join("api.json"), text).unwrap(),
        }
        let found = Client::discover(DataDir::Given(dir.clone()), None, None);
        assert!(
            matches!(found, Err(ClientError::NotFound(_))),
            "{what}: {:?}",
            found.err()
        );
        let out = relay_cmd(&dir, &["status"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(5), "{what}: {stderr}");
        assert!(stderr.contains("no broker found"), "{what}: {stderr}");
    }
    // Half of RELAY_URL + RELAY_TOKEN is no broker either.
    for (url, token) in [(Some("http://127.0.0.1:1"), None), (None, Some("t"))] {
        let found = Client::discover(
            DataDir::Default,
            url.map(str::to_string),
            token.map(str::to_string),
        );
        assert!(
            matches!(found, Err(ClientError::NotFound(_))),
            "{url:?} {token:?}: {:?}",
            found.err()
        );
    }

    // A broker started on a data dir with a corrupt api.json (the one cut short) writes
    // a good one, with a new token, and clients find it.
    let dir = tmp.path().join("data-2");
    let relay = RelayProcess::start(&dir).unwrap();
    assert!(relay.api.token.len() >= 32);
    let status = relay.cli_json(&["status", "--json"]);
    assert!(status["last_seq"].is_u64(), "{status}");
    let found = Client::discover(DataDir::Given(dir), None, None).unwrap();
    assert_eq!(found.url(), relay.api.url);
}
