//! The mock's file-writing tool call, carried out by the real CLIs: Codex's escalated
//! `exec_command` and Claude Code's `Bash`, each asked for approval and accepted by one
//! rule ([`relay_mock_model::WRITE_FILE_RULE`]), the file written in the agent's cwd.

use relay_tests::agents::state;

use crate::repo::{env_with_repo, wait_ended, write_prompt};

#[tokio::test(flavor = "multi_thread")]
async fn a_write_lands_in_the_agents_cwd_for_codex_and_claude_code() {
    let (env, repo) = env_with_repo().await;
    let rule = relay_mock_model::WRITE_FILE_RULE;
    env.add_agent("cx", &["--auto-accept", rule]);
    env.add_claude("cl", &["--auto-accept", rule]);

    let content = "two lines\nwritten by cx";
    let cx = env.ask_no_wait("cx", &write_prompt("by-cx.txt", content));
    let cl = env.ask_no_wait("cl", &write_prompt("by-cl.txt", "by cl"));
    for (flight, path, text) in [(&cx, "by-cx.txt", content), (&cl, "by-cl.txt", "by cl")] {
        let f = wait_ended(&env, flight).await;
        assert_eq!(state(&f), "completed", "{f}");
        // The model answered once it had the tool's result.
        let typed = text.replace('\n', "\\n");
        assert_eq!(f["output"], format!("wrote {path}: {typed}"), "{f}");
        let written = std::fs::read_to_string(repo.path.join(path));
        assert_eq!(written.as_deref().ok(), Some(text), "{f}");
        // Accepted by the rule, not by a person.
        let approval = env.approval_of(flight);
        assert_eq!(
            approval["decided_by"],
            format!("policy:auto-accept:{rule}"),
            "{approval}"
        );
    }
}
