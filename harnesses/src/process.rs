//! Child process supervision, shared by every adapter that drives a CLI over pipes.
//!
//! [`Supervised::spawn`] starts the program in its own process group (so the agent's own
//! children, shells and tools, can be signalled together) with stdin and stdout piped
//! for the protocol, and stderr drained by a task into a [`StderrTail`] ring of the last
//! [`STDERR_TAIL_LINES`] lines for error reports (read by a [`crate::lines::LineReader`]
//! that cuts a long line as it arrives, and stripped of terminal escapes). The adapter's owner task races its
//! protocol loop against [`Supervised::wait`], then calls [`Supervised::finish`] or
//! [`Supervised::terminate`] to get an [`ExitInfo`].
//!
//! No process is leaked: `terminate` sends SIGTERM to the whole group, waits a grace
//! period, then SIGKILLs the group's tree; `finish` SIGKILLs whatever is left of the tree
//! after the leader exited on its own; and dropping a [`Supervised`] that was not reaped
//! this way SIGKILLs the tree synchronously (tokio's `kill_on_drop` alone would only reach
//! the leader).
//!
//! "The tree" is the group plus every descendant of its members found through `/proc`
//! parent links: agents start commands in sessions of their own (Codex runs each command
//! under `setsid`), which a group signal does not reach. Every child also carries a
//! marker in its environment ([`MARKER_ENV`]) that its descendants inherit, so one whose
//! parent died first (reparented away, no longer traceable by parent links) is still
//! found. The tree is frozen (SIGSTOP) before it is killed, so nothing forks or leaves
//! the group mid-sweep. Only a descendant that both left the group and cleared its
//! environment can escape, after its parent died.
//!
//! A child does not inherit Relay's environment, which holds the broker's secrets (API
//! and NATS tokens, cloud keys, the data dir that leads to the operator token): it starts
//! from an empty one, gets the few variables of [`INHERITED_ENV`] (and `LC_*`) that are
//! set in Relay's, then the agent's own [`ProcessSpec::env`], then [`MARKER_ENV`].

use std::collections::{BTreeMap, VecDeque};
use std::ffi::OsStr;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rustix::process::{kill_process, kill_process_group, Pid, Signal};
use tokio::io::{AsyncRead, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::task::JoinHandle;

use crate::error::HarnessError;
use crate::lines::{LineReader, Overflow};

/// How many stderr lines [`StderrTail`] keeps.
pub const STDERR_TAIL_LINES: usize = 50;
/// Longer stderr lines are cut to this many bytes as they arrive, the rest discarded (a
/// stray binary dump must neither bloat error reports nor Relay's memory).
const STDERR_LINE_MAX: usize = 2000;
/// After the leader exits, how long to wait for stderr to reach EOF before reporting
/// (a grandchild may hold the pipe open).
const STDERR_DRAIN: Duration = Duration::from_millis(500);

/// The environment variable that marks a supervised child and its descendants; its value
/// names the child (`<relay pid>-<counter>`).
pub const MARKER_ENV: &str = "RELAY_SUPERVISED";

/// The variables of Relay's own environment that a child inherits, when set, besides
/// every `LC_*`: what a CLI (and the shells and tools it runs) needs to find programs,
/// its home and config dirs, the user, locale, terminal, time zone, a temp dir and TLS
/// roots. Nothing else passes: no `RELAY_*` (tokens, URL, data dir), no cloud or model
/// keys, no proxies (their URLs may carry credentials). An agent that needs more gets it
/// from its own [`ProcessSpec::env`].
pub const INHERITED_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "TERM",
    "TZ",
    "TMPDIR",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_STATE_HOME",
    "XDG_CACHE_HOME",
    "XDG_RUNTIME_DIR",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    // Where the Rust toolchain lives when not under HOME (the official Docker images).
    "CARGO_HOME",
    "RUSTUP_HOME",
    // Hosts that bypass a proxy (no credentials; the proxies themselves may hold some,
    // so they come only from an agent's own `--env`).
    "NO_PROXY",
    "no_proxy",
];

/// `mutex` locked, even if a thread panicked holding it: what it guards (a child's
/// handle, a stderr tail) stays usable, and a panic elsewhere must not stop a session.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The agent's working directory exists and is a directory. Blocking (a `stat`).
pub fn check_cwd(cwd: &std::path::Path) -> Result<(), HarnessError> {
    let problem = match std::fs::metadata(cwd) {
        Ok(m) if m.is_dir() => return Ok(()),
        Ok(_) => "is not a directory".to_string(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "does not exist".to_string(),
        Err(e) => format!("cannot be read: {e}"),
    };
    Err(HarnessError::Cwd {
        cwd: cwd.display().to_string(),
        problem,
    })
}

/// Whether a child inherits Relay's variable `name`; see [`INHERITED_ENV`].
fn inherited(name: &OsStr) -> bool {
    name.to_str()
        .is_some_and(|name| name.starts_with("LC_") || INHERITED_ENV.contains(&name))
}

/// The variables of Relay's environment a child inherits ([`INHERITED_ENV`], `LC_*`):
/// the whole environment of a program Relay runs besides the agent's own.
pub(crate) fn inherited_env() -> impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)> {
    std::env::vars_os().filter(|(name, _)| inherited(name))
}

/// What to run. Its `Debug` names the variables but never shows their values (an
/// agent's secrets are among them).
#[derive(Clone, Default)]
pub struct ProcessSpec {
    pub program: PathBuf,
    pub args: Vec<String>,
    /// The agent's own variables: set after the few inherited from Relay
    /// ([`INHERITED_ENV`]), which they override.
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
}

impl std::fmt::Debug for ProcessSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessSpec")
            .field("program", &self.program)
            .field("args", &self.args)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("cwd", &self.cwd)
            .finish()
    }
}

/// How a child ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitInfo {
    /// Exit code, or `None` when killed by a signal.
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// The last lines of stderr, oldest first.
    pub stderr_tail: String,
}

impl ExitInfo {
    pub fn to_error(&self) -> HarnessError {
        HarnessError::ProcessExited {
            code: self.code,
            signal: self.signal,
            stderr_tail: self.stderr_tail.clone(),
        }
    }
}

/// The last [`STDERR_TAIL_LINES`] lines a child wrote on stderr. Cheap to clone; the
/// drain task and the session handle share it.
#[derive(Debug, Clone, Default)]
pub struct StderrTail(Arc<Mutex<VecDeque<String>>>);

/// `line` as a person would have read it on a terminal, and inert: escape sequences
/// (CSI, OSC, DCS and the other strings, with their payloads) are removed by
/// `strip-ansi-escapes` (a `vte` parser), and so is every control character left, tabs
/// excepted (they become spaces).
pub(crate) fn strip_ansi(line: &str) -> String {
    // The parser knows the 7-bit forms of escape sequences; a C1 control (U+0080..U+009F)
    // is the same control as ESC followed by it minus 0x40 (ECMA-48), so `\u{9b}` opens a
    // CSI like `ESC [`. The parser drops tabs; they separate words, so keep a space.
    let mut seven_bit = String::with_capacity(line.len());
    for c in line.chars() {
        match u32::from(c) {
            c1 @ 0x80..=0x9f => {
                seven_bit.push('\x1b');
                seven_bit.extend(char::from_u32(c1 - 0x40));
            }
            0x09 => seven_bit.push(' '),
            _ => seven_bit.push(c),
        }
    }
    strip_ansi_escapes::strip_str(&seven_bit)
        .chars()
        .filter(|c| !c.is_control())
        .collect()
}

impl StderrTail {
    /// Adds a line, marked `…` when it was `cut`.
    fn push(&self, line: String, cut: bool) {
        let mut line = if line.contains(char::is_control) {
            strip_ansi(&line)
        } else {
            line
        };
        if cut {
            line.push('…');
        }
        let mut lines = lock(&self.0);
        if lines.len() == STDERR_TAIL_LINES {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    /// The lines joined with `\n`.
    pub fn snapshot(&self) -> String {
        let lines = lock(&self.0);
        lines
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The protocol pipes of a spawned child.
pub struct Pipes {
    pub stdin: ChildStdin,
    pub stdout: ChildStdout,
}

/// A running child in its own process group. See the module docs.
pub struct Supervised {
    child: Child,
    pid: u32,
    program: String,
    stderr: StderrTail,
    stderr_task: Option<JoinHandle<()>>,
    /// `MARKER_ENV=<value>`, as it appears in `/proc/<pid>/environ` of the tree.
    marker: Vec<u8>,
    /// `false` once the group has been SIGKILLed after the leader was reaped: nothing is
    /// left to kill, and the pgid may be reused by an unrelated process.
    group_live: bool,
}

impl Supervised {
    pub fn spawn(spec: &ProcessSpec) -> Result<(Supervised, Pipes), HarnessError> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let program = spec.program.display().to_string();
        let marker = format!(
            "{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .env_clear()
            .envs(inherited_env())
            .envs(&spec.env)
            .env(MARKER_ENV, &marker)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own group: the agent's children get signalled with it, and a Ctrl-C
            // meant for Relay's terminal does not reach the agent directly.
            .process_group(0)
            .kill_on_drop(true);
        if let Some(cwd) = &spec.cwd {
            cmd.current_dir(cwd);
        }
        let mut child = cmd.spawn().map_err(|source| {
            // exec's ENOENT names no file: a missing directory reads as a missing
            // program ("cannot start .../codex: No such file or directory").
            match &spec.cwd {
                Some(cwd) if source.kind() == io::ErrorKind::NotFound => match check_cwd(cwd) {
                    Err(e) => e,
                    Ok(()) => HarnessError::Spawn {
                        program: program.clone(),
                        source,
                    },
                },
                _ => HarnessError::Spawn {
                    program: program.clone(),
                    source,
                },
            }
        })?;
        let (Some(pid), Some(stdin), Some(stdout), Some(stderr)) = (
            child.id(),
            child.stdin.take(),
            child.stdout.take(),
            child.stderr.take(),
        ) else {
            // Only possible if the child was already reaped, which nothing did yet.
            return Err(HarnessError::Spawn {
                program,
                source: io::Error::other("child has no pid or pipes right after spawn"),
            });
        };
        let tail = StderrTail::default();
        let stderr_task = tokio::spawn(drain_stderr(stderr, tail.clone(), program.clone()));
        tracing::debug!(pid, %program, "spawned child");
        Ok((
            Supervised {
                child,
                pid,
                program,
                stderr: tail,
                stderr_task: Some(stderr_task),
                marker: format!("{MARKER_ENV}={marker}").into_bytes(),
                group_live: true,
            },
            Pipes { stdin, stdout },
        ))
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn stderr_tail(&self) -> StderrTail {
        self.stderr.clone()
    }

    /// Waits for the leader to exit. Cancel-safe: race it in a `select!`.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        self.child.wait().await
    }

    /// After the leader exited with `status`: kills what is left of its group, waits
    /// briefly for the stderr drain, and reports.
    pub async fn finish(&mut self, status: ExitStatus) -> ExitInfo {
        self.kill_group_remains();
        if let Some(task) = self.stderr_task.take() {
            // A grandchild holding stderr open must not stall the report.
            let _ = tokio::time::timeout(STDERR_DRAIN, task).await;
        }
        let info = ExitInfo {
            code: status.code(),
            signal: status.signal(),
            stderr_tail: self.stderr.snapshot(),
        };
        tracing::debug!(pid = self.pid, program = %self.program, ?info.code, ?info.signal, "child exited");
        info
    }

    /// Stops the child: SIGTERM to the group, `grace` to exit, then SIGKILL to the group.
    pub async fn terminate(&mut self, grace: Duration) -> ExitInfo {
        if let Ok(Some(status)) = self.child.try_wait() {
            return self.finish(status).await;
        }
        signal_group(self.pid, Signal::TERM);
        let status = match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(Ok(status)) => Some(status),
            Ok(Err(err)) => {
                tracing::warn!(pid = self.pid, %err, "wait on child failed");
                None
            }
            Err(_) => None,
        };
        let status = match status {
            Some(status) => status,
            None => {
                tracing::warn!(pid = self.pid, program = %self.program, "child ignored SIGTERM; killing its group");
                kill_tree(self.pid, &self.marker);
                match self.child.wait().await {
                    Ok(status) => status,
                    // Reaped elsewhere or not waitable: report it as killed.
                    Err(_) => ExitStatus::from_raw(Signal::KILL.as_raw()),
                }
            }
        };
        self.finish(status).await
    }

    /// The leader is gone; SIGKILL its tree in case children outlived it, once.
    fn kill_group_remains(&mut self) {
        if self.group_live {
            kill_tree(self.pid, &self.marker);
            self.group_live = false;
        }
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        // Dropped without `finish`/`terminate` (a runtime shutting down, a panic): the
        // leader may still run. SIGKILL the whole tree now; `kill_on_drop` then reaps.
        if self.group_live {
            kill_tree(self.pid, &self.marker);
        }
        if let Some(task) = self.stderr_task.take() {
            task.abort();
        }
    }
}

/// How many times [`kill_tree`] rescans for processes forked while it froze the tree.
const FREEZE_ROUNDS: usize = 8;

/// SIGKILLs group `pgid` and every descendant of its members, wherever they live.
///
/// The tree is frozen first: SIGSTOP to the group, then to every member and descendant
/// found through `/proc`, rescanning until a scan finds nothing new. A stopped process
/// can neither fork nor call `setsid`, so nothing escapes between the scan and the kill
/// (a child that left the group just after a single scan would otherwise survive both a
/// group kill and a kill of the descendants listed before it left). Every process found
/// is then SIGKILLed by pid, and the group as a whole. Descendants are listed while their
/// parents still live: once a parent dies its children are reparented and untraceable.
fn kill_tree(pgid: u32, marker: &[u8]) {
    signal(pgid, Signal::STOP, true);
    let mut frozen: Vec<u32> = Vec::new();
    for _ in 0..FREEZE_ROUNDS {
        let fresh: Vec<u32> = tree(pgid, marker)
            .into_iter()
            .filter(|pid| !frozen.contains(pid))
            .collect();
        if fresh.is_empty() {
            break;
        }
        for &pid in &fresh {
            signal(pid, Signal::STOP, false);
        }
        frozen.extend(fresh);
    }
    for &pid in &frozen {
        signal(pid, Signal::KILL, false);
    }
    signal(pgid, Signal::KILL, true);
}

/// Sends `sig` to process `pid`, or to process group `pid` when `group`. Errors (ESRCH:
/// already gone) are expected and ignored.
fn signal(pid: u32, sig: Signal, group: bool) {
    // 0 and 1 would mean our own group, or every process: never.
    let Some(target) = i32::try_from(pid)
        .ok()
        .filter(|p| *p > 1)
        .and_then(Pid::from_raw)
    else {
        return;
    };
    let sent = if group {
        kill_process_group(target, sig)
    } else {
        kill_process(target, sig)
    };
    if let Err(err) = sent {
        tracing::trace!(pid, sig = sig.as_raw(), group, %err, "signal");
    }
}

fn signal_group(pgid: u32, sig: Signal) {
    signal(pgid, sig, true);
}

/// Live members of group `pgid`, every live descendant of theirs in or out of the group,
/// and every live process whose environment holds `marker` (`MARKER_ENV=<value>`), from
/// `/proc` (empty where there is no `/proc`).
fn tree(pgid: u32, marker: &[u8]) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    // (pid, ppid, pgrp) of every live process.
    let mut procs = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid pgrp ...`; comm may contain spaces and parentheses.
        let Some(rest) = stat.rsplit_once(')').map(|(_, rest)| rest) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let (Some(&state), Some(ppid), Some(pgrp)) = (
            fields.first(),
            fields.get(1).and_then(|f| f.parse::<u32>().ok()),
            fields.get(2).and_then(|f| f.parse::<u32>().ok()),
        ) else {
            continue;
        };
        if state != "Z" {
            procs.push((pid, ppid, pgrp));
        }
    }
    let marked = |pid: u32| {
        std::fs::read(format!("/proc/{pid}/environ"))
            .is_ok_and(|env| env.split(|&b| b == 0).any(|var| var == marker))
    };
    let mut found: Vec<u32> = procs
        .iter()
        .filter(|p| p.2 == pgid || marked(p.0))
        .map(|p| p.0)
        .collect();
    let mut frontier = found.clone();
    while let Some(parent) = frontier.pop() {
        for &(pid, ppid, _) in &procs {
            if ppid == parent && !found.contains(&pid) {
                found.push(pid);
                frontier.push(pid);
            }
        }
    }
    found
}

async fn drain_stderr<R: AsyncRead + Unpin>(stderr: R, tail: StderrTail, program: String) {
    let mut lines = LineReader::new(BufReader::new(stderr), STDERR_LINE_MAX, Overflow::Truncate);
    loop {
        match lines.read_line().await {
            Ok(false) => return,
            Ok(true) => {
                let line = lines.line();
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                let line = if lines.truncated() {
                    whole_chars(line)
                } else {
                    line
                };
                let line = String::from_utf8_lossy(line);
                tracing::trace!(%program, "stderr: {line}");
                tail.push(line.into_owned(), lines.truncated());
            }
            Err(err) => {
                tracing::debug!(%program, %err, "stderr read failed");
                return;
            }
        }
    }
}

/// `bytes` without the start of a UTF-8 character that a cut left at its end.
fn whole_chars(bytes: &[u8]) -> &[u8] {
    match std::str::from_utf8(bytes) {
        // `error_len() == None`: the input ended inside a character.
        Err(err) if err.error_len().is_none() => &bytes[..err.valid_up_to()],
        _ => bytes,
    }
}

#[cfg(test)]
mod tests;
