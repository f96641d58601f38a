//! Approvals: `relay approvals`, `relay approve`.

use clap::Args;
use relay_protocol::domain::{Approval, ApprovalDecision};

use super::Actor;
use crate::client::Client;
use crate::terminal::{errln, one_line, outln};
use crate::views::print_json;

#[derive(Args)]
pub struct ApprovalsArgs {
    /// pending, decided, expired or all.
    #[arg(long, default_value = "pending")]
    state: String,
    /// Print JSON (machine-readable) instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct ApproveArgs {
    /// The approval's id (from `relay approvals`).
    id: String,
    /// accept, accept_for_session, decline or cancel.
    decision: ApprovalDecision,
    #[command(flatten)]
    actor: Actor,
    /// Print JSON (machine-readable) instead of text.
    #[arg(long)]
    json: bool,
}

/// `relay approvals`.
pub async fn list(client: &Client, args: ApprovalsArgs) -> anyhow::Result<()> {
    let ApprovalsArgs { state, json } = args;
    let list: Vec<Approval> = client
        .get_query(&["v1", "approvals"], &[("state", state.clone())])
        .await?;
    if json {
        print_json(&list)?;
    } else if list.is_empty() {
        errln!("no {state} approvals");
    } else {
        for a in list {
            outln!(
                "{}  {:<12} {:<10} {}  {}",
                a.id,
                a.agent,
                serde_json::to_value(a.request.kind)?
                    .as_str()
                    .unwrap_or("?"),
                one_line(&a.request.detail),
                a.decided_by
                    .map(|d| format!("(decided by {})", one_line(&d)))
                    .unwrap_or_default()
            );
        }
    }
    Ok(())
}

/// `relay approve`.
pub async fn approve(client: &Client, args: ApproveArgs) -> anyhow::Result<()> {
    let ApproveArgs {
        id,
        decision,
        actor,
        json,
    } = args;
    let a: Approval = client
        .post(
            &["v1", "approvals", &id],
            &serde_json::json!({ "decision": decision, "decided_by": actor.name() }),
        )
        .await?;
    if json {
        print_json(&a)?;
    } else {
        outln!(
            "{} {} by {}",
            a.id,
            decision.as_str(),
            a.decided_by.as_deref().unwrap_or("?")
        );
    }
    Ok(())
}
