//! The `relay` command line behaves like git and cargo, through the real binary against
//! a real broker and the real pinned Codex (mock model): a closed stdout ends a command
//! quietly with 0; each outcome has its exit code; an overloaded broker says so; Ctrl-C
//! on `relay ask` interrupts the flight and names it; `relay ask` follows its flight
//! across a broker `kill -9` and restart; tables fit a narrow and a wide terminal, and
//! the status line never wraps.
//!
//! Over 600 lines: the CLI's conventions end to end, one test per convention.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use relay_tests::agents::{state, Env};
use relay_tests::tmux::TmuxServer;
use relay_tests::{procs, relay_bin, wait_until, RelayProcess, Signal};

/// `relay ARGS` against `relay`'s data dir, stdout and stderr piped.
fn spawn(relay: &RelayProcess, args: &[&str]) -> Child {
    relay.spawn_cli(args).unwrap()
}

/// The id of the flight that runs (waits until one does).
async fn running_flight(relay: &RelayProcess) -> String {
    wait_until("a flight to run", Duration::from_secs(60), || async {
        let live = relay.cli_json(&["flight", "list", "--live", "--json"]);
        live.as_array()
            .unwrap()
            .iter()
            .find(|f| state(f) == "running")
            .map(|f| f["id"].as_str().unwrap().to_string())
    })
    .await
}

/// Waits for `child` to exit (at most `secs`); its exit code, stdout and stderr.
async fn finish(mut child: Child, secs: u64) -> (Option<i32>, String, String) {
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let readers = std::thread::spawn(move || {
        let mut o = String::new();
        let mut e = String::new();
        if let Some(s) = out.as_mut() {
            let _ = s.read_to_string(&mut o);
        }
        if let Some(s) = err.as_mut() {
            let _ = s.read_to_string(&mut e);
        }
        (o, e)
    });
    let status = wait_until("the command to exit", Duration::from_secs(secs), || {
        let status = child.try_wait().unwrap();
        async move { status }
    })
    .await;
    let (o, e) = readers.join().unwrap();
    (status.code(), o, e)
}

/// Runs `relay ARGS` with stdout a pipe whose reader is already gone: every write of
/// the command fails with EPIPE, as under `| head` once head has its lines.
async fn with_stdout_closed(relay: &RelayProcess, args: &[&str]) -> (Option<i32>, String) {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let child = Command::new(&relay.bin)
        .args(args)
        .env("RELAY_DATA_DIR", &relay.data_dir)
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (code, _, stderr) = finish(child, 30).await;
    (code, stderr)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_closed_stdout_ends_every_command_quietly_with_status_0() {
    let env = Env::start().await;
    env.add_agent("codex-1", &[]);
    let out = env.relay.cli_ok(&["ask", "codex-1", "hello there"]);
    assert_eq!(out.trim(), "ok: hello there");
    env.relay.cli_ok(&["send", "a message to read"]);
    let flight = env.relay.cli_json(&["flight", "list", "--json"])[0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    for args in [
        &["events", "--json"][..],
        &["events", "--follow", "--json"],
        &["events", "--follow"],
        &["events"],
        &["flight", "show", &flight, "--updates"],
        &["flight", &flight, "--updates", "--json"],
        &["flight", "list"],
        &["agent", "list"],
        &["read"],
        &["replay", "agent", "codex-1"],
        &["replay", "flight", &flight, "--json"],
        &["watch", "--flight", &flight],
        &["watch", "--agent", "codex-1"],
        &["completions", "bash"],
        &["man"],
        &["--help"],
    ] {
        let (code, stderr) = with_stdout_closed(&env.relay, args).await;
        assert_eq!(code, Some(0), "relay {args:?}: {stderr}");
        assert_eq!(stderr, "", "relay {args:?} said something on stderr");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn each_outcome_has_its_exit_code() {
    let env = Env::start().await;
    env.add_agent("codex-1", &[]);
    let relay = &env.relay;
    let code = |args: &[&str]| {
        let out = relay.cli(args);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // (what, arguments, exit code, what stderr says)
    let cases: Vec<(&str, Vec<&str>, i32, &str)> = vec![
        ("done", vec!["ask", "codex-1", "hi"], 0, ""),
        (
            "usage: an argument clap refuses",
            vec!["ask"],
            2,
            "required arguments were not provided",
        ),
        (
            "usage: a name the broker refuses",
            vec![
                "agent",
                "add",
                "bad name",
                "--harness",
                "codex",
                "--cwd",
                "/tmp",
            ],
            2,
            "(invalid_request)",
        ),
        (
            "not found: an unknown agent",
            vec!["ask", "nobody", "hi"],
            3,
            "unknown agent \"nobody\" (unknown_agent)",
        ),
        (
            "not found: an unknown flight",
            vec!["flight", "show", "flt_nope"],
            3,
            "(unknown_flight)",
        ),
        (
            "refused: the agent exists",
            vec![
                "agent",
                "add",
                "codex-1",
                "--harness",
                "codex",
                "--cwd",
                "/tmp",
            ],
            4,
            "(agent_exists)",
        ),
        (
            "failed: the flight failed",
            vec!["ask", "codex-1", "fail now"],
            1,
            "failed on purpose",
        ),
    ];
    for (what, args, expected, says) in cases {
        let (got, stderr) = code(&args);
        assert_eq!(got, Some(expected), "{what}: {stderr}");
        assert!(stderr.contains(says), "{what}: {stderr}");
    }

    // Cancelled: a flight interrupted by someone else ends the ask with 6.
    let ask = spawn(relay, &["ask", "codex-1", "hang on"]);
    let id = running_flight(relay).await;
    relay.cli_ok(&["flight", "interrupt", &id]);
    let (got, _, stderr) = finish(ask, 60).await;
    assert_eq!(got, Some(6), "cancelled: {stderr}");
    assert!(
        stderr.contains(&format!("flight {id} cancelled")),
        "{stderr}"
    );

    // Unavailable: no broker ever ran there; a broker that stopped.
    let tmp = tempfile::tempdir().unwrap();
    let out = relay_tests::relay_cmd(tmp.path(), &["status"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{stderr}");
    assert!(stderr.contains("has no api.json"), "{stderr}");
    let stopped = tmp.path().join("stopped");
    let mut gone = RelayProcess::start(&stopped).unwrap();
    gone.kill9();
    let out = relay_tests::relay_cmd(&stopped, &["agent", "list"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{stderr}");
    assert!(stderr.contains("cannot reach the broker"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_overloaded_broker_reads_as_overloaded_not_unreachable() {
    let tmp = tempfile::tempdir().unwrap();
    // No connection kept for the operator: the follower's is the only one.
    let relay = RelayProcess::start_with(
        &tmp.path().join("data"),
        &["--max-connections", "1"],
        &[("RELAY_RESERVED_CONNECTIONS", "0")],
    )
    .unwrap();
    // The one connection, held by a follower once it printed the log's first event
    // (the stream is open then).
    let mut follower = spawn(&relay, &["events", "--follow"]);
    let stdout = follower.stdout.take().unwrap();
    let (tx, printed) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line);
        let _ = tx.send(line);
    });
    relay_tests::wait_until_blocking(
        "the follower to print an event",
        Duration::from_secs(30),
        || printed.try_recv().ok().filter(|l| !l.is_empty()),
    );
    let mut said = String::new();
    let code = wait_until("a refused request", Duration::from_secs(30), || {
        let out = relay.cli(&["agent", "list"]);
        said = String::from_utf8_lossy(&out.stderr).into_owned();
        async move { out.status.code().filter(|c| *c != 0) }
    })
    .await;
    assert_eq!(code, 5, "{said}");
    assert!(said.contains("overloaded"), "{said}");
    assert!(!said.contains("cannot reach"), "{said}");
    procs::signal(follower.id(), Signal::KILL);
    let _ = finish(follower, 10).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_on_ask_interrupts_the_flight_and_says_how_to_follow_it() {
    let env = Env::start().await;
    env.add_agent("codex-1", &[]);
    let ask = spawn(&env.relay, &["ask", "codex-1", "hang on"]);
    let id = running_flight(&env.relay).await;
    procs::signal(ask.id(), Signal::INT);
    let (code, _, stderr) = finish(ask, 60).await;
    assert_eq!(code, Some(130), "{stderr}");
    assert!(
        stderr.contains(&format!("interrupting flight {id}"))
            && stderr.contains(&format!("relay watch --flight {id}")),
        "{stderr}"
    );
    let f = env.wait_flight(&id, 30, |f| state(f) != "running").await;
    assert_eq!(state(&f), "cancelled", "{f}");

    // A second Ctrl-C leaves the flight running and says how to stop it.
    let mut ask = spawn(&env.relay, &["ask", "codex-1", "hang again"]);
    let id = running_flight(&env.relay).await;
    let pid = ask.id();
    let mut stderr = ask.stderr.take().unwrap();
    procs::signal(pid, Signal::INT);
    // The first interrupt is said before the second Ctrl-C comes.
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&seen).contains("interrupting flight") {
        let n = stderr.read(&mut buf).unwrap();
        assert!(n > 0, "{}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    procs::signal(pid, Signal::INT);
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).unwrap();
    assert!(
        rest.contains(&format!("left flight {id} running"))
            || rest.contains(&format!("flight {id} cancelled")),
        "{rest}"
    );
    let status = wait_until("the ask to exit", Duration::from_secs(30), || {
        let status = ask.try_wait().unwrap();
        async move { status }
    })
    .await;
    assert_eq!(status.code(), Some(130));
    // The interrupt sent by the first Ctrl-C ends it either way.
    let f = env.wait_flight(&id, 30, |f| state(f) != "running").await;
    assert_eq!(state(&f), "cancelled", "{f}");
}

#[tokio::test(flavor = "multi_thread")]
async fn ask_follows_its_flight_across_a_broker_kill_9_and_restart() {
    let mut env = Env::start().await;
    env.add_agent("codex-1", &[]);
    // The agent is busy with a turn that never ends; the ask waits queued behind it.
    let busy = env.ask_no_wait("codex-1", "hang on");
    env.wait_flight(&busy, 60, |f| state(f) == "running").await;
    let ask = spawn(&env.relay, &["ask", "codex-1", "after the restart"]);
    // The ask's flight once it is on disk and published (the log's events: a listing
    // may show it a moment before, while its commit is synced and before the ask has
    // its answer).
    let queued = wait_until("the ask's flight", Duration::from_secs(30), || async {
        let (_, events) = env
            .relay
            .http()
            .get("/v1/events?after=0&limit=100000")
            .await;
        events
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["type"] == "invocation_created")
            .map(|e| e["flight"]["id"].as_str().unwrap().to_string())
            .find(|id| id != &busy)
    })
    .await;
    let codex = env.codex_pid("codex-1").await;
    env.relay.kill9();
    assert!(procs::wait_gone(codex, Duration::from_secs(15)).await);
    env.relay.restart().unwrap();
    let (code, stdout, stderr) = finish(ask, 120).await;
    let f = env
        .wait_flight(&queued, 60, |f| {
            matches!(state(f), "completed" | "failed" | "cancelled")
        })
        .await;
    assert!(stderr.contains("lost the broker"), "{stderr}");
    assert!(stderr.contains("the broker is back"), "{stderr}");
    // The queued flight is delivered by the restarted broker, and the ask that was
    // waiting for it prints its reply, once, and exits 0.
    assert_eq!(state(&f), "completed", "{f}\n{stderr}");
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout, "ok: after the restart\n", "{stderr}");
    // The flight that was running when the broker died did not stay running.
    let b = env.wait_flight(&busy, 30, |f| state(f) != "running").await;
    assert_eq!(state(&b), "failed", "{b}");
}

/// `relay ARGS` in a pane `width` columns wide; its screen once it exited.
fn in_pane(tmux: &TmuxServer, relay: &RelayProcess, width: u16, args: &str) -> Vec<String> {
    in_pane_as(tmux, relay, width, "", args, false)
}

/// [`in_pane`] with `env` (`NAME=VALUE ...`) in the command's environment, and the
/// screen's colours as escape sequences when `escapes`.
fn in_pane_as(
    tmux: &TmuxServer,
    relay: &RelayProcess,
    width: u16,
    env: &str,
    args: &str,
    escapes: bool,
) -> Vec<String> {
    // A session of its own, left to the server's end (the server ends with its last
    // session, and a command sent as it ends finds no server).
    let name = format!("w{}", uuid::Uuid::new_v4().simple());
    let command = format!(
        "env {env} RELAY_DATA_DIR={} {} {args}; echo EXITED-$?; sleep 600",
        relay.data_dir.display(),
        relay.bin.display()
    );
    tmux.ok(&[
        "new-session",
        "-d",
        "-s",
        &name,
        "-x",
        &width.to_string(),
        "-y",
        "40",
        &command,
    ]);
    let screen = relay_tests::wait_until_blocking(
        "the command to exit in its pane",
        Duration::from_secs(30),
        || {
            let flags = if escapes { "-pe" } else { "-p" };
            let out = tmux.ok(&["capture-pane", flags, "-t", &name]);
            out.contains("EXITED-").then_some(out)
        },
    );
    screen
        .lines()
        .take_while(|l| !l.starts_with("EXITED-"))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn tables_fit_a_narrow_and_a_wide_terminal_and_the_status_line_never_wraps() {
    let env = Env::start().await;
    env.add_agent("codex-1", &[]);
    env.add_agent("an-agent-with-a-rather-long-name", &[]);
    let task = "please summarise every module of this repository in one careful sentence each";
    env.relay.cli_ok(&["ask", "codex-1", task]);
    let tmux = TmuxServer::new();

    for width in [80, 60] {
        let narrow = in_pane(&tmux, &env.relay, width, "flight list");
        assert_eq!(narrow.len(), 2, "a header and one row: {narrow:#?}");
        assert!(narrow[0].starts_with("FLIGHT"), "{narrow:#?}");
        assert!(narrow[0].contains("SUMMARY"), "{narrow:#?}");
        for line in &narrow {
            assert!(
                line.chars().count() <= width.into(),
                "{line:?} is wider than {width}"
            );
        }
        assert!(narrow[1].contains("completed"), "{narrow:#?}");
        assert!(narrow[1].ends_with('…'), "cut at a word: {narrow:#?}");
        if width == 80 {
            assert!(narrow[1].contains("ago"), "{narrow:#?}");
        }
    }

    let wide = in_pane(&tmux, &env.relay, 200, "flight list");
    assert!(wide[1].ends_with(&format!("ok: {task}")), "{wide:#?}");

    let agents = in_pane(&tmux, &env.relay, 80, "agent list");
    assert!(agents[0].starts_with("NAME"), "{agents:#?}");
    assert!(
        agents
            .iter()
            .any(|l| l.starts_with("an-agent-with-a-rather-long-name")),
        "{agents:#?}"
    );
    // Colour on a terminal, for states; none with NO_COLOR, none in a pipe, always with
    // --color always.
    let coloured = in_pane_as(&tmux, &env.relay, 120, "", "flight list", true).join("\n");
    assert!(coloured.contains("\x1b[32mcompleted"), "{coloured:?}");
    for (env_, args) in [
        ("NO_COLOR=1", "flight list"),
        ("", "--color never flight list"),
    ] {
        let plain = in_pane_as(&tmux, &env.relay, 120, env_, args, true).join("\n");
        assert!(plain.contains("completed"), "{env_} {args}: {plain:?}");
        assert!(!plain.contains("\x1b[32m"), "{env_} {args}: {plain:?}");
    }
    let piped = env.relay.cli_ok(&["flight", "list"]);
    assert!(!piped.contains('\x1b'), "{piped:?}");
    let forced = env.relay.cli_ok(&["--color", "always", "flight", "list"]);
    assert!(forced.contains("\x1b[32mcompleted\x1b[0m"), "{forced:?}");

    let empty = in_pane(&tmux, &env.relay, 60, "approval list");
    assert_eq!(empty, vec!["no approval waits for a decision".to_string()]);

    // The status line of a waiting ask in a 50-column pane: redrawn in place, never
    // wrapped, so the screen keeps one line of it however long it waits.
    let command = format!(
        "env RELAY_DATA_DIR={} {} ask codex-1 'hang in there'",
        env.relay.data_dir.display(),
        env.relay.bin.display()
    );
    tmux.ok(&[
        "new-session",
        "-d",
        "-s",
        "ask",
        "-x",
        "50",
        "-y",
        "20",
        &command,
    ]);
    let mut frames = std::collections::HashSet::new();
    relay_tests::wait_until_blocking(
        "the status line to be redrawn a few times",
        Duration::from_secs(60),
        || {
            let screen = tmux.ok(&["capture-pane", "-p", "-S", "-", "-t", "ask"]);
            let lines: Vec<&str> = screen.lines().filter(|l| !l.trim().is_empty()).collect();
            assert!(
                lines.len() <= 1,
                "the status line wrapped or repeated: {lines:#?}"
            );
            if let Some(line) = lines.first() {
                assert!(line.chars().count() < 50, "{line:?}");
                if line.contains("codex-1") {
                    frames.insert(line.chars().next());
                }
            }
            (frames.len() >= 3).then_some(())
        },
    );
    tmux.ok(&["send-keys", "-t", "ask", "C-c"]);
}

#[test]
fn help_lists_the_commands_by_use_and_the_old_spellings_still_work() {
    let out = Command::new(relay_bin()).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for group in [
        "Daily:",
        "Agents and conversations:",
        "Running Relay:",
        "Exit codes:",
    ] {
        assert!(help.contains(group), "{help}");
    }
    for old in [
        &["flights", "--help"][..],
        &["approvals", "--help"],
        &["approve", "--help"],
        &["steer", "--help"],
        &["interrupt", "--help"],
        &["peek", "--help"],
    ] {
        let out = Command::new(relay_bin()).args(old).output().unwrap();
        assert!(out.status.success(), "relay {old:?}");
    }
    let out = Command::new(relay_bin())
        .args(["completions", "bash"])
        .output()
        .unwrap();
    let script = String::from_utf8_lossy(&out.stdout);
    assert!(
        script.contains("flight") && script.contains("approval"),
        "{script}"
    );
    let out = Command::new(relay_bin()).arg("man").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains(".TH relay"));
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(relay_bin())
        .args(["man", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    for page in [
        "relay.1",
        "relay-ask.1",
        "relay-flight-list.1",
        "relay-agent-add.1",
    ] {
        assert!(dir.path().join(page).exists(), "{page}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn updates_and_an_agents_watch_read_as_transcripts_and_the_watch_survives_a_restart() {
    use std::io::BufRead;
    let mut env = Env::start().await;
    env.add_agent("codex-1", &[]);
    // An agent's watch, started before its first flight.
    let mut watch = spawn(&env.relay, &["watch", "--agent", "codex-1"]);
    let (tx, printed) = std::sync::mpsc::channel();
    let stdout = watch.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut shown = String::new();
    let wait_for = |what: &str, shown: &mut String| {
        relay_tests::wait_until_blocking(
            format!("the watch to show {what:?}"),
            Duration::from_secs(60),
            || {
                shown.extend(printed.try_iter().map(|l| l + "\n"));
                shown.contains(what).then_some(())
            },
        )
    };
    wait_for("agent codex-1", &mut shown);
    let out = env
        .relay
        .cli_ok(&["ask", "codex-1", "slow: one two three four"]);
    assert_eq!(out.trim(), "one two three four");
    // The streamed words on one line, under the flight's header: not a line per delta.
    wait_for("one two three four", &mut shown);
    let id = env.relay.cli_json(&["flight", "list", "--json"])[0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(shown.contains(&format!("── flight {id} ──")), "{shown}");
    assert!(!shown.contains("\"kind\""), "no raw JSON: {shown}");

    // `flight show --updates`: the same transcript, after the flight's fields.
    let text = env.relay.cli_ok(&["flight", "show", &id, "--updates"]);
    assert!(text.contains("--- updates ---"), "{text}");
    assert!(
        text.contains("one two three four\n"),
        "deltas joined: {text}"
    );
    assert!(text.contains("[completed]"), "{text}");
    assert!(!text.contains("\"kind\""), "no raw JSON: {text}");
    // --json keeps the raw records.
    let json = env
        .relay
        .cli_json(&["flight", "show", &id, "--updates", "--json"]);
    assert!(json["updates"].as_array().unwrap().len() >= 4, "{json}");

    // The broker restarts under the watch: it says so, goes on from the last event it
    // showed, and shows the next flight once.
    let codex = env.codex_pid("codex-1").await;
    env.relay.kill9();
    assert!(procs::wait_gone(codex, Duration::from_secs(15)).await);
    env.relay.restart().unwrap();
    env.relay.cli_ok(&["ask", "codex-1", "after the restart"]);
    wait_for("ok: after the restart", &mut shown);
    // The flight's end follows its text: wait for the watch to show it too.
    relay_tests::wait_until_blocking(
        "the watch to show the second flight's end",
        Duration::from_secs(60),
        || {
            shown.extend(printed.try_iter().map(|l| l + "\n"));
            (shown.matches("[completed]").count() >= 2).then_some(())
        },
    );
    // Nothing of the first flight was shown again after the restart.
    assert_eq!(
        shown
            .matches("queued from operator: slow: one two three four")
            .count(),
        1,
        "{shown}"
    );
    assert_eq!(
        shown.matches(&format!("── flight {id} ──")).count(),
        1,
        "{shown}"
    );
    assert_eq!(shown.matches("[completed]").count(), 2, "{shown}");
    procs::signal(watch.id(), Signal::KILL);
    let (_, _, stderr) = finish(watch, 10).await;
    assert!(stderr.contains("lost the broker"), "{stderr}");
    assert!(stderr.contains("the broker is back"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flights_watch_resumes_after_a_restart_and_ends_with_the_flight() {
    let mut env = Env::start().await;
    env.add_agent("codex-1", &[]);
    let id = env.ask_no_wait("codex-1", "hang on");
    env.wait_flight(&id, 60, |f| state(f) == "running").await;
    let mut watch = spawn(&env.relay, &["watch", "--flight", &id]);
    // Its stdout, line by line, on a thread (a read blocks): the broker dies only once
    // the watch showed its snapshot.
    let stdout = watch.stdout.take().unwrap();
    let (tx, printed) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut shown = String::new();
    let mut wait_for = |what: String| {
        relay_tests::wait_until_blocking(
            format!("the watch to show {what:?}"),
            Duration::from_secs(60),
            || {
                shown.extend(printed.try_iter().map(|l| l + "\n"));
                shown.contains(&what).then_some(())
            },
        );
    };
    wait_for(format!("flight {id} of codex-1: running"));
    let codex = env.codex_pid("codex-1").await;
    env.relay.kill9();
    assert!(procs::wait_gone(codex, Duration::from_secs(15)).await);
    env.relay.restart().unwrap();
    // The restarted broker fails the flight that was running; the watch, resumed, shows
    // that and ends with it: exit 1.
    wait_for("[failed: relay stopped".to_string());
    let (code, _, stderr) = finish(watch, 60).await;
    shown.extend(printed.try_iter().map(|l| l + "\n"));
    let f = env.wait_flight(&id, 30, |f| state(f) != "running").await;
    assert_eq!(state(&f), "failed", "{f}");
    assert_eq!(code, Some(1), "{shown}\n{stderr}");
    assert!(stderr.contains("lost the broker"), "{stderr}");
    assert_eq!(shown.matches("[running]").count(), 1, "{shown}");

    // A resumed watch of a flight that ended at or before `after` ends at once.
    let (status, last) = env.relay.http().get("/v1/status").await;
    assert_eq!(status, 200);
    let after = last["last_seq"].as_u64().unwrap();
    let resumed = Command::new(&env.relay.bin)
        .args(["watch", "--flight", &id, "--json"])
        .env("RELAY_DATA_DIR", &env.relay.data_dir)
        .output()
        .unwrap();
    assert_eq!(resumed.status.code(), Some(1));
    let url = format!("{}/v1/watch?flight={id}&after={after}", env.relay.api.url);
    let body = reqwest::Client::new()
        .get(url)
        .bearer_auth(&env.relay.api.token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(body.contains("event: resumed"), "{body}");
    assert!(!body.contains("event: flight_updated"), "{body}");
}
