//! An approval that waits for a person must not wait unseen (agents left idle overnight
//! on a question nobody saw is the top complaint with the peers). When an approval is
//! recorded and no rule of its agent's policy decided it:
//!
//! - the user's `relay up --notify-command CMD` runs, once for that approval, in the
//!   background: `/bin/sh -c CMD` with `relay up`'s environment (so a desktop notifier
//!   finds the display) plus the approval's `RELAY_APPROVAL_ID`, `_AGENT`, `_FLIGHT`,
//!   `_KIND`, `_COMMAND` and `_REASON` (made inert: control characters and newlines
//!   escaped, [`relay_protocol::text::one_line`]) and `RELAY_DASHBOARD` (the page of
//!   approvals). The approval's text only ever reaches the command as variables, never
//!   as part of the command line. The command gets [`NOTIFY_DEADLINE`] to finish; then
//!   its process group is killed (and at a shutdown, as the plane's tasks end). What it
//!   prints is logged.
//! - the agent's `--approval-timeout SECS` starts: an approval still pending after it is
//!   declined, recorded as decided by `policy:timeout:<SECS>s`, like any decision (the
//!   harness gets the answer first). Without one, an approval waits for a person until
//!   its turn ends. The timeout's task ends as soon as the approval is decided.
//!
//! At most [`NOTIFY_POOL`] notify commands run at once: an approval that comes while they
//! all run waits, and when one ends, everything waiting by then goes to ONE command, its
//! variables those of the first approval waiting and `RELAY_APPROVAL_COUNT` (how many it
//! stands for, 1 for a command of its own), `RELAY_APPROVAL_IDS` (their ids, space
//! separated, the first [`BATCH_IDS`]) and `_COMMAND` saying how many more wait. A turn
//! raising 400 approvals thus starts a handful of commands, not 400.
//!
//! Neither survives a restart of the broker, and neither needs to: a restart ends the
//! turns that were waiting, and their approvals expire with them (`relay:restart`).

use std::collections::{HashSet, VecDeque};
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use relay_protocol::domain::{truncate_bytes, Approval};
use relay_protocol::text::one_line;
use tokio_util::sync::CancellationToken;

use crate::tasks::Tasks;

/// How long the notify command may run.
pub const NOTIFY_DEADLINE: Duration = Duration::from_secs(60);
/// Approvals remembered as notified (a report delivered twice notifies once).
const REMEMBERED: usize = 4096;
/// Most of the command's output that is logged.
const LOGGED_OUTPUT: usize = 2048;
/// Notify commands running at once, at most.
pub const NOTIFY_POOL: usize = 4;
/// Most approval ids one batched command names.
pub const BATCH_IDS: usize = 100;
/// Most approvals kept waiting for a batch (past that, only counted).
const WAITING: usize = 4096;

/// `relay up --notify-command`: what runs when an approval waits for a person.
#[derive(Clone)]
pub struct Notifier {
    command: Arc<str>,
    /// `http://127.0.0.1:PORT/#/approvals`
    dashboard: Arc<str>,
    notified: Arc<Mutex<Remembered>>,
    pool: Arc<Mutex<Pool>>,
}

/// The notify commands running, and the approvals waiting for one.
#[derive(Default)]
struct Pool {
    running: usize,
    waiting: Vec<Approval>,
    /// Waiting approvals past [`WAITING`], counted only.
    uncounted: usize,
}

#[derive(Default)]
struct Remembered {
    ids: HashSet<String>,
    order: VecDeque<String>,
}

impl Remembered {
    /// Whether `id` is new (and remember it).
    fn first(&mut self, id: &str) -> bool {
        if !self.ids.insert(id.to_string()) {
            return false;
        }
        self.order.push_back(id.to_string());
        if self.order.len() > REMEMBERED {
            if let Some(old) = self.order.pop_front() {
                self.ids.remove(&old);
            }
        }
        true
    }
}

impl Notifier {
    /// `command` runs with `sh -c`; `dashboard` is the broker's page (`http://HOST:PORT/`).
    pub fn new(command: &str, dashboard: &str) -> Notifier {
        Notifier {
            command: Arc::from(command),
            dashboard: Arc::from(format!("{}/#/approvals", dashboard.trim_end_matches('/'))),
            notified: Arc::default(),
            pool: Arc::default(),
        }
    }

    /// Runs the command for `approval` in the background, unless it ran for it already.
    pub fn approval_waits(&self, approval: &Approval, tasks: &Tasks) {
        let first = self
            .notified
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .first(&approval.id);
        if !first {
            return;
        }
        {
            let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
            if pool.running >= NOTIFY_POOL {
                if pool.waiting.len() < WAITING {
                    pool.waiting.push(approval.clone());
                } else {
                    pool.uncounted += 1;
                }
                return;
            }
            pool.running += 1;
        }
        // This slot runs the command, then whatever waits by then as one batch, until
        // nothing waits.
        let this = self.clone();
        let stop = tasks.stop_token().clone();
        let first = vec![approval.clone()];
        tasks.track(async move {
            let mut batch = (first, 0);
            loop {
                let (cmd, id) = this.command(&batch.0, batch.1);
                run(cmd, &id, &stop).await;
                let mut pool = this.pool.lock().unwrap_or_else(PoisonError::into_inner);
                if pool.waiting.is_empty() || stop.is_cancelled() {
                    pool.running -= 1;
                    return;
                }
                batch = (
                    std::mem::take(&mut pool.waiting),
                    std::mem::take(&mut pool.uncounted),
                );
            }
        });
    }

    /// The command for `batch` (not empty), and the approval id it is logged under:
    /// the first approval's variables, with the count and ids of all of them.
    fn command(&self, batch: &[Approval], uncounted: usize) -> (tokio::process::Command, String) {
        let approval = &batch[0];
        let count = batch.len() + uncounted;
        let mut detail = one_line(&approval.request.detail);
        if count > 1 {
            detail = format!("{detail} (and {} more approvals waiting)", count - 1);
        }
        let ids: Vec<&str> = batch
            .iter()
            .take(BATCH_IDS)
            .map(|a| a.id.as_str())
            .collect();
        let mut cmd = tokio::process::Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(&*self.command)
            .env_remove("RELAY_TOKEN")
            .env("RELAY_APPROVAL_ID", &approval.id)
            .env("RELAY_APPROVAL_AGENT", &approval.agent)
            .env("RELAY_APPROVAL_FLIGHT", &approval.request.flight)
            .env("RELAY_APPROVAL_KIND", approval.request.kind.to_string())
            .env("RELAY_APPROVAL_COMMAND", detail)
            .env(
                "RELAY_APPROVAL_REASON",
                one_line(approval.request.reason.as_deref().unwrap_or("")),
            )
            .env("RELAY_APPROVAL_COUNT", count.to_string())
            .env("RELAY_APPROVAL_IDS", ids.join(" "))
            .env("RELAY_DASHBOARD", &*self.dashboard)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        (cmd, approval.id.clone())
    }
}

/// Runs the notify command to its end or its deadline, and logs how it went.
async fn run(mut cmd: tokio::process::Command, approval: &str, stop: &CancellationToken) {
    let child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            tracing::warn!(%approval, error = %e, "the notify command did not start");
            return;
        }
    };
    let group = child.id();
    let waited = tokio::select! {
        waited = tokio::time::timeout(NOTIFY_DEADLINE, child.wait_with_output()) => {
            waited.map_err(|_| "at its deadline")
        }
        _ = stop.cancelled() => Err("at the shutdown"),
    };
    match waited {
        Ok(Ok(out)) => {
            let (stdout, stderr) = (logged(&out.stdout), logged(&out.stderr));
            if out.status.success() {
                tracing::info!(%approval, %stdout, %stderr, "notify command ran");
            } else {
                tracing::warn!(%approval, status = %out.status, %stdout, %stderr, "notify command failed");
            }
        }
        Ok(Err(e)) => tracing::warn!(%approval, error = %e, "notify command"),
        Err(when) => {
            // The shell is killed with its future; its children too, with the group.
            if let Some(pid) = group.and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
                let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            }
            tracing::warn!(%approval, deadline = ?NOTIFY_DEADLINE, "notify command killed {when}");
        }
    }
}

/// What the command printed, as logged: its first [`LOGGED_OUTPUT`] bytes (cut at a
/// character boundary), on one inert line.
fn logged(bytes: &[u8]) -> String {
    let mut text = String::from_utf8_lossy(bytes).into_owned();
    truncate_bytes(&mut text, LOGGED_OUTPUT);
    one_line(text.trim())
}

/// How every timeout's decider begins (`/metrics` tells them from other policies by it).
pub const TIMEOUT_DECIDER: &str = "policy:timeout:";

/// `policy:timeout:<SECS>s`: who an approval's timeout decides as.
pub fn timeout_decider(secs: u64) -> String {
    format!("{TIMEOUT_DECIDER}{secs}s")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_approval_is_notified_once_and_memory_is_bounded() {
        let mut r = Remembered::default();
        assert!(r.first("a"));
        assert!(!r.first("a"));
        for i in 0..REMEMBERED + 10 {
            r.first(&i.to_string());
        }
        assert_eq!(r.ids.len(), REMEMBERED);
        assert_eq!(r.order.len(), REMEMBERED);
        assert!(r.first("a"), "the oldest ids are forgotten first");
    }

    #[test]
    fn logged_output_is_cut_at_a_character_boundary() {
        // One byte short of the limit, then a 2-byte character across it.
        let printed = format!("{}é and more", "a".repeat(LOGGED_OUTPUT - 1));
        let line = logged(printed.as_bytes());
        assert_eq!(line, "a".repeat(LOGGED_OUTPUT - 1));
        assert_eq!(logged(b"  done\n\x1b[0m"), "done\\n\\x1b[0m");
    }
}
