#![allow(clippy::unwrap_used, clippy::expect_used)]

use relay_protocol::domain::{AgentSpec, AgentState, ApprovalRequest, ApprovalState};

use super::*;

fn approval(kind: ApprovalKind, detail: &str) -> Approval {
    Approval {
        id: "apr_1".into(),
        agent: "a1".into(),
        request: ApprovalRequest {
            flight: "flt_1".into(),
            kind,
            detail: detail.into(),
            reason: None,
            harness_request_id: "0".into(),
        },
        state: ApprovalState::Pending,
        decision: None,
        decided_by: None,
        created_at: 0,
        remembered: None,
        decided_at: None,
    }
}

fn command(detail: &str) -> Approval {
    approval(ApprovalKind::Command, detail)
}

fn agent(name: &str, cwd: &str, thread: Option<&str>) -> Agent {
    Agent {
        spec: AgentSpec::new(name, Harness::CodexAppServer, cwd),
        state: AgentState::Offline,
        session_id: thread.map(str::to_string),
        thread_id: thread.map(str::to_string),
        endpoint: None,
        state_reason: None,
        note: None,
        program: None,
        worktree: None,
        created_at: 0,
        updated_at: 0,
    }
}

fn remember(scope: RuleScope) -> Remember {
    Remember {
        scope,
        any_arg: None,
    }
}

fn rule_of(detail: &str, scope: RuleScope, decision: ApprovalDecision) -> Remembered {
    let a1 = agent("a1", "/repo", Some("t1"));
    let mut r = remembered_rule(&command(detail), &a1, decision, remember(scope), "ann").unwrap();
    r.id = format!("rul_{detail}_{scope}_{decision}");
    r
}

#[test]
fn a_command_is_remembered_as_the_list_it_runs_and_reads_back_as_it() {
    for (detail, pattern) in [
        ("cargo test", "cargo test"),
        ("/bin/bash -lc 'cargo test'", "cargo test"),
        (
            "bash -c 'cargo test -p relay-broker'",
            "cargo test -p relay-broker",
        ),
        ("ls ''", "ls ''"),
    ] {
        let a = command(detail);
        let p = remembered_pattern(&a, None).unwrap();
        assert_eq!(p, pattern, "{detail:?}");
        let argv = command_argv(detail).unwrap();
        assert!(Rule::parse(&p).unwrap().matches(&argv, true), "{detail:?}");
    }
    // A quoted argument inside a shell's script, as Codex sends it.
    let script = shlex::try_join(["git", "commit", "-m", "a b"]).unwrap();
    let detail = shlex::try_join(["/bin/bash", "-lc", &script]).unwrap();
    let p = remembered_pattern(&command(&detail), None).unwrap();
    assert_eq!(p, script);
    assert!(matches(
        &rule_of(&detail, RuleScope::Agent, ApprovalDecision::Accept),
        &command(&script)
    ));
}

#[test]
fn what_cannot_be_remembered_exactly_is_refused_with_a_reason() {
    for (detail, why) in [
        ("/bin/bash -lc \"cargo test\"", "canonical"),
        ("cargo  test", "canonical"),
        ("/bin/bash -lc 'cargo test; id'", "canonical"),
        ("", "canonical"),
        ("ls '*'", "pattern"),
        ("'FOO=1' cargo test", "program"),
    ] {
        let err = remembered_pattern(&command(detail), None).unwrap_err();
        assert!(err.contains(why), "{detail:?}: {err}");
    }
    let script = shlex::try_join(["ls", "**"]).unwrap();
    let wrapped = shlex::try_join(["/bin/bash", "-lc", &script]).unwrap();
    let err = remembered_pattern(&command(&wrapped), None).unwrap_err();
    assert!(err.contains("pattern"), "{err}");
    let other = approval(ApprovalKind::Other, "grant write access to /");
    assert!(remembered_pattern(&other, None)
        .unwrap_err()
        .contains("only a command or a file change"));
    let file = approval(ApprovalKind::FileChange, "src/lib.rs");
    assert_eq!(remembered_pattern(&file, None).unwrap(), "src/lib.rs");
    assert!(remembered_pattern(&file, Some(1)).is_err());
    let a1 = agent("a1", "/repo", Some("t1"));
    let cancel = remembered_rule(
        &command("cargo test"),
        &a1,
        ApprovalDecision::Cancel,
        remember(RuleScope::Agent),
        "ann",
    );
    assert!(cancel.unwrap_err().contains("only accept and decline"));
    let sessionless = agent("a2", "/repo", None);
    let session = remembered_rule(
        &command("cargo test"),
        &sessionless,
        ApprovalDecision::Accept,
        remember(RuleScope::Session),
        "ann",
    );
    assert!(session.unwrap_err().contains("no session yet"));
}

#[test]
fn any_arg_takes_a_plain_argument_only() {
    let a = command("/bin/bash -lc 'cargo test parser'");
    let p = remembered_pattern(&a, Some(2)).unwrap();
    assert_eq!(p, "cargo test *");
    let rule = Rule::parse(&p).unwrap();
    for (argv, ok) in [
        (&["cargo", "test", "parser"][..], true),
        (&["cargo", "test", "lexer"][..], true),
        (&["cargo", "test"][..], false),
        (&["cargo", "test", "a", "b"][..], false),
        (&["cargo", "test", "--config=x"][..], false),
        (&["cargo", "test", "+nightly"][..], false),
        (&["cargo", "test", "@args"][..], false),
        (&["cargo", "test", "X=1"][..], false),
    ] {
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        assert_eq!(rule.matches(&argv, true), ok, "{argv:?}");
    }
    for (detail, n, why) in [
        ("cargo test -p x", 2, "not a plain argument"),
        ("cargo +nightly test", 1, "not a plain argument"),
        ("make 'X=1'", 1, "not a plain argument"),
        ("cargo test @args", 2, "not a plain argument"),
        ("cargo test", 0, "counts from 1"),
        ("cargo test", 2, "1 argument(s)"),
    ] {
        let err = remembered_pattern(&command(detail), Some(n)).unwrap_err();
        assert!(err.contains(why), "{detail:?} {n}: {err}");
    }
}

/// The probe's smuggling variants against a rule remembered from `cargo test` (as Codex
/// asks it, through a shell): none is taken, for an accept and a decline alike, since a
/// remembered rule matches the whole list.
#[test]
fn a_remembered_rule_refuses_the_smuggling_variants_of_the_probe() {
    let accept = rule_of(
        "/bin/bash -lc 'cargo test'",
        RuleScope::Agent,
        ApprovalDecision::Accept,
    );
    let decline = rule_of("cargo test", RuleScope::Agent, ApprovalDecision::Decline);
    assert_eq!(accept.pattern, "cargo test");
    for bad in crate::policy::SMUGGLED_CARGO_TEST {
        let a = command(bad);
        assert!(!matches(&accept, &a), "accept took {bad:?}");
        assert!(!matches(&decline, &a), "decline took {bad:?}");
    }
    for good in [
        "cargo test",
        "/bin/bash -lc 'cargo test'",
        "bash -c 'cargo test'",
        "/usr/bin/zsh -lc 'cargo test'",
    ] {
        assert!(matches(&accept, &command(good)), "{good:?}");
        assert!(matches(&decline, &command(good)), "{good:?}");
    }
    // Nor another kind with the same text.
    assert!(!matches(
        &accept,
        &approval(ApprovalKind::FileChange, "cargo test")
    ));
}

#[test]
fn a_file_change_matches_its_exact_detail_only() {
    let a1 = agent("a1", "/repo", Some("t1"));
    let file = approval(ApprovalKind::FileChange, "src/lib.rs");
    let rule = remembered_rule(
        &file,
        &a1,
        ApprovalDecision::Accept,
        remember(RuleScope::Agent),
        "ann",
    )
    .unwrap();
    assert!(matches(&rule, &file));
    for other in ["src/lib.rs ", "src/lib.rsx", "./src/lib.rs", "src/*.rs", ""] {
        assert!(!matches(&rule, &approval(ApprovalKind::FileChange, other)));
    }
}

#[test]
fn scopes_apply_to_their_session_agent_project_or_everyone() {
    let a1 = agent("a1", "/repo", Some("t1"));
    let a1_later = agent("a1", "/repo", Some("t2"));
    let a2 = agent("a2", "/repo", Some("t9"));
    let b1 = agent("b1", "/other", None);
    let decline = ApprovalDecision::Decline;
    let accept = ApprovalDecision::Accept;
    let session = rule_of("cargo test", RuleScope::Session, accept);
    assert_eq!(session.session.as_deref(), Some("t1"));
    let by_agent = rule_of("cargo test", RuleScope::Agent, accept);
    let project = rule_of("cargo test", RuleScope::Project, accept);
    assert_eq!(project.project.as_deref(), Some("/repo"));
    let everywhere = rule_of("cargo test", RuleScope::Everywhere, accept);
    for (rule, who) in [
        (&session, [true, false, false, false]),
        (&by_agent, [true, true, false, false]),
        (&project, [true, true, true, false]),
        (&everywhere, [true, true, true, true]),
    ] {
        let got = [&a1, &a1_later, &a2, &b1].map(|a| applies(rule, a));
        assert_eq!(got, who, "{:?}", rule.scope);
    }
    // Declines first, then the narrowest scope, then the oldest.
    let mut older_everywhere_decline = rule_of("cargo test", RuleScope::Everywhere, decline);
    older_everywhere_decline.created_at = 0;
    let mut rules = vec![
        everywhere.clone(),
        project.clone(),
        by_agent.clone(),
        session.clone(),
    ];
    let a = command("cargo test");
    assert_eq!(deciding(&rules, &a1, &a).unwrap().id, session.id);
    assert_eq!(deciding(&rules, &a1_later, &a).unwrap().id, by_agent.id);
    assert_eq!(deciding(&rules, &a2, &a).unwrap().id, project.id);
    assert_eq!(deciding(&rules, &b1, &a).unwrap().id, everywhere.id);
    assert!(deciding(&rules, &a1, &command("cargo test -q")).is_none());
    rules.push(older_everywhere_decline.clone());
    assert_eq!(
        deciding(&rules, &a1, &a).unwrap().id,
        older_everywhere_decline.id
    );
    let mut first = by_agent.clone();
    first.id = "rul_0".into();
    first.created_at = 0;
    let mut second = by_agent.clone();
    second.id = "rul_1".into();
    second.created_at = 5;
    assert_eq!(deciding(&[second, first], &a1, &a).unwrap().id, "rul_0");
}

#[test]
fn only_codex_gets_accept_for_session_and_only_for_a_session_rule() {
    use ApprovalDecision::*;
    let cmd = ApprovalKind::Command;
    for h in Harness::ALL {
        let codex = h == Harness::CodexAppServer;
        let session_accept = if codex { AcceptForSession } else { Accept };
        assert_eq!(harness_answer(h, cmd, Accept, true), session_accept, "{h}");
        assert_eq!(
            harness_answer(h, cmd, AcceptForSession, true),
            session_accept
        );
        assert_eq!(harness_answer(h, cmd, Accept, false), Accept);
        assert_eq!(harness_answer(h, cmd, AcceptForSession, false), Accept);
        assert_eq!(harness_answer(h, cmd, Decline, true), Decline);
        assert_eq!(harness_answer(h, cmd, Cancel, false), Cancel);
    }
}

/// Codex's `acceptForSession` on a file change approves its paths (and a grant root)
/// for the rest of the session: wider than the exact change a rule remembers, so a
/// file change, or any other request, gets a plain accept even for a session rule.
#[test]
fn codex_gets_accept_for_session_for_a_command_only() {
    use ApprovalDecision::*;
    let codex = Harness::CodexAppServer;
    for kind in [ApprovalKind::FileChange, ApprovalKind::Other] {
        assert_eq!(
            harness_answer(codex, kind, Accept, true),
            Accept,
            "{kind:?}"
        );
        assert_eq!(
            harness_answer(codex, kind, AcceptForSession, true),
            Accept,
            "{kind:?}"
        );
    }
}
