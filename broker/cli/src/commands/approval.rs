//! Approvals: `relay approval list|decide` (the older `relay approvals` and `relay
//! approve` are kept).

use clap::{Args, Subcommand};
use relay_client::Client;
use relay_protocol::api::{ApprovalsQuery, DecideApproval};
use relay_protocol::domain::{Approval, ApprovalDecision};
use relay_protocol::methods::call as m;

use super::Actor;
use crate::help;
use crate::terminal::outln;
use crate::views::print_json;
use crate::views::table::{age, Cell, Table};

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
        actor,
        json,
    } = args;
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
            },
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
