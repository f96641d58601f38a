//! Approvals: `relay approval list|decide` (the older `relay approvals` and `relay
//! approve` are kept), and an agent's approval policy as `relay agent add` takes it
//! ([`PolicyArgs`]) and `relay agent show` prints it ([`policy_lines`]).

use clap::{Args, Subcommand};
use relay_client::Client;
use relay_protocol::api::{ApprovalsQuery, DecideApproval, Empty};
use relay_protocol::domain::{Approval, ApprovalDecision, ApprovalPolicy, Remember, RuleScope};
use relay_protocol::methods::call as m;

use super::Actor;
use crate::help;
use crate::terminal::outln;
use crate::views::print_json;
use crate::views::table::{age, Cell, Table};

/// `relay agent add`'s approval policy flags.
#[derive(Args)]
pub struct PolicyArgs {
    /// Accept approval requests for exactly this command (repeatable). A rule is
    /// shell-quoted words: the program, then literal arguments; `*` stands for one
    /// plain argument (no leading `-`, `+` or `@`, no `=`), `**` (last) for any number
    /// of them. `cargo
    /// test` accepts `cargo test` and nothing longer; `cargo test *` also accepts
    /// `cargo test parser`, never `cargo test --config ...`. A command is matched as
    /// it will run: a shell's `-c` script only when it is a plain list of words.
    #[arg(long = "auto-accept", value_name = "RULE")]
    pub auto_accept: Vec<String>,
    /// Decline approval requests for commands that start with this rule's words
    /// (repeatable; same syntax as --auto-accept).
    #[arg(long = "auto-decline", value_name = "RULE")]
    pub auto_decline: Vec<String>,
    /// Decline an approval request that no rule decided and nobody answered within
    /// SECS seconds; it is recorded as decided by `policy:timeout:<SECS>s`. Without
    /// it, a request waits for a person however long (until its turn ends): `relay
    /// up --notify-command` and the dashboard tell you it waits.
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pub approval_timeout: Option<u64>,
    /// Accept every file change the agent's own edit tool asks to make (Codex's
    /// apply_patch, Claude Code's Edit and Write...), recorded as decided by
    /// `policy:accept_file_changes`. Natural for an agent in a worktree of its own
    /// (--worktree), where each flight's changes are a commit you can revert.
    #[arg(long)]
    pub accept_file_changes: bool,
}

impl PolicyArgs {
    pub fn policy(self) -> ApprovalPolicy {
        ApprovalPolicy {
            accept_commands: self.auto_accept,
            decline_commands: self.auto_decline,
            accept_file_changes: self.accept_file_changes,
            timeout_secs: self.approval_timeout,
        }
    }
}

/// `relay agent show`'s lines for an agent's approval policy (`approvals`: whether its
/// harness asks for approvals at all).
pub fn policy_lines(policy: &ApprovalPolicy, approvals: bool) -> Vec<String> {
    let mut lines = Vec::new();
    for rule in &policy.accept_commands {
        lines.push(format!("accept    {rule}"));
    }
    if policy.accept_file_changes {
        lines.push("accept    every file change (--accept-file-changes)".to_string());
    }
    for rule in &policy.decline_commands {
        lines.push(format!("decline   {rule}"));
    }
    match policy.timeout_secs {
        Some(secs) => lines.push(format!(
            "approvals declined when nobody answers within {secs} s"
        )),
        None if approvals => {
            lines.push("approvals wait for a person (no --approval-timeout)".to_string())
        }
        None => {}
    }
    lines
}

#[derive(Subcommand)]
pub enum ApprovalCmd {
    /// List approval requests (the pending ones by default).
    #[command(alias = "ls", after_help = help::APPROVAL_LIST)]
    List(ApprovalsArgs),
    /// Decide an approval request: accept, accept_for_session, decline or cancel.
    #[command(after_help = help::APPROVAL_DECIDE)]
    Decide(ApproveArgs),
}

/// `relay approval list|decide`.
pub async fn run(client: &Client, cmd: ApprovalCmd) -> anyhow::Result<()> {
    match cmd {
        ApprovalCmd::List(args) => list(client, args).await,
        ApprovalCmd::Decide(args) => approve(client, args).await,
    }
}

#[derive(Args)]
pub struct ApprovalsArgs {
    /// pending, decided, expired or all.
    #[arg(long, default_value = "pending", value_parser = ["pending", "decided", "expired", "all"])]
    state: String,
    /// Print JSON (machine-readable) instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct ApproveArgs {
    /// The approval's id (from `relay approval list`).
    id: String,
    /// accept, accept_for_session, decline or cancel.
    decision: ApprovalDecision,
    /// Also remember the decision as a rule, which decides the next identical request
    /// itself: for this agent's `session`, the `agent`, its `project` (every agent in
    /// the same directory) or `everywhere`. Only with accept or decline. A command is
    /// remembered exactly as it will run (never a prefix: `cargo test` does not cover
    /// `cargo test --release`).
    #[arg(long, value_name = "SCOPE")]
    remember: Option<RuleScope>,
    /// With --remember: the command's Nth argument (1 = the first after the program)
    /// may be any plain argument (not an option) in the rule: `--any-arg 2` remembers
    /// `cargo test parser` as `cargo test *`.
    #[arg(long, value_name = "N", requires = "remember",
          value_parser = clap::value_parser!(u32).range(1..))]
    any_arg: Option<u32>,
    #[command(flatten)]
    actor: Actor,
    /// Print JSON (machine-readable) instead of text.
    #[arg(long)]
    json: bool,
}

/// `relay approval list` (and `relay approvals`).
pub async fn list(client: &Client, args: ApprovalsArgs) -> anyhow::Result<()> {
    let ApprovalsArgs { state, json } = args;
    let list: Vec<Approval> = client
        .call::<m::ApprovalList>(
            &[],
            &ApprovalsQuery {
                state: Some(state.clone()),
            },
        )
        .await?;
    if json {
        print_json(&list)?;
        return Ok(());
    }
    let decided = state != "pending";
    let mut headers = vec!["APPROVAL", "AGENT", "KIND", "ASKED"];
    if decided {
        headers.extend(["STATE", "DECISION", "BY"]);
    }
    headers.push("COMMAND");
    // The command whole, however wide: its end may be what matters.
    let mut table = Table::new(&headers).uncut();
    for a in &list {
        let kind = serde_json::to_value(a.request.kind)?;
        let mut row = vec![
            Cell::new(&a.id),
            Cell::new(&a.agent),
            Cell::new(kind.as_str().unwrap_or("?")),
            Cell::dim(age(a.created_at)),
        ];
        if decided {
            let decision = a
                .decision
                .map(|d| d.as_str().to_string())
                .unwrap_or_default();
            row.extend([
                Cell::state(a.state.to_string()),
                Cell::state(decision),
                Cell::new(a.decided_by.as_deref().unwrap_or("")),
            ]);
        }
        row.push(Cell::new(&a.request.detail));
        table.row(row);
    }
    let empty = match state.as_str() {
        "pending" => "no approval waits for a decision".to_string(),
        s => format!("no {s} approvals"),
    };
    table.print(crate::terminal::width(), &empty);
    Ok(())
}

/// `relay approve`.
pub async fn approve(client: &Client, args: ApproveArgs) -> anyhow::Result<()> {
    let ApproveArgs {
        id,
        decision,
        remember,
        any_arg,
        actor,
        json,
    } = args;
    let remember = remember_of(decision, remember, any_arg)?;
    let decided_by = actor.name();
    // Relay's own identities, from the one list the broker checks too: refused here
    // before anything is sent.
    if let Some(why) = relay_protocol::domain::decider::reserved(&decided_by, false) {
        crate::exit::usage!(
            "--as {decided_by:?} is not allowed: {why}; decide under your own name"
        );
    }
    let a: Approval = client
        .call::<m::ApprovalDecide>(
            &[&id],
            &DecideApproval {
                decision,
                decided_by,
                remember,
            },
        )
        .await?;
    if json {
        return print_json(&a);
    }
    outln!(
        "{} {} by {}",
        a.id,
        decision.as_str(),
        a.decided_by.as_deref().unwrap_or("?")
    );
    if let Some(rule_id) = &a.remembered {
        // The approval names the rule; the rule says what it decides and where.
        match client.call::<m::RuleShow>(&[rule_id], &Empty {}).await {
            Ok(rule) => outln!("{}", super::rule::remembered_line(&rule)),
            Err(e) => outln!("remembered as rule {rule_id} (relay rule show {rule_id}: {e})"),
        }
    } else if remember.is_some() {
        // A broker that took the decision but made no rule must not look like it did.
        crate::terminal::errln!("relay: warning: the broker recorded the decision but no rule");
    }
    Ok(())
}

/// `--remember` and `--any-arg` as the broker takes them: only an accept or a decline
/// is remembered (a cancel is no answer to the request, and `accept_for_session` is
/// `accept --remember session`).
fn remember_of(
    decision: ApprovalDecision,
    scope: Option<RuleScope>,
    any_arg: Option<u32>,
) -> anyhow::Result<Option<Remember>> {
    let Some(scope) = scope else {
        return Ok(None);
    };
    match decision {
        ApprovalDecision::Accept | ApprovalDecision::Decline => {}
        ApprovalDecision::AcceptForSession => crate::exit::usage!(
            "--remember goes with accept or decline: for `accept_for_session`, decide `accept --remember session`"
        ),
        ApprovalDecision::Cancel => {
            crate::exit::usage!("--remember goes with accept or decline, not cancel")
        }
    }
    Ok(Some(Remember { scope, any_arg }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Add {
        #[command(flatten)]
        policy: PolicyArgs,
    }

    fn policy(args: &[&str]) -> ApprovalPolicy {
        let argv = std::iter::once("add").chain(args.iter().copied());
        Add::try_parse_from(argv).unwrap().policy.policy()
    }

    #[derive(Parser)]
    struct Decide {
        #[command(flatten)]
        args: ApproveArgs,
    }

    fn decide(args: &[&str]) -> Result<Option<Remember>, String> {
        let argv = std::iter::once("decide").chain(args.iter().copied());
        let a = Decide::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .args;
        remember_of(a.decision, a.remember, a.any_arg).map_err(|e| e.to_string())
    }

    #[test]
    fn remember_takes_a_scope_and_an_argument_position() {
        assert_eq!(decide(&["apr_1", "accept"]), Ok(None));
        assert_eq!(
            decide(&["apr_1", "accept", "--remember", "agent"]),
            Ok(Some(Remember {
                scope: RuleScope::Agent,
                any_arg: None
            }))
        );
        assert_eq!(
            decide(&[
                "apr_1",
                "decline",
                "--remember",
                "everywhere",
                "--any-arg",
                "2"
            ]),
            Ok(Some(Remember {
                scope: RuleScope::Everywhere,
                any_arg: Some(2)
            }))
        );
        let no_scope = decide(&["apr_1", "accept", "--remember", "forever"]).unwrap_err();
        assert!(no_scope.contains("forever"), "{no_scope}");
        let alone = decide(&["apr_1", "accept", "--any-arg", "1"]).unwrap_err();
        assert!(alone.contains("--remember"), "{alone}");
        let zero = decide(&["apr_1", "accept", "--remember", "agent", "--any-arg", "0"]);
        assert!(zero.unwrap_err().contains("--any-arg"));
        let cancel = decide(&["apr_1", "cancel", "--remember", "agent"]).unwrap_err();
        assert_eq!(cancel, "--remember goes with accept or decline, not cancel");
        let session = decide(&["apr_1", "accept_for_session", "--remember", "agent"]);
        assert!(session.unwrap_err().contains("accept --remember session"));
    }

    #[test]
    fn accept_file_changes_is_a_flag_of_the_policy() {
        let p = policy(&["--accept-file-changes", "--auto-accept", "cargo test"]);
        assert!(p.accept_file_changes);
        assert_eq!(p.accept_commands, vec!["cargo test".to_string()]);
        assert!(!policy(&[]).accept_file_changes);
        let lines = policy_lines(&p, true);
        assert_eq!(
            lines,
            vec![
                "accept    cargo test",
                "accept    every file change (--accept-file-changes)",
                "approvals wait for a person (no --approval-timeout)",
            ]
        );
        let plain = policy_lines(&policy(&["--approval-timeout", "5"]), true);
        assert_eq!(
            plain,
            vec!["approvals declined when nobody answers within 5 s"]
        );
        assert!(policy_lines(&policy(&[]), false).is_empty());
    }
}
