//! The agent types' unit tests (apart: `agent.rs` stays under 600 lines).

use super::*;

#[test]
fn secret_variables_are_found_by_name_or_by_value_and_moved_apart() {
    for name in [
        "OPENAI_API_KEY",
        "GH_TOKEN",
        "DB_PASSWORD",
        "MYSQL_PWD",
        "SENTRY_DSN",
        "GITHUB_PAT",
        "AWS_SECRET_ACCESS_KEY",
    ] {
        assert!(looks_secret(name), "{name}");
    }
    for name in ["PATH", "RUST_LOG", "LANG", "CODEX_HOME", "PATH_INFO"] {
        assert!(!looks_secret(name), "{name}");
    }
    assert!(looks_secret_value("postgres://u:pw@db:5432/x"));
    assert!(!looks_secret_value("http://127.0.0.1:9/x@y"));
    let mut spec = AgentSpec::new("a", Harness::CodexAppServer, "/w");
    spec.env.insert("OPENAI_API_KEY".into(), "sk-1".into());
    spec.env
        .insert("DATABASE_URL".into(), "postgres://u:pw@h/db".into());
    spec.env.insert("PLAIN".into(), "x".into());
    spec.secrets.0.insert("GIVEN".into(), "g".into());
    spec.move_secrets();
    spec.move_secrets();
    assert_eq!(spec.env["OPENAI_API_KEY"], SECRET_SHOWN);
    assert_eq!(spec.env["DATABASE_URL"], SECRET_SHOWN);
    assert_eq!(spec.env["GIVEN"], SECRET_SHOWN);
    assert_eq!(spec.env["PLAIN"], "x");
    assert_eq!(spec.secrets.0["OPENAI_API_KEY"], "sk-1");
    assert_eq!(spec.secrets.0["DATABASE_URL"], "postgres://u:pw@h/db");
    assert!(
        !format!("{spec:?}").contains("sk-1"),
        "Debug shows no value"
    );
}

#[test]
fn agent_names_fit_in_subjects() {
    assert!(valid_agent_name("codex-1"));
    assert!(valid_agent_name("Pi_2"));
    for bad in ["", "-x", "a b", "a.b", "a*", "a>", &"x".repeat(65)] {
        assert!(!valid_agent_name(bad), "{bad:?}");
    }
}

#[test]
fn names_honour_a_column_width() {
    assert_eq!(format!("{:<8}|", Harness::PiRpc), "pi_rpc  |");
    assert_eq!(format!("{}", Harness::PiRpc), "pi_rpc");
}

#[test]
fn agent_json_is_flat() {
    let agent = Agent {
        worktree: None,
        spec: AgentSpec {
            fork: None,
            budget: None,
            worktree: None,
            name: "codex-1".into(),
            harness: Harness::CodexAppServer,
            cwd: "/tmp".into(),
            model: None,
            node: None,
            wake: WakePolicy::OnDemand,
            command: None,
            args: vec![],
            env: BTreeMap::new(),
            secrets: Default::default(),
            approval_policy: ApprovalPolicy::default(),
            pane: None,
            turn_timeout_secs: None,
            allow_from: vec![],
        },
        state: AgentState::Idle,
        session_id: Some("t1".into()),
        thread_id: Some("t1".into()),
        endpoint: None,
        state_reason: None,
        note: None,
        program: None,
        created_at: 1,
        updated_at: 2,
    };
    let v = serde_json::to_value(&agent).unwrap();
    assert_eq!(v["name"], "codex-1");
    assert_eq!(v["harness"], "codex_app_server");
    assert_eq!(v["thread_id"], "t1");
    assert_eq!(v["session_id"], "t1");
    let back: Agent = serde_json::from_value(v).unwrap();
    assert_eq!(back, agent);
}
