//! A small typed client of one tmux server: each method runs one `tmux -L SOCKET ...`
//! command and turns its failure into [`HarnessError::Tmux`].
//!
//! The `tmux` client starts from a clean environment, like every agent process
//! ([`crate::process::inherited_env`]): when it is the one that starts the server, the
//! server (and so every pane's base environment) holds none of Relay's secrets. A server
//! Relay starts reads no configuration file (`-f /dev/null`), so a user's `~/.tmux.conf`
//! cannot change how panes behave under Relay (key bindings, `remain-on-exit`); a server
//! that already runs keeps its own.
//!
//! Panes are named by their id (`%3`), which tmux never reuses while the server lives;
//! a `session:window.pane` target would follow whatever pane holds that place now.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;

use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use crate::error::HarnessError;

/// The program run for every command.
const TMUX: &str = "tmux";

/// One tmux server, reached by its socket name (`tmux -L NAME`) or path (`tmux -S
/// PATH`, when it holds a `/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tmux {
    socket: String,
}

/// What to start in a new detached session.
#[derive(Debug, Clone)]
pub struct NewSession<'a> {
    /// The session's name (tmux refuses `.` and `:` in it).
    pub name: &'a str,
    /// The program and its arguments, run directly (no shell in between).
    pub command: &'a [String],
    /// Variables set in the pane's environment, over the server's.
    pub env: &'a BTreeMap<String, String>,
    pub cwd: Option<&'a Path>,
    /// Columns and rows.
    pub size: (u16, u16),
    /// Where the pane's output goes (a FIFO), piped before the pane can print anything.
    pub output: Option<&'a Path>,
}

impl Tmux {
    pub fn new(socket: impl Into<String>) -> Tmux {
        Tmux {
            socket: socket.into(),
        }
    }

    /// The socket name (`-L`).
    pub fn socket(&self) -> &str {
        &self.socket
    }

    /// Runs `tmux -L SOCKET ARGS`, with `input` on its stdin, and returns its stdout.
    async fn run(&self, args: &[&str], input: Option<&[u8]>) -> Result<String, HarnessError> {
        self.run_with_path(args, input, None).await
    }

    /// [`run`](Self::run) with `PATH` set to `path` in the client's environment, when
    /// given.
    async fn run_with_path(
        &self,
        args: &[&str],
        input: Option<&[u8]>,
        path: Option<&str>,
    ) -> Result<String, HarnessError> {
        let command = args.first().copied().unwrap_or_default().to_string();
        let mut cmd = Command::new(TMUX);
        cmd.args(relay_protocol::domain::tmux_socket_args(&self.socket))
            .arg("-f")
            .arg("/dev/null")
            .args(args)
            .env_clear()
            .envs(crate::process::inherited_env())
            .envs(path.map(|p| ("PATH", p)))
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|source| HarnessError::Spawn {
            program: TMUX.to_string(),
            source,
        })?;
        if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
            stdin.write_all(input).await?;
            // Dropped: tmux reads to end of file.
        }
        let out = child.wait_with_output().await?;
        if !out.status.success() {
            return Err(HarnessError::Tmux {
                command,
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Starts `new` in a detached session (starting the server if need be) and returns
    /// its pane's id.
    ///
    /// The command goes to tmux on stdin (`start-server ; source-file -`), not on the
    /// client's command line: the pane's variables include the agent's token and
    /// secrets, and a command line is readable by every process of the machine.
    ///
    /// In the same script, before tmux reads anything the pane prints: its output is
    /// piped to `new.output` ([`pipe_output`](Self::pipe_output)), so Relay sees it
    /// from the first byte (a program turning bracketed paste on at once included); and
    /// the variables are removed from the session's environment, which tmux fills from
    /// `-e` and which any process reaching the server could read back
    /// (`show-environment`) — a program in the pane whose own environment was scrubbed
    /// (a sandboxed tool call) included. The pane's process keeps them; a window a person
    /// opens in the session later does not get them.
    pub async fn new_session(&self, new: &NewSession<'_>) -> Result<String, HarnessError> {
        let mut words = vec![
            "new-session".to_string(),
            "-d".into(),
            "-P".into(),
            "-F".into(),
            quote("#{pane_id}"),
            "-s".into(),
            quote(new.name),
            "-x".into(),
            new.size.0.to_string(),
            "-y".into(),
            new.size.1.to_string(),
        ];
        if let Some(cwd) = new.cwd {
            words.extend(["-c".into(), quote(&cwd.display().to_string())]);
        }
        for (name, value) in new.env {
            words.extend(["-e".into(), quote(&format!("{name}={value}"))]);
        }
        words.push("--".into());
        words.extend(new.command.iter().map(|word| quote(word)));
        let mut line = words.join(" ") + "\n";
        let session = quote(&format!("={}", new.name));
        if let Some(output) = new.output {
            let target = quote(&format!("={}:", new.name));
            let shell = quote(&pipe_command(output)?);
            line.push_str(&format!("pipe-pane -O -t {target} {shell}\n"));
        }
        for name in new.env.keys() {
            line.push_str(&format!(
                "set-environment -u -t {session} {}\n",
                quote(name)
            ));
        }
        // A new session's first process gets the client's PATH, whatever `-e` says.
        let path = new.env.get("PATH").map(String::as_str);
        let pane = self
            .run_with_path(
                &["start-server", ";", "source-file", "-"],
                Some(line.as_bytes()),
                path,
            )
            .await
            .map_err(|e| match e {
                HarnessError::Tmux { stderr, .. } => HarnessError::Tmux {
                    command: "new-session".into(),
                    stderr,
                },
                other => other,
            })?
            .trim()
            .to_string();
        if !pane.starts_with('%') {
            return Err(HarnessError::Tmux {
                command: "new-session".into(),
                stderr: format!("no pane id in its answer: {pane:?}"),
            });
        }
        Ok(pane)
    }

    /// Whether `pane` exists and its program runs. `false` when the server is gone too.
    pub async fn pane_alive(&self, pane: &str) -> Result<bool, HarnessError> {
        // `display -t %N` of a missing pane falls back to another one; a listing does not.
        let listed = match self
            .run(&["list-panes", "-a", "-F", "#{pane_id} #{pane_dead}"], None)
            .await
        {
            Ok(listed) => listed,
            Err(HarnessError::Tmux { stderr, .. }) if no_server(&stderr) => return Ok(false),
            Err(e) => return Err(e),
        };
        Ok(listed
            .lines()
            .any(|line| line.split_once(' ') == Some((pane, "0"))))
    }

    /// Pastes `text` into `pane` as one bracketed paste: loaded from stdin into the
    /// named `buffer` (no length limit on a command line, nothing in `ps`), then
    /// `paste-buffer -p -d` (bracketed when the program asked for it; the buffer is
    /// deleted after).
    pub async fn paste(&self, pane: &str, buffer: &str, text: &str) -> Result<(), HarnessError> {
        self.run(&["load-buffer", "-b", buffer, "-"], Some(text.as_bytes()))
            .await?;
        self.run(
            &["paste-buffer", "-p", "-d", "-b", buffer, "-t", pane],
            None,
        )
        .await?;
        Ok(())
    }

    /// Sends `keys` (tmux key names: `Enter`, `C-c`) to `pane`.
    pub async fn send_keys(&self, pane: &str, keys: &[&str]) -> Result<(), HarnessError> {
        let mut args = vec!["send-keys", "-t", pane];
        args.extend(keys);
        self.run(&args, None).await.map(drop)
    }

    /// The pane's visible text, lines joined, without escape codes.
    pub async fn capture(&self, pane: &str) -> Result<String, HarnessError> {
        self.run(&["capture-pane", "-p", "-J", "-t", pane], None)
            .await
    }

    /// The pane's visible text, then its cursor's place (`x,y`) on a last line: what a
    /// person sees change when a line-based program takes a line (the cursor moves on,
    /// the text may not).
    pub async fn screen(&self, pane: &str) -> Result<String, HarnessError> {
        self.run(
            &[
                "capture-pane",
                "-p",
                "-J",
                "-t",
                pane,
                ";",
                "display-message",
                "-p",
                "-t",
                pane,
                "#{cursor_x},#{cursor_y}",
            ],
            None,
        )
        .await
    }

    /// The pane's visible text and up to `history` lines above it, lines joined, without
    /// escape codes.
    pub async fn capture_history(&self, pane: &str, history: u32) -> Result<String, HarnessError> {
        let start = format!("-{history}");
        self.run(
            &["capture-pane", "-p", "-J", "-S", &start, "-t", pane],
            None,
        )
        .await
    }

    /// The id of the live pane `target` names: a pane id (`%3`) or `session:window.pane`;
    /// `None` when there is no such pane, it is dead, or no server runs.
    pub async fn find_pane(&self, target: &str) -> Result<Option<String>, HarnessError> {
        let format = "#{pane_id} #{session_name}:#{window_index}.#{pane_index} #{pane_dead}";
        let listed = match self.run(&["list-panes", "-a", "-F", format], None).await {
            Ok(listed) => listed,
            Err(HarnessError::Tmux { stderr, .. }) if no_server(&stderr) => return Ok(None),
            Err(e) => return Err(e),
        };
        Ok(listed.lines().find_map(|line| {
            let mut words = line.rsplitn(3, ' ');
            let (dead, address, id) = (words.next()?, words.next()?, words.next()?);
            (dead == "0" && (id == target || address == target)).then(|| id.to_string())
        }))
    }

    /// The first pane of session `name` and whether its program has ended; `None` when
    /// there is no such session.
    pub async fn session_pane(&self, name: &str) -> Result<Option<(String, bool)>, HarnessError> {
        let exact = format!("={name}");
        match self
            .run(
                &[
                    "list-panes",
                    "-s",
                    "-t",
                    &exact,
                    "-F",
                    "#{pane_id} #{pane_dead}",
                ],
                None,
            )
            .await
        {
            Ok(listed) => Ok(listed.lines().next().and_then(|line| {
                let (id, dead) = line.split_once(' ')?;
                Some((id.to_string(), dead == "1"))
            })),
            Err(HarnessError::Tmux { stderr, .. })
                if no_server(&stderr)
                    || stderr.contains("can't find")
                    || stderr.contains("no current target") =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Stops sending `pane`'s output anywhere (ends the `pipe-pane` command).
    pub async fn stop_pipe(&self, pane: &str) -> Result<(), HarnessError> {
        self.run(&["pipe-pane", "-t", pane], None).await.map(drop)
    }

    /// Streams what `pane` prints from now on into the FIFO (or file) at `path`, through
    /// a `cat` tmux runs; tmux closes it when the pane is gone.
    pub async fn pipe_output(&self, pane: &str, path: &Path) -> Result<(), HarnessError> {
        let shell = pipe_command(path)?;
        self.run(&["pipe-pane", "-O", "-t", pane, &shell], None)
            .await
            .map(drop)
    }

    /// Remembers on `pane` (a user option, `@relay_bracketed_paste`) whether its program
    /// has bracketed paste on, as Relay saw it: a Relay that restarts and adopts the pane
    /// reads it back ([`bracketed_paste`](Self::bracketed_paste)), since tmux 3.3 shows
    /// the mode in no format.
    pub async fn set_bracketed_paste(&self, pane: &str, on: bool) -> Result<(), HarnessError> {
        let value = if on { "1" } else { "0" };
        self.run(
            &["set-option", "-p", "-t", pane, BRACKETED_OPTION, value],
            None,
        )
        .await
        .map(drop)
    }

    /// What [`set_bracketed_paste`](Self::set_bracketed_paste) remembered on `pane`:
    /// `None` when nothing was.
    pub async fn bracketed_paste(&self, pane: &str) -> Result<Option<bool>, HarnessError> {
        let value = self
            .run(
                &[
                    "show-options",
                    "-p",
                    "-q",
                    "-v",
                    "-t",
                    pane,
                    BRACKETED_OPTION,
                ],
                None,
            )
            .await?;
        Ok(match value.trim() {
            "1" => Some(true),
            "0" => Some(false),
            _ => None,
        })
    }

    /// Ends the session that holds `pane` (its programs get SIGHUP).
    pub async fn kill_session_of(&self, pane: &str) -> Result<(), HarnessError> {
        self.run(&["kill-session", "-t", pane], None)
            .await
            .map(drop)
    }

    /// Ends the server and every pane on it.
    pub async fn kill_server(&self) -> Result<(), HarnessError> {
        match self.run(&["kill-server"], None).await {
            Err(HarnessError::Tmux { stderr, .. }) if no_server(&stderr) => Ok(()),
            other => other.map(drop),
        }
    }
}

/// The pane option in which Relay remembers whether a pane's program has bracketed
/// paste on.
const BRACKETED_OPTION: &str = "@relay_bracketed_paste";

/// The shell command `pipe-pane` runs to send a pane's output to the FIFO at `path`.
fn pipe_command(path: &Path) -> Result<String, HarnessError> {
    let path = path.display().to_string();
    let quoted = shlex::try_quote(&path).map_err(|_| HarnessError::Tmux {
        command: "pipe-pane".into(),
        stderr: format!("cannot quote {path:?} for the shell"),
    })?;
    Ok(format!("exec cat > {quoted}"))
}

/// `word` as one word of tmux's command language, taken literally: in single quotes
/// (no `$`, `~` or `\\` expansion there), with a quote as `'\\''` and a line break as
/// `"\\n"` / `"\\r"` between quoted parts (tmux joins adjacent parts into one word).
fn quote(word: &str) -> String {
    let mut quoted = String::with_capacity(word.len() + 2);
    quoted.push('\'');
    for c in word.chars() {
        match c {
            '\'' => quoted.push_str(r"'\''"),
            '\n' => quoted.push_str(r#"'"\n"'"#),
            '\r' => quoted.push_str(r#"'"\r"'"#),
            c => quoted.push(c),
        }
    }
    quoted.push('\'');
    quoted
}

/// Whether tmux said no server runs on the socket, or the one there was ending (an
/// agent's own server exits with its last session: a client that reached it just then
/// says it "exited unexpectedly").
fn no_server(stderr: &str) -> bool {
    stderr.contains("no server running")
        || stderr.contains("error connecting to")
        || stderr.contains("server exited unexpectedly")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_word_is_quoted_whole_and_literal() {
        assert_eq!(quote("plain"), "'plain'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote("a\nb\rc"), r#"'a'"\n"'b'"\r"'c'"#);
        assert_eq!(quote("$HOME ~ #{x} ; \\"), r"'$HOME ~ #{x} ; \'");
    }
}
