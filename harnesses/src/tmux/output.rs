//! A pane's output, pushed: tmux's `pipe-pane` into a FIFO, read as the pane prints,
//! rendered to plain text and sent to the running turn ([`read_output`]); and the state
//! the reader shares with the session ([`Shared`]).

use std::collections::VecDeque;
use std::io::Write;
use std::path::PathBuf;
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

/// Opens the FIFO for reading once tmux's `cat` has it open for writing: a reader opened
/// before any writer would see end of file at once, so the open blocks (on the blocking
/// pool) until the writer comes. If it never does, the open is released by opening the
/// write end here.
pub(super) async fn open_fifo(fifo: PathBuf) -> Result<pipe::Receiver, HarnessError> {
    let path = fifo.clone();
    let open = tokio::task::spawn_blocking(move || std::fs::File::open(path));
    match tokio::time::timeout(PIPE_OPEN, open).await {
        Ok(Ok(file)) => Ok(pipe::Receiver::from_file(file?)?),
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
    dir: tempfile::TempDir,
    tmux: Tmux,
    pane: String,
    shared: Arc<Shared>,
    coalesce: Duration,
) {
    let mut text = PaneText::default();
    let mut buf = vec![0u8; 16 * 1024];
    let mut pending = String::new();
    let mut tick = tokio::time::interval(coalesce);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            read = output.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => {
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
    drop(dir);
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
