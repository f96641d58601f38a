//! tmux agents kept apart (issue 25, finding 5's tmux side and finding 7's temp dirs),
//! through `relay up` with a real tmux server per agent:
//!
//! - a pane of agent A, whose `$TMUX` reaches only its own server, can neither read agent
//!   B's session environment (its `RELAY_TOKEN`, its `--env` secrets) nor type into B's
//!   pane; and no server keeps an agent's token or secrets in its session or global
//!   environment, its own agent's included;
//! - each agent's pane is on a server of its own, which `agent show` names for attaching;
//! - the directory of a pane's output FIFO (`relay-tmux-*` in `TMPDIR`) is gone once the
//!   pane is followed, also after `kill -9` of `relay up` and the pane's adoption;
//! - a multi-line task to a program that did not turn bracketed paste on (a plain `read`
//!   loop) fails saying why, and nothing of it reaches the program.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use relay_tests::agents::{state, Env};
use relay_tests::wait::wait_until;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(30);

/// B: records its own `RELAY_TOKEN`, then is an interactive shell (whatever is typed
/// into its pane runs).
const VICTIM: &str = r#"#!/bin/sh
printf '%s' "$RELAY_TOKEN" > "$DIR/b-token"
PS1='b$ ' exec sh -i
"#;

/// A: through its pane's `$TMUX`, reads B's session environment, its own session's and
/// the server's global one, and types a command into B's session; then idles.
const PROBE: &str = r#"#!/bin/sh
tmux show-environment -t relay-b > "$DIR/a-saw-b" 2>&1
tmux show-environment > "$DIR/a-saw-own" 2>&1
tmux show-environment -g > "$DIR/a-saw-global" 2>&1
tmux send-keys -t relay-b "touch $DIR/canary" Enter > "$DIR/a-typed" 2>&1
echo done > "$DIR/a-done"
exec sleep 100000
"#;

/// A line reader that never turns bracketed paste on: each line it gets is appended to
/// `$DIR/lines`.
const LINES: &str = r#"#!/bin/sh
printf 'lines> '
while IFS= read -r line; do
  printf '%s\n' "$line" >> "$DIR/lines"
  printf 'lines> '
done
"#;

/// The server and pane `agent show NAME` says to attach to (`look tmux -L S attach -t
/// %N`).
fn look(env: &Env, name: &str) -> (String, String) {
    let shown = env.relay.cli_ok(&["agent", "show", name]);
    let line = shown
        .lines()
        .find_map(|l| l.strip_prefix("look"))
        .unwrap_or_else(|| panic!("no look line: {shown}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    match words[..] {
        ["tmux", "-L", socket, "attach", "-t", pane] => (socket.to_string(), pane.to_string()),
        _ => panic!("not an attach command: {line:?}"),
    }
}

/// Runs `tmux -L socket ARGS` from the test (its own environment), stdout and stderr.
fn tmux(socket: &str, args: &[&str]) -> String {
    let out = std::process::Command::new("tmux")
        .args(["-L", socket])
        .args(args)
        .output()
        .unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The `relay-tmux-*` directories in `dir`, with their modes.
fn fifo_dirs(dir: &Path) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("relay-tmux-"))
        .map(|e| {
            let mode = e.metadata().map(|m| m.permissions().mode()).unwrap_or(0);
            format!("{} {:o}", e.file_name().to_string_lossy(), mode & 0o777)
        })
        .collect()
}

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file)).unwrap_or_default()
}

async fn wait_file(dir: &Path, file: &str) {
    let path = dir.join(file);
    wait_until(format!("{file} written"), WAIT, || async {
        path.exists().then_some(())
    })
    .await;
}

async fn wait_online(env: &Env, name: &str) {
    wait_until(format!("{name} has a pane"), WAIT, || async {
        env.agent(name).await["endpoint"]["pane"]
            .as_str()
            .map(|_| ())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pane_cannot_read_another_agents_secrets_nor_type_into_its_pane() {
    let scratch = tempfile::tempdir().unwrap();
    let tmpdir = scratch.path().display().to_string();
    // The pane keeps the broker's address it started with: the same port after restart.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let mut env = Env::start_with_env(&["--listen", &listen], &[("TMPDIR", &tmpdir)]).await;
    let dir = env.tmp.path().join("probe");
    std::fs::create_dir_all(&dir).unwrap();
    for (file, text) in [("victim.sh", VICTIM), ("probe.sh", PROBE)] {
        std::fs::write(dir.join(file), text).unwrap();
    }
    let dir_env = format!("DIR={}", dir.display());
    let victim = format!("sh {}", dir.join("victim.sh").display());
    let probe = format!("sh {}", dir.join("probe.sh").display());
    env.add_tmux(
        "b",
        &victim,
        &["--env", &dir_env, "--env", "B_API_TOKEN=sekrit-of-b"],
    );
    env.add_tmux(
        "a",
        &probe,
        &["--env", &dir_env, "--env", "A_API_TOKEN=sekrit-of-a"],
    );

    env.relay.cli_ok(&["agent", "wake", "b"]);
    wait_file(&dir, "b-token").await;
    wait_online(&env, "b").await;
    let b_token = read(&dir, "b-token");
    assert!(b_token.len() > 16, "{b_token:?}");
    env.relay.cli_ok(&["agent", "wake", "a"]);
    wait_file(&dir, "a-done").await;
    wait_online(&env, "a").await;

    // Each agent's pane is on a server of its own.
    let (a_server, _) = look(&env, "a");
    let (b_server, b_pane) = look(&env, "b");
    assert_ne!(a_server, b_server);

    // A saw nothing of B: no session of that name on its server.
    let saw_b = read(&dir, "a-saw-b");
    assert!(
        (saw_b.contains("no such session") || saw_b.contains("can't find session"))
            && !saw_b.contains(&b_token),
        "{saw_b}"
    );
    assert!(!saw_b.contains("sekrit-of-b"), "{saw_b}");
    // Nor its own agent's token or secrets, kept by the server after the start.
    for file in ["a-saw-own", "a-saw-global"] {
        let saw = read(&dir, file);
        assert!(
            !saw.contains("RELAY_TOKEN=") && !saw.contains("sekrit-of-a"),
            "{file}: {saw}"
        );
    }
    // What A typed did not reach B: B runs a marker typed after it, and not A's command.
    let marker = dir.join("b-marker");
    tmux(
        &b_server,
        &[
            "send-keys",
            "-t",
            &b_pane,
            &format!("touch {}", marker.display()),
            "Enter",
        ],
    );
    wait_file(&dir, "b-marker").await;
    assert!(
        !dir.join("canary").exists(),
        "A's keys ran in B's pane: {}",
        read(&dir, "a-typed")
    );
    // B's server keeps neither B's token nor its secret.
    for args in [
        &["show-environment", "-t", "relay-b"][..],
        &["show-environment", "-g"],
    ] {
        let kept = tmux(&b_server, args);
        assert!(
            !kept.contains(&b_token) && !kept.contains("sekrit-of-b"),
            "{args:?}: {kept}"
        );
    }

    // No FIFO directory is left once the panes are followed...
    assert_eq!(fifo_dirs(scratch.path()), Vec::<String>::new());
    // ...nor after `kill -9` of relay and the panes' adoption.
    env.relay.restart().unwrap();
    for name in ["a", "b"] {
        env.relay.cli_ok(&["agent", "wake", name]);
        wait_online(&env, name).await;
    }
    assert_eq!(look(&env, "b"), (b_server.clone(), b_pane), "adopted");
    assert_eq!(fifo_dirs(scratch.path()), Vec::<String>::new());
    env.relay.kill9();
    assert_eq!(fifo_dirs(scratch.path()), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_line_task_to_a_program_without_bracketed_paste_fails_saying_why() {
    let env = Env::start().await;
    let dir = env.tmp.path().join("lines");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("lines.sh"), LINES).unwrap();
    let dir_env = format!("DIR={}", dir.display());
    let command = format!("sh {}", dir.join("lines.sh").display());
    env.add_tmux(
        "plain",
        &command,
        &["--env", &dir_env, "--turn-timeout", "60"],
    );

    let id = env.ask_no_wait("plain", "first line\nsecond line\nthird line");
    let f: Value = env
        .wait_flight(&id, 60, |f| {
            matches!(state(f), "completed" | "failed" | "cancelled")
        })
        .await;
    assert_eq!(state(&f), "failed", "{f}");
    let why = f["error"].as_str().unwrap_or_default();
    assert!(
        why.contains("bracketed paste") && why.contains("one line"),
        "{f}"
    );
    // A one-line task still goes in (its flight's trailer as lines of its own); the
    // program got nothing before it.
    let id = env.ask_no_wait("plain", "just one line");
    wait_until("the one-line task in the pane", WAIT, || async {
        read(&dir, "lines")
            .contains(&format!("[Relay flight {id}"))
            .then_some(())
    })
    .await;
    let lines = read(&dir, "lines");
    assert!(lines.starts_with("just one line\n"), "{lines:?}");
    assert!(!lines.contains("second line"), "{lines:?}");
}
