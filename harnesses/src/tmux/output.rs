//! A pane's output, pushed: tmux's `pipe-pane` into a FIFO ([`OutputFifo`]), read as
//! the pane prints, rendered to plain text and sent to the running turn
//! ([`read_output`]), its program's bracketed paste mode followed ([`PasteModes`]); and
//! the state the reader shares with the session ([`Shared`]).

use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use relay_protocol::harness::HarnessEvent;
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, watch};

use super::client::Tmux;
use crate::error::HarnessError;
use crate::process::lock;

/// How many lines of the pane's rendered output a session keeps for its exit report.
const TAIL_LINES: usize = 40;

/// How many events the stream holds before the output reader waits for the runtime.
pub(super) const EVENT_CAPACITY: usize = 256;

/// How long the output reader waits for tmux's `cat` to open the FIFO.
const PIPE_OPEN: Duration = Duration::from_secs(10);

/// How long a pane's output must be quiet before it counts as ready for a task (a TUI
/// done drawing, a REPL showing its prompt).
pub(super) const READY_QUIET: Duration = Duration::from_millis(300);

/// What the session and its output reader share.
pub(super) struct Shared {
    /// The turn the pane's output belongs to.
    pub(super) turn: Mutex<Option<String>>,
    /// Taken by the reader once it has reported the pane's end.
    pub(super) events: Mutex<Option<mpsc::Sender<HarnessEvent>>>,
    /// The last lines of rendered output.
    pub(super) tail: Mutex<VecDeque<String>>,
    /// Bytes the pane has printed since it was followed.
    pub(super) printed: watch::Sender<u64>,
    /// Set once the reader has reported the pane's end.
    pub(super) gone: watch::Sender<bool>,
    /// Whether the pane's program has bracketed paste on (`CSI ? 2004 h`), as its output
    /// said; `None` when Relay has not seen it say (a pane it began to follow late).
    pub(super) bracketed: Mutex<Option<bool>>,
}

impl Shared {
    pub(super) fn sender(&self) -> Option<mpsc::Sender<HarnessEvent>> {
        lock(&self.events).clone()
    }

    pub(super) async fn emit(&self, event: HarnessEvent) {
        if let Some(events) = self.sender() {
            let _ = events.send(event).await;
        }
    }

    pub(super) fn tail(&self) -> String {
        lock(&self.tail)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Adds rendered `text` to the tail.
    pub(super) fn remember(&self, text: &str) {
        let mut tail = lock(&self.tail);
        let mut parts = text.split('\n');
        if let Some(first) = parts.next() {
            match tail.back_mut() {
                Some(last) => last.push_str(first),
                None => tail.push_back(first.to_string()),
            }
        }
        for line in parts {
            tail.push_back(line.to_string());
        }
        while tail.len() > TAIL_LINES {
            tail.pop_front();
        }
    }
}

/// A FIFO for a pane's output, in a directory of its own that only this user may enter
/// (0700: the pane's output may hold anything the agent printed). Both are removed once
/// the FIFO is open at both ends ([`open_fifo`]; the open ends work on) or when this is
/// dropped, so a Relay killed later leaves nothing behind.
pub(super) struct OutputFifo {
    dir: tempfile::TempDir,
    path: PathBuf,
}

impl OutputFifo {
    pub(super) fn new() -> Result<OutputFifo, HarnessError> {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::Builder::new()
            .prefix("relay-tmux-")
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir()?;
        let path = dir.path().join("output");
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            &path,
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
        )
        .map_err(std::io::Error::from)?;
        Ok(OutputFifo { dir, path })
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// The directory (for tests of its mode).
    #[cfg(test)]
    fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// Opens the FIFO for reading once tmux's `cat` has it open for writing: a reader opened
/// before any writer would see end of file at once, so the open blocks (on the blocking
/// pool) until the writer comes. If it never does, the open is released by opening the
/// write end here.
///
/// Open, the FIFO and its directory are removed: nothing opens them again.
pub(super) async fn open_fifo(output: OutputFifo) -> Result<pipe::Receiver, HarnessError> {
    let fifo = output.path.clone();
    let path = fifo.clone();
    let open = tokio::task::spawn_blocking(move || std::fs::File::open(path));
    match tokio::time::timeout(PIPE_OPEN, open).await {
        Ok(Ok(file)) => {
            let receiver = pipe::Receiver::from_file(file?)?;
            output.dir.close()?;
            Ok(receiver)
        }
        Ok(Err(join)) => Err(HarnessError::Io(std::io::Error::other(join))),
        Err(_) => {
            let _ = pipe::OpenOptions::new().open_sender(&fifo);
            Err(HarnessError::Tmux {
                command: "pipe-pane".into(),
                stderr: format!("the pane's output did not reach Relay within {PIPE_OPEN:?}"),
            })
        }
    }
}

/// What [`strip_ansi_escapes::Writer`] renders: the printable text and newlines.
#[derive(Clone, Default)]
struct Rendered(Arc<Mutex<Vec<u8>>>);

impl Write for Rendered {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        lock(&self.0).extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A pane's output rendered to plain text as it comes: one escape parser across chunks,
/// so a sequence split between two reads is still removed; bytes that are not UTF-8
/// become U+FFFD. Public for the fuzz targets (`tests/tests/fuzz`).
pub struct PaneText {
    rendered: Rendered,
    parser: strip_ansi_escapes::Writer<Rendered>,
}

impl Default for PaneText {
    fn default() -> Self {
        let rendered = Rendered::default();
        PaneText {
            parser: strip_ansi_escapes::Writer::new(rendered.clone()),
            rendered,
        }
    }
}

impl PaneText {
    /// The text of the next `bytes` the pane printed.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        let _ = self
            .parser
            .write_all(bytes)
            .and_then(|()| self.parser.flush());
        let bytes = std::mem::take(&mut *lock(&self.rendered.0));
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// Reads what the pane prints until tmux closes the pipe (the pane is gone): counts it
/// (delivery confirms by it), renders it to plain text (one escape parser across reads,
/// so a sequence split between two reads is still removed), and sends it to the running
/// turn as text deltas, at most one per `coalesce`. Then reports the pane's end.
pub(super) async fn read_output(
    mut output: pipe::Receiver,
    tmux: Tmux,
    pane: String,
    shared: Arc<Shared>,
    coalesce: Duration,
) {
    let mut text = PaneText::default();
    let mut buf = vec![0u8; 16 * 1024];
    let mut pending = String::new();
    let mut modes = PasteModes::default();
    let mut tick = tokio::time::interval(coalesce);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            read = output.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if let Some(on) = modes.scan(&buf[..n]) {
                        let changed = lock(&shared.bracketed).replace(on) != Some(on);
                        if changed {
                            if let Err(e) = tmux.set_bracketed_paste(&pane, on).await {
                                tracing::debug!(%pane, error = %e, "cannot remember the pane's paste mode");
                            }
                        }
                    }
                    shared.printed.send_modify(|printed| *printed += n as u64);
                    let text = text.push(&buf[..n]);
                    shared.remember(&text);
                    pending.push_str(&text);
                }
            },
            _ = tick.tick(), if !pending.is_empty() => send_output(&shared, &mut pending).await,
        }
    }
    send_output(&shared, &mut pending).await;
    let alive = tmux.pane_alive(&pane).await.unwrap_or(false);
    let why = if alive {
        format!("pane {pane} no longer sends its output to Relay")
    } else {
        format!("pane {pane} is gone")
    };
    let stderr_tail = format!("{why}; its last output:\n{}", shared.tail());
    // Taken: the stream ends once the session's own clones are dropped.
    let events = lock(&shared.events).take();
    if let Some(events) = events {
        let _ = events
            .send(HarnessEvent::ProcessExited {
                code: None,
                signal: None,
                stderr_tail,
            })
            .await;
    }
    shared.gone.send_replace(true);
}

/// Follows a pane program's bracketed paste mode through its output, across reads: `CSI
/// ? Pm h` turns it on and `CSI ? Pm l` off when a parameter is 2004; a reset (`ESC c`)
/// turns it off. Anything else is passed over.
#[derive(Debug, Default)]
pub(super) struct PasteModes {
    state: Scan,
    /// The parameters of the private mode sequence being read (digits and `;`).
    params: Vec<u8>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Scan {
    #[default]
    Text,
    Escape,
    Csi,
    Private,
}

/// The longest parameter list followed; a longer one is not a mode Relay cares for.
const MAX_PARAMS: usize = 64;

/// The bracketed paste mode's number.
const BRACKETED_PASTE: &[u8] = b"2004";

impl PasteModes {
    /// Scans `bytes`: the mode as the last sequence in them that set it left it, if one
    /// did.
    pub(super) fn scan(&mut self, bytes: &[u8]) -> Option<bool> {
        let mut last = None;
        for &b in bytes {
            self.state = match (self.state, b) {
                (_, 0x1b) => Scan::Escape,
                (Scan::Escape, b'[') => Scan::Csi,
                (Scan::Escape, b'c') => {
                    last = Some(false);
                    Scan::Text
                }
                (Scan::Csi, b'?') => {
                    self.params.clear();
                    Scan::Private
                }
                (Scan::Private, b'0'..=b'9' | b';') if self.params.len() < MAX_PARAMS => {
                    self.params.push(b);
                    Scan::Private
                }
                (Scan::Private, b'h' | b'l') => {
                    if self
                        .params
                        .split(|&p| p == b';')
                        .any(|p| p == BRACKETED_PASTE)
                    {
                        last = Some(b == b'h');
                    }
                    Scan::Text
                }
                _ => Scan::Text,
            };
        }
        last
    }
}

/// Sends `pending` to the running turn, if one runs; else it is only in the tail.
async fn send_output(shared: &Shared, pending: &mut String) {
    let text = std::mem::take(pending);
    let turn = lock(&shared.turn).clone();
    if let (Some(turn_id), false) = (turn, text.is_empty()) {
        shared
            .emit(HarnessEvent::TextDelta {
                item_id: format!("{turn_id}-pane"),
                turn_id,
                delta: text,
            })
            .await;
    }
}

/// Waits until the pane's output has been quiet for [`READY_QUIET`], or `deadline`, or
/// (with `busy`) until it has printed without a pause for that long.
pub(super) async fn settle(
    printed: &mut watch::Receiver<u64>,
    deadline: tokio::time::Instant,
    busy: Option<Duration>,
) {
    let busy_until = busy.map(|b| tokio::time::Instant::now() + b);
    loop {
        let now = tokio::time::Instant::now();
        if now >= deadline || busy_until.is_some_and(|b| now >= b) {
            return;
        }
        match tokio::time::timeout(READY_QUIET, printed.changed()).await {
            Ok(Ok(())) => continue,
            Ok(Err(_)) | Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_paste_mode_is_followed_across_reads_and_among_other_modes() {
        let mut modes = PasteModes::default();
        assert_eq!(modes.scan(b"plain text, no modes"), None);
        assert_eq!(modes.scan(b"\x1b[?2004h> "), Some(true));
        assert_eq!(modes.scan(b"\x1b[?20"), None);
        assert_eq!(modes.scan(b"04l"), Some(false));
        assert_eq!(modes.scan(b"\x1b[?1049;2004h\x1b[?25l"), Some(true));
        assert_eq!(modes.scan(b"\x1bc"), Some(false));
        // Not the mode: another one, a non-private sequence, a longer number.
        assert_eq!(modes.scan(b"\x1b[?1004h\x1b[2004h\x1b[?20040h"), None);
        assert_eq!(modes.scan(b"\x1b[?2004h\x1b[?2004l"), Some(false));
    }

    #[test]
    fn the_fifo_directory_is_private_and_goes_with_it() {
        use std::os::unix::fs::PermissionsExt;
        let fifo = OutputFifo::new().unwrap();
        let dir = fifo.dir().to_path_buf();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        drop(fifo);
        assert!(!dir.exists());
    }
}
