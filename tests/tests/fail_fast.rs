//! A broken agent says why, fast, through the real `relay` binary and the REAL pinned
//! codex: a codex whose model provider is a closed port on 127.0.0.1 (with retries on,
//! so it streams "Reconnecting..." notes) fails its flight with that note as the cause
//! after the stall timeout (5 s here, not the 600 s idle watchdog), and `agent show` and
//! `flight show` show the note; `agent add` refuses a missing cwd (CLI and HTTP) and a
//! program that does not run, warns of missing credentials, and holds under many
//! registrations at once; `agent show` says why an agent is `failed`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use relay_tests::agents::Env;
use serde_json::{json, Value};

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_model_fails_the_flight_with_its_note_within_the_stall_timeout() {
    let env = Env::start_with(&["--turn-stall-timeout", "5"]).await;
    let add = env.add_unreachable_codex("lost-1");
    assert!(add.status.success(), "{}", text(&add.stderr));
    // Its provider is another than OpenAI's: no credentials warning.
    assert!(
        !text(&add.stderr).contains("warning"),
        "{}",
        text(&add.stderr)
    );

    // stdout and stderr are pipes (not a terminal).
    let ask = env.relay.cli(&["ask", "lost-1", "hello"]);
    assert!(!ask.status.success(), "{}", text(&ask.stdout));

    let agent = env.agent("lost-1").await;
    let note = agent["note"]["text"].as_str().unwrap().to_string();
    let id = agent["note"]["flight"].as_str().unwrap().to_string();
    // What codex 0.169.0 sends for a provider on a closed port (`error` with
    // `willRetry: true`), with its details.
    assert!(
        note.starts_with("Reconnecting... "),
        "the agent's note: {note}"
    );
    let flight = env.flight(&id).await;
    assert_eq!(flight["state"], "failed", "{flight}");
    assert_eq!(
        flight["error"].as_str().unwrap(),
        format!("codex could not reach its model for 5 s: {note}; the turn was interrupted")
    );
    assert_eq!(flight["note"]["text"], note.as_str(), "{flight}");
    // The note reached the flight as an update before it failed.
    let updates = env.updates(&id).await;
    let kinds: Vec<(&str, &str)> = updates
        .iter()
        .map(|u| {
            (
                u["kind"].as_str().unwrap(),
                u["text"].as_str().or(u["to"].as_str()).unwrap_or(""),
            )
        })
        .collect();
    let first_note = kinds.iter().position(|k| k.0 == "note").unwrap();
    let failed = kinds
        .iter()
        .position(|k| *k == ("state", "failed"))
        .unwrap();
    assert!(first_note < failed, "{kinds:?}");
    // `relay ask` said why on stderr: the note as a line while it waited (no terminal:
    // no status line), then the failure with its cause; and its exit code says failed.
    let said = text(&ask.stderr);
    assert!(said.contains(&format!("relay: lost-1: {note}")), "{said}");
    assert!(said.contains(flight["error"].as_str().unwrap()), "{said}");
    let noted = said.find(&format!("relay: lost-1: {note}")).unwrap();
    let failed_at = said.find("relay: flight ").unwrap();
    assert!(noted < failed_at, "the note came before the end: {said}");
    assert_eq!(ask.status.code(), Some(1), "{said}");

    // `agent show` and `flight show`, as text and JSON.
    let shown = env.relay.cli_ok(&["agent", "show", "lost-1"]);
    assert!(
        shown.lines().any(|l| l.starts_with("note      ")
            && l.contains(&note)
            && l.contains(&format!("flight {id}"))),
        "{shown}"
    );
    let shown = env.relay.cli_json(&["agent", "show", "lost-1", "--json"]);
    assert_eq!(shown["note"]["text"], note.as_str());
    let shown = env.relay.cli_ok(&["flight", &id]);
    assert!(
        shown
            .lines()
            .any(|l| l.starts_with("note       ") && l.contains(&note)),
        "{shown}"
    );
    let shown = env.relay.cli_json(&["flight", &id, "--json"]);
    assert_eq!(shown["note"]["text"], note.as_str());
}

/// The message of a refused registration: CLI exit non-zero, with `what` on stderr.
fn refused(env: &Env, args: &[&str], what: &str) {
    let out = env.relay.cli(args);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{args:?} was accepted: {err}");
    assert!(err.contains(what), "{args:?}: {err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_add_refuses_what_cannot_run_and_warns_of_missing_credentials() {
    let env = Env::start().await;
    let work = env.work.display().to_string();
    let add = |name: &str| -> Vec<String> {
        ["agent", "add", name, "--harness", "codex_app_server"]
            .map(str::to_string)
            .to_vec()
    };
    let args = |v: &[String]| v.to_vec();

    // A missing cwd, by CLI and by HTTP: refused, naming the path.
    let mut a = add("nodir-1");
    a.extend(["--cwd".into(), "/nonexistent/dir".into()]);
    let a = args(&a);
    refused(
        &env,
        &a.iter().map(String::as_str).collect::<Vec<_>>(),
        "the agent's working directory /nonexistent/dir does not exist",
    );
    let (code, body) = env
        .relay
        .http()
        .post(
            "/v1/agents",
            &json!({"name": "nodir-2", "harness": "codex_app_server", "cwd": "/nonexistent/dir"}),
        )
        .await;
    assert_eq!(code, 400, "{body}");
    assert_eq!(body["error"]["code"], "invalid_request");
    assert_eq!(
        body["error"]["message"],
        "agent \"nodir-2\" cannot be added: the agent's working directory /nonexistent/dir does not exist"
    );
    // A file is not a directory.
    let file = env.tmp.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let file = file.display().to_string();
    refused(
        &env,
        &[
            "agent",
            "add",
            "file-1",
            "--harness",
            "pi_rpc",
            "--cwd",
            &file,
        ],
        &format!("the agent's working directory {file} is not a directory"),
    );

    // A program that is not there, and one that fails its --version.
    refused(
        &env,
        &[
            "agent",
            "add",
            "noprog-1",
            "--harness",
            "codex_app_server",
            "--cwd",
            &work,
            "--command",
            "/nonexistent/codex",
        ],
        "cannot start /nonexistent/codex",
    );
    let broken = env.tmp.path().join("broken-cli");
    std::fs::write(
        &broken,
        "#!/bin/sh\necho 'libfoo.so: cannot open shared object' >&2\nexit 127\n",
    )
    .unwrap();
    std::fs::set_permissions(&broken, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let broken = broken.display().to_string();
    refused(
        &env,
        &[
            "agent", "add", "broken-1", "--harness", "claude_stream_json", "--cwd", &work,
            "--command", &broken,
        ],
        &format!("{broken} does not run: `{broken} --version` exited with code 127: libfoo.so: cannot open shared object"),
    );
    // None of them was registered.
    let agents = env.relay.cli_json(&["agent", "list", "--json"]);
    assert_eq!(agents, json!([]));

    // Credentials not found: accepted, with a warning on stderr, per harness.
    let empty = env.tmp.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let empty = empty.display().to_string();
    for (name, harness, var, says) in [
        (
            "nokey-codex",
            "codex_app_server",
            "CODEX_HOME",
            "no codex credentials found",
        ),
        (
            "nokey-claude",
            "claude_stream_json",
            "CLAUDE_CONFIG_DIR",
            "no Claude Code credentials found",
        ),
        (
            "nokey-pi",
            "pi_rpc",
            "PI_CODING_AGENT_DIR",
            "no pi credentials found",
        ),
    ] {
        let out = env.relay.cli(&[
            "agent",
            "add",
            name,
            "--harness",
            harness,
            "--cwd",
            &work,
            "--env",
            &format!("{var}={empty}"),
            "--env",
            &format!("HOME={empty}"),
        ]);
        let err = text(&out.stderr);
        assert!(out.status.success(), "{name}: {err}");
        assert!(
            err.starts_with(&format!("relay: warning: {says}")),
            "{name}: {err}"
        );
    }
    // With a key among its secrets, none.
    let out = env.relay.cli(&[
        "agent",
        "add",
        "keyed-claude",
        "--harness",
        "claude_stream_json",
        "--cwd",
        &work,
        "--env",
        &format!("CLAUDE_CONFIG_DIR={empty}"),
        "--env",
        &format!("HOME={empty}"),
        "--env",
        "ANTHROPIC_API_KEY=sk-test",
    ]);
    assert!(out.status.success());
    assert!(
        !text(&out.stderr).contains("warning"),
        "{}",
        text(&out.stderr)
    );
    // Over HTTP the warnings come in the answer.
    let (code, body) = env
        .relay
        .http()
        .post(
            "/v1/agents",
            &json!({"name": "nokey-http", "harness": "codex_app_server", "cwd": work,
                    "env": {"CODEX_HOME": empty, "HOME": empty}}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["name"], "nokey-http");
    let warnings = body["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1, "{body}");
    assert!(warnings[0]
        .as_str()
        .unwrap()
        .starts_with("no codex credentials found"));

    // An agent of another node is not checked on this host: accepted, saying so.
    let out = env.relay.cli(&[
        "agent",
        "add",
        "far-1",
        "--harness",
        "codex_app_server",
        "--cwd",
        "/nonexistent/far",
        "--node",
        "n1",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("relay: warning: agent far-1 runs on node n1: its directory, program and credentials are on that host and were not checked here"),
        "{}",
        text(&out.stderr)
    );
}

/// The directory goes away after the agent was added: the session cannot start, the
/// flight fails naming the directory (not "cannot start .../codex: No such file or
/// directory" about a program that is there), and `agent show` says why it is failed.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_that_cannot_start_says_why_in_the_flight_and_agent_show() {
    let env = Env::start().await;
    let gone = env.tmp.path().join("goes-away");
    std::fs::create_dir_all(&gone).unwrap();
    let gone_str = gone.display().to_string();
    env.relay.cli_ok(&[
        "agent",
        "add",
        "homeless-1",
        "--harness",
        "codex_app_server",
        "--cwd",
        &gone_str,
        "--env",
        &format!("CODEX_HOME={}", env.codex_home.display()),
    ]);
    std::fs::remove_dir(&gone).unwrap();
    let out = env.relay.cli(&["ask", "homeless-1", "hello"]);
    assert!(!out.status.success());
    let why = format!(
        "cannot start codex app-server: the agent's working directory {gone_str} does not exist"
    );
    let agent: Value = env
        .relay
        .cli_json(&["agent", "show", "homeless-1", "--json"]);
    assert_eq!(
        (agent["state"].as_str(), agent["state_reason"].as_str()),
        (Some("failed"), Some(why.as_str())),
        "{agent}"
    );
    let shown = env.relay.cli_ok(&["agent", "show", "homeless-1"]);
    assert!(
        shown.lines().any(|l| l == format!("why       {why}")),
        "{shown}"
    );
    assert!(text(&out.stderr).contains(&why), "{}", text(&out.stderr));
}

/// Many registrations at once, each running its checks (the real codex's --version):
/// every one is answered (accepted, or refused for its missing cwd), none hangs, and the
/// accepted ones are all there.
#[tokio::test(flavor = "multi_thread")]
async fn many_registrations_at_once_are_all_answered() {
    let env = Env::start().await;
    let work = env.work.display().to_string();
    let home = env.codex_home.display().to_string();
    let http = env.relay.http();
    let mut tasks = Vec::new();
    for i in 0..40 {
        let http = http.clone();
        let cwd = if i % 4 == 3 {
            format!("/nonexistent/many-{i}")
        } else {
            work.clone()
        };
        let body = json!({"name": format!("many-{i}"), "harness": "codex_app_server",
                          "cwd": cwd, "env": {"CODEX_HOME": home}});
        tasks.push(tokio::spawn(async move {
            (i, http.post("/v1/agents", &body).await)
        }));
    }
    let mut accepted = Vec::new();
    for t in tasks {
        let (i, (code, body)) = tokio::time::timeout(std::time::Duration::from_secs(120), t)
            .await
            .expect("a registration hung")
            .unwrap();
        if i % 4 == 3 {
            assert_eq!(code, 400, "{i}: {body}");
            assert!(
                body["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains(&format!("/nonexistent/many-{i} does not exist")),
                "{body}"
            );
        } else {
            assert_eq!(code, 200, "{i}: {body}");
            assert_eq!(body.get("warnings"), None, "{body}");
            accepted.push(format!("many-{i}"));
        }
    }
    let mut listed: Vec<String> = env
        .relay
        .cli_json(&["agent", "list", "--json"])
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap().to_string())
        .collect();
    listed.sort();
    accepted.sort();
    assert_eq!(listed, accepted);
}
