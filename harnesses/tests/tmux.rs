//! The tmux adapter against a real tmux server, through the harness seam: a pane starts,
//! a pasted task arrives whole and inert, a pane that takes nothing stalls, a pane that
//! goes is reported, a pane whose ready pattern does not show gets nothing and fails
//! with what it shows, a pane with neither a command nor a shell is refused, and an
//! agent's session left on the server all agents once shared is ended, the agent
//! started on a server of its own.
//!
//! Each test has its own server on a random socket name, killed by a guard however the
//! test ends, and its own directory. The pane runs a small REPL (a shell script) that
//! behaves like an agent's TUI: it turns bracketed paste on, records what was pasted as
//! data, and runs as a command whatever arrives outside a paste, so a task that could
//! end the paste early would run its tail. Every wait has a timeout so a bug fails
//! instead of hanging; nothing sleeps or measures time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use relay_harnesses::config::CliConfig;
use relay_harnesses::tmux::screens::ReadyPattern;
use relay_harnesses::tmux::{Tmux, TmuxConfig, TmuxLauncher};
use relay_harnesses::{Endpoint, HarnessError, HarnessSession, RelayAccess, Spawned};
use relay_protocol::domain::{AgentSpec, Harness, PaneSpec};
use relay_protocol::harness::{HarnessEvent, TurnOutcome};
use relay_tests::harness_events::{assert_ended, until, within};
use relay_tests::tmux::TmuxServer;
use relay_tests::wait::wait_until;
use tempfile::TempDir;
use tokio::sync::mpsc::Receiver;

const WAIT: Duration = Duration::from_secs(30);

/// A REPL with bracketed paste: prints `ready> `, records every pasted line in
/// `$RECEIVED`, evaluates whatever comes outside a paste, and says how many lines it
/// took; says `interrupted` on `C-c`. Writes its Relay variables to `$ENV_SEEN` first.
const REPL: &str = r#"#!/bin/sh
printf '%s|%s|%s\n' "$RELAY_AGENT" "$RELAY_URL" "$RELAY_TOKEN" > "$ENV_SEEN"
trap 'printf "interrupted\n"; intr=1' INT
esc=$(printf '\033')
printf '\033[?2004h'
printf 'ready> '
inpaste=0
lines=0
while :; do
  intr=0
  IFS= read -r line || { [ "$intr" = 1 ] && continue; break; }
  case $line in "$esc[200~"*) inpaste=1; line=${line#"$esc[200~"} ;; esac
  if [ "$inpaste" = 1 ]; then
    case $line in
      *"$esc[201~"*)
        printf '%s\n' "${line%%"$esc[201~"*}" >> "$RECEIVED"
        lines=$((lines + 1))
        inpaste=0
        line=${line#*"$esc[201~"}
        printf 'received %s lines\n' "$lines"
        lines=0 ;;
      *)
        printf '%s\n' "$line" >> "$RECEIVED"
        lines=$((lines + 1))
        continue ;;
    esac
  fi
  if [ -n "$line" ]; then eval "$line"; fi
  printf 'ready> '
done
"#;

/// A tmux server on a socket of its own, killed on drop, and a client of it.
struct Server {
    _server: TmuxServer,
    tmux: Tmux,
}

impl Server {
    fn new() -> Server {
        let server = TmuxServer::new();
        Server {
            tmux: Tmux::new(server.socket()),
            _server: server,
        }
    }
}

struct Pane {
    server: Server,
    dir: TempDir,
    session: Arc<dyn HarnessSession>,
    events: Receiver<HarnessEvent>,
    pane: String,
    conversation: String,
}

impl Pane {
    fn received(&self) -> PathBuf {
        self.dir.path().join("received")
    }
}

fn access() -> RelayAccess {
    RelayAccess {
        agent: "pane-agent".into(),
        url: "http://127.0.0.1:9".into(),
        // Everything tmux's command language could expand or split on.
        token: "tok'1 $HOME ~ #{pane_id} \"q\" \\ ; \nline2".into(),
        program: "/opt/relay/bin/relay".into(),
    }
}

/// `config` for `program` with `args` in `dir`, on `server`, with Relay access.
fn config(server: &Server, dir: &Path, program: &str, args: &[&str]) -> TmuxConfig {
    let mut cli = CliConfig::new(program);
    cli.args = args.iter().map(|a| a.to_string()).collect();
    cli.cwd = Some(dir.to_path_buf());
    cli.env
        .extend(access().env().into_iter().map(|(k, v)| (k.to_string(), v)));
    for (name, file) in [("RECEIVED", "received"), ("ENV_SEEN", "env")] {
        cli.env
            .insert(name.into(), dir.join(file).display().to_string());
    }
    let mut config = TmuxConfig::new("agent", cli);
    config.socket = server.tmux.socket().to_string();
    config
}

/// Starts `config` and opens its conversation once the pane shows `ready`.
async fn start(server: Server, dir: TempDir, config: TmuxConfig, ready: &str) -> Pane {
    let Spawned { session, events } = within(WAIT, "spawn", TmuxLauncher::spawn_with(config))
        .await
        .unwrap();
    let Endpoint::Pane { pane } = session.endpoint() else {
        panic!("a tmux session has a pane endpoint");
    };
    let tmux = server.tmux.clone();
    wait_until(format!("pane {pane} shows {ready:?}"), WAIT, || {
        let (tmux, pane) = (tmux.clone(), pane.clone());
        async move {
            tmux.capture(&pane)
                .await
                .unwrap()
                .contains(ready)
                .then_some(())
        }
    })
    .await;
    let conversation = session.open(None).await.unwrap();
    assert_eq!(conversation.id, pane);
    assert!(conversation.lost.is_none());
    Pane {
        server,
        dir,
        session,
        events,
        pane,
        conversation: conversation.id,
    }
}

/// A pane running the REPL.
async fn repl() -> Pane {
    let server = Server::new();
    let dir = TempDir::new().unwrap();
    let script = dir.path().join("repl.sh");
    std::fs::write(&script, REPL).unwrap();
    let config = config(&server, dir.path(), "/bin/sh", &[script.to_str().unwrap()]);
    start(server, dir, config, "ready>").await
}

/// Waits until the REPL's record of pasted lines is task `want` (as sanitised) as turn
/// `t1` gets it, with the flight and how to answer after it (a long mismatch is reported
/// by size, not printed whole).
async fn wait_received(pane: &Pane, want: &str) {
    let want = format!("{}\n", relay_harnesses::tmux::task_text(want, "t1", false));
    let path = pane.received();
    wait_until("the pasted text recorded whole", WAIT, || {
        let (path, want) = (path.clone(), want.clone());
        async move {
            let got = tokio::fs::read_to_string(&path).await.unwrap_or_default();
            match got == want {
                true => Ok(()),
                false if got.len() < 2000 => Err(format!("{got:?}")),
                false => Err(format!("{} of {} bytes", got.len(), want.len())),
            }
        }
    })
    .await;
}

async fn shut_down(mut pane: Pane) {
    within(WAIT, "shutdown", pane.session.shutdown())
        .await
        .unwrap();
    let seen = until(&mut pane.events, WAIT, |e| {
        matches!(e, HarnessEvent::ProcessExited { .. })
    })
    .await;
    assert!(matches!(
        seen.last(),
        Some(HarnessEvent::ProcessExited { .. })
    ));
    assert_ended(&mut pane.events, WAIT).await;
    assert!(!pane.server.tmux.pane_alive(&pane.pane).await.unwrap());
}

/// The text deltas of `turn` in `events`, joined.
fn deltas(events: &[HarnessEvent], turn: &str) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            HarnessEvent::TextDelta { turn_id, delta, .. } if turn_id == turn => {
                Some(delta.as_str())
            }
            _ => None,
        })
        .collect()
}

/// Waits for the turn's output to include `text`; returns every event seen.
async fn until_output(
    events: &mut Receiver<HarnessEvent>,
    turn: &str,
    text: &str,
) -> Vec<HarnessEvent> {
    let mut seen = Vec::new();
    while !deltas(&seen, turn).contains(text) {
        seen.extend(
            until(events, WAIT, |e| {
                matches!(e, HarnessEvent::TextDelta { .. })
            })
            .await,
        );
    }
    seen
}

#[tokio::test]
async fn a_pasted_task_reaches_the_pane_whole_and_its_output_comes_back_as_the_turns() {
    let mut pane = repl().await;
    // The pane has the agent's access to Relay in its environment.
    let env = std::fs::read_to_string(pane.dir.path().join("env")).unwrap();
    assert_eq!(
        env,
        "pane-agent|http://127.0.0.1:9|tok'1 $HOME ~ #{pane_id} \"q\" \\ ; \nline2\n"
    );

    let task = "hello pane\n  two words\tand a tab\nlast line";
    let turn = pane
        .session
        .start_turn(&pane.conversation, task, "t1")
        .await
        .unwrap();
    assert_eq!(turn, "t1");
    wait_received(&pane, "hello pane\n  two words and a tab\nlast line").await;
    let seen = until_output(&mut pane.events, "t1", "received 5 lines").await;
    assert_eq!(
        seen.first(),
        Some(&HarnessEvent::TurnStarted {
            turn_id: "t1".into()
        })
    );
    // Rendered: no escape codes, no carriage returns.
    let output = deltas(&seen, "t1");
    assert!(!output.contains(['\x1b', '\r']), "{output:?}");
    assert!(pane.session.stderr_tail().contains("received 5 lines"));
    shut_down(pane).await;
}

#[tokio::test]
async fn a_hostile_task_arrives_as_inert_text_and_nothing_runs() {
    let pane = repl().await;
    let canary = pane.dir.path().join("canary");
    let (task, want) = relay_tests::tmux::hostile_task(&canary);
    pane.session
        .start_turn(&pane.conversation, &task, "t1")
        .await
        .unwrap();
    wait_received(&pane, &want).await;
    assert!(!canary.exists(), "a command in the task ran");
    shut_down(pane).await;
}

#[tokio::test]
async fn a_100_kb_task_arrives_whole() {
    let pane = repl().await;
    // Lines under the terminal's 4 KB line limit (the REPL reads a cooked terminal).
    let line = "0123456789".repeat(10);
    let task = vec![line.as_str(); 1024].join("\n");
    assert!(task.len() > 100_000);
    pane.session
        .start_turn(&pane.conversation, &task, "t1")
        .await
        .unwrap();
    wait_received(&pane, &task).await;
    shut_down(pane).await;
}

#[tokio::test]
async fn a_pane_that_takes_no_input_stalls_and_fails_the_turn() {
    let server = Server::new();
    let dir = TempDir::new().unwrap();
    // No echo, no reading: nothing a paste or a key does shows on the pane.
    let mut config = config(
        &server,
        dir.path(),
        "/bin/sh",
        &["-c", "stty -echo; printf 'deaf'; exec sleep 1000"],
    );
    config.confirm_timeout = Duration::from_millis(300);
    let mut pane = start(server, dir, config, "deaf").await;
    let err = pane
        .session
        .start_turn(&pane.conversation, "anyone there?", "t1")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, HarnessError::Stalled { pane: p, .. } if *p == pane.pane),
        "{err:?}"
    );
    let seen = until(&mut pane.events, WAIT, |e| {
        matches!(e, HarnessEvent::TurnCompleted { .. })
    })
    .await;
    assert!(matches!(
        seen.last(),
        Some(HarnessEvent::TurnCompleted { turn_id, outcome: TurnOutcome::Failed { error } })
            if turn_id == "t1" && error.contains("stalled")
    ));
    shut_down(pane).await;
}

#[tokio::test]
async fn a_pane_that_goes_ends_the_stream_with_its_last_output() {
    let mut pane = repl().await;
    let killed = std::process::Command::new("tmux")
        .args([
            "-L",
            pane.server.tmux.socket(),
            "kill-pane",
            "-t",
            &pane.pane,
        ])
        .output()
        .unwrap();
    assert!(killed.status.success(), "{killed:?}");
    let seen = until(&mut pane.events, WAIT, |e| {
        matches!(e, HarnessEvent::ProcessExited { .. })
    })
    .await;
    let Some(HarnessEvent::ProcessExited { stderr_tail, .. }) = seen.last() else {
        unreachable!("until stops at the exit");
    };
    assert!(
        stderr_tail.contains(&format!("pane {} is gone", pane.pane)),
        "{stderr_tail}"
    );
    assert_ended(&mut pane.events, WAIT).await;
    // Gone already: starting a turn or shutting down says so without hanging.
    assert!(matches!(
        pane.session.start_turn(&pane.conversation, "x", "t1").await,
        Err(HarnessError::ChannelClosed)
    ));
    within(WAIT, "shutdown", pane.session.shutdown())
        .await
        .unwrap();
}

#[tokio::test]
async fn interrupt_reaches_the_pane_as_ctrl_c_and_ends_the_turn() {
    let mut pane = repl().await;
    pane.session
        .start_turn(&pane.conversation, "think about it", "t1")
        .await
        .unwrap();
    assert!(matches!(
        pane.session.interrupt(&pane.conversation, "t2").await,
        Err(HarnessError::NoActiveTurn { .. })
    ));
    pane.session
        .interrupt(&pane.conversation, "t1")
        .await
        .unwrap();
    let seen = until(&mut pane.events, WAIT, |e| {
        matches!(e, HarnessEvent::TurnCompleted { .. })
    })
    .await;
    assert_eq!(
        seen.last(),
        Some(&HarnessEvent::TurnCompleted {
            turn_id: "t1".into(),
            outcome: TurnOutcome::Interrupted
        })
    );
    let (tmux, id) = (pane.server.tmux.clone(), pane.pane.clone());
    wait_until("the pane says it was interrupted", WAIT, || {
        let (tmux, id) = (tmux.clone(), id.clone());
        async move {
            let screen = tmux.capture(&id).await.unwrap();
            screen.contains("interrupted").then_some(()).ok_or(screen)
        }
    })
    .await;
    shut_down(pane).await;
}

/// Loads until `$GO` exists (printing `loading`), recording in `$EARLY` any line that
/// reaches it meanwhile; then runs the REPL, which prompts `ready> `.
const LOADING: &str = r#"#!/bin/bash
printf 'loading\n'
while [ ! -e "$GO" ]; do
  if IFS= read -r -t 0.1 line; then printf '%s\n' "$line" >> "$EARLY"; fi
done
exec sh "$REPL_SCRIPT"
"#;

#[tokio::test]
async fn a_pane_whose_ready_pattern_does_not_show_gets_nothing_and_fails_with_its_screen() {
    let server = Server::new();
    let dir = TempDir::new().unwrap();
    let (repl, loading) = (dir.path().join("repl.sh"), dir.path().join("loading.sh"));
    std::fs::write(&repl, REPL).unwrap();
    std::fs::write(&loading, LOADING).unwrap();
    let (go, early) = (dir.path().join("go"), dir.path().join("early"));
    let mut config = config(
        &server,
        dir.path(),
        "/bin/bash",
        &[loading.to_str().unwrap()],
    );
    for (name, path) in [("GO", &go), ("EARLY", &early), ("REPL_SCRIPT", &repl)] {
        config
            .cli
            .env
            .insert(name.into(), path.display().to_string());
    }
    config.judge.pattern = Some(ReadyPattern::new(r"^ready>\z").unwrap());
    config.ready_timeout = Duration::from_secs(1);
    let mut pane = start(server, dir, config, "loading").await;

    let err = pane
        .session
        .start_turn(&pane.conversation, "too early", "t1")
        .await
        .unwrap_err();
    let HarnessError::NotReady { pane: p, detail } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(*p, pane.pane);
    assert!(
        detail.contains("did not show its ready pattern \"^ready>\\\\z\"")
            && detail.ends_with("its screen ends: loading"),
        "{detail}"
    );
    assert!(err.to_string().starts_with("stalled: "), "{err}");
    let seen = until(&mut pane.events, WAIT, |e| {
        matches!(e, HarnessEvent::TurnCompleted { .. })
    })
    .await;
    assert!(matches!(
        seen.last(),
        Some(HarnessEvent::TurnCompleted { outcome: TurnOutcome::Failed { error }, .. })
            if error.contains("did not show its ready pattern")
    ));
    // Nothing was pasted, nor a key sent.
    assert!(!early.exists(), "{:?}", std::fs::read_to_string(&early));

    // Once it shows its prompt, it gets the next task.
    std::fs::write(&go, "").unwrap();
    let tmux = pane.server.tmux.clone();
    let id = pane.pane.clone();
    wait_until("the prompt", WAIT, || {
        let (tmux, id) = (tmux.clone(), id.clone());
        async move {
            tmux.capture(&id)
                .await
                .unwrap()
                .contains("ready>")
                .then_some(())
        }
    })
    .await;
    pane.session
        .start_turn(&pane.conversation, "now", "t1")
        .await
        .unwrap();
    wait_received(&pane, "now").await;
    assert!(!early.exists(), "{:?}", std::fs::read_to_string(&early));
    shut_down(pane).await;
}

#[tokio::test]
async fn a_pane_to_start_with_neither_a_command_nor_a_shell_is_refused() {
    let mut agent = AgentSpec::new("bare", Harness::Tmux, "/tmp");
    let err = TmuxConfig::for_agent(&agent, None).unwrap_err();
    assert!(
        matches!(&err, HarnessError::Config { detail } if detail.contains("--command") && detail.contains("--shell")),
        "{err:?}"
    );
    // Asked for explicitly, a shell it is.
    agent.pane = Some(PaneSpec {
        shell: true,
        ..PaneSpec::default()
    });
    let config = TmuxConfig::for_agent(&agent, None).unwrap();
    // Nothing judges a shell's screen: it is ready once quiet.
    assert!(!config.judge.judges());
    // A known CLI's screens judge its pane.
    agent.pane = None;
    agent.command = Some("codex".into());
    let config = TmuxConfig::for_agent(&agent, None).unwrap();
    assert!(config.judge.judges());
    agent.command = None;
    // A pane to attach to runs what it runs.
    agent.pane = Some(PaneSpec {
        target: Some("%1".into()),
        ..PaneSpec::default()
    });
    assert!(TmuxConfig::for_agent(&agent, None).is_ok());
    // A ready pattern that is not one is refused too.
    agent.command = Some("codex".into());
    agent.pane = Some(PaneSpec {
        ready_pattern: Some("(".into()),
        ..PaneSpec::default()
    });
    let err = TmuxConfig::for_agent(&agent, None).unwrap_err();
    assert!(
        matches!(&err, HarnessError::Config { detail } if detail.contains("not a valid regular expression")),
        "{err:?}"
    );
}

#[tokio::test]
async fn an_agents_session_left_on_the_shared_server_ends_and_it_starts_on_its_own() {
    let shared = TmuxServer::new();
    let dir = TempDir::new().unwrap();
    // The session an older Relay started for agent `old` on the server all agents shared.
    let legacy = shared.ok(&[
        "new-session",
        "-d",
        "-P",
        "-F",
        "#{pane_id}",
        "-s",
        "relay-old",
        "sleep 100000",
    ]);
    let mut agent = AgentSpec::new("old", Harness::Tmux, dir.path().display().to_string());
    agent.command = Some("/bin/sh".into());
    agent.args = vec!["-c".into(), "printf 'mine> '; exec sleep 100000".into()];
    agent.pane = Some(PaneSpec {
        socket: shared.socket().to_string(),
        ..PaneSpec::default()
    });
    let config = TmuxConfig::for_agent(&agent, None).unwrap();
    let own = Tmux::new(shared.agent_socket("old"));
    assert_eq!(config.socket, own.socket());
    let Spawned { session, .. } = within(WAIT, "spawn", TmuxLauncher::spawn_with(config))
        .await
        .unwrap();
    let Endpoint::Pane { pane } = session.endpoint() else {
        panic!("a tmux session has a pane endpoint");
    };
    // Ended there, started on the agent's own server.
    assert!(!shared.panes().contains(&legacy), "{:?}", shared.panes());
    assert_eq!(
        own.session_pane("relay-old").await.unwrap(),
        Some((pane.clone(), false))
    );
    within(WAIT, "shutdown", session.shutdown()).await.unwrap();
    assert!(!own.pane_alive(&pane).await.unwrap());
}
