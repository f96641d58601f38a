//! Remembered decisions: the rule a decision with `--remember SCOPE [--any-arg N]`
//! becomes, which remembered rules apply to an agent now, and which one decides a request.
//! Pure functions: the broker's `ops` builds the rule before the harness is answered (a
//! request that cannot be remembered exactly is refused and stays pending), and the
//! plane's policy step looks rules up with them.
//!
//! A command is remembered as the argument list it runs ([`command_argv`]: the same
//! canonical split and shell unwrapping as `--auto-accept`), written back word by word
//! with shell quoting; a word that would read as a pattern (`*`, `**`) cannot be
//! remembered. `--any-arg N` puts `*` (any plain argument) at argument N, and only where
//! the person saw a plain argument. The rule matches the WHOLE list, for an accept and a
//! decline alike, so it never takes more than what the person saw. A file change is
//! remembered as its request's detail, exactly (what each harness names there: Claude
//! Code the path, Codex and ACP agents their description of the change), and matches
//! only that same detail. Other requests cannot be remembered.

use relay_protocol::domain::{
    Agent, Approval, ApprovalDecision, ApprovalKind, Harness, Remember, Rule as Remembered,
    RuleScope,
};

use super::{command_argv, plain_argument, Rule, Word};

/// Why a command cannot be remembered when its text is not in canonical form.
pub const NOT_CANONICAL: &str =
    "this command cannot be remembered exactly: its text is not in canonical form";

/// The pattern a remembered decision of `approval` gets (see the module docs).
pub fn remembered_pattern(approval: &Approval, any_arg: Option<u32>) -> Result<String, String> {
    let detail = &approval.request.detail;
    match approval.request.kind {
        ApprovalKind::Command => command_pattern(detail, any_arg),
        ApprovalKind::FileChange if any_arg.is_some() => Err(
            "--any-arg generalises a command's argument; a file change is remembered exactly"
                .into(),
        ),
        ApprovalKind::FileChange if detail.trim().is_empty() => {
            Err("this file change cannot be remembered: its request names no file".into())
        }
        ApprovalKind::FileChange => Ok(detail.clone()),
        ApprovalKind::Other => Err(
            "only a command or a file change can be remembered; this request (other) asks a person each time"
                .into(),
        ),
    }
}

fn command_pattern(detail: &str, any_arg: Option<u32>) -> Result<String, String> {
    let argv = command_argv(detail).ok_or(NOT_CANONICAL)?;
    if let Some(w) = argv.iter().find(|w| *w == "*" || *w == "**") {
        return Err(format!(
            "this command cannot be remembered exactly: its argument {w:?} would read as a pattern"
        ));
    }
    let at = match any_arg {
        None => None,
        Some(0) => {
            return Err(
                "--any-arg counts from 1 (the first argument after the program): the program is never generalised"
                    .into(),
            )
        }
        Some(n) => {
            let i = n as usize;
            let Some(word) = argv.get(i) else {
                return Err(format!(
                    "--any-arg {n}: the command has {} argument(s) after its program",
                    argv.len() - 1
                ));
            };
            if !plain_argument(word) {
                return Err(format!(
                    "--any-arg {n}: {word:?} is not a plain argument (an option, `+toolchain`, `@file` or `NAME=value` is never generalised)"
                ));
            }
            Some(i)
        }
    };
    let mut words = Vec::with_capacity(argv.len());
    let mut expected = Vec::with_capacity(argv.len());
    for (i, w) in argv.iter().enumerate() {
        if Some(i) == at {
            words.push("*".to_string());
            expected.push(Word::One);
        } else {
            words.push(
                shlex::try_quote(w)
                    .map_err(|_| NOT_CANONICAL.to_string())?
                    .into_owned(),
            );
            expected.push(Word::Literal(w.clone()));
        }
    }
    let pattern = words.join(" ");
    // It must read back as exactly these words, and match the list the person saw.
    let rule = Rule::parse(&pattern)
        .map_err(|e| format!("this command cannot be remembered exactly: {e}"))?;
    if rule.words != expected || !rule.matches(&argv, true) {
        return Err(format!(
            "this command cannot be remembered exactly: {pattern:?} does not read back as it"
        ));
    }
    Ok(pattern)
}

/// The session a session-scoped rule of `agent` is tied to: its thread, else its
/// harness session.
pub fn current_session(agent: &Agent) -> Option<&str> {
    agent.thread_id.as_deref().or(agent.session_id.as_deref())
}

/// The rule a person's decision with `remember` becomes (its id, time and counters are
/// the writer's to fill in), or why it cannot be remembered.
pub fn remembered_rule(
    approval: &Approval,
    agent: &Agent,
    decision: ApprovalDecision,
    remember: Remember,
    decided_by: &str,
) -> Result<Remembered, String> {
    let decision = match decision {
        ApprovalDecision::Accept | ApprovalDecision::AcceptForSession => ApprovalDecision::Accept,
        ApprovalDecision::Decline => ApprovalDecision::Decline,
        ApprovalDecision::Cancel => {
            return Err("only accept and decline can be remembered (cancel ends the turn)".into())
        }
    };
    let pattern = remembered_pattern(approval, remember.any_arg)?;
    let name = agent.spec.name.clone();
    let (session, project) = match remember.scope {
        RuleScope::Session => match current_session(agent) {
            Some(s) => (Some(s.to_string()), None),
            None => {
                return Err(format!(
                    "agent {name:?} has no session yet, so nothing can be remembered for its session; remember it for the agent instead"
                ))
            }
        },
        RuleScope::Project => (None, Some(agent.spec.cwd.clone())),
        RuleScope::Agent | RuleScope::Everywhere => (None, None),
    };
    Ok(Remembered {
        id: String::new(),
        decision,
        kind: approval.request.kind,
        pattern,
        scope: remember.scope,
        agent: Some(name),
        session,
        project,
        origin: Some(approval.id.clone()),
        created_by: decided_by.to_string(),
        created_at: 0,
        matched: 0,
        last_matched_at: None,
    })
}

/// Whether `rule` applies to `agent` now (its scope).
pub fn applies(rule: &Remembered, agent: &Agent) -> bool {
    let same_agent = rule.agent.as_deref() == Some(agent.spec.name.as_str());
    match rule.scope {
        RuleScope::Session => {
            same_agent
                && rule.session.is_some()
                && rule.session.as_deref() == current_session(agent)
        }
        RuleScope::Agent => same_agent,
        RuleScope::Project => rule.project.as_deref() == Some(agent.spec.cwd.as_str()),
        RuleScope::Everywhere => true,
    }
}

/// Whether `rule` matches `approval`'s request (kind and pattern; not its scope).
pub fn matches(rule: &Remembered, approval: &Approval) -> bool {
    if rule.kind != approval.request.kind {
        return false;
    }
    match rule.kind {
        ApprovalKind::Command => command_argv(&approval.request.detail)
            .is_some_and(|argv| Rule::parse(&rule.pattern).is_ok_and(|r| r.matches(&argv, true))),
        ApprovalKind::FileChange => rule.pattern == approval.request.detail,
        ApprovalKind::Other => false,
    }
}

/// The rule that decides `approval` of `agent`, of `rules`: declines before accepts,
/// then the narrowest scope (session, agent, project, everywhere), then the oldest.
pub fn deciding<'a>(
    rules: &'a [Remembered],
    agent: &Agent,
    approval: &Approval,
) -> Option<&'a Remembered> {
    let scope_rank = |s: RuleScope| match s {
        RuleScope::Session => 0,
        RuleScope::Agent => 1,
        RuleScope::Project => 2,
        RuleScope::Everywhere => 3,
    };
    rules
        .iter()
        .filter(|r| applies(r, agent) && matches(r, approval))
        .min_by(|a, b| {
            let key = |r: &Remembered| {
                (
                    r.decision != ApprovalDecision::Decline,
                    scope_rank(r.scope),
                    r.created_at,
                )
            };
            key(a).cmp(&key(b)).then_with(|| a.id.cmp(&b.id))
        })
}

/// The answer a harness gets for `decision` (see the table in the module docs of
/// [`super`]): `session_rule` when the decision was remembered, or matched, by an
/// accept rule of scope `session`.
pub fn harness_answer(
    harness: Harness,
    decision: ApprovalDecision,
    session_rule: bool,
) -> ApprovalDecision {
    match decision {
        ApprovalDecision::Accept | ApprovalDecision::AcceptForSession
            if session_rule && harness == Harness::CodexAppServer =>
        {
            ApprovalDecision::AcceptForSession
        }
        // No harness-side "always" without the Relay rule that records it.
        ApprovalDecision::AcceptForSession => ApprovalDecision::Accept,
        d => d,
    }
}

#[cfg(test)]
mod tests;
