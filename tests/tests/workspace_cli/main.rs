//! Agents in worktrees of their own, through the real `relay` CLI and a real `relay up`
//! with `relay-instant-codex` as the agents' harness (a task `write:PATH=TEXT` writes a
//! file in its working directory, the agent's worktree), on real git repositories in temp
//! dirs: the refusals of `agent add --worktree` each say what to do; a flight's commit is
//! shown (`flight show`, `diff --stat`, `diff --json`), reverted once; `remove` refuses a
//! dirty worktree, then `--force` keeps the work on the branch; `doctor` finds an orphan
//! worktree and `--fix` removes it; a harness without fork is refused; a revert over a
//! trusted NATS bus; many clients at once; `agent add --accept-file-changes` recorded.
//! In `records`: how a flight's commit is recorded (over the bus, kept across a crash,
//! never written by a client). In `node`: a node's agent, its worktree made on the
//! node's host.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use relay_tests::load::instant_codex_bin;
use relay_tests::{wait_until, RelayProcess};
use serde_json::Value;

mod node;
mod records;

struct Setup {
    tmp: tempfile::TempDir,
    repo: PathBuf,
    relay: RelayProcess,
}

impl Setup {
    /// A repository on `main` with one commit, and a broker whose git sees no config of
    /// this machine's.
    fn start() -> Setup {
        Self::start_with(&[])
    }

    /// [`Setup::start`] with extra `relay up` arguments.
    fn start_with(extra: &[&str]) -> Setup {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("home");
        std::fs::create_dir_all(&home).unwrap();
        let repo = tmp.path().join("repo");
        relay_tests::git::repo(&repo);
        let repo = std::fs::canonicalize(&repo).unwrap();
        let home_s = home.display().to_string();
        let relay = RelayProcess::start_with(
            &tmp.path().join("data"),
            extra,
            &[("HOME", &home_s), ("GIT_CONFIG_NOSYSTEM", "1")],
        )
        .unwrap();
        Setup { tmp, repo, relay }
    }

    fn git(&self, args: &[&str]) -> String {
        relay_tests::git::git(&self.repo, args)
    }

    /// `relay agent add NAME --worktree ...` of an instant-codex agent on the repo.
    fn add(&self, name: &str, extra: &[&str]) -> Output {
        let (repo, bin) = (
            self.repo.display().to_string(),
            instant_codex_bin().display().to_string(),
        );
        let mut args = vec![
            "agent",
            "add",
            name,
            "--harness",
            "codex",
            "--cwd",
            &repo,
            "--command",
            &bin,
        ];
        args.extend_from_slice(extra);
        self.relay.cli(&args)
    }

    fn agent(&self, name: &str) -> Value {
        self.relay.cli_json(&["agent", "show", name, "--json"])
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The refusal of `out`, which must have failed.
fn refused(out: &Output) -> String {
    assert!(!out.status.success(), "not refused: {}", stdout(out));
    stderr(out)
}

/// `agent add --accept-file-changes` records the policy (JSON and text of `agent show`);
/// without it file changes wait for a person.
#[tokio::test(flavor = "multi_thread")]
async fn accept_file_changes_is_recorded_on_the_agent() {
    let s = Setup::start();
    let out = s.add("fc", &["--worktree", "--accept-file-changes"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = s.add("nofc", &["--worktree"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let policy = |name: &str| s.agent(name)["approval_policy"].clone();
    assert_eq!(
        policy("fc")["accept_file_changes"],
        true,
        "{}",
        policy("fc")
    );
    assert!(
        policy("nofc")["accept_file_changes"].is_null(),
        "{}",
        policy("nofc")
    );
    let line = "accept    every file change (--accept-file-changes)";
    let shown = s.relay.cli_ok(&["agent", "show", "fc"]);
    assert!(shown.contains(line), "{shown}");
    let shown = s.relay.cli_ok(&["agent", "show", "nofc"]);
    assert!(!shown.contains(line), "{shown}");
    // The flag takes no value.
    let e = refused(&s.add("fc2", &["--accept-file-changes=yes"]));
    assert!(e.contains("--accept-file-changes"), "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_add_worktree_refusals_say_what_to_do() {
    let s = Setup::start();
    // Not a repository.
    let plain = s.tmp.path().join("plain");
    std::fs::create_dir_all(&plain).unwrap();
    let plain_s = plain.display().to_string();
    let out = s.relay.cli(&[
        "agent",
        "add",
        "a0",
        "--harness",
        "codex",
        "--cwd",
        &plain_s,
        "--command",
        &instant_codex_bin().display().to_string(),
        "--worktree",
    ]);
    let e = refused(&out);
    assert!(
        e.contains("is not a git repository") && e.contains("git init"),
        "{e}"
    );
    // An unknown base.
    let e = refused(&s.add("a1", &["--worktree", "--base", "no-such-ref"]));
    assert!(
        e.contains("\"no-such-ref\" is not a branch, tag or commit"),
        "{e}"
    );
    assert!(e.contains("branch -a"), "{e}");
    // The branch taken by someone else's work.
    s.git(&["branch", "relay/a2"]);
    let e = refused(&s.add("a2", &["--worktree"]));
    assert!(e.contains("branch relay/a2 already exists"), "{e}");
    assert!(e.contains("branch -D relay/a2"), "{e}");
    // A dirty base: the default base has uncommitted changes the worktree would miss.
    std::fs::write(s.repo.join("README.md"), "changed\n").unwrap();
    let e = refused(&s.add("a3", &["--worktree"]));
    assert!(
        e.contains("uncommitted changes") && e.contains("README.md"),
        "{e}"
    );
    assert!(e.contains("--base"), "{e}");
    // ...which naming the base explicitly goes past.
    let ok = s.add("a3", &["--worktree", "--base", "main"]);
    assert!(ok.status.success(), "{}", stderr(&ok));
    // Copy patterns out of the repository, before any git runs.
    let e = refused(&s.add("a4", &["--worktree", "--copy", "../secrets"]));
    assert!(e.contains("--copy") && e.contains("no `..`"), "{e}");
    // The worktree's flags without --worktree are a usage error.
    let e = refused(&s.add("a5", &["--base", "main"]));
    assert!(e.contains("--worktree"), "{e}");

    // Only a3 was registered, and only it has a worktree beside the main checkout.
    let agents = s.relay.cli_json(&["agent", "list", "--json"]);
    let names: Vec<&str> = agents
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["a3"]);
    let list = s.git(&["worktree", "list", "--porcelain"]);
    assert_eq!(list.matches("worktree ").count(), 2, "{list}");
    // The main checkout keeps its own change, untouched.
    assert_eq!(
        std::fs::read_to_string(s.repo.join("README.md")).unwrap(),
        "changed\n"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flights_commit_is_shown_diffed_reverted_and_remove_keeps_the_work() {
    let s = Setup::start();
    let out = s.add("w", &["--worktree"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let agent = s.agent("w");
    let path = PathBuf::from(agent["worktree_state"]["path"].as_str().unwrap());
    assert_eq!(agent["worktree_state"]["branch"], "relay/w");
    assert_eq!(agent["worktree_state"]["base"], "main");
    let show = s.relay.cli_ok(&["agent", "show", "w"]);
    assert!(
        show.contains("worktree") && show.contains("relay/w"),
        "{show}"
    );

    let asked = s
        .relay
        .cli(&["ask", "w", "write:notes.txt=from the agent", "--json"]);
    assert!(asked.status.success(), "{}", stderr(&asked));
    let flight: Value = serde_json::from_slice(&asked.stdout).unwrap();
    let id = flight["id"].as_str().unwrap().to_string();
    assert_eq!(flight["state"], "completed", "{flight}");
    let commit = &flight["commit"];
    assert_eq!(commit["branch"], "relay/w", "{flight}");
    assert_eq!(commit["files"][0]["path"], "notes.txt", "{flight}");
    // The flight record keeps the commit without its patch.
    assert!(commit.get("patch").is_none(), "{flight}");
    // The commit names the flight; the main checkout never saw the file.
    let message = s.git(&["log", "-1", "--format=%B", "relay/w"]);
    assert!(
        message.contains(&format!("Relay-Flight: {id}")),
        "{message}"
    );
    assert!(!s.repo.join("notes.txt").exists());

    // The plain ask says what it committed, on stderr (stdout stays the reply).
    let plain = s.relay.cli(&["ask", "w", "write:more.txt=again"]);
    assert!(plain.status.success(), "{}", stderr(&plain));
    assert!(
        stdout(&plain).contains("ok: write:more.txt"),
        "{}",
        stdout(&plain)
    );
    assert!(
        stderr(&plain).contains("on relay/w: 1 file, +1 -0")
            && stderr(&plain).contains("relay diff flt_"),
        "{}",
        stderr(&plain)
    );
    let list = s.relay.cli_ok(&["agent", "list"]);
    // Two flights, two commits ahead of main (recorded before each flight ended).
    assert!(list.contains("relay/w +2 -0"), "{list}");
    let replay = s.relay.cli_ok(&["replay", "agent", "w"]);
    assert!(replay.contains("on relay/w from main"), "{replay}");
    assert!(replay.contains("commit "), "{replay}");

    let shown = s.relay.cli_ok(&["flight", "show", &id]);
    assert!(
        shown.contains("commit") && shown.contains("1 file, +1 -0"),
        "{shown}"
    );
    let stat = s.relay.cli_ok(&["diff", &id, "--stat"]);
    assert!(stat.contains("notes.txt +1 -0"), "{stat}");
    let diff = s.relay.cli_json(&["diff", &id, "--json"]);
    assert!(
        diff["commit"]["patch"]
            .as_str()
            .unwrap()
            .contains("+from the agent"),
        "{diff}"
    );
    let patch = s.relay.cli_ok(&["diff", &id]);
    assert!(patch.contains("+from the agent"), "{patch}");
    let branch = s.relay.cli_ok(&["diff", "w", "--stat"]);
    assert!(
        branch.contains("relay/w against main") && branch.contains("notes.txt +1 -0"),
        "{branch}"
    );

    // Revert: a commit of its own, recorded on the flight; not twice.
    let reverted = s.relay.cli_ok(&["revert", &id]);
    assert!(reverted.contains("reverted by commit"), "{reverted}");
    let f = s.relay.cli_json(&["flight", "show", &id, "--json"]);
    let by = f["commit"]["reverted_by"]["commit"].as_str().unwrap();
    let message = s.git(&["log", "-1", "--format=%B", by]);
    assert!(
        message.contains(&format!("Relay-Revert-Of: {id}")),
        "{message}"
    );
    assert!(!path.join("notes.txt").exists());
    let e = refused(&s.relay.cli(&["revert", &id]));
    assert!(e.contains("reverted already"), "{e}");
    // An agent's name where a flight id goes: a usage error saying how to find one.
    let out = s.relay.cli(&["revert", "w"]);
    let e = refused(&out);
    assert_eq!(out.status.code(), Some(2), "{e}");
    assert!(
        e.contains("flights are named flt_") && e.contains("relay flight list --agent w"),
        "{e}"
    );
    // The broker says it too, to every interface (exit 3: not found).
    let out = s.relay.cli(&["flight", "show", "w"]);
    let e = refused(&out);
    assert_eq!(out.status.code(), Some(3), "{e}");
    assert!(
        e.contains("unknown flight \"w\": flight ids look like flt_"),
        "{e}"
    );

    // Uncommitted work in the worktree: remove refuses, naming it and what to do.
    std::fs::write(path.join("draft.txt"), "unfinished\n").unwrap();
    let e = refused(&s.relay.cli(&["agent", "remove", "w"]));
    assert!(e.contains("draft.txt") && e.contains("--force"), "{e}");
    assert!(path.exists());
    let removed = s.relay.cli_ok(&["agent", "remove", "w", "--force"]);
    assert!(removed.contains("branch relay/w is kept"), "{removed}");
    assert!(removed.contains("branch -D relay/w"), "{removed}");
    // The runtime removes the worktree after the removal's event; the work is on the
    // branch.
    wait_until(
        "the worktree to be removed",
        Duration::from_secs(20),
        || async { (!path.exists()).then_some(()) },
    )
    .await;
    let files = s.git(&["show", "--stat", "--format=%s", "relay/w"]);
    assert!(files.contains("draft.txt"), "{files}");
}

#[tokio::test(flavor = "multi_thread")]
async fn doctor_finds_an_orphan_worktree_and_fix_removes_it() {
    let mut s = Setup::start();
    // A registration the broker's rules refuse after its worktree was made (a secret's
    // name is only checked there; the CLI cannot send a bad one, the API can): the
    // worktree is left, and the refusal says so.
    let spec = serde_json::json!({
        "name": "orphan",
        "harness": "codex_app_server",
        "cwd": s.repo.display().to_string(),
        "command": instant_codex_bin().display().to_string(),
        "worktree": {},
        "secrets": {"A=B": "x"},
    });
    let (code, body) = s.relay.http().post("/v1/agents", &spec).await;
    assert_eq!(code, 400, "{body}");
    let e = body["error"]["message"].as_str().unwrap();
    assert!(
        e.contains("is left") && e.contains("relay doctor --fix"),
        "{e}"
    );
    let out = s.add("kept", &["--worktree"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let kept = PathBuf::from(s.agent("kept")["worktree_state"]["path"].as_str().unwrap());
    s.relay.terminate().unwrap();

    let data = s.relay.data_dir.display().to_string();
    let home = s.tmp.path().join("home");
    let doctor = |args: &[&str]| {
        Command::new(&s.relay.bin)
            .args(args)
            .args(["--data-dir", &data])
            .env("HOME", &home)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env_remove("RELAY_URL")
            .env_remove("RELAY_TOKEN")
            .output()
            .unwrap()
    };
    let found = doctor(&["doctor", "--json"]);
    assert!(found.status.success(), "{}", stderr(&found));
    let report: Value = serde_json::from_slice(&found.stdout).unwrap();
    let orphans = report["orphan_worktrees"].as_array().unwrap();
    assert_eq!(orphans.len(), 1, "{report}");
    assert_eq!(orphans[0]["agent"], "orphan");
    let orphan = PathBuf::from(orphans[0]["path"].as_str().unwrap());
    assert!(orphan.exists());
    let text = doctor(&["doctor"]);
    let text = stdout(&text);
    assert!(
        text.contains("no agent owns") && text.contains("--fix"),
        "{text}"
    );

    let fixed = doctor(&["doctor", "--fix"]);
    assert!(fixed.status.success(), "{}", stderr(&fixed));
    assert!(!orphan.exists(), "{}", stdout(&fixed));
    // The owned one stays; the orphan's branch too; nothing is left to fix.
    assert!(kept.exists());
    assert!(!s.git(&["branch", "--list", "relay/orphan"]).is_empty());
    let again: Value = serde_json::from_slice(&doctor(&["doctor", "--json"]).stdout).unwrap();
    assert_eq!(again["orphan_worktrees"], serde_json::json!([]), "{again}");
    s.relay.restart().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn fork_is_refused_with_why() {
    let s = Setup::start();
    let acp = instant_codex_bin().with_file_name("relay-fake-acp");
    let repo = s.repo.display().to_string();
    s.relay.cli_ok(&[
        "agent",
        "add",
        "ed",
        "--harness",
        "acp",
        "--cwd",
        &repo,
        "--command",
        &acp.display().to_string(),
    ]);
    let e = refused(&s.relay.cli(&["agent", "fork", "ed", "ed2"]));
    assert!(e.contains("harness acp cannot fork a session"), "{e}");

    let out = s.add("cx", &["--worktree"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let e = refused(&s.relay.cli(&["agent", "fork", "cx", "cx2"]));
    assert!(e.contains("has no session yet"), "{e}");
    s.relay.cli_ok(&["ask", "cx", "hello"]);
    let e = refused(
        &s.relay
            .cli(&["agent", "fork", "cx", "cx2", "--at", "flt_nope"]),
    );
    assert!(e.contains("is not a flight of agent cx"), "{e}");
    // Nothing was registered by a refused fork.
    let e = refused(&s.relay.cli(&["agent", "show", "cx2"]));
    assert!(e.contains("cx2"), "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn many_clients_add_worktree_agents_and_diff_at_once() {
    let s = Setup::start();
    const N: usize = 8;
    let names: Vec<String> = (0..N).map(|i| format!("par-{i}")).collect();
    let (repo, bin) = (
        s.repo.display().to_string(),
        instant_codex_bin().display().to_string(),
    );
    let children: Vec<_> = names
        .iter()
        .map(|n| {
            s.relay
                .spawn_cli(&[
                    "agent",
                    "add",
                    n,
                    "--harness",
                    "codex",
                    "--cwd",
                    &repo,
                    "--command",
                    &bin,
                    "--worktree",
                ])
                .unwrap()
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let list = s.git(&["worktree", "list", "--porcelain"]);
    for n in &names {
        assert!(
            list.contains(&format!("branch refs/heads/relay/{n}")),
            "{list}"
        );
    }
    let diffs: Vec<_> = names
        .iter()
        .map(|n| s.relay.spawn_cli(&["diff", n, "--json"]).unwrap())
        .collect();
    for (c, n) in diffs.into_iter().zip(&names) {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let d: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(d["agent"], n.as_str());
        assert_eq!(d["worktree"]["branch"], format!("relay/{n}"));
        assert_eq!(d["files"], serde_json::json!([]), "{d}");
    }
}
