//! A full disk and a stuck one, through the real `relay` binary on a real filesystem:
//! the data dir on a 40 MB tmpfs, filled by the broker's own writes; writes are refused
//! with `storage_full` (HTTP 507) while reads and `relay status` (which says the disk is
//! full) go on and nothing acknowledged is lost; once space is freed, writes go on
//! without a restart, SIGTERM ends the process, and a restart finds every acknowledged
//! write. A storage thread that cannot finish (held by the test-only hook, as sled holds
//! it in `make_stable` on a full disk) makes `relay up` exit with a clear error.
//!
//! Needs `mount -t tmpfs` (root). Under CI=true a refused mount fails the test; outside
//! CI it is skipped with the reason printed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use relay_tests::RelayProcess;
use serde_json::{json, Value};

/// A tmpfs mounted for one test, unmounted when dropped.
struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` at `dir`; `None` (skipped, reason printed) when mount is
    /// not permitted outside CI; under CI=true, a failed mount fails the test.
    fn mount(dir: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output();
        let why = match out {
            Ok(o) if o.status.success() => {
                return Some(Tmpfs {
                    dir: dir.to_path_buf(),
                })
            }
            Ok(o) => String::from_utf8_lossy(&o.stderr).into_owned(),
            Err(e) => e.to_string(),
        };
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!(
                "cannot mount a tmpfs at {} (this test needs root): {why}",
                dir.display()
            );
        }
        eprintln!(
            "SKIPPED: cannot mount a tmpfs at {} (needs root): {why}",
            dir.display()
        );
        None
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let out = Command::new("umount").arg(&self.dir).output();
        if !out.as_ref().is_ok_and(|o| o.status.success()) {
            // Still busy (a process of a failed test): detach it, never leave it.
            let _ = Command::new("umount").arg("-l").arg(&self.dir).output();
        }
    }
}

async fn post(relay: &RelayProcess, body: &str) -> (u16, Value) {
    relay
        .http()
        .post(
            "/v1/messages",
            &json!({"conversation": "channel.shared", "author": "me", "body": body}),
        )
        .await
}

/// The bodies stored in the conversation, in order.
async fn bodies(relay: &RelayProcess) -> Vec<String> {
    let (code, v) = relay
        .http()
        .get("/v1/conversations/channel.shared/messages?limit=100000")
        .await;
    assert_eq!(code, 200, "{v}");
    v.as_array()
        .unwrap()
        .iter()
        .map(|m| m["body"].as_str().unwrap().to_string())
        .collect()
}

/// A body of about 200 KB, marked with `i` so each is told apart.
fn big(i: usize) -> String {
    format!("{i:06} {}", "x".repeat(200 * 1024))
}

/// Fills `path` until the filesystem has about `leave` bytes free.
fn fill(path: &Path, leave: u64) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![7u8; 1 << 20];
    loop {
        let free = rustix::fs::statvfs(path.parent().unwrap()).unwrap();
        if free.f_bavail * free.f_frsize <= leave + (1 << 20) {
            break;
        }
        f.write_all(&chunk).unwrap();
    }
    f.sync_all().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_disk_refuses_writes_keeps_reads_and_status_and_recovers_without_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("mnt");
    let Some(_tmpfs) = Tmpfs::mount(&mnt, "40m") else {
        return;
    };
    // The data dir is the tmpfs itself; the log is beside it (tmp/mnt.log), off it.
    let mut relay = RelayProcess::start_with(&mnt, &[], &[("RELAY_DISK_RESERVE_MB", "8")]).unwrap();
    let pid = relay.pid();
    // Room for about 60 big messages past the reserve, the rest taken by a filler.
    let filler = mnt.join("filler");
    fill(&filler, 20 << 20);

    // The broker's own writes fill the disk: each is acknowledged (200) or refused with
    // storage_full (507), nothing else, and the refusals begin before sled meets ENOSPC.
    let mut acknowledged = Vec::new();
    let mut refused = None;
    for i in 0..1000 {
        let body = big(i);
        let (code, v) = post(&relay, &body).await;
        match code {
            200 => acknowledged.push(body),
            507 => {
                refused = Some(v);
                break;
            }
            _ => panic!("post {i}: {code} {v}\nlog:\n{}", relay.log_text()),
        }
    }
    let refused = refused.expect("the disk never filled");
    assert_eq!(refused["error"]["code"], "storage_full", "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("full"), "{message}");
    assert!(
        acknowledged.len() > 10,
        "only {} stored",
        acknowledged.len()
    );

    // Many writers at once: every one refused the same way, none half stored.
    let mut writers = tokio::task::JoinSet::new();
    for i in 0..16 {
        let http = relay.http();
        writers.spawn(async move {
            http.post(
                "/v1/messages",
                &json!({"conversation": "channel.shared", "author": "me", "body": format!("refused {i}")}),
            )
            .await
        });
    }
    while let Some(r) = writers.join_next().await {
        let (code, v) = r.unwrap();
        assert_eq!(code, 507, "{v}");
        assert_eq!(v["error"]["code"], "storage_full", "{v}");
    }

    // Reads and status answer; status says the disk is full.
    assert_eq!(bodies(&relay).await, acknowledged);
    let (code, status) = relay.http().get("/v1/status").await;
    assert_eq!(code, 200, "{status}");
    assert_eq!(status["disk"]["full"], true, "{status}");
    let text = relay.cli_ok(&["status"]);
    assert!(text.contains("FULL"), "{text}");
    assert!(text.contains("storage_full"), "{text}");
    let cli = relay.cli(&["send", "--to", "channel.shared", "from the cli"]);
    assert!(!cli.status.success());
    let said = String::from_utf8_lossy(&cli.stderr);
    assert!(said.contains("full"), "{said}");

    // Space comes back: the same process takes writes again.
    std::fs::remove_file(&filler).unwrap();
    let (code, v) = post(&relay, "after the space came back").await;
    assert_eq!(code, 200, "{v}\nlog:\n{}", relay.log_text());
    assert_eq!(relay.pid(), pid);
    let (_, status) = relay.http().get("/v1/status").await;
    assert_eq!(status["disk"]["full"], false, "{status}");
    acknowledged.push("after the space came back".into());
    assert_eq!(bodies(&relay).await, acknowledged);

    // SIGTERM ends it, cleanly; a restart finds every acknowledged write.
    let status = relay.terminate().unwrap();
    assert!(status.success(), "{status}\nlog:\n{}", relay.log_text());
    relay.restart().unwrap();
    assert_eq!(bodies(&relay).await, acknowledged);
    let status = relay.terminate().unwrap();
    assert!(status.success(), "{status}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_turn_that_ends_while_clients_are_refused_for_a_full_disk_is_stored_as_completed() {
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("mnt");
    let Some(_tmpfs) = Tmpfs::mount(&mnt, "40m") else {
        return;
    };
    let env =
        relay_tests::agents::Env::start_in(Some(&mnt), &[], &[("RELAY_DISK_RESERVE_MB", "8")])
            .await;
    env.add_agent("a", &[]);
    // A turn that streams for a few seconds: the disk fills while it runs.
    let words: Vec<String> = (0..16).map(|i| format!("w{i}")).collect();
    let flight = env.ask_no_wait("a", &format!("slow: {}", words.join(" ")));
    env.wait_delta(&flight).await;
    let filler = mnt.join("filler");
    fill(&filler, 10 << 20);
    // Clients fill the rest, until they are refused.
    let mut refused = false;
    for i in 0..1000 {
        let (code, v) = post(&env.relay, &big(i)).await;
        match code {
            200 => {}
            507 => {
                refused = true;
                break;
            }
            _ => panic!("post {i}: {code} {v}"),
        }
    }
    assert!(refused, "the disk never filled");
    assert_ne!(
        relay_tests::agents::state(&env.flight(&flight).await),
        "completed"
    );
    // The turn ends meanwhile: its output and its end are stored.
    let f = env
        .wait_flight(&flight, 60, |f| relay_tests::agents::state(f) != "running")
        .await;
    assert_eq!(
        relay_tests::agents::state(&f),
        "completed",
        "{f}\nlog:\n{}",
        env.relay.log_text()
    );
    assert!(
        f["output"].as_str().unwrap_or_default().contains("w15"),
        "{f}"
    );
    // Clients are still refused: the disk is still under its reserve.
    let (code, v) = post(&env.relay, "still refused").await;
    assert_eq!(code, 507, "{v}");
    // A restart finds the flight completed.
    let mut relay = env.relay;
    assert!(relay.terminate().unwrap().success(), "{}", relay.log_text());
    std::fs::remove_file(&filler).unwrap();
    relay.restart().unwrap();
    let (code, f) = relay.http().get(&format!("/v1/flights/{flight}")).await;
    assert_eq!(code, 200, "{f}");
    assert_eq!(relay_tests::agents::state(&f), "completed", "{f}");
    assert!(relay.terminate().unwrap().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_storage_thread_that_cannot_finish_makes_relay_up_exit_with_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let stall = tmp.path().join("stall");
    let stall_env = stall.display().to_string();
    let mut relay = RelayProcess::start_with(
        &data,
        &[],
        &[
            ("RELAY_STORAGE_STALL_TIMEOUT", "2"),
            // The test-only hook (relay_infra::disk::TEST_STALL_ENV): flushes block
            // while this file exists, as sled's do in `make_stable` on a full disk.
            ("RELAY_TEST_STALL_STORAGE_WHILE", &stall_env),
        ],
    )
    .unwrap();
    let (code, v) = post(&relay, "before").await;
    assert_eq!(code, 200, "{v}");
    std::fs::write(&stall, "").unwrap();
    // A write that now cannot finish; its answer never comes.
    let http = relay.http();
    let hung = tokio::spawn(async move {
        http.try_request(
            reqwest::Method::POST,
            "/v1/messages",
            Some(
                json!({"conversation": "channel.shared", "author": "me", "body": "stuck"})
                    .to_string()
                    .into_bytes(),
            ),
        )
        .await
    });
    // Exits by itself (no signal), in error, saying why.
    let status = tokio::task::spawn_blocking(move || {
        let status = relay.wait_exit(Duration::from_secs(60));
        (status, relay)
    })
    .await
    .unwrap();
    let (status, relay) = status;
    let status = status.unwrap_or_else(|e| panic!("{e}\nlog:\n{}", relay.log_text()));
    assert!(!status.success(), "{status}");
    let log = relay.log_text();
    assert!(
        log.contains("the storage thread has been stuck"),
        "no clear error in the log:\n{log}"
    );
    hung.abort();
    // The stuck process is gone, so is its lock: a new one opens the same data dir.
    std::fs::remove_file(&stall).unwrap();
    let mut again = RelayProcess::start(&data).unwrap();
    let (code, v) = again
        .http()
        .get("/v1/conversations/channel.shared/messages")
        .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v[0]["body"], "before", "{v}");
    assert!(again.terminate().unwrap().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_ends_relay_up_even_while_its_storage_thread_is_stuck() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let stall = tmp.path().join("stall");
    let stall_env = stall.display().to_string();
    let mut relay = RelayProcess::start_with(
        &data,
        &[],
        &[
            ("RELAY_STORAGE_STALL_TIMEOUT", "2"),
            ("RELAY_TEST_STALL_STORAGE_WHILE", &stall_env),
        ],
    )
    .unwrap();
    std::fs::write(&stall, "").unwrap();
    let http = relay.http();
    let hung = tokio::spawn(async move {
        http.try_request(
            reqwest::Method::POST,
            "/v1/messages",
            Some(
                json!({"conversation": "channel.shared", "author": "me", "body": "stuck"})
                    .to_string()
                    .into_bytes(),
            ),
        )
        .await
    });
    // Whether or not that write reached the storage thread first, the drain's final
    // flush does, and is held there too.
    let status = tokio::task::spawn_blocking(move || {
        let status = relay.terminate();
        (status, relay)
    })
    .await
    .unwrap();
    let (status, relay) = status;
    // Ended (in error: the drain could not commit), not wedged.
    let status = status.unwrap_or_else(|e| panic!("{e}\nlog:\n{}", relay.log_text()));
    assert!(!status.success(), "{status}");
    hung.abort();
}

/// Every file and directory under the data dir, with its mode.
fn modes(dir: &Path) -> Vec<(PathBuf, u32)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let meta = std::fs::symlink_metadata(&p).unwrap();
        out.push((p.clone(), meta.mode() & 0o777));
        if meta.is_dir() {
            out.extend(modes(&p));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn relay_up_keeps_its_files_private_and_refuses_symlinks_and_a_data_dir_of_another_user() {
    let tmp = tempfile::tempdir().unwrap();

    // Every file 0600, every directory 0700, sled's included, whatever the umask.
    let data = tmp.path().join("data");
    let mut relay = RelayProcess::start(&data).unwrap();
    let (code, v) = post(&relay, "secret").await;
    assert_eq!(code, 200, "{v}");
    // A value this large is a file of its own, made by sled after the open: an agent's
    // secrets (kept in sled only, never in the event log), two of 100 KB (one variable
    // over 128 KiB could not be given to a program at all).
    let secret = |c: char| c.to_string().repeat(100 * 1024);
    let (code, v) = relay
        .http()
        .post(
            "/v1/agents",
            &json!({"name": "a1", "harness": "codex_app_server", "cwd": "/tmp",
                    "wake": "manual",
                    "env": {"API_TOKEN": secret('t'), "DB_PASSWORD": secret('p')}}),
        )
        .await;
    assert_eq!(code, 200, "{v}");
    assert!(relay.terminate().unwrap().success());
    let all = modes(&data);
    assert!(all.iter().any(|(p, _)| p.ends_with("db/db")), "{all:?}");
    assert!(
        all.iter()
            .any(|(p, _)| p.parent().is_some_and(|d| d.ends_with("db/blobs"))),
        "no blob: {all:?}"
    );
    for (p, mode) in &all {
        let want = if p.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(*mode, want, "{} is {mode:o}", p.display());
    }

    // A planted `db` symlink is refused, and nothing is written where it points.
    let planted = tmp.path().join("planted");
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir_all(&planted).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, planted.join("db")).unwrap();
    let e = RelayProcess::start(&planted)
        .err()
        .expect("a db symlink was followed");
    assert!(e.to_string().contains("is a symlink"), "{e:#}");
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);

    // A data dir owned by someone else is refused, naming the owner.
    if rustix::process::geteuid().as_raw() != 0 {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("this test needs root to give a directory to nobody");
        }
        eprintln!("SKIPPED the other user's data dir: needs root to chown");
        return;
    }
    let theirs = tmp.path().join("theirs");
    std::fs::create_dir_all(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let e = RelayProcess::start(&theirs)
        .err()
        .expect("another user's data dir was accepted");
    let text = format!("{e:#}");
    assert!(text.contains("owned by nobody (uid 65534)"), "{text}");
}
