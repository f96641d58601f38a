//! The spec `agent.fork` builds (the turns kept up to its flight, counted also through a
//! fork of a fork; the base from that flight's commit), seen by a recording stand-in for
//! the runtime; and a spec the rules refuse never reaching the runtime that makes
//! worktrees.

use super::*;

/// The port as a fork sees it: records the spec it is asked to check, makes no worktree.
struct Recorder(std::sync::Mutex<Vec<AgentSpec>>);

impl relay_broker::ports::FlightControl for Recorder {
    fn steer(
        &self,
        _: Flight,
        _: String,
        _: Option<String>,
    ) -> futures::future::BoxFuture<'static, Result<(), BrokerError>> {
        Box::pin(async { Ok(()) })
    }
    fn interrupt(&self, _: Flight) -> futures::future::BoxFuture<'static, Result<(), BrokerError>> {
        Box::pin(async { Ok(()) })
    }
    fn reply(
        &self,
        _: Flight,
        _: String,
    ) -> futures::future::BoxFuture<'static, Result<(), BrokerError>> {
        Box::pin(async { Ok(()) })
    }
    fn approval_decided(
        &self,
        _: relay_protocol::domain::Approval,
    ) -> futures::future::BoxFuture<'static, Result<(), BrokerError>> {
        Box::pin(async { Ok(()) })
    }
    fn wake(
        &self,
        _: relay_protocol::domain::Agent,
    ) -> futures::future::BoxFuture<'static, Result<(), BrokerError>> {
        Box::pin(async { Ok(()) })
    }
    fn peek(
        &self,
        _: relay_protocol::domain::Agent,
        _: usize,
    ) -> futures::future::BoxFuture<'static, Result<relay_protocol::api::Peek, BrokerError>> {
        Box::pin(async { Err(BrokerError::NoRuntime) })
    }
    fn check_agent(
        &self,
        spec: AgentSpec,
    ) -> futures::future::BoxFuture<'static, Result<relay_broker::ports::AgentChecked, BrokerError>>
    {
        self.0.lock().unwrap().push(spec);
        Box::pin(async { Ok(relay_broker::ports::AgentChecked::default()) })
    }
    fn worktree_dirty(
        &self,
        _: relay_protocol::domain::Agent,
    ) -> futures::future::BoxFuture<'static, Result<Vec<String>, BrokerError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    fn agent_diff(
        &self,
        _: relay_protocol::domain::Agent,
    ) -> futures::future::BoxFuture<'static, Result<relay_protocol::api::AgentDiff, BrokerError>>
    {
        Box::pin(async { Err(BrokerError::NoRuntime) })
    }
    fn revert(
        &self,
        _: Flight,
        _: FlightCommit,
        _: String,
    ) -> futures::future::BoxFuture<'static, Result<relay_broker::ports::Reverting, BrokerError>>
    {
        Box::pin(async { Err(BrokerError::NoRuntime) })
    }
}

/// A flight of `agent` that ran on thread `thread` and ended, with `head` as its commit.
async fn turn(b: &Broker, agent: &str, thread: &str, head: Option<&str>) -> String {
    let f = b
        .invoke(InvokeRequest::new(agent, "hi"))
        .await
        .unwrap()
        .flight;
    b.update_flight(&f.id, state(FlightState::Running))
        .await
        .unwrap();
    b.update_flight(
        &f.id,
        FlightChange::Session {
            thread_id: Some(thread.into()),
            turn_id: None,
        },
    )
    .await
    .unwrap();
    if let Some(head) = head {
        let mut c = commit();
        c.head = head.into();
        b.update_flight(
            &f.id,
            FlightChange::Commit {
                commit: Box::new(c),
            },
        )
        .await
        .unwrap();
    }
    b.update_flight(&f.id, state(FlightState::Completed))
        .await
        .unwrap();
    f.id
}

#[tokio::test]
async fn a_fork_keeps_the_turns_up_to_its_flight_and_branches_from_its_commit() {
    let b = broker().await;
    let spec = AgentSpec {
        worktree: Some(WorktreeSpec {
            base: None,
            dir: Some("/srv/trees".into()),
            copy: vec![".env".into()],
        }),
        env: [("OPENAI_API_KEY".to_string(), "sk-kept-apart".to_string())].into(),
        ..AgentSpec::new("src", Harness::CodexAppServer, "/repo")
    };
    let recorder = std::sync::Arc::new(Recorder(std::sync::Mutex::new(Vec::new())));
    let control: std::sync::Arc<dyn relay_broker::ports::FlightControl> = recorder.clone();
    b.add_agent(spec, Some(control.as_ref())).await.unwrap();
    // An earlier session's flight, then three on the current one (the second changed
    // nothing).
    turn(&b, "src", "old-thread", Some(&"0".repeat(40))).await;
    turn(&b, "src", "t1", Some(&"1".repeat(40))).await;
    let f2 = turn(&b, "src", "t1", None).await;
    let f3 = turn(&b, "src", "t1", Some(&"3".repeat(40))).await;
    b.execute(relay_broker::Command::UpdateAgent {
        name: "src".into(),
        state: None,
        thread_id: Some("t1".into()),
        endpoint: None,
        reason: None,
        program: None,
        worktree: None,
    })
    .await
    .unwrap();

    let fork = |name: &str, at: Option<&str>| relay_protocol::api::ForkRequest {
        name: name.into(),
        at: at.map(str::to_string),
    };
    let added = relay_broker::workspaces::fork(&b, Some(&control), "src", fork("at2", Some(&f2)))
        .await
        .unwrap();
    let checked = recorder.0.lock().unwrap().last().cloned().unwrap();
    let f = checked.fork.clone().unwrap();
    assert_eq!((f.agent.as_str(), f.thread_id.as_str()), ("src", "t1"));
    assert_eq!(f.flight.as_deref(), Some(f2.as_str()));
    assert_eq!((f.keep_turns, f.turns), (Some(2), 3));
    assert_eq!(f.cwd, "/repo");
    // f2 made no commit: the last one before it, f1's.
    let w = checked.worktree.clone().unwrap();
    assert_eq!(w.base, Some("1".repeat(40)));
    assert_eq!(
        (w.dir.as_deref(), w.copy.clone()),
        (Some("/srv/trees"), vec![".env".to_string()])
    );
    // The runtime gets SRC's secret to start NEW; the record shows its name only.
    assert_eq!(
        checked.secrets.0.get("OPENAI_API_KEY").map(String::as_str),
        Some("sk-kept-apart")
    );
    assert_eq!(added.agent.spec.name, "at2");
    assert_eq!(
        added.agent.spec.env["OPENAI_API_KEY"],
        relay_protocol::domain::SECRET_SHOWN
    );

    // By default: the last flight, its own commit.
    relay_broker::workspaces::fork(&b, Some(&control), "src", fork("last", None))
        .await
        .unwrap();
    let checked = recorder.0.lock().unwrap().last().cloned().unwrap();
    assert_eq!(
        checked.fork.as_ref().unwrap().flight.as_deref(),
        Some(f3.as_str())
    );
    assert_eq!(checked.worktree.unwrap().base, Some("3".repeat(40)));

    // A flight of an earlier session, and one that is not SRC's, are refused.
    let old = b
        .store()
        .read(|s| s.recent_flights(1000, |f| f.thread_id.as_deref() == Some("old-thread")))
        .await
        .unwrap();
    let e = relay_broker::workspaces::fork(&b, Some(&control), "src", fork("x", Some(&old[0].id)))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("earlier session"), "{e}");
    let e = relay_broker::workspaces::fork(&b, Some(&control), "src", fork("x", Some("flt_nope")))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("not a flight of agent src"), "{e}");
}

#[tokio::test]
async fn a_spec_the_rules_refuse_never_reaches_the_runtime_that_makes_worktrees() {
    let b = broker().await;
    let recorder = std::sync::Arc::new(Recorder(std::sync::Mutex::new(Vec::new())));
    let control: std::sync::Arc<dyn relay_broker::ports::FlightControl> = recorder.clone();
    let with = |name: &str| AgentSpec {
        worktree: Some(WorktreeSpec::default()),
        ..AgentSpec::new(name, Harness::CodexAppServer, "/repo")
    };
    // Names git would run with (`relay/x y`, `worktrees/../../evil`), a reserved one.
    for name in ["x y", "../../evil", "operator"] {
        let e = b
            .add_agent(with(name), Some(control.as_ref()))
            .await
            .unwrap_err();
        assert!(matches!(e, BrokerError::BadInput(_)), "{name:?}: {e:?}");
    }
    assert!(
        recorder.0.lock().unwrap().is_empty(),
        "the runtime was asked to make a worktree for a refused spec"
    );
    // A fork under a bad name is refused the same way, before its worktree is made.
    b.add_agent(with("src"), Some(control.as_ref()))
        .await
        .unwrap();
    b.execute(relay_broker::Command::UpdateAgent {
        name: "src".into(),
        state: None,
        thread_id: Some("t1".into()),
        endpoint: None,
        reason: None,
        program: None,
        worktree: None,
    })
    .await
    .unwrap();
    let asked = recorder.0.lock().unwrap().len();
    let e = relay_broker::workspaces::fork(
        &b,
        Some(&control),
        "src",
        relay_protocol::api::ForkRequest {
            name: "bad name".into(),
            at: None,
        },
    )
    .await
    .unwrap_err();
    assert!(matches!(e, BrokerError::BadInput(_)), "{e:?}");
    assert_eq!(recorder.0.lock().unwrap().len(), asked);
}

#[tokio::test]
async fn a_fork_of_a_fork_counts_the_turns_its_session_began_with() {
    let b = broker().await;
    let recorder = std::sync::Arc::new(Recorder(std::sync::Mutex::new(Vec::new())));
    let control: std::sync::Arc<dyn relay_broker::ports::FlightControl> = recorder.clone();
    let thread = |name: &str, t: &str| relay_broker::Command::UpdateAgent {
        name: name.into(),
        state: None,
        thread_id: Some(t.into()),
        endpoint: None,
        reason: None,
        program: None,
        worktree: None,
    };
    let fork = |name: &str, at: &str| relay_protocol::api::ForkRequest {
        name: name.into(),
        at: Some(at.into()),
    };
    b.add_agent(
        AgentSpec::new("src", Harness::CodexAppServer, "/repo"),
        Some(control.as_ref()),
    )
    .await
    .unwrap();
    turn(&b, "src", "t1", None).await;
    let f2 = turn(&b, "src", "t1", None).await;
    turn(&b, "src", "t1", None).await;
    b.execute(thread("src", "t1")).await.unwrap();
    // mid's session: src's first two turns, then its own.
    relay_broker::workspaces::fork(&b, Some(&control), "src", fork("mid", &f2))
        .await
        .unwrap();
    let m1 = turn(&b, "mid", "t-mid", None).await;
    turn(&b, "mid", "t-mid", None).await;
    b.execute(thread("mid", "t-mid")).await.unwrap();
    relay_broker::workspaces::fork(&b, Some(&control), "mid", fork("last", &m1))
        .await
        .unwrap();
    let f = recorder
        .0
        .lock()
        .unwrap()
        .last()
        .cloned()
        .unwrap()
        .fork
        .unwrap();
    assert_eq!(f.thread_id, "t-mid");
    // Up to m1 in t-mid: src's two turns, then m1.
    assert_eq!((f.keep_turns, f.turns), (Some(3), 4));

    // Once mid's forked session is gone (a new one), its flights are all its thread has.
    let n1 = turn(&b, "mid", "t-new", None).await;
    b.execute(thread("mid", "t-new")).await.unwrap();
    relay_broker::workspaces::fork(&b, Some(&control), "mid", fork("again", &n1))
        .await
        .unwrap();
    let f = recorder
        .0
        .lock()
        .unwrap()
        .last()
        .cloned()
        .unwrap()
        .fork
        .unwrap();
    assert_eq!((f.keep_turns, f.turns), (Some(1), 1));
}
