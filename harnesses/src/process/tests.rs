//! Unit tests of process supervision: the environment, the stderr tail, killing the group.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use relay_tests::procs::{self, alive};
use relay_tests::wait_until;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use super::*;

fn sh(script: &str) -> ProcessSpec {
    ProcessSpec {
        program: "/bin/sh".into(),
        args: vec!["-c".into(), script.into()],
        ..Default::default()
    }
}

/// Waits (bounded) until `pid` is gone: reaped, or a zombie.
async fn gone(pid: u32) -> bool {
    procs::wait_gone(pid, Duration::from_secs(20)).await
}

#[test]
fn escape_sequences_are_stripped() {
    assert_eq!(
        strip_ansi("\x1b[2m2026-11-22\x1b[0m \x1b[31mERROR\x1b[0m codex: boom"),
        "2026-11-22 ERROR codex: boom"
    );
    assert_eq!(strip_ansi("\x1b]0;title\x07plain \x1b(Bx"), "plain x");
    assert_eq!(strip_ansi("no escapes"), "no escapes");
    assert_eq!(strip_ansi("cut at the end \x1b["), "cut at the end ");
    // DCS (sixel here), with its payload, up to ST.
    assert_eq!(
        strip_ansi("before \x1bPq#0;2;0;0;0#1!14@\x1b\\after"),
        "before after"
    );
    assert_eq!(strip_ansi("a\x1bP1$rpayload\x1b\\b"), "ab");
    // OSC ended by ST (a hyperlink) rather than BEL.
    assert_eq!(
        strip_ansi("\x1b]8;;http://example.invalid\x1b\\link\x1b]8;;\x1b\\ text"),
        "link text"
    );
    // APC, PM and SOS strings.
    assert_eq!(
        strip_ansi("1\x1b_apc\x1b\\2\x1b^pm\x1b\\3\x1bXsos\x1b\\4"),
        "1234"
    );
    // 8-bit C1 controls: CSI, DCS ... ST, NEL.
    assert_eq!(strip_ansi("\u{9b}31mred\u{9b}0m plain"), "red plain");
    assert_eq!(strip_ansi("\u{90}payload\u{9c}after\u{85}"), "after");
    // Whatever control is left (CR, BEL, BS, DEL) is dropped; a tab becomes a space.
    assert_eq!(strip_ansi("a\rb\x07c\x08d\x7fe\tf"), "abcde f");
    assert_eq!(strip_ansi("é ü 日本"), "é ü 日本");
}

#[test]
fn only_allow_listed_variables_are_inherited() {
    for name in [
        "PATH",
        "HOME",
        "LANG",
        "LC_ALL",
        "LC_CTYPE",
        "TMPDIR",
        "SSL_CERT_FILE",
    ] {
        assert!(inherited(OsStr::new(name)), "{name}");
    }
    for name in [
        "RELAY_TOKEN",
        "RELAY_URL",
        "RELAY_DATA_DIR",
        "RELAY_NATS_REQUEST_TOKEN",
        MARKER_ENV,
        "AWS_SECRET_ACCESS_KEY",
        "OPENAI_API_KEY",
        "HTTPS_PROXY",
        "LD_PRELOAD",
        "path",
        "PATHX",
    ] {
        assert!(!inherited(OsStr::new(name)), "{name}");
    }
}

#[tokio::test]
async fn stderr_tail_keeps_the_last_lines() {
    let (mut p, _pipes) = Supervised::spawn(&sh(
        "for i in $(seq 1 60); do echo line$i >&2; done; exit 3",
    ))
    .unwrap();
    let status = p.wait().await.unwrap();
    let info = p.finish(status).await;
    assert_eq!(info.code, Some(3));
    assert_eq!(info.signal, None);
    let lines: Vec<&str> = info.stderr_tail.lines().collect();
    assert_eq!(lines.len(), STDERR_TAIL_LINES);
    assert_eq!(lines.first(), Some(&"line11"));
    assert_eq!(lines.last(), Some(&"line60"));
}

#[tokio::test]
async fn an_endless_stderr_line_is_kept_cut_as_it_arrives() {
    let (mut child, stderr) = tokio::io::duplex(64 * 1024);
    let tail = StderrTail::default();
    let drain = tokio::spawn(drain_stderr(stderr, tail.clone(), "test".into()));
    // 64 MiB and no newline. Each write returns once the drain has taken all but the
    // pipe's 64 KiB: by the last, the drain has gone far past the bound.
    let chunk = vec![b'x'; 1 << 20];
    for _ in 0..64 {
        child.write_all(&chunk).await.unwrap();
    }
    let cut = format!("{}…", "x".repeat(STDERR_LINE_MAX));
    let now = tail.snapshot();
    assert!(now == cut, "the tail holds {} bytes", now.len());
    child.write_all(b"\nshort\n").await.unwrap();
    drop(child);
    drain.await.unwrap();
    assert_eq!(tail.snapshot(), format!("{cut}\nshort"));
}

#[tokio::test]
async fn a_64_mib_stderr_line_is_cut_and_the_next_line_kept() {
    let (mut p, _pipes) = Supervised::spawn(&sh(
        "head -c 67108864 /dev/zero | tr '\\0' x >&2; printf '\\nshort\\n' >&2",
    ))
    .unwrap();
    let status = p.wait().await.unwrap();
    let info = p.finish(status).await;
    assert_eq!(info.code, Some(0));
    let tail = info.stderr_tail;
    let expected = format!("{}…\nshort", "x".repeat(STDERR_LINE_MAX));
    assert!(tail == expected, "the tail holds {} bytes", tail.len());
}

#[tokio::test]
async fn a_cut_inside_a_character_keeps_whole_characters() {
    let (mut child, stderr) = tokio::io::duplex(64 * 1024);
    let tail = StderrTail::default();
    let drain = tokio::spawn(drain_stderr(stderr, tail.clone(), "test".into()));
    // 'é' is two bytes: the bound falls between them.
    let line = format!("{}{}\n", "a".repeat(STDERR_LINE_MAX - 1), "é".repeat(10));
    child.write_all(line.as_bytes()).await.unwrap();
    drop(child);
    drain.await.unwrap();
    assert_eq!(
        tail.snapshot(),
        format!("{}…", "a".repeat(STDERR_LINE_MAX - 1))
    );
}

#[tokio::test]
async fn terminate_kills_the_whole_group() {
    // The leader ignores SIGTERM and has a child in the same group.
    let (mut p, mut pipes) =
        Supervised::spawn(&sh("trap '' TERM; sleep 30 & echo $!; wait")).unwrap();
    let mut out = BufReader::new(&mut pipes.stdout);
    let mut line = String::new();
    out.read_line(&mut line).await.unwrap();
    let grandchild: u32 = line.trim().parse().unwrap();
    assert!(alive(grandchild));
    let info = p.terminate(Duration::from_millis(200)).await;
    assert_eq!(info.signal, Some(Signal::KILL.as_raw()));
    // The grandchild was reparented: it is gone once init has reaped it.
    assert!(gone(grandchild).await, "grandchild {grandchild} survived");
    assert!(!alive(p.pid()));
}

#[tokio::test]
async fn descendants_in_their_own_session_are_killed_too() {
    // leader -> helper (same group) -> sleeper (own session, via setsid). The leader
    // dies first, as when an agent's launcher is killed from outside.
    let (mut p, mut pipes) =
        Supervised::spawn(&sh("sh -c 'setsid sleep 31.25 & echo $!; wait' & wait")).unwrap();
    let mut out = BufReader::new(&mut pipes.stdout);
    let mut line = String::new();
    out.read_line(&mut line).await.unwrap();
    let sleeper: u32 = line.trim().parse().unwrap();
    assert!(alive(sleeper));
    signal(p.pid(), Signal::KILL, false);
    let status = p.wait().await.unwrap();
    let info = p.finish(status).await;
    assert_eq!(info.signal, Some(Signal::KILL.as_raw()));
    assert!(gone(sleeper).await, "sleeper {sleeper} survived");
}

#[tokio::test]
async fn a_tree_that_keeps_forking_into_new_sessions_is_killed_whole() {
    // The leader forks sessions of their own as fast as it can while it is killed:
    // whatever it started, before or during the sweep, must not survive.
    let (mut p, mut pipes) = Supervised::spawn(&sh(
        "i=0; while [ $i -lt 300 ]; do setsid sleep 31.75 & i=$((i+1)); [ $i = 20 ] && echo go; done; wait",
    ))
    .unwrap();
    let mut out = BufReader::new(&mut pipes.stdout);
    let mut line = String::new();
    out.read_line(&mut line).await.unwrap();
    assert_eq!(line, "go\n");
    let info = p.terminate(Duration::from_millis(0)).await;
    assert!(info.signal.is_some(), "{info:?}");
    wait_until("no survivor", Duration::from_secs(20), || async {
        let left = procs::running(&["sleep", "31.75"]);
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    })
    .await;
}

#[tokio::test]
async fn drop_kills_the_group() {
    let (p, _pipes) = Supervised::spawn(&sh("sleep 30")).unwrap();
    let pid = p.pid();
    assert!(alive(pid));
    drop(p);
    assert!(gone(pid).await, "{pid} survived");
}

#[tokio::test]
async fn missing_program_is_a_spawn_error() {
    let err = Supervised::spawn(&ProcessSpec {
        program: "/nonexistent/relay-test".into(),
        ..Default::default()
    })
    .err()
    .unwrap();
    assert!(matches!(err, HarnessError::Spawn { .. }), "{err:?}");
}

/// A missing directory is named as such, not as the (present) program missing: exec's
/// ENOENT names no file.
#[tokio::test]
async fn a_missing_cwd_is_named_not_taken_for_a_missing_program() {
    let err = Supervised::spawn(&ProcessSpec {
        program: "/bin/sh".into(),
        cwd: Some("/nonexistent/relay-dir".into()),
        ..Default::default()
    })
    .err()
    .unwrap();
    assert_eq!(
        err.to_string(),
        "the agent's working directory /nonexistent/relay-dir does not exist"
    );
    assert!(matches!(err, HarnessError::Cwd { .. }), "{err:?}");
}
