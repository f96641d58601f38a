//! `relay-instant-codex`: a stand-in for `codex app-server` that answers at once, for load
//! tests and benchmarks (it measures Relay, not a model).
//!
//! It speaks the same JSON-RPC lines as the real app-server (the types of
//! `relay_harnesses::codex::app_server`): `initialize`, `thread/start`, `thread/resume` (any id is
//! resumed, with no earlier turns), and `turn/start`, which it answers with the turn and
//! then, without waiting, `turn/started`, `item/started`, one `item/agentMessage/delta`
//! (`ok: <task>`), `item/completed` and `turn/completed`. `turn/steer` and
//! `turn/interrupt` are refused as "no active turn": a turn is over before either can
//! arrive.
//!
//! A task `stream:N:SIZE[:RATE]` (for the benchmarks, `relay-bench`) streams instead N
//! `item/agentMessage/delta` notifications of SIZE bytes each, at RATE per second if given
//! (else as fast as the pipe takes them), then `item/completed` with the whole text and a
//! `turn/completed` without items, as the real app-server sends it. Each delta starts with
//! the time it was written, in nanoseconds since the UNIX epoch (20 digits, then `.`s up
//! to SIZE; a SIZE under 20 cuts the timestamp), so that a subscriber on the same machine
//! can measure the latency of every delta. Nothing else is read while a stream runs.
//!
//! Two variables of its environment (an agent's `--env`) serve the chaos test
//! (`relay_tests::chaos`): `RELAY_INSTANT_CODEX_LOG=FILE` appends each task it receives
//! (one line, newlines as spaces, written before the turn is answered) to FILE, so a test
//! counts how many times each task really reached a harness; `RELAY_INSTANT_CODEX_TURN_MS=N`
//! holds each plain turn N ms after its delta before completing it, so invocations queue
//! behind a running turn. `RELAY_INSTANT_CODEX_STREAM_BARRIER=DIR:N` holds each stream
//! before its first delta until N processes have reached it (each makes a file in DIR),
//! so that several agents' streams surely run at once (the burst test of
//! `tests/long_answers.rs`).
//!
//! A task `write:PATH=TEXT` first writes TEXT (and a newline) to PATH, relative to its
//! working directory (an agent's worktree: the workspace tests), then answers as usual.
//!
//! Invoked as the agent's `--command`; the `app-server` argument is ignored.

use std::io::{BufRead, BufWriter, Write};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use relay_harnesses::codex::app_server::{
    error_code, method, notification, ErrorObject, ErrorResponse, InitializeResponse,
    KnownThreadItem, Message, Notification, Request, Response, Thread, ThreadItem, Turn,
    TurnStatus,
};
use relay_tests::load::STREAM_BARRIER_VAR;
use serde_json::{json, Value};

fn main() -> std::io::Result<()> {
    let stdin = std::io::stdin();
    let mut out = BufWriter::new(std::io::stdout().lock());
    let mut next_thread = 0u64;
    let mut next_turn = 0u64;
    let mut runs = RunLog::from_env()?;
    let hold = std::env::var(TURN_MS_VAR)
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map(Duration::from_millis);
    for line in stdin.lock().lines() {
        let line = line?;
        let Ok(Message::Request(req)) = serde_json::from_str::<Message>(&line) else {
            // Notifications (`initialized`) and answers need nothing back.
            continue;
        };
        match req.method.as_str() {
            method::INITIALIZE => respond(
                &mut out,
                &req,
                to_value(&InitializeResponse {
                    user_agent: "relay-instant-codex".into(),
                    codex_home: None,
                    platform_os: None,
                }),
            )?,
            method::THREAD_START | method::THREAD_RESUME => {
                let id = match param(&req, "threadId") {
                    Some(id) => id,
                    None => {
                        next_thread += 1;
                        format!("00000000-0000-4000-8000-{next_thread:012}")
                    }
                };
                let thread = Thread {
                    id,
                    path: None,
                    cwd: None,
                    preview: None,
                    turns: Vec::new(),
                };
                respond(&mut out, &req, json!({ "thread": to_value(&thread) }))?;
            }
            method::TURN_START => {
                next_turn += 1;
                let thread_id = param(&req, "threadId").unwrap_or_default();
                let turn_id = format!("turn-{next_turn}");
                let task = req
                    .params
                    .as_ref()
                    .and_then(|p| p["input"][0]["text"].as_str())
                    .unwrap_or_default()
                    .to_string();
                if let Some(runs) = &mut runs {
                    runs.record(&task)?;
                }
                if let Some((path, text)) =
                    task.strip_prefix("write:").and_then(|w| w.split_once('='))
                {
                    std::fs::write(path, format!("{text}\n"))?;
                }
                let turn = |status, items| Turn {
                    id: turn_id.clone(),
                    status,
                    items,
                    error: None,
                };
                respond(
                    &mut out,
                    &req,
                    json!({ "turn": to_value(&turn(TurnStatus::InProgress, vec![])) }),
                )?;
                let turn_note = |status, items| json!({ "threadId": thread_id, "turn": to_value(&turn(status, items)) });
                notify(
                    &mut out,
                    notification::TURN_STARTED,
                    turn_note(TurnStatus::InProgress, vec![]),
                )?;
                let item_id = format!("msg-{next_turn}");
                if let Some(stream) = Stream::parse(&task) {
                    out.flush()?;
                    stream_barrier()?;
                    stream.run(&mut out, &thread_id, &turn_id, &item_id)?;
                    out.flush()?;
                    continue;
                }
                let text = format!("ok: {task}");
                let item = |text: &str| {
                    ThreadItem::Known(KnownThreadItem::AgentMessage {
                        id: item_id.clone(),
                        text: text.to_string(),
                    })
                };
                let item_note = |text: &str| json!({ "threadId": thread_id, "turnId": turn_id, "item": to_value(&item(text)) });
                notify(&mut out, notification::ITEM_STARTED, item_note(""))?;
                notify(
                    &mut out,
                    notification::AGENT_MESSAGE_DELTA,
                    json!({ "threadId": thread_id, "turnId": turn_id, "itemId": item_id, "delta": text }),
                )?;
                if let Some(hold) = hold {
                    // The delta is seen while the turn is held: the flight is running.
                    out.flush()?;
                    std::thread::sleep(hold);
                }
                notify(&mut out, notification::ITEM_COMPLETED, item_note(&text))?;
                notify(
                    &mut out,
                    notification::TURN_COMPLETED,
                    turn_note(TurnStatus::Completed, vec![item(&text)]),
                )?;
            }
            other => {
                let message = match other {
                    method::TURN_STEER => "no active turn to steer".to_string(),
                    method::TURN_INTERRUPT => "no active turn to interrupt".to_string(),
                    _ => format!("unknown method {other}"),
                };
                write(
                    &mut out,
                    &Message::Error(ErrorResponse {
                        id: req.id.clone(),
                        error: ErrorObject {
                            code: error_code::INVALID_REQUEST,
                            message,
                            data: None,
                        },
                    }),
                )?;
            }
        }
        out.flush()?;
    }
    Ok(())
}

/// The variable naming the file each received task is appended to.
pub const LOG_VAR: &str = "RELAY_INSTANT_CODEX_LOG";
/// The variable holding each plain turn that many milliseconds.
pub const TURN_MS_VAR: &str = "RELAY_INSTANT_CODEX_TURN_MS";

/// Waits at the stream barrier ([`STREAM_BARRIER_VAR`], `DIR:N`), if set: this process's file made in
/// its directory, until the directory holds N files (checked each millisecond; after a
/// minute the stream goes on anyway: a process that never came is the test's failure to
/// report, not a reason to hang).
fn stream_barrier() -> std::io::Result<()> {
    let Some(spec) = std::env::var_os(STREAM_BARRIER_VAR) else {
        return Ok(());
    };
    let spec = spec.to_string_lossy();
    let Some((dir, n)) = spec
        .rsplit_once(':')
        .and_then(|(dir, n)| Some((std::path::PathBuf::from(dir), n.parse::<usize>().ok()?)))
    else {
        return Err(std::io::Error::other(format!(
            "{STREAM_BARRIER_VAR} is not DIR:N: {spec}"
        )));
    };
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(std::process::id().to_string()), b"")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::read_dir(&dir)?.count() < n && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// The file of [`LOG_VAR`], opened to append.
struct RunLog(std::fs::File);

impl RunLog {
    fn from_env() -> std::io::Result<Option<RunLog>> {
        let Some(path) = std::env::var_os(LOG_VAR) else {
            return Ok(None);
        };
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Some(RunLog(file)))
    }

    /// One `write` of the whole line: with O_APPEND, lines of several harness processes
    /// never interleave, and a line is in the file once the call returns (a `kill -9`
    /// after it does not lose it).
    fn record(&mut self, task: &str) -> std::io::Result<()> {
        let mut line = task.replace(['\n', '\r'], " ");
        line.push('\n');
        self.0.write_all(line.as_bytes())
    }
}

fn param(req: &Request, name: &str) -> Option<String> {
    req.params.as_ref()?[name].as_str().map(str::to_string)
}

fn to_value<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

fn respond(out: &mut impl Write, req: &Request, result: Value) -> std::io::Result<()> {
    write(
        out,
        &Message::Response(Response {
            id: req.id.clone(),
            result,
        }),
    )
}

fn notify(out: &mut impl Write, method: &str, params: Value) -> std::io::Result<()> {
    write(
        out,
        &Message::Notification(Notification {
            method: method.to_string(),
            params: Some(params),
        }),
    )
}

fn write(out: &mut impl Write, msg: &Message) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, msg)?;
    out.write_all(b"\n")
}

/// A `stream:N:SIZE[:RATE]` task (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Stream {
    deltas: u64,
    size: usize,
    /// Deltas per second; `None`: as fast as possible.
    rate: Option<f64>,
}

impl Stream {
    fn parse(task: &str) -> Option<Stream> {
        let mut parts = task.trim().strip_prefix("stream:")?.split(':');
        let deltas = parts.next()?.parse().ok()?;
        let size = parts.next()?.parse().ok()?;
        let rate = match parts.next() {
            Some(r) => Some(r.parse::<f64>().ok().filter(|r| *r > 0.0)?),
            None => None,
        };
        if parts.next().is_some() {
            return None;
        }
        Some(Stream { deltas, size, rate })
    }

    /// Everything after `item/started`: the deltas, `item/completed` with their whole
    /// text, `turn/completed`.
    fn run(
        &self,
        out: &mut impl Write,
        thread_id: &str,
        turn_id: &str,
        item_id: &str,
    ) -> std::io::Result<()> {
        let started = Instant::now();
        let mut all =
            String::with_capacity(self.size.saturating_mul(self.deltas as usize).min(1 << 26));
        for i in 0..self.deltas {
            if let Some(rate) = self.rate {
                // An absolute schedule: a late delta does not delay the ones after it.
                let due = started + Duration::from_secs_f64(i as f64 / rate);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
            let text = delta_text(self.size);
            write_delta(out, thread_id, turn_id, item_id, &text)?;
            all.push_str(&text);
            if self.rate.is_some() {
                // Paced deltas are timed one by one: none may wait in the buffer.
                out.flush()?;
            }
        }
        let item = ThreadItem::Known(KnownThreadItem::AgentMessage {
            id: item_id.to_string(),
            text: all,
        });
        notify(
            out,
            notification::ITEM_COMPLETED,
            json!({ "threadId": thread_id, "turnId": turn_id, "item": to_value(&item) }),
        )?;
        let turn = Turn {
            id: turn_id.to_string(),
            status: TurnStatus::Completed,
            items: Vec::new(),
            error: None,
        };
        notify(
            out,
            notification::TURN_COMPLETED,
            json!({ "threadId": thread_id, "turn": to_value(&turn) }),
        )
    }
}

/// An `item/agentMessage/delta` line, the bytes [`notify`] writes for it, made without a
/// `Value` of it first: the stand-in shares the benchmark's 2 cores with the broker it
/// measures, and building a map for each of 1,000,000 deltas took it over half a core.
fn write_delta(
    out: &mut impl Write,
    thread_id: &str,
    turn_id: &str,
    item_id: &str,
    delta: &str,
) -> std::io::Result<()> {
    // The keys in the order `json!`'s map writes them (sorted).
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Params<'a> {
        delta: &'a str,
        item_id: &'a str,
        thread_id: &'a str,
        turn_id: &'a str,
    }
    #[derive(serde::Serialize)]
    struct Line<'a> {
        method: &'a str,
        params: Params<'a>,
    }
    serde_json::to_writer(
        &mut *out,
        &Line {
            method: notification::AGENT_MESSAGE_DELTA,
            params: Params {
                delta,
                item_id,
                thread_id,
                turn_id,
            },
        },
    )?;
    out.write_all(b"\n")
}

/// SIZE bytes: the time now (nanoseconds since the UNIX epoch, 20 digits), then `.`s.
fn delta_text(size: usize) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut text = format!("{nanos:020}");
    text.truncate(size);
    while text.len() < size {
        text.push('.');
    }
    text
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn stream_tasks_parse_and_anything_else_is_a_plain_task() {
        assert_eq!(
            Stream::parse("stream:1000:32"),
            Some(Stream {
                deltas: 1000,
                size: 32,
                rate: None
            })
        );
        assert_eq!(
            Stream::parse("stream:10:64:1000"),
            Some(Stream {
                deltas: 10,
                size: 64,
                rate: Some(1000.0)
            })
        );
        for plain in [
            "load task 1",
            "stream:",
            "stream:x:32",
            "stream:1:2:0",
            "stream:1:2:3:4",
        ] {
            assert_eq!(Stream::parse(plain), None, "{plain}");
        }
    }

    #[test]
    fn a_delta_is_its_size_and_starts_with_the_time() {
        let text = delta_text(32);
        assert_eq!(text.len(), 32);
        let nanos: u128 = text[..20].parse().unwrap();
        assert!(nanos > 1_600_000_000_000_000_000);
        assert!(text[20..].chars().all(|c| c == '.'));
        assert_eq!(delta_text(8).len(), 8);
    }

    #[test]
    fn a_delta_is_written_as_the_notification_it_is() {
        let (mut fast, mut general) = (Vec::new(), Vec::new());
        let text = "t\u{e9}\"\n\\x";
        write_delta(&mut fast, "th", "t1", "m1", text).unwrap();
        notify(
            &mut general,
            notification::AGENT_MESSAGE_DELTA,
            json!({ "threadId": "th", "turnId": "t1", "itemId": "m1", "delta": text }),
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(fast).unwrap(),
            String::from_utf8(general).unwrap()
        );
    }

    #[test]
    fn a_stream_sends_its_deltas_then_the_whole_text_and_the_end_of_the_turn() {
        let mut out = Vec::new();
        Stream::parse("stream:3:25")
            .unwrap()
            .run(&mut out, "th", "t1", "m1")
            .unwrap();
        let lines: Vec<Value> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let methods: Vec<&str> = lines
            .iter()
            .map(|l| l["method"].as_str().unwrap())
            .collect();
        assert_eq!(
            methods,
            [
                notification::AGENT_MESSAGE_DELTA,
                notification::AGENT_MESSAGE_DELTA,
                notification::AGENT_MESSAGE_DELTA,
                notification::ITEM_COMPLETED,
                notification::TURN_COMPLETED,
            ]
        );
        let deltas: String = lines[..3]
            .iter()
            .map(|l| l["params"]["delta"].as_str().unwrap())
            .collect();
        assert_eq!(deltas.len(), 75);
        assert_eq!(lines[3]["params"]["item"]["text"], deltas);
        assert_eq!(lines[4]["params"]["turn"]["status"], "completed");
    }
}
