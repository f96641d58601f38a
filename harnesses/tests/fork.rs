//! `HarnessSession::fork` of each harness that has it (Codex app-server, Claude Code, Pi),
//! against the real pinned CLI and a mock model, through the harness seam only.
//!
//! One test per CLI, the same story: a source agent in directory `src` runs two turns
//! ("first zanzibar", "second yokohama"); a fork keeping one turn, made by another agent in
//! another directory (a worktree, for Relay), sends the model the first turn and not the
//! second; a fork keeping all sends both; the source goes on unchanged (its next
//! request carries both turns and nothing of the forks'); a fork of an unknown session
//! is a [`HarnessError::Fork`], never a fresh session. Each test has its own mock, CLI
//! home and directories; every wait has a timeout, and every process is gone at the end.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use relay_harnesses::claude::ClaudeLauncher;
use relay_harnesses::codex::CodexLauncher;
use relay_harnesses::pi::PiLauncher;
use relay_harnesses::{HarnessError, HarnessSession, Launcher, Spawned};
use relay_mock_model::{
    all_input_text, claude_env, codex_env, write_codex_home, write_pi_dir, MockModel,
    RecordedRequest,
};
use relay_protocol::domain::{AgentSpec, ForkSpec, Harness};
use relay_protocol::harness::{HarnessEvent, TurnOutcome};
use relay_tests::harness_events::{is_turn_completed, outcome, shut_down, until, within};
use relay_tests::wait_until;
use tempfile::TempDir;
use tokio::sync::mpsc::Receiver;

const WAIT: Duration = Duration::from_secs(30);

/// A CLI home, and the two directories the agents work in.
struct Dirs {
    home: TempDir,
    src: TempDir,
    new: TempDir,
}

fn dirs() -> Dirs {
    Dirs {
        home: tempfile::tempdir().unwrap(),
        src: tempfile::tempdir().unwrap(),
        new: tempfile::tempdir().unwrap(),
    }
}

struct Agent {
    session: Arc<dyn HarnessSession>,
    events: Receiver<HarnessEvent>,
    /// Its harness session (thread) id.
    id: String,
    turns: u32,
}

impl Agent {
    /// Runs a turn with `text` (which must be unique in the test) and returns the model
    /// request that carried it.
    async fn turn(&mut self, mock: &MockModel, text: &str) -> RecordedRequest {
        self.turns += 1;
        let turn = format!("t{}", self.turns);
        within(
            WAIT,
            "start_turn",
            self.session.start_turn(&self.id, text, &turn),
        )
        .await
        .unwrap();
        let seen = until(&mut self.events, WAIT, is_turn_completed).await;
        assert!(
            matches!(outcome(&seen), TurnOutcome::Completed { .. }),
            "{text}: {:?}",
            outcome(&seen)
        );
        let requests: Vec<_> = mock
            .requests()
            .into_iter()
            .filter(|r| r.last_user_text().is_some_and(|t| t.contains(text)))
            .collect();
        assert_eq!(requests.len(), 1, "one model request for {text:?}");
        requests.into_iter().next().unwrap()
    }

    async fn stop(mut self) {
        shut_down(&*self.session, &mut self.events, WAIT).await;
    }
}

async fn spawn(
    launcher: &dyn Launcher,
    spec: &AgentSpec,
) -> (Arc<dyn HarnessSession>, Receiver<HarnessEvent>) {
    let Spawned { session, events } = within(WAIT, "spawn", launcher.spawn(spec, None))
        .await
        .unwrap();
    (session, events)
}

/// Waits until a file under `dir` holds `text`: a CLI may write its transcript a moment
/// after the turn's end is reported.
async fn wait_for_file_with(dir: &Path, text: &str) {
    fn holds(dir: &Path, text: &str) -> bool {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| {
                let path = e.path();
                if path.is_dir() {
                    holds(&path, text)
                } else {
                    std::fs::read_to_string(&path).is_ok_and(|t| t.contains(text))
                }
            })
    }
    wait_until(format!("a transcript holding {text:?}"), WAIT, || async {
        holds(dir, text).then_some(())
    })
    .await;
}

/// The story of the module docs, for one CLI; `spec(dir)` is an agent of it working in
/// `dir`, keeping its sessions under `dirs.home`.
async fn forks_keep_the_turns_asked_for(
    launcher: &dyn Launcher,
    mock: &MockModel,
    dirs: &Dirs,
    spec: impl Fn(&Path) -> AgentSpec,
) {
    let (session, events) = spawn(launcher, &spec(dirs.src.path())).await;
    let opened = within(WAIT, "open", session.open(None)).await.unwrap();
    let mut src = Agent {
        session,
        events,
        id: opened.id,
        turns: 0,
    };
    src.turn(mock, "first zanzibar").await;
    src.turn(mock, "second yokohama").await;
    wait_for_file_with(dirs.home.path(), "ok: second yokohama").await;

    let src_id = src.id.clone();
    let fork_spec = |keep_turns| ForkSpec {
        agent: "src".into(),
        thread_id: src_id.clone(),
        flight: None,
        keep_turns,
        turns: 2,
        cwd: dirs.src.path().display().to_string(),
    };
    let fork = |keep| {
        let spec = spec(dirs.new.path());
        let from = fork_spec(keep);
        async move {
            let (session, events) = spawn(launcher, &spec).await;
            let opened = within(WAIT, "fork", session.fork(&from)).await.unwrap();
            assert_eq!(opened.lost, None);
            Agent {
                session,
                events,
                id: opened.id,
                turns: 0,
            }
        }
    };

    // Keeping the first turn: its prompt and answer, nothing of the second.
    let mut first = fork(Some(1)).await;
    assert_ne!(first.id, src.id);
    let seen = all_input_text(&first.turn(mock, "third quito").await);
    for kept in ["first zanzibar", "ok: first zanzibar"] {
        assert!(
            seen.contains(kept),
            "{kept:?} not in the fork's request: {seen}"
        );
    }
    assert!(
        !seen.contains("yokohama"),
        "the second turn is in the fork: {seen}"
    );
    // Its own turn is kept too: the fork goes on as a session of its own.
    let seen = all_input_text(&first.turn(mock, "sixth valparaiso").await);
    assert!(
        seen.contains("third quito") && seen.contains("first zanzibar"),
        "{seen}"
    );
    assert!(!seen.contains("yokohama"), "{seen}");

    // Keeping all of it.
    let mut whole = fork(None).await;
    assert_ne!(whole.id, src.id);
    assert_ne!(whole.id, first.id);
    let seen = all_input_text(&whole.turn(mock, "fourth wellington").await);
    for kept in [
        "first zanzibar",
        "ok: first zanzibar",
        "second yokohama",
        "ok: second yokohama",
    ] {
        assert!(
            seen.contains(kept),
            "{kept:?} not in the whole fork's request: {seen}"
        );
    }
    assert!(!seen.contains("quito"), "{seen}");

    // The source goes on as it was.
    let seen = all_input_text(&src.turn(mock, "fifth ulaanbaatar").await);
    for kept in [
        "first zanzibar",
        "ok: first zanzibar",
        "second yokohama",
        "ok: second yokohama",
    ] {
        assert!(
            seen.contains(kept),
            "{kept:?} not in the source's request: {seen}"
        );
    }
    for theirs in ["quito", "wellington", "valparaiso"] {
        assert!(
            !seen.contains(theirs),
            "a fork's turn reached the source: {seen}"
        );
    }

    // A session that does not exist: refused, no session opened instead.
    let (session, mut events) = spawn(launcher, &spec(dirs.new.path())).await;
    let mut unknown = fork_spec(Some(1));
    unknown.thread_id = "0190aaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee".into();
    let err = within(WAIT, "fork of an unknown session", session.fork(&unknown))
        .await
        .unwrap_err();
    assert!(matches!(err, HarnessError::Fork { .. }), "{err:?}");
    assert!(err.to_string().contains(&unknown.thread_id), "{err}");
    let started = within(WAIT, "start_turn", session.start_turn("any", "hello", "t9")).await;
    assert!(started.is_err(), "a turn ran after a refused fork");
    shut_down(&*session, &mut events, WAIT).await;

    for agent in [src, first, whole] {
        agent.stop().await;
    }
}

#[tokio::test]
async fn codex_forks_a_thread_cut_after_a_turn() {
    let mock = MockModel::start().await.unwrap();
    let dirs = dirs();
    write_codex_home(dirs.home.path(), &mock.url()).unwrap();
    let home = dirs.home.path().to_path_buf();
    forks_keep_the_turns_asked_for(&CodexLauncher, &mock, &dirs, |dir| {
        let mut agent = AgentSpec::new("cx", Harness::CodexAppServer, dir.display().to_string());
        agent.env.extend(codex_env(&home));
        agent
    })
    .await;
}

#[tokio::test]
async fn claude_forks_a_session_of_another_directory_cut_after_a_turn() {
    let mock = MockModel::start().await.unwrap();
    let dirs = dirs();
    let env = claude_env(dirs.home.path(), &mock.base_url());
    forks_keep_the_turns_asked_for(&ClaudeLauncher, &mock, &dirs, |dir| {
        let mut agent = AgentSpec::new("cl", Harness::ClaudeStreamJson, dir.display().to_string());
        agent.env.extend(env.iter().cloned());
        agent
    })
    .await;
}

#[tokio::test]
async fn pi_forks_a_session_of_another_directory_cut_after_a_turn() {
    let mock = MockModel::start().await.unwrap();
    let dirs = dirs();
    let env = write_pi_dir(dirs.home.path(), &mock.base_url()).unwrap();
    forks_keep_the_turns_asked_for(&PiLauncher, &mock, &dirs, |dir| {
        let mut agent = AgentSpec::new("pi", Harness::PiRpc, dir.display().to_string());
        agent.args = vec!["--provider".into(), "mock".into()];
        agent.model = Some("mock-model".into());
        agent.env.extend(env.iter().cloned());
        agent
    })
    .await;
    // Only the kept sessions: the source, and one per fork (the whole copy made on the
    // way to a cut one is gone).
    let sessions = std::fs::read_dir(dirs.home.path().join("sessions"))
        .unwrap()
        .flatten()
        .map(|d| std::fs::read_dir(d.path()).unwrap().count())
        .sum::<usize>();
    assert_eq!(sessions, 3);
}
