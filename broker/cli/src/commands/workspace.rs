//! Agents' worktrees: `relay agent add --worktree ...`'s flags, `relay diff`, `relay
//! revert`, `relay agent fork`, what `relay agent remove` says of the branch it keeps,
//! and the worktree lines of `relay agent show` and `relay flight show`.

use std::path::PathBuf;

use clap::Args;
use relay_client::Client;
use relay_protocol::api::{AgentAdded, AgentDiff, Empty, FlightDiff, ForkRequest};
use relay_protocol::domain::{short, Agent, FileChange, Flight, WorktreeSpec, WorktreeState};
use relay_protocol::methods::call as m;

use crate::exit::usage;
use crate::terminal::{errln, out, outln};
use crate::views::print_json;

/// `relay agent add`'s worktree flags.
#[derive(Args, Debug, Default)]
pub struct WorktreeArgs {
    /// Run the agent in a git worktree of its own, on branch relay/NAME, made from the
    /// repository --cwd names (which the agent never touches). Each flight's changes
    /// become a commit on that branch (`relay diff`, `relay revert`); `relay agent
    /// remove` removes the worktree and keeps the branch. Without it the agent works in
    /// --cwd itself.
    #[arg(long)]
    pub worktree: bool,
    /// With --worktree: the branch, tag or commit the agent's branch starts from
    /// [default: the repository's current branch, refused while it has uncommitted
    /// changes].
    #[arg(long, value_name = "REF", requires = "worktree")]
    pub base: Option<String>,
    /// With --worktree: make the worktree in DIR/NAME [default: the runtime's data
    /// dir's worktrees/NAME, outside the repository].
    #[arg(long, value_name = "DIR", requires = "worktree")]
    pub worktree_dir: Option<PathBuf>,
    /// With --worktree: copy these untracked files of the repository into the worktree
    /// when it is made (`.env`, `config/*.local`: paths or globs relative to the
    /// repository; repeatable).
    #[arg(long = "copy", value_name = "PAT", requires = "worktree")]
    pub copy: Vec<String>,
}

impl WorktreeArgs {
    /// The spec the flags ask for (`None`: no --worktree).
    pub fn spec(self) -> Option<WorktreeSpec> {
        if !self.worktree {
            return None;
        }
        Some(WorktreeSpec {
            base: self.base,
            dir: self
                .worktree_dir
                .map(|d| std::path::absolute(&d).unwrap_or(d).display().to_string()),
            copy: self.copy,
        })
    }
}

/// `relay diff FLIGHT|AGENT`.
#[derive(Args)]
#[command(
    after_help = "A flt_... id is a flight: the commit its changes made, as recorded (also for \
a node's agent, and after its worktree is gone). Anything else is an agent: its branch against its base, \
read now.\n\nExamples:\n  relay diff flt_01J...\n  relay diff codex-1 --stat\n  relay diff flt_01J... --json"
)]
pub struct DiffArgs {
    /// A flight id (flt_...) or an agent's name.
    pub target: String,
    /// The files changed, with lines added and removed, instead of the patch.
    #[arg(long)]
    pub stat: bool,
    /// Print JSON (machine-readable) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `relay revert FLIGHT`.
#[derive(Args)]
#[command(
    after_help = "The revert is a commit of its own on the agent's branch (trailer \
Relay-Revert-Of: flt_...), made between its turns; the flight records it.\n\nExample:\n  relay revert flt_01J..."
)]
pub struct RevertArgs {
    /// The flight whose changes are undone.
    pub flight: String,
    /// Print JSON (machine-readable) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `relay agent fork SRC NEW`.
#[derive(Args)]
pub struct ForkArgs {
    /// The agent forked from.
    pub src: String,
    /// The new agent's name.
    pub new: String,
    /// The flight of SRC's conversation to fork at: NEW's session has SRC's turns up to
    /// and including it, and its worktree that flight's commit [default: SRC's last
    /// flight].
    #[arg(long, value_name = "FLIGHT")]
    pub at: Option<String>,
    /// Print JSON (machine-readable) instead of text.
    #[arg(long)]
    pub json: bool,
}

pub async fn diff(client: &Client, args: DiffArgs) -> anyhow::Result<()> {
    if args.target.starts_with("flt_") {
        let d: FlightDiff = client
            .call::<m::FlightDiffShow>(&[&args.target], &Empty {})
            .await?;
        if args.json {
            return print_json(&d);
        }
        let Some(c) = &d.commit else {
            outln!(
                "flight {} changed no file (or agent {} has no worktree)",
                d.flight,
                d.agent
            );
            return Ok(());
        };
        if args.stat {
            outln!("{}", c.summary());
            stat(&c.files);
        } else {
            patch(c.patch.as_deref().unwrap_or(""), c.patch_truncated);
        }
    } else {
        let d: AgentDiff = client
            .call::<m::AgentDiffShow>(&[&args.target], &Empty {})
            .await?;
        if args.json {
            return print_json(&d);
        }
        if args.stat {
            let w = &d.worktree;
            outln!(
                "{} against {} ({}): {} file{}, +{} -{}",
                w.branch,
                w.base,
                short(&w.base_commit),
                d.files.len(),
                if d.files.len() == 1 { "" } else { "s" },
                d.added,
                d.removed
            );
            stat(&d.files);
        } else {
            patch(&d.patch, d.patch_truncated);
        }
    }
    Ok(())
}

/// `--stat`: a file a line, with its lines added and removed.
fn stat(files: &[FileChange]) {
    for f in files {
        if f.binary {
            outln!("  {} (binary)", f.path);
        } else {
            outln!("  {} +{} -{}", f.path, f.added, f.removed);
        }
    }
}

fn patch(text: &str, truncated: bool) {
    out!("{text}");
    if truncated {
        errln!(
            "relay: the patch was longer and is cut here (see the branch with git for all of it)"
        );
    }
}

pub async fn revert(client: &Client, args: RevertArgs) -> anyhow::Result<()> {
    // An agent's name is the likely mistake (`relay diff` takes either): say how to find
    // the flight.
    if !args.flight.starts_with("flt_") {
        usage!(
            "{:?} is not a flight id: flights are named flt_...; `relay flight list --agent {}` lists an agent's flights, and `relay revert flt_...` reverts one",
            args.flight,
            args.flight
        );
    }
    let f: Flight = client
        .call::<m::FlightRevert>(&[&args.flight], &Empty {})
        .await?;
    if args.json {
        return print_json(&f);
    }
    match f.commit.as_ref().and_then(|c| c.reverted_by.as_ref()) {
        Some(r) => outln!(
            "flight {} {} on {}",
            f.id,
            r.summary(),
            f.commit.as_ref().map(|c| c.branch.as_str()).unwrap_or("")
        ),
        None => outln!(
            "revert of flight {} asked of agent {}'s runtime; `relay flight show {}` shows it once made",
            f.id,
            f.agent,
            f.id
        ),
    }
    Ok(())
}

pub async fn fork(client: &Client, args: ForkArgs) -> anyhow::Result<()> {
    let added: AgentAdded = client
        .call::<m::AgentFork>(
            &[&args.src],
            &ForkRequest {
                name: args.new,
                at: args.at,
            },
        )
        .await?;
    for warning in &added.warnings {
        errln!("relay: warning: {warning}");
    }
    if args.json {
        return print_json(&added);
    }
    let a = &added.agent;
    let at = a
        .spec
        .fork
        .as_ref()
        .and_then(|f| f.flight.clone())
        .map(|f| format!(" at flight {f}"))
        .unwrap_or_default();
    outln!(
        "forked {} from {}{at}; its first turn continues that conversation: relay ask {} \"...\"",
        a.spec.name,
        args.src,
        a.spec.name
    );
    if let Some(w) = &a.worktree {
        outln!("worktree  {}", worktree_line(w));
    }
    Ok(())
}

/// What `relay agent remove [--force]` says after the agent is gone.
pub fn removed(agent: &Agent, force: bool) {
    outln!("removed {}", agent.spec.name);
    match (&agent.worktree, &agent.spec.node) {
        // The node decides, on its host (the broker cannot see that worktree): without
        // --force it keeps one holding uncommitted work rather than lose it.
        (Some(w), Some(node)) if force => outln!(
            "worktree {} is removed by node {node} on its host (uncommitted work in it is committed on the branch first)",
            w.path
        ),
        (Some(w), Some(node)) => outln!(
            "worktree {} is removed by node {node} on its host, and kept there if it holds uncommitted work (`relay doctor` on that host does not reach it yet: `git -C {} worktree list` there shows it)",
            w.path,
            agent.spec.cwd
        ),
        (Some(w), None) => outln!("worktree {} removed", w.path),
        (None, _) => {}
    }
    if let Some(kept) = relay_broker::workspaces::branch_kept(agent) {
        outln!("{kept}");
    }
}

/// One line of a worktree: where, its branch from what, ahead/behind.
pub fn worktree_line(w: &WorktreeState) -> String {
    let mut line = format!(
        "{} on {} from {} ({}): {} ahead, {} behind",
        w.path,
        w.branch,
        w.base,
        short(&w.base_commit),
        w.ahead,
        w.behind
    );
    if w.recreated > 0 {
        line.push_str(&format!(
            "; recreated {} time{} (deleted or moved by hand)",
            w.recreated,
            if w.recreated == 1 { "" } else { "s" }
        ));
    }
    line
}

/// `relay agent show`'s worktree lines.
pub fn show_lines(a: &Agent) -> Vec<String> {
    let mut lines = Vec::new();
    match (&a.spec.worktree, &a.worktree) {
        (_, Some(w)) => lines.push(format!("worktree  {}", worktree_line(w))),
        (Some(_), None) => lines.push(format!(
            "worktree  not made yet (its node makes it at its first session), branch {}",
            relay_protocol::domain::branch_of(&a.spec.name)
        )),
        (None, None) => {}
    }
    if let Some(f) = &a.spec.fork {
        let at = f.flight.as_deref().unwrap_or("its last flight");
        lines.push(format!("forked    from {} at {at}", f.agent));
    }
    lines
}

/// `relay agent list`'s short marker of an agent's worktree: `relay/a +2`.
pub fn list_marker(a: &Agent) -> String {
    match (&a.spec.worktree, &a.worktree) {
        (_, Some(w)) => format!("{} +{} -{}", w.branch, w.ahead, w.behind),
        (Some(_), None) => relay_protocol::domain::branch_of(&a.spec.name),
        (None, None) => String::new(),
    }
}

/// `relay flight show`'s commit lines.
pub fn flight_lines(f: &Flight) -> Vec<String> {
    let Some(c) = &f.commit else {
        return Vec::new();
    };
    // The summary starts with "commit ..." (or "commits up to ...").
    let mut lines = vec![format!("changes    {}", c.summary())];
    if !c.also_flights.is_empty() {
        lines.push(format!("also       {}", c.also_flights.join(", ")));
    }
    lines.push(format!("diff       relay diff {}", f.id));
    lines
}
