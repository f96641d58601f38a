//! The processes the tests start and watch, read from `/proc` in one place: whether a pid
//! is alive, the members of a process group, a process's children, the processes running
//! one command line (or naming a path in one), a process's resident memory, and signals.
//!
//! A zombie (exited, not yet reaped by its parent) counts as gone everywhere: it runs
//! nothing and holds nothing but its `/proc` entry.

pub use rustix::process::Signal;
use rustix::process::{kill_process, kill_process_group, Pid};
use std::time::Duration;

use crate::wait::try_wait_until;

/// What the tests read of `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub pid: u32,
    /// `R`, `S`, `T`, `Z`...
    pub state: char,
    pub ppid: u32,
    /// The process group.
    pub pgrp: u32,
}

impl Stat {
    pub fn is_zombie(&self) -> bool {
        self.state == 'Z'
    }
}

/// `pid (comm) state ppid pgrp ...`; `comm` may hold spaces and parentheses, so the fields
/// are read after its last `)`.
fn parse_stat(pid: u32, text: &str) -> Option<Stat> {
    let (_, rest) = text.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some(Stat {
        pid,
        state,
        ppid,
        pgrp,
    })
}

/// The process `pid`, if it exists (zombies included).
pub fn stat(pid: u32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(pid, &text)
}

/// True while `pid` has an entry in `/proc`: running, or a zombie not yet reaped.
pub fn exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// True while `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    stat(pid).is_some_and(|s| !s.is_zombie())
}

/// Every live (non-zombie) process.
pub fn live() -> Vec<Stat> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(stat)
        .filter(|s| !s.is_zombie())
        .collect()
}

/// Live processes of process group `pgid`: a supervised agent child leads its own group,
/// so this is the child and everything it started there.
pub fn group_members(pgid: u32) -> Vec<u32> {
    live_where(|s| s.pgrp == pgid)
}

/// Live children of `pid`.
pub fn children(pid: u32) -> Vec<u32> {
    live_where(|s| s.ppid == pid)
}

fn live_where(keep: impl Fn(&Stat) -> bool) -> Vec<u32> {
    live().into_iter().filter(keep).map(|s| s.pid).collect()
}

/// The command line of `pid`, one string per argument.
pub fn cmdline(pid: u32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    // Each argument ends with a NUL.
    let Some(args) = raw.strip_suffix(&[0]) else {
        return Some(Vec::new());
    };
    Some(
        args.split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
    )
}

/// Live processes whose command line is exactly `argv`.
pub fn running(argv: &[&str]) -> Vec<u32> {
    live_running(|c| c == argv)
}

/// Live processes with an argument that contains `needle` (a directory of the test's own
/// that every process of a fixture names, say).
pub fn mentioning(needle: &str) -> Vec<u32> {
    live_running(|c| c.iter().any(|a| a.contains(needle)))
}

fn live_running(keep: impl Fn(&[String]) -> bool) -> Vec<u32> {
    live_where(|s| cmdline(s.pid).is_some_and(|c| keep(&c)))
}

/// The resident memory of `pid` (`VmRSS`), in bytes.
pub fn rss_bytes(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|l| l.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .ok_or_else(|| anyhow::anyhow!("no VmRSS in /proc/{pid}/status"))?;
    Ok(kb * 1024)
}

/// Sends `sig` to `pid`; a negative `pid` is a process group, as with kill(2). A pid
/// that is gone, 0, or does not fit is ignored.
pub fn signal(pid: impl TryInto<i32>, sig: Signal) {
    let Ok(pid) = pid.try_into() else {
        return;
    };
    let _ = match Pid::from_raw(pid.saturating_abs()) {
        Some(p) if pid < 0 => kill_process_group(p, sig),
        Some(p) => kill_process(p, sig),
        None => return,
    };
}

/// Waits until `pid` is gone (or a zombie); `false` if it still runs after `within`.
pub async fn wait_gone(pid: u32, within: Duration) -> bool {
    try_wait_until(format!("process {pid} to end"), within, || async {
        (!alive(pid)).then_some(())
    })
    .await
    .is_ok()
}

/// Waits until no live process is left in group `pgid`; fails naming the ones left.
pub async fn wait_group_gone(pgid: u32, within: Duration) {
    crate::wait::wait_until(
        format!("process group {pgid} to be empty"),
        within,
        || async {
            let left = group_members(pgid);
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("{left:?} still in it"))
            }
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn stat_is_read_after_the_last_parenthesis_of_the_command_name() {
        assert_eq!(
            parse_stat(7, "7 (a) b (c)) Z 1 42 42 0 -1"),
            Some(Stat {
                pid: 7,
                state: 'Z',
                ppid: 1,
                pgrp: 42
            })
        );
        assert_eq!(parse_stat(7, "7 (cut"), None);
        assert_eq!(parse_stat(7, "7 (x) S one 2"), None);
    }

    #[tokio::test]
    async fn a_child_is_seen_alive_in_its_group_and_gone_once_reaped() {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("sleep")
            .args(["30.5"])
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = child.id();
        let me = std::process::id();
        assert!(alive(pid));
        assert_eq!(stat(pid).map(|s| (s.ppid, s.pgrp)), Some((me, pid)));
        assert_eq!(group_members(pid), vec![pid]);
        assert!(children(me).contains(&pid));
        assert!(running(&["sleep", "30.5"]).contains(&pid));
        assert!(mentioning("30.5").contains(&pid));
        assert!(!mentioning("no process has this argument 30.5").contains(&pid));
        assert!(rss_bytes(pid).unwrap() > 0);
        signal(pid, Signal::KILL);
        // Dead but not reaped: a zombie, already gone for these helpers.
        assert!(wait_gone(pid, Duration::from_secs(30)).await);
        wait_group_gone(pid, Duration::from_secs(30)).await;
        assert!(exists(pid), "a zombie until reaped");
        child.wait().unwrap();
        assert!(!exists(pid));
    }
}
