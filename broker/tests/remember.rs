//! Remembered decisions over a real sled store: a person's decision with `remember`
//! writes its rule with the decision; the next identical request of an agent the rule
//! applies to is decided by it (`rule:<id>`, counted), the same command with one more
//! option or another agent's still asks a person; each scope applies where it says;
//! a removed rule decides nothing; rules and counters survive a restart and agree with
//! doctor's rebuild; the harness gets its own form of the answer (Codex
//! `acceptForSession` for a command decided by a recorded session rule only); and many
//! clients at once deciding and removing leave exactly the rules and counts they made. The fake here is the runtime's
//! port only (it records the answers a harness would get).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use relay_broker::ops::{self, Via};
use relay_broker::ports::{AgentChecked, FlightControl, Reverting};
use relay_broker::store::Store;
use relay_broker::{remembered, Broker, BrokerConfig, BrokerError, Command, Outcome};
use relay_protocol::domain::{
    decider, Agent, AgentSpec, Approval, ApprovalDecision, ApprovalKind, ApprovalRequest,
    ApprovalState, Flight, FlightCommit, Harness, InvokeRequest, Remember, RuleScope,
};
use tokio_util::sync::CancellationToken;

use ApprovalDecision::*;

/// The runtime's port: records each answer a harness gets, (approval, decision).
#[derive(Default)]
struct Answers(Mutex<Vec<(String, ApprovalDecision)>>);

impl Answers {
    fn of(&self, approval: &str) -> Option<ApprovalDecision> {
        let all = self.0.lock().unwrap();
        all.iter()
            .rev()
            .find(|(a, _)| a == approval)
            .map(|(_, d)| *d)
    }
}

fn ok() -> BoxFuture<'static, Result<(), BrokerError>> {
    Box::pin(async { Ok(()) })
}

impl FlightControl for Answers {
    fn steer(
        &self,
        _: Flight,
        _: String,
        _: Option<String>,
    ) -> BoxFuture<'static, Result<(), BrokerError>> {
        ok()
    }
    fn interrupt(&self, _: Flight) -> BoxFuture<'static, Result<(), BrokerError>> {
        ok()
    }
    fn reply(&self, _: Flight, _: String) -> BoxFuture<'static, Result<(), BrokerError>> {
        ok()
    }
    fn approval_decided(&self, a: Approval) -> BoxFuture<'static, Result<(), BrokerError>> {
        self.0.lock().unwrap().push((a.id, a.decision.unwrap()));
        ok()
    }
    fn wake(&self, _: Agent) -> BoxFuture<'static, Result<(), BrokerError>> {
        ok()
    }
    fn peek(
        &self,
        _: Agent,
        _: usize,
    ) -> BoxFuture<'static, Result<relay_protocol::api::Peek, BrokerError>> {
        Box::pin(async { Err(BrokerError::NoRuntime) })
    }
    fn check_agent(&self, _: AgentSpec) -> BoxFuture<'static, Result<AgentChecked, BrokerError>> {
        Box::pin(async { Ok(AgentChecked::default()) })
    }
    fn worktree_dirty(&self, _: Agent) -> BoxFuture<'static, Result<Vec<String>, BrokerError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    fn agent_diff(
        &self,
        _: Agent,
    ) -> BoxFuture<'static, Result<relay_protocol::api::AgentDiff, BrokerError>> {
        Box::pin(async { Err(BrokerError::NoRuntime) })
    }
    fn revert(
        &self,
        _: Flight,
        _: FlightCommit,
        _: String,
    ) -> BoxFuture<'static, Result<Reverting, BrokerError>> {
        Box::pin(async { Err(BrokerError::NoRuntime) })
    }
}

struct World {
    broker: Broker,
    answers: Arc<Answers>,
    control: Arc<dyn FlightControl>,
    stop: CancellationToken,
    writer: tokio::task::JoinHandle<()>,
}

async fn open(store: Store) -> World {
    let stop = CancellationToken::new();
    let (broker, writer) = Broker::start(store, BrokerConfig::default(), stop.clone())
        .await
        .unwrap();
    let answers = Arc::new(Answers::default());
    let control: Arc<dyn FlightControl> = answers.clone();
    World {
        broker,
        answers,
        control,
        stop,
        writer,
    }
}

impl World {
    /// Agent `name` (cwd `cwd`), on session `thread`.
    async fn agent(&self, name: &str, harness: Harness, cwd: &str, thread: &str) {
        self.broker
            .register_agent(AgentSpec::new(name, harness, cwd))
            .await
            .unwrap();
        self.session(name, thread).await;
    }

    async fn session(&self, name: &str, thread: &str) {
        self.broker
            .execute(Command::UpdateAgent {
                name: name.into(),
                state: None,
                thread_id: Some(thread.into()),
                endpoint: None,
                reason: None,
                program: None,
                worktree: None,
            })
            .await
            .unwrap();
    }

    /// Agent `agent` asks to run `detail` (a command), in a new flight.
    async fn ask(&self, agent: &str, kind: ApprovalKind, detail: &str) -> Approval {
        let flight = self
            .broker
            .invoke(InvokeRequest::new(agent, "work"))
            .await
            .unwrap()
            .flight;
        let outcome = self
            .broker
            .execute(Command::RequestApproval {
                agent: agent.into(),
                request: ApprovalRequest {
                    flight: flight.id,
                    kind,
                    detail: detail.into(),
                    reason: None,
                    harness_request_id: "1".into(),
                },
            })
            .await
            .unwrap();
        match outcome {
            Outcome::Approval(a) => a,
            other => panic!("{other:?}"),
        }
    }

    async fn command(&self, agent: &str, detail: &str) -> Approval {
        self.ask(agent, ApprovalKind::Command, detail).await
    }

    /// A person decides, remembering with `scope`.
    async fn person(
        &self,
        a: &Approval,
        decision: ApprovalDecision,
        scope: Option<RuleScope>,
    ) -> Result<Approval, BrokerError> {
        ops::decide(
            &self.broker,
            Some(&self.control),
            &a.id,
            decision,
            "ann",
            Some(Via::Client),
            scope.map(|scope| Remember {
                scope,
                any_arg: None,
            }),
        )
        .await
    }

    /// The plane's step after the static policy: decided by a remembered rule, or not.
    async fn by_rules(&self, a: &Approval) -> Option<Approval> {
        let agent = self.broker.agent(&a.agent).await.unwrap().unwrap();
        remembered::decide(&self.broker, Some(&self.control), a, &agent)
            .await
            .unwrap()
    }

    async fn rule(&self, id: &str) -> relay_protocol::domain::Rule {
        remembered::show(&self.broker, id).await.unwrap()
    }

    async fn consistent(&self) {
        let report = self.broker.store().read(|s| s.verify()).await.unwrap();
        assert!(report.is_consistent(), "{report:?}");
    }

    async fn close(self) {
        self.stop.cancel();
        drop(self.broker);
        self.writer.await.unwrap();
    }
}

#[tokio::test]
async fn a_remembered_accept_decides_the_next_identical_command_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let w = open(Store::open(&dir.path().join("db")).unwrap()).await;
    w.agent("a1", Harness::CodexAppServer, "/repo", "t1").await;
    w.agent("a2", Harness::CodexAppServer, "/repo", "t2").await;

    let first = w.command("a1", "/bin/bash -lc 'cargo test'").await;
    assert_eq!(w.by_rules(&first).await, None, "no rule yet");
    let decided = w
        .person(&first, Accept, Some(RuleScope::Agent))
        .await
        .unwrap();
    let rule_id = decided.remembered.clone().expect("remembered");
    assert_eq!(decided.decided_by.as_deref(), Some("ann"));
    assert_eq!(
        w.answers.of(&first.id),
        Some(Accept),
        "not Codex's session form"
    );
    let rule = w.rule(&rule_id).await;
    assert_eq!(
        (rule.pattern.as_str(), rule.scope, rule.decision, rule.kind),
        (
            "cargo test",
            RuleScope::Agent,
            Accept,
            ApprovalKind::Command
        )
    );
    assert_eq!(rule.agent.as_deref(), Some("a1"));
    assert_eq!(rule.origin.as_deref(), Some(first.id.as_str()));
    assert_eq!((rule.created_by.as_str(), rule.matched), ("ann", 0));

    // The next identical command (as the shell or directly) runs without a person.
    for (n, detail) in ["/bin/bash -lc 'cargo test'", "cargo test"]
        .iter()
        .enumerate()
    {
        let again = w.command("a1", detail).await;
        let auto = w.by_rules(&again).await.expect("decided by the rule");
        assert_eq!(
            auto.decided_by.as_deref(),
            Some(decider::RULE.to_string() + &rule_id).as_deref()
        );
        assert_eq!(
            (auto.state, auto.decision),
            (ApprovalState::Decided, Some(Accept))
        );
        assert_eq!(w.answers.of(&again.id), Some(Accept));
        assert_eq!(w.rule(&rule_id).await.matched, n as u64 + 1);
    }
    let last_matched = w.rule(&rule_id).await.last_matched_at;
    assert!(last_matched.is_some());

    // One more option, or another agent: a person is asked.
    let extra = w.command("a1", "cargo test --release").await;
    assert_eq!(w.by_rules(&extra).await, None);
    let other = w.command("a2", "cargo test").await;
    assert_eq!(w.by_rules(&other).await, None);
    assert_eq!(
        remembered::list(&w.broker, Some("a2")).await.unwrap(),
        vec![],
        "no rule applies to a2"
    );
    assert_eq!(
        remembered::list(&w.broker, Some("a1")).await.unwrap().len(),
        1
    );
    w.consistent().await;
    w.close().await;

    // Another process: the rule and its counters are there, and still decide.
    let w = open(Store::open(&dir.path().join("db")).unwrap()).await;
    let kept = w.rule(&rule_id).await;
    assert_eq!((kept.matched, kept.last_matched_at), (2, last_matched));
    let after = w.command("a1", "cargo test").await;
    assert!(w.by_rules(&after).await.is_some());
    assert_eq!(w.rule(&rule_id).await.matched, 3);

    // Removed: it asks again, and the removal is an event naming who.
    let removed = remembered::remove(&w.broker, &rule_id, "operator", Via::Client)
        .await
        .unwrap();
    assert_eq!(removed.matched, 3);
    let asks = w.command("a1", "cargo test").await;
    assert_eq!(w.by_rules(&asks).await, None);
    assert!(matches!(
        remembered::show(&w.broker, &rule_id).await,
        Err(BrokerError::UnknownRule(_))
    ));
    assert!(matches!(
        remembered::remove(&w.broker, &rule_id, "operator", Via::Client).await,
        Err(BrokerError::UnknownRule(_))
    ));
    let events = w
        .broker
        .store()
        .read(|s| s.events_after(0, 10_000))
        .await
        .unwrap();
    let removal = events.iter().find_map(|e| match &e.body {
        relay_protocol::event::EventBody::RuleRemoved { rule, removed_by } => {
            Some((rule.id.clone(), removed_by.clone()))
        }
        _ => None,
    });
    assert_eq!(removal, Some((rule_id.clone(), "operator".to_string())));
    w.consistent().await;
    w.close().await;
}

#[tokio::test]
async fn each_scope_applies_where_it_says_and_codex_gets_its_session_form() {
    let w = open(Store::temporary().unwrap()).await;
    w.agent("a1", Harness::CodexAppServer, "/repo", "t1").await;
    w.agent("a2", Harness::CodexAppServer, "/repo", "t2").await;
    w.agent("c1", Harness::ClaudeStreamJson, "/other", "s1")
        .await;

    // Session: Codex's own acceptForSession, for that session only, once the rule is
    // recorded: the decision that makes it is a plain accept (it is recorded after the
    // harness has it, and a crash between must not leave Codex an "always" alone).
    let a = w.command("a1", "ls").await;
    let d = w
        .person(&a, Accept, Some(RuleScope::Session))
        .await
        .unwrap();
    assert_eq!(w.answers.of(&a.id), Some(Accept));
    let session_rule = w.rule(d.remembered.as_deref().unwrap()).await;
    assert_eq!(session_rule.session.as_deref(), Some("t1"));
    let again = w.command("a1", "ls").await;
    let auto = w.by_rules(&again).await.unwrap();
    assert_eq!(auto.decision, Some(Accept));
    assert_eq!(w.answers.of(&again.id), Some(AcceptForSession));
    w.session("a1", "t1-new").await;
    assert_eq!(w.by_rules(&w.command("a1", "ls").await).await, None);

    // A person's accept_for_session without remember is remembered for the session, on
    // any harness; Claude Code gets a plain allow.
    let c = w.command("c1", "bash -c 'make build'").await;
    let d = w.person(&c, AcceptForSession, None).await.unwrap();
    assert_eq!(d.decision, Some(AcceptForSession));
    assert_eq!(w.answers.of(&c.id), Some(Accept));
    let r = w.rule(d.remembered.as_deref().unwrap()).await;
    assert_eq!(
        (r.scope, r.session.as_deref()),
        (RuleScope::Session, Some("s1"))
    );
    assert!(w
        .by_rules(&w.command("c1", "make build").await)
        .await
        .is_some());
    // One that cannot be remembered exactly is a plain accept, answered and recorded so.
    let odd = w.command("c1", "make  build").await;
    let d = w.person(&odd, AcceptForSession, None).await.unwrap();
    assert_eq!((d.decision, d.remembered), (Some(Accept), None));
    assert_eq!(w.answers.of(&odd.id), Some(Accept));

    // An explicit remember that cannot be kept exactly: refused, and still pending.
    let refused = w.command("a1", "/bin/bash -lc 'cargo test; id'").await;
    let e = w
        .person(&refused, Accept, Some(RuleScope::Agent))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("canonical form"), "{e}");
    assert_eq!(w.answers.of(&refused.id), None, "the harness got nothing");
    let still = w.broker.store().read({
        let id = refused.id.clone();
        move |s| s.approval(&id)
    });
    assert_eq!(still.await.unwrap().unwrap().state, ApprovalState::Pending);
    let other = w.ask("a1", ApprovalKind::Other, "grant /").await;
    assert!(w
        .person(&other, Accept, Some(RuleScope::Agent))
        .await
        .is_err());

    // Project: every agent of the same cwd, not another's.
    let p = w.command("a1", "git status").await;
    w.person(&p, Accept, Some(RuleScope::Project))
        .await
        .unwrap();
    assert!(w
        .by_rules(&w.command("a2", "git status").await)
        .await
        .is_some());
    assert_eq!(w.by_rules(&w.command("c1", "git status").await).await, None);

    // Everywhere: every agent. A remembered decline wins over it, for its agent.
    let e = w.command("a2", "date").await;
    w.person(&e, Accept, Some(RuleScope::Everywhere))
        .await
        .unwrap();
    assert!(w.by_rules(&w.command("c1", "date").await).await.is_some());
    let no = w.command("a1", "date").await;
    let d = w
        .person(&no, Decline, Some(RuleScope::Agent))
        .await
        .unwrap();
    assert_eq!(w.answers.of(&no.id), Some(Decline));
    let declined = w.by_rules(&w.command("a1", "date").await).await.unwrap();
    assert_eq!(declined.decision, Some(Decline));
    assert_eq!(
        declined.decided_by,
        Some(format!("rule:{}", d.remembered.unwrap()))
    );
    assert_eq!(
        w.by_rules(&w.command("a2", "date").await)
            .await
            .unwrap()
            .decision,
        Some(Accept)
    );

    // A file change: its exact detail.
    let f = w.ask("c1", ApprovalKind::FileChange, "src/lib.rs").await;
    w.person(&f, Accept, Some(RuleScope::Agent)).await.unwrap();
    let same = w.ask("c1", ApprovalKind::FileChange, "src/lib.rs").await;
    assert!(w.by_rules(&same).await.is_some());
    let other_file = w.ask("c1", ApprovalKind::FileChange, "src/main.rs").await;
    assert_eq!(w.by_rules(&other_file).await, None);
    w.consistent().await;
    w.close().await;
}

/// Codex gets `acceptForSession` for a command only: for a file change it would approve
/// the change's paths for the rest of the session, wider than the exact change the rule
/// remembers. A person's `accept_for_session` remembered wider than the session is
/// recorded as the accept its rule and the harness got.
#[tokio::test]
async fn codex_gets_accept_for_session_for_a_session_command_only() {
    let w = open(Store::temporary().unwrap()).await;
    w.agent("a1", Harness::CodexAppServer, "/repo", "t1").await;

    let f = w
        .ask("a1", ApprovalKind::FileChange, "update src/lib.rs")
        .await;
    let d = w
        .person(&f, AcceptForSession, Some(RuleScope::Session))
        .await
        .unwrap();
    assert_eq!(w.answers.of(&f.id), Some(Accept));
    let rule = d.remembered.clone().unwrap();
    assert_eq!(w.rule(&rule).await.scope, RuleScope::Session);
    let again = w
        .ask("a1", ApprovalKind::FileChange, "update src/lib.rs")
        .await;
    let by_rule = w.by_rules(&again).await.unwrap();
    assert_eq!(by_rule.decided_by, Some(format!("rule:{rule}")));
    assert_eq!(w.answers.of(&again.id), Some(Accept));

    let c = w.command("a1", "cargo build").await;
    let d = w
        .person(&c, AcceptForSession, Some(RuleScope::Agent))
        .await
        .unwrap();
    assert_eq!(w.answers.of(&c.id), Some(Accept));
    assert_eq!(d.decision, Some(Accept));
    assert_eq!(
        w.rule(d.remembered.as_deref().unwrap()).await.decision,
        Accept
    );
    w.consistent().await;
    w.close().await;
}

/// 16 clients at once each decide an approval remembering it; then 16 at once match
/// (the even ones, twice each) or remove (the odd ones) their rules: exactly the even
/// rules stay, each matched twice, and the projection agrees with a rebuild.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_clients_remembering_and_removing_at_once_leave_exact_rules_and_counts() {
    const N: usize = 16;
    let w = Arc::new(open(Store::temporary().unwrap()).await);
    w.agent("a1", Harness::CodexAppServer, "/repo", "t1").await;
    let mut tasks = Vec::new();
    for i in 0..N {
        let w = w.clone();
        tasks.push(tokio::spawn(async move {
            let a = w.command("a1", &format!("echo n{i}")).await;
            let d = w.person(&a, Accept, Some(RuleScope::Agent)).await.unwrap();
            (i, d.remembered.unwrap())
        }));
    }
    let mut rules = Vec::new();
    for t in tasks {
        rules.push(t.await.unwrap());
    }
    let all = remembered::list(&w.broker, None).await.unwrap();
    assert_eq!(all.len(), N);
    let mut patterns: Vec<String> = all.iter().map(|r| r.pattern.clone()).collect();
    patterns.sort();
    let mut expected: Vec<String> = (0..N).map(|i| format!("echo n{i}")).collect();
    expected.sort();
    assert_eq!(patterns, expected);

    let mut tasks = Vec::new();
    for (i, id) in rules.clone() {
        let w = w.clone();
        tasks.push(tokio::spawn(async move {
            if i % 2 == 0 {
                for _ in 0..2 {
                    let a = w.command("a1", &format!("echo n{i}")).await;
                    let d = w.by_rules(&a).await.expect("decided by its rule");
                    assert_eq!(d.decided_by, Some(format!("rule:{id}")));
                }
            } else {
                remembered::remove(&w.broker, &id, "bob", Via::Client)
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let left = remembered::list(&w.broker, None).await.unwrap();
    assert_eq!(left.len(), N / 2);
    for (i, id) in &rules {
        match left.iter().find(|r| &r.id == id) {
            Some(r) => assert_eq!((i % 2, r.matched), (0, 2), "{r:?}"),
            None => assert_eq!(i % 2, 1, "rule {id} lost"),
        }
    }
    for i in (1..N).step_by(2) {
        let a = w.command("a1", &format!("echo n{i}")).await;
        assert_eq!(w.by_rules(&a).await, None, "a removed rule decided");
    }
    w.consistent().await;
}

/// The fleet's watch (the dashboard's, `watch?fleet=true`) carries each rule added and
/// removed as it happens, so a Rules view stays live.
#[tokio::test]
async fn the_fleet_watch_carries_each_rule_added_and_removed() {
    use relay_protocol::event::EventBody;
    use relay_protocol::watch::Scope;
    let dir = tempfile::tempdir().unwrap();
    let w = open(Store::open(&dir.path().join("db")).unwrap()).await;
    w.agent("a1", Harness::CodexAppServer, "/repo", "t1").await;
    let (_, mut fleet) = relay_broker::watch::watch(&w.broker, Scope::Fleet)
        .await
        .unwrap();
    let asked = w.command("a1", "cargo test").await;
    let decided = w.person(&asked, Accept, Some(RuleScope::Agent)).await;
    let id = decided.unwrap().remembered.expect("remembered");
    remembered::remove(&w.broker, &id, "ann@dashboard", Via::Dashboard)
        .await
        .unwrap();
    let mut rules = Vec::new();
    while rules.len() < 2 {
        let event = tokio::time::timeout(std::time::Duration::from_secs(10), fleet.recv())
            .await
            .expect("the fleet's next event")
            .unwrap()
            .unwrap();
        match &event.body {
            EventBody::RuleAdded { rule } => rules.push(format!("added {}", rule.id)),
            EventBody::RuleRemoved { rule, removed_by } => {
                rules.push(format!("removed {} by {removed_by}", rule.id))
            }
            _ => {}
        }
    }
    assert_eq!(
        rules,
        [
            format!("added {id}"),
            format!("removed {id} by ann@dashboard")
        ]
    );
    w.close().await;
}
