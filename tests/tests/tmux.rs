//! tmux agents through `relay up`: a real tmux server on a socket of the test's own, a
//! scripted interactive agent in a pane (a small REPL in `sh`) that collects the task
//! pasted into it and answers with `relay reply`, and real kills.
//!
//! - a task reaches the pane, the agent answers, the flight completes with the answer,
//!   posted as the reply; `agent show` names the pane, `peek` shows it, replay shows
//!   the flight; a hostile task arrives as plain text and nothing in it runs; a 100 KB
//!   task arrives whole;
//! - many clients ask several tmux agents at once, each gets its own answer;
//! - a pane that takes no input stalls; an unanswered flight fails at its timeout and
//!   the pane gets `C-c`; `relay interrupt` sends `C-c`;
//! - a pane started outside Relay is attached, answers, and its death fails the running
//!   flight and marks the agent offline;
//! - the pane outlives `kill -9` of `relay up` and is adopted, not started twice, on
//!   the agent's own server, its program's paste mode remembered (a task of several lines
//!   still goes in whole);
//! - a real codex TUI with no credentials (a fresh CODEX_HOME) shows its sign-in screen:
//!   the flight stalls with that reason and how to fix it, and nothing is pasted;
//! - a pane with a ready pattern gets its task only once the pattern shows (also under
//!   many clients at once);
//! - a tmux agent with neither `--command` nor `--shell` is refused, by the CLI and over
//!   HTTP (many at once), and so is a ready pattern that is not a regular expression.
//!
//! Over 600 lines: tmux agents end to end, one test per behaviour, read as one file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use relay_harnesses::tmux::{sanitize::sanitize, task_text};
use relay_tests::agents::{state, Env};
use relay_tests::tmux::TmuxServer;
use relay_tests::wait::wait_until;
use serde_json::{json, Value};

const TURN: u64 = 60;
const WAIT: Duration = Duration::from_secs(30);

/// The scripted agent: turns bracketed paste on and prints `agent> `, collects a task's
/// lines (the paste's brackets dropped) until Relay's trailer names its flight, records
/// the task in `$RECEIVED/<flight>`, and answers `done: <first line>` with `relay reply`;
/// a task whose first line starts with `silent` gets no answer. `C-c` prints
/// `interrupted` and adds a line to `$RECEIVED/interrupts`.
const AGENT: &str = r#"#!/bin/sh
trap 'printf "interrupted\n"; echo interrupted >> "$RECEIVED/interrupts"; intr=1' INT
esc=$(printf '\033')
printf '\033[?2004hagent> '
task=
while :; do
  intr=0
  IFS= read -r line || { [ "$intr" = 1 ] && { task=; printf 'agent> '; continue; }; break; }
  line=${line#"$esc[200~"}
  line=${line%"$esc[201~"}
  case $line in
    "[Relay flight "*)
      flight=${line#"[Relay flight "}
      flight=${flight%%.*}
      printf '%s' "$task" > "$RECEIVED/$flight"
      first=$(printf '%s\n' "$task" | head -n 1)
      case $first in
        silent*) ;;
        *) relay reply "$flight" "done: $first" ;;
      esac
      task=
      printf 'agent> ' ;;
    *) task="$task$line
" ;;
  esac
done
"#;

fn terminal(f: &Value) -> bool {
    matches!(state(f), "completed" | "failed" | "cancelled")
}

/// Writes the agent's script and the folder it records tasks in; the `--env` and
/// command that run it.
fn agent_files(env: &Env) -> (String, String) {
    let script = env.tmp.path().join("agent.sh");
    std::fs::write(&script, AGENT).unwrap();
    let received = env.tmp.path().join("received");
    std::fs::create_dir_all(&received).unwrap();
    (
        format!("RECEIVED={}", received.display()),
        format!("sh {}", script.display()),
    )
}

fn add_agent(env: &Env, name: &str, extra: &[&str]) {
    let (received, command) = agent_files(env);
    let mut args = vec!["--env", received.as_str()];
    args.extend_from_slice(extra);
    env.add_tmux(name, &command, &args);
}

/// What the agent recorded of flight `flight`'s task.
fn received(env: &Env, flight: &str) -> Option<String> {
    std::fs::read_to_string(env.tmp.path().join("received").join(flight)).ok()
}

/// What the agent records of `task` given as flight `flight`: the task as the pane gets
/// it (sanitised), up to Relay's trailer.
fn recorded(task: &str, flight: &str) -> String {
    let whole = sanitize(&task_text(task, flight, false));
    let trailer = whole.rfind("[Relay flight ").unwrap();
    whole[..trailer].to_string()
}

fn interrupts(env: &Env) -> usize {
    std::fs::read_to_string(env.tmp.path().join("received").join("interrupts"))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

async fn wait_interrupts(env: &Env, n: usize) {
    wait_until(format!("{n} C-c seen by the agent"), WAIT, || async {
        (interrupts(env) >= n).then_some(())
    })
    .await;
}

async fn ask(env: &Env, agent: &str, text: &str) -> (String, Value) {
    let id = env.ask_no_wait(agent, text);
    let f = env.wait_flight(&id, TURN, terminal).await;
    (id, f)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripted_agent_in_a_pane_answers_through_relay_reply() {
    let env = Env::start().await;
    add_agent(&env, "tm-1", &[]);

    // `relay ask` waits for the answer and prints it.
    let out = env.relay.cli_ok(&["ask", "tm-1", "hello pane"]);
    assert!(out.contains("done: hello pane"), "{out}");
    let flights = env
        .relay
        .cli_json(&["flights", "--agent", "tm-1", "--json"]);
    let f = &flights[0];
    let id = f["id"].as_str().unwrap();
    assert_eq!(state(f), "completed", "{f}");
    assert_eq!(f["output"], "done: hello pane", "{f}");
    assert_eq!(received(&env, id).unwrap(), recorded("hello pane", id));
    // The answer is posted as tm-1's reply to the task's message.
    let reply = env.message_with_body(f["conversation"].as_str().unwrap(), "done: hello pane");
    assert_eq!(reply["author"], "tm-1", "{reply}");
    let request = env.message_with_body(f["conversation"].as_str().unwrap(), "hello pane");
    assert_eq!(reply["reply_to"], request["id"], "{reply}");
    // What the pane printed meanwhile came as live updates of the flight.
    let updates = env.updates(id).await;
    let printed: String = updates
        .iter()
        .filter(|u| u["kind"] == "delta")
        .filter_map(|u| u["text"].as_str())
        .collect();
    assert!(printed.contains("hello pane"), "{updates:?}");
    assert!(!printed.contains('\x1b'), "{printed:?}");

    // Where the pane is, and how to look at it.
    let agent = env.agent("tm-1").await;
    let pane = agent["endpoint"]["pane"].as_str().unwrap().to_string();
    assert!(pane.starts_with('%'), "{agent}");
    let shown = env.relay.cli_ok(&["agent", "show", "tm-1"]);
    let look = format!("tmux -L {} attach -t {pane}", env.tmux.agent_socket("tm-1"));
    assert!(shown.contains(&look), "{shown}");
    // `peek`: the pane's last lines as plain text, up to the agent's next prompt (it
    // prints it after its answer went).
    let peek = wait_until("the next prompt in peek", WAIT, || async {
        let peek = env.relay.cli_json(&["peek", "tm-1", "-n", "5", "--json"]);
        match peek["lines"].as_array().and_then(|l| l.last()) {
            Some(last) if last == "agent>" => Ok(peek),
            _ => Err(peek.to_string()),
        }
    })
    .await;
    assert_eq!(peek["pane"], pane.as_str(), "{peek}");
    let lines = peek["lines"].as_array().unwrap();
    assert!(lines.len() <= 5, "{peek}");
    // Replay shows a tmux flight like any other.
    let replay = env.relay.cli_ok(&["replay", "flight", id]);
    assert!(replay.contains("done: hello pane"), "{replay}");

    // A hostile task: escape sequences, paste end markers, control characters, command
    // substitution.
    let canary = env.tmp.path().join("canary");
    let (hostile, inert) = relay_tests::tmux::hostile_task(&canary);
    let (id, f) = ask(&env, "tm-1", &hostile).await;
    assert_eq!(state(&f), "completed", "{f}");
    assert_eq!(received(&env, &id).unwrap(), format!("{inert}\n\n"));
    assert!(!canary.exists(), "a command in the task ran");
    assert_eq!(
        f["output"],
        format!("done: first; touch {}", canary.display()),
        "{f}"
    );

    // 100 KB (in lines a terminal's line discipline takes) arrives whole.
    let big: String = (0..1000)
        .map(|i| format!("{i:05} {}\n", "x".repeat(93)))
        .collect();
    let big = big.trim_end().to_string();
    let (id, f) = ask(&env, "tm-1", &big).await;
    assert_eq!(state(&f), "completed", "{f}");
    let got = received(&env, &id).unwrap();
    assert_eq!(got.len(), recorded(&big, &id).len());
    assert!(got == recorded(&big, &id), "the 100 KB task differs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clients_ask_tmux_agents_at_once() {
    let env = Env::start().await;
    let agents = ["tm-a", "tm-b", "tm-c"];
    for a in agents {
        add_agent(&env, a, &[]);
    }
    // And one that is judged ready by its prompt, not by a quiet pane.
    let agents = ["tm-a", "tm-b", "tm-c", "tm-p"];
    add_agent(&env, "tm-p", &["--ready-pattern", r"^agent>\z"]);
    let http = env.relay.http();
    let mut asks = Vec::new();
    for i in 0..24 {
        let http = http.clone();
        let agent = agents[i % agents.len()];
        asks.push(tokio::spawn(async move {
            let task = format!("task {i} for {agent}");
            let (code, f) = http
                .post(
                    "/v1/invocations",
                    &json!({"target": agent, "task": task, "requester": "operator"}),
                )
                .await;
            assert_eq!(code, 200, "{f}");
            (task, f["flight"]["id"].as_str().unwrap().to_string())
        }));
    }
    for ask in asks {
        let (task, id) = ask.await.unwrap();
        let f = env.wait_flight(&id, TURN * 2, terminal).await;
        assert_eq!(state(&f), "completed", "{f}");
        assert_eq!(f["output"], format!("done: {task}"), "{f}");
        assert_eq!(received(&env, &id).unwrap(), recorded(&task, &id));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deaf_pane_stalls_an_unanswered_flight_times_out_and_interrupt_sends_ctrl_c() {
    let env = Env::start().await;
    // Takes no input: nothing shows, whatever is pasted or typed.
    env.add_tmux("deaf", "sh -c 'stty -echo; echo deaf; exec sleep 600'", &[]);
    let (_, f) = ask(&env, "deaf", "are you there").await;
    assert_eq!(state(&f), "failed", "{f}");
    let reason = f["error"].as_str().unwrap_or_default();
    assert!(reason.contains("stalled"), "{f}");

    // No answer within the ask's timeout: the flight fails, and the pane gets C-c.
    add_agent(&env, "tm-1", &[]);
    let id = env
        .relay
        .cli_ok(&[
            "ask",
            "tm-1",
            "--no-wait",
            "--timeout",
            "2",
            "silent please",
        ])
        .trim()
        .to_string();
    let f = env.wait_flight(&id, TURN, terminal).await;
    assert_eq!(state(&f), "failed", "{f}");
    let reason = f["error"].as_str().unwrap_or_default();
    assert!(reason.contains("no answer within 2 s"), "{f}");
    wait_interrupts(&env, 1).await;

    // `relay interrupt` of a running flight: C-c reaches the pane, the flight ends.
    let id = env.ask_no_wait("tm-1", "silent again");
    wait_until("the task in the pane", WAIT, || async {
        received(&env, &id).map(|_| ())
    })
    .await;
    env.relay.cli_ok(&["interrupt", &id]);
    let f = env.wait_flight(&id, TURN, terminal).await;
    assert_eq!(state(&f), "cancelled", "{f}");
    wait_interrupts(&env, 2).await;
    // The pane is still there, and answers the next task.
    let (_, f) = ask(&env, "tm-1", "after the interrupt").await;
    assert_eq!(f["output"], "done: after the interrupt", "{f}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_pane_answers_and_its_death_fails_the_running_flight() {
    let env = Env::start().await;
    let (received_env, command) = agent_files(&env);
    // The user's own server and pane, started outside Relay, with the broker's address
    // and a token in its environment so that `relay reply` works from it.
    let user = TmuxServer::new();
    let url = format!("RELAY_URL={}", env.relay.api.url);
    let token = format!("RELAY_TOKEN={}", env.relay.api.token);
    // (tmux gives a new session's process the client's PATH, whatever `-e` says.)
    let command = format!(
        "env PATH={}:/usr/bin:/bin {command}",
        relay_tests::relay_bin().parent().unwrap().display()
    );
    let pane = user.ok(&[
        "new-session",
        "-d",
        "-P",
        "-F",
        "#{pane_id}",
        "-e",
        &url,
        "-e",
        &token,
        "-e",
        &received_env,
        &command,
    ]);
    wait_until("the user's agent ready", WAIT, || async {
        user.capture(&pane).contains("agent>").then_some(())
    })
    .await;
    // Relay does not know what the pane runs: who may invoke it is said, never a default.
    let unsaid = env.relay.cli(&[
        "agent",
        "attach",
        "mine",
        "--pane",
        &pane,
        "--socket",
        user.socket(),
    ]);
    assert!(!unsaid.status.success());
    assert!(
        String::from_utf8_lossy(&unsaid.stderr).contains("--allow-from"),
        "{unsaid:?}"
    );
    let out = env.relay.cli_ok(&[
        "agent",
        "attach",
        "mine",
        "--pane",
        &pane,
        "--socket",
        user.socket(),
        "--allow-from",
        "operator",
    ]);
    assert!(out.contains(&format!("attached to pane {pane}")), "{out}");
    // A pane is one agent's.
    let twice = env.relay.cli(&[
        "agent",
        "attach",
        "again",
        "--pane",
        &pane,
        "--socket",
        user.socket(),
        "--allow-from",
        "operator",
    ]);
    assert!(!twice.status.success());
    assert!(
        String::from_utf8_lossy(&twice.stderr).contains("is agent mine's already"),
        "{twice:?}"
    );

    let (_, f) = ask(&env, "mine", "hello from outside").await;
    assert_eq!(f["output"], "done: hello from outside", "{f}");

    let id = env.ask_no_wait("mine", "silent while the pane dies");
    wait_until("the task in the pane", WAIT, || async {
        received(&env, &id).map(|_| ())
    })
    .await;
    user.ok(&["kill-pane", "-t", &pane]);
    let f = env.wait_flight(&id, TURN, terminal).await;
    assert_eq!(state(&f), "failed", "{f}");
    let reason = f["error"].as_str().unwrap_or_default();
    assert!(reason.contains(&format!("pane {pane} is gone")), "{f}");
    wait_until("mine offline", WAIT, || async {
        (env.agent("mine").await["state"] == "offline").then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pane_outlives_kill_9_of_relay_and_is_adopted_not_started_twice() {
    // The pane keeps the broker's address it started with: the same port after restart.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let mut env = Env::start_with(&["--listen", &listen]).await;
    add_agent(&env, "tm-1", &[]);
    let (_, f) = ask(&env, "tm-1", "before").await;
    assert_eq!(f["output"], "done: before", "{f}");
    let panes = env.tmux.agent_panes("tm-1");
    assert_eq!(panes.len(), 1, "{panes:?}");

    let id = env.ask_no_wait("tm-1", "silent when relay dies");
    wait_until("the task in the pane", WAIT, || async {
        received(&env, &id).map(|_| ())
    })
    .await;
    env.relay.restart().unwrap();
    // The flight that was running is settled by the restart, not left running.
    let f = env.wait_flight(&id, TURN, terminal).await;
    assert_eq!(state(&f), "failed", "{f}");

    // Of several lines: the adopted pane's paste mode is the one Relay remembered on it.
    let (id, f) = ask(&env, "tm-1", "after\nthe restart").await;
    assert_eq!(f["output"], "done: after", "{f}");
    assert_eq!(
        received_task(&env, &id),
        recorded("after\nthe restart", &id)
    );
    assert_eq!(
        env.tmux.agent_panes("tm-1"),
        panes,
        "the same pane, adopted"
    );
    assert!(Path::new(&env.tmp.path().join("received")).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_codex_tui_in_a_pane_answers_through_relays_mcp_reply_tool() {
    let env = Env::start().await;
    let home = env.codex_home.display().to_string();
    let (codex_home, home) = (format!("CODEX_HOME={home}"), format!("HOME={home}"));
    // `codex`: the pinned CLI, its TUI, with Relay's MCP server wired in.
    env.add_tmux("cx-tui", "codex", &["--env", &codex_home, "--env", &home]);
    // Two lines: the TUI turns bracketed paste on, so they go in as one task.
    let task = "answer: from the codex tui\nand a second line";
    let (id, f) = ask(&env, "cx-tui", task).await;
    assert_eq!(state(&f), "completed", "{f}");
    assert_eq!(f["output"], "from the codex tui", "{f}");
    // The model was told the flight and to use the MCP tool, and called it.
    let told = env
        .mock
        .requests()
        .iter()
        .filter_map(|r| r.last_user_text())
        .find(|t| t.starts_with("answer: from the codex tui"))
        .unwrap();
    assert_eq!(told, task_text(task, &id, true));
    let reply = env.message_with_body(f["conversation"].as_str().unwrap(), "from the codex tui");
    assert_eq!(reply["author"], "cx-tui", "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_codex_agent_asks_a_tmux_agent_through_relay_mcp() {
    let env = Env::start().await;
    add_agent(&env, "tm-1", &[]);
    env.add_agent("cx-1", &[]);
    let ask_tmux = json!({"agent": "tm-1", "text": "what is in the pane"});
    let (parent, f) = ask(&env, "cx-1", &format!("mcp:relay:ask {ask_tmux}")).await;
    assert_eq!(state(&f), "completed", "{f}");
    let output = f["output"].as_str().unwrap_or_default();
    assert!(output.contains("done: what is in the pane"), "{f}");
    let children = env
        .relay
        .cli_json(&["flights", "--agent", "tm-1", "--json"]);
    let child = &children[0];
    assert_eq!(child["parent_flight"], parent.as_str(), "{child}");
    assert_eq!(child["output"], "done: what is in the pane", "{child}");
    let tree = env.relay.cli_json(&["flight", &parent, "--tree", "--json"]);
    assert_eq!(tree["children"][0]["flight"]["id"], child["id"], "{tree}");
}

/// The output of a CLI run, stdout then stderr.
fn said(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_codex_tui_at_its_sign_in_screen_stalls_the_flight_and_gets_nothing() {
    let env = Env::start().await;
    // A fresh CODEX_HOME: no credentials and no provider of its own, so the real codex
    // TUI shows its sign-in picker.
    let fresh = env.tmp.path().join("fresh-codex");
    std::fs::create_dir_all(&fresh).unwrap();
    let (codex_home, home) = (
        format!("CODEX_HOME={}", fresh.display()),
        format!("HOME={}", fresh.display()),
    );
    env.add_tmux("cx-new", "codex", &["--env", &codex_home, "--env", &home]);
    // (The timeout only bounds this test should the stall go unnoticed.)
    let out = env
        .relay
        .cli(&["ask", "cx-new", "--timeout", "60", "hello from relay"]);
    assert!(!out.status.success(), "{out:?}");
    let panes = env.tmux.agent_panes("cx-new");
    assert_eq!(panes.len(), 1, "{panes:?}");
    let pane = &panes[0];
    let why = format!(
        "stalled: codex in pane {pane} shows its sign-in screen; sign in there (tmux -L {} attach -t {pane}) or give it credentials",
        env.tmux.agent_socket("cx-new")
    );
    assert!(said(&out).contains(&why), "{}", said(&out));
    let flights = env
        .relay
        .cli_json(&["flights", "--agent", "cx-new", "--json"]);
    let f = &flights[0];
    assert_eq!(state(f), "failed", "{f}");
    let reason = f["error"].as_str().unwrap_or_default();
    assert!(reason.contains(&why), "{f}");
    // Nothing was pasted: the pane still shows the picker, and no trace of the task.
    let screen = env.tmux.agent_capture("cx-new", pane);
    assert!(screen.contains("Sign in with ChatGPT"), "{screen}");
    assert!(
        !screen.contains("hello from relay") && !screen.contains("Relay flight"),
        "{screen}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pane_with_a_ready_pattern_gets_its_task_once_the_pattern_shows() {
    let env = Env::start().await;
    let (received_env, command) = agent_files(&env);
    let received = env.tmp.path().join("received");
    // Loads until `go` exists, recording anything typed meanwhile; then the agent,
    // which prompts `agent> `.
    let slow = env.tmp.path().join("slow.sh");
    std::fs::write(
        &slow,
        format!(
            "#!/bin/bash\nprintf 'loading\\n'\nwhile [ ! -e \"$RECEIVED/go\" ]; do\n  if IFS= read -r -t 0.1 line; then printf '%s\\n' \"$line\" >> \"$RECEIVED/early\"; fi\ndone\nexec {command}\n"
        ),
    )
    .unwrap();
    env.add_tmux(
        "slow",
        &format!("bash {}", slow.display()),
        &["--env", &received_env, "--ready-pattern", r"^agent>\z"],
    );
    let id = env.ask_no_wait("slow", "hello when ready");
    // Relay looked at the loading pane and waits for its prompt (the quiet rule would
    // have pasted by now).
    wait_until("relay waits for the pane's prompt", WAIT, || async {
        env.relay
            .log_text()
            .contains("pane not ready for a task yet")
            .then_some(())
    })
    .await;
    let waiting = env.flight(&id).await;
    assert!(matches!(state(&waiting), "queued" | "waking"), "{waiting}");
    std::fs::write(received.join("go"), "").unwrap();
    let f = env.wait_flight(&id, TURN, terminal).await;
    assert_eq!(state(&f), "completed", "{f}");
    assert_eq!(f["output"], "done: hello when ready", "{f}");
    assert_eq!(received_task(&env, &id), recorded("hello when ready", &id));
    let early = received.join("early");
    assert!(!early.exists(), "{:?}", std::fs::read_to_string(&early));
}

/// What the agent recorded of flight `flight`'s task (it must have).
fn received_task(env: &Env, flight: &str) -> String {
    received(env, flight).unwrap_or_else(|| panic!("no task recorded for {flight}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tmux_agent_without_a_command_is_refused_unless_it_asks_for_a_shell() {
    let env = Env::start().await;
    let work = env.work.display().to_string();
    let add = |name: &str, extra: &[&str]| {
        let mut args = vec!["agent", "add", name, "--harness", "tmux", "--cwd", &work];
        args.extend_from_slice(extra);
        env.relay.cli(&args)
    };
    // No --command, no --shell: refused by the broker, saying what to pass.
    let out = add("bare", &["--socket", env.tmux.socket()]);
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("names no program")
            && err.contains("--command CMD")
            && err.contains("--shell"),
        "{err}"
    );
    // Both: clap says they conflict.
    let out = add("both", &["--shell", "--command", "codex"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    // A ready pattern that is not a regular expression.
    let out = add("badre", &["--command", "sh", "--ready-pattern", "agent> ("]);
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a valid regular expression"), "{err}");
    // --shell and --ready-pattern are a tmux agent's only.
    for flag in [&["--shell"][..], &["--ready-pattern", "x"][..]] {
        let mut args = vec![
            "agent",
            "add",
            "cx",
            "--harness",
            "codex_app_server",
            "--cwd",
            &work,
        ];
        args.extend_from_slice(flag);
        let out = env.relay.cli(&args);
        assert!(!out.status.success(), "{out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("is for a tmux agent"),
            "{out:?}"
        );
    }

    // Over HTTP, from many clients at once: each refused, none registered.
    let http = env.relay.http();
    let mut posts = Vec::new();
    for i in 0..16 {
        let http = http.clone();
        let work = work.clone();
        posts.push(tokio::spawn(async move {
            let body = match i % 2 {
                0 => json!({"name": format!("bare-{i}"), "harness": "tmux", "cwd": work}),
                _ => json!({"name": format!("bare-{i}"), "harness": "tmux", "cwd": work,
                            "command": "sh", "pane": {"ready_pattern": "(", "shell": false}}),
            };
            http.post("/v1/agents", &body).await
        }));
    }
    for (i, post) in posts.into_iter().enumerate() {
        let (code, body) = post.await.unwrap();
        assert_eq!(code, 400, "{body}");
        assert_eq!(body["error"]["code"], "invalid_request", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        let want = match i % 2 {
            0 => "names no program",
            _ => "not a valid regular expression",
        };
        assert!(message.contains(want), "{message}");
    }
    let agents = env.relay.cli_json(&["agent", "list", "--json"]);
    assert_eq!(agents.as_array().unwrap().len(), 0, "{agents}");

    // Asked for explicitly, with who may invoke it, a shell pane is accepted: by the CLI,
    // and over HTTP.
    let out = add(
        "sh-1",
        &[
            "--shell",
            "--socket",
            env.tmux.socket(),
            "--allow-from",
            "operator",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let shown = env.agent("sh-1").await;
    assert_eq!(shown["pane"]["shell"], true, "{shown}");
    let (code, body) = http
        .post(
            "/v1/agents",
            &json!({"name": "sh-2", "harness": "tmux", "cwd": work, "pane": {"shell": true},
                        "allow_from": ["operator", "lead"]}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["pane"]["socket"], "relay", "{body}");
    assert_eq!(body["pane"]["shell"], true, "{body}");
}
