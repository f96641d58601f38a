//! Remembered decisions: `relay rule list|show|remove`, and how `relay approval decide
//! --remember` says what it remembered ([`remembered_line`]). A rule is made by deciding
//! an approval with `--remember SCOPE`; it decides the next identical request itself
//! (recorded as decided by `rule:<id>`).

use clap::{Args, Subcommand};
use relay_client::Client;
use relay_protocol::api::{Empty, RulesQuery};
use relay_protocol::domain::{Rule, RuleScope};
use relay_protocol::methods::call as m;

use crate::help;
use crate::terminal::outln;
use crate::views::print_json;
use crate::views::table::{age, Cell, Table};

#[derive(Subcommand)]
pub enum RuleCmd {
    /// List remembered decisions: what each decides, where it applies, how often it did.
    #[command(alias = "ls", after_help = help::RULE_LIST)]
    List(ListArgs),
    /// Show one remembered decision.
    #[command(
        after_help = "Examples:\n  relay rule show rul_01...\n  relay rule show rul_01... --json"
    )]
    Show {
        /// The rule's id (from `relay rule list`).
        id: String,
        /// Print JSON (machine-readable) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Remove a remembered decision: the next such request asks a person again.
    #[command(alias = "rm", after_help = "Example:\n  relay rule remove rul_01...")]
    Remove {
        /// The rule's id (from `relay rule list`).
        id: String,
        /// Print JSON (machine-readable) instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
pub struct ListArgs {
    /// Only the rules that apply to this agent now (its session's, its own, its
    /// project's and those for every agent).
    #[arg(long, value_name = "AGENT")]
    agent: Option<String>,
    /// Print JSON (machine-readable) instead of text.
    #[arg(long)]
    json: bool,
}

/// `relay rule list|show|remove`.
pub async fn run(client: &Client, cmd: RuleCmd) -> anyhow::Result<()> {
    match cmd {
        RuleCmd::List(ListArgs { agent, json }) => {
            let query = RulesQuery {
                agent: agent.clone(),
            };
            let rules: Vec<Rule> = client.call::<m::RuleList>(&[], &query).await?;
            if json {
                return print_json(&rules);
            }
            let empty = match &agent {
                Some(a) => format!("no remembered decision applies to {a}"),
                None => "no remembered decisions (`relay approval decide ID accept --remember agent` makes one)".to_string(),
            };
            rules_table(&rules).print(crate::terminal::width(), &empty);
        }
        RuleCmd::Show { id, json } => {
            let rule: Rule = client.call::<m::RuleShow>(&[&id], &Empty {}).await?;
            if json {
                return print_json(&rule);
            }
            for line in show_lines(&rule) {
                outln!("{line}");
            }
        }
        RuleCmd::Remove { id, json } => {
            let rule: Rule = client.call::<m::RuleRemove>(&[&id], &Empty {}).await?;
            if json {
                return print_json(&rule);
            }
            outln!(
                "removed {}: {} `{}` {}; such requests ask again",
                rule.id,
                rule.decision.as_str(),
                rule.pattern,
                scope_phrase(&rule)
            );
        }
    }
    Ok(())
}

/// The listing: the pattern last, cut with an ellipsis on a narrow terminal (`rule
/// show` has it whole), the least needed columns left out first.
fn rules_table(rules: &[Rule]) -> Table {
    let mut table = Table::new(&[
        "RULE", "DECISION", "KIND", "SCOPE", "ORIGIN", "MATCHED", "LAST", "PATTERN",
    ])
    .optional(&["ORIGIN", "LAST", "KIND", "SCOPE"]);
    for r in rules {
        table.row(vec![
            Cell::new(&r.id),
            Cell::state(r.decision.as_str()),
            Cell::new(kind(r)),
            Cell::new(scope_text(r)),
            Cell::dim(r.origin.as_deref().unwrap_or("-")),
            Cell::new(r.matched.to_string()),
            Cell::dim(r.last_matched_at.map(age).unwrap_or_else(|| "-".into())),
            Cell::new(&r.pattern),
        ]);
    }
    table
}

fn kind(r: &Rule) -> String {
    serde_json::to_value(r.kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// The scope and what it is bound to, short: `agent a1`, `session a1/thr_9`, `project
/// /src/app`, `everywhere`.
fn scope_text(r: &Rule) -> String {
    let agent = r.agent.as_deref().unwrap_or("?");
    match r.scope {
        RuleScope::Session => format!("session {agent}/{}", r.session.as_deref().unwrap_or("?")),
        RuleScope::Agent => format!("agent {agent}"),
        RuleScope::Project => format!("project {}", r.project.as_deref().unwrap_or("?")),
        RuleScope::Everywhere => "everywhere".into(),
    }
}

/// Where a rule applies, as a sentence ends: `for agent a1`, `for agent a1's session
/// thr_9`, `for the agents in /src/app`, `for every agent`.
pub fn scope_phrase(r: &Rule) -> String {
    let agent = r.agent.as_deref().unwrap_or("?");
    match r.scope {
        RuleScope::Session => format!(
            "for agent {agent}'s session {}",
            r.session.as_deref().unwrap_or("?")
        ),
        RuleScope::Agent => format!("for agent {agent}"),
        RuleScope::Project => format!("for the agents in {}", r.project.as_deref().unwrap_or("?")),
        RuleScope::Everywhere => "for every agent".into(),
    }
}

/// What `relay approval decide --remember` prints: `remembered as rule rul_...: accept
/// `cargo test` for agent a1`.
pub fn remembered_line(r: &Rule) -> String {
    format!(
        "remembered as rule {}: {} `{}` {}",
        r.id,
        r.decision.as_str(),
        r.pattern,
        scope_phrase(r)
    )
}

/// `relay rule show`'s lines.
fn show_lines(r: &Rule) -> Vec<String> {
    let mut lines = vec![
        format!("rule      {}", r.id),
        format!("decision  {}", r.decision.as_str()),
        format!("kind      {}", kind(r)),
        format!("pattern   {}", r.pattern),
        format!("scope     {}", r.scope),
    ];
    if let Some(a) = &r.agent {
        let role = match r.scope {
            RuleScope::Session | RuleScope::Agent => "",
            // For a wider scope the agent only says whose approval made it.
            RuleScope::Project | RuleScope::Everywhere => " (whose approval made it)",
        };
        lines.push(format!("agent     {a}{role}"));
    }
    if let Some(s) = &r.session {
        lines.push(format!("session   {s}"));
    }
    if let Some(p) = &r.project {
        lines.push(format!("project   {p}"));
    }
    lines.push(format!(
        "origin    {} (decided by {}, {})",
        r.origin.as_deref().unwrap_or("-"),
        r.created_by,
        age(r.created_at)
    ));
    let last = r
        .last_matched_at
        .map(|t| format!(", last {}", age(t)))
        .unwrap_or_default();
    lines.push(format!("matched   {} times{last}", r.matched));
    lines
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use relay_protocol::domain::{ApprovalDecision, ApprovalKind};

    fn rule(scope: RuleScope) -> Rule {
        Rule {
            id: "rul_1".into(),
            decision: ApprovalDecision::Accept,
            kind: ApprovalKind::Command,
            pattern: "cargo test".into(),
            scope,
            agent: Some("a1".into()),
            session: (scope == RuleScope::Session).then(|| "thr_9".into()),
            project: (scope == RuleScope::Project).then(|| "/src/app".into()),
            origin: Some("apr_1".into()),
            created_by: "operator".into(),
            created_at: relay_protocol::clock::now_ms(),
            matched: 2,
            last_matched_at: None,
        }
    }

    #[test]
    fn what_was_remembered_reads_as_a_sentence() {
        assert_eq!(
            remembered_line(&rule(RuleScope::Agent)),
            "remembered as rule rul_1: accept `cargo test` for agent a1"
        );
        assert_eq!(
            scope_phrase(&rule(RuleScope::Session)),
            "for agent a1's session thr_9"
        );
        assert_eq!(
            scope_phrase(&rule(RuleScope::Project)),
            "for the agents in /src/app"
        );
        assert_eq!(
            scope_phrase(&rule(RuleScope::Everywhere)),
            "for every agent"
        );
    }

    #[test]
    fn the_listing_has_every_column_and_cuts_the_pattern_on_a_narrow_terminal() {
        let mut long = rule(RuleScope::Session);
        long.pattern = format!("cargo test {}", "--package relay-broker ".repeat(6));
        let rules = vec![rule(RuleScope::Agent), long];
        let lines = rules_table(&rules).render(None);
        assert_eq!(
            lines[0],
            "RULE   DECISION  KIND     SCOPE             ORIGIN  MATCHED  LAST  PATTERN"
        );
        assert!(
            lines[1].starts_with(
                "rul_1  accept    command  agent a1          apr_1   2        -     cargo test"
            ),
            "{lines:#?}"
        );
        assert!(lines[2].contains("session a1/thr_9"), "{lines:#?}");
        // A pipe gets the pattern whole; a narrow terminal cuts it with an ellipsis
        // and leaves out what it can do without.
        assert!(lines[2].ends_with("--package relay-broker"), "{lines:#?}");
        let narrow = rules_table(&rules).render(Some(60));
        assert!(
            narrow.iter().all(|l| crate::terminal::columns(l) <= 60),
            "{narrow:#?}"
        );
        assert!(narrow[2].ends_with('…'), "{narrow:#?}");
        assert!(narrow[2].starts_with("rul_1"), "{narrow:#?}");
    }

    #[test]
    fn a_rule_shows_whole() {
        let lines = show_lines(&rule(RuleScope::Project)).join("\n");
        assert!(lines.contains("pattern   cargo test"), "{lines}");
        assert!(lines.contains("scope     project"), "{lines}");
        assert!(lines.contains("project   /src/app"), "{lines}");
        assert!(
            lines.contains("agent     a1 (whose approval made it)"),
            "{lines}"
        );
        assert!(
            lines.contains("origin    apr_1 (decided by operator, 0s ago)"),
            "{lines}"
        );
        assert!(lines.contains("matched   2 times"), "{lines}");
    }
}
