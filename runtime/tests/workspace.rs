//! Agents' worktrees made, refused, removed and found orphaned, with real git in temp
//! repositories (through `Runtime::prepare_worktree`, `worktree_dirty`,
//! `orphan_worktrees`, `agent_diff` and `Control::AgentRemoved`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use relay_harnesses::Harnesses;
use relay_protocol::domain::{Agent, AgentSpec, AgentState};
use relay_protocol::runtime::Control;
use relay_runtime::workspace::WorkspaceError;
use relay_runtime::{Runtime, RuntimeConfig, RuntimeError};
use support::repo::{git, spec, Repo};
use tokio_util::sync::CancellationToken;

struct Rt {
    dir: tempfile::TempDir,
    runtime: Runtime,
    _stop: CancellationToken,
}

fn rt() -> Rt {
    let dir = tempfile::tempdir().unwrap();
    let stop = CancellationToken::new();
    let (runtime, _reports) = Runtime::start_with(
        RuntimeConfig::new(dir.path()),
        Harnesses::default(),
        stop.clone(),
    )
    .unwrap();
    Rt {
        dir,
        runtime,
        _stop: stop,
    }
}

fn agent(spec: AgentSpec) -> Agent {
    Agent {
        spec,
        state: AgentState::Offline,
        session_id: None,
        thread_id: None,
        endpoint: None,
        state_reason: None,
        note: None,
        program: None,
        worktree: None,
        created_at: 0,
        updated_at: 0,
    }
}

fn refusal(e: RuntimeError) -> WorkspaceError {
    match e {
        RuntimeError::Workspace(w) => w,
        other => panic!("not a workspace refusal: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worktree_is_made_on_its_branch_from_the_base_with_the_files_asked_for() {
    let repo = Repo::new();
    std::fs::write(repo.path.join(".env"), "SECRET=1\n").unwrap();
    std::fs::create_dir(repo.path.join("config")).unwrap();
    std::fs::write(repo.path.join("config/app.local"), "local\n").unwrap();
    std::fs::write(repo.path.join("config/other.txt"), "not asked\n").unwrap();
    let rt = rt();
    let spec = spec("a1", &repo.path, None, &[".env", "config/*.local"]);
    let state = rt.runtime.prepare_worktree(&spec).await.unwrap();
    let path = std::fs::canonicalize(rt.dir.path())
        .unwrap()
        .join("worktrees/a1");
    assert_eq!(state.path, path.display().to_string());
    assert_eq!(state.branch, "relay/a1");
    assert_eq!(state.base, "main");
    assert_eq!(state.base_commit, repo.head());
    assert_eq!(state.head, repo.head());
    assert_eq!((state.ahead, state.behind, state.recreated), (0, 0, 0));
    assert_eq!(git(&path, &["symbolic-ref", "--short", "HEAD"]), "relay/a1");
    assert_eq!(
        std::fs::read_to_string(path.join(".env")).unwrap(),
        "SECRET=1\n"
    );
    assert_eq!(
        std::fs::read_to_string(path.join("config/app.local")).unwrap(),
        "local\n"
    );
    assert!(!path.join("config/other.txt").exists());
    assert_eq!(
        std::fs::read_to_string(path.join("src/lib.txt")).unwrap(),
        "one\ntwo\nthree\n"
    );
    // The copied files are not work: the worktree is clean.
    assert!(rt
        .runtime
        .worktree_dirty(&agent(spec.clone()))
        .await
        .unwrap()
        .is_empty());
    // Asked again (a second registration check): the same worktree, found.
    let again = rt.runtime.prepare_worktree(&spec).await.unwrap();
    assert_eq!((again.path, again.head), (state.path, state.head));
    // The main checkout is as it was.
    assert_eq!(repo.git(&["symbolic-ref", "--short", "HEAD"]), "main");
    assert_eq!(
        repo.git(&["status", "--porcelain", "--untracked-files=no"]),
        ""
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_refusal_says_what_to_do() {
    let rt = rt();
    // Not a repository.
    let plain = tempfile::tempdir().unwrap();
    let e = refusal(
        rt.runtime
            .prepare_worktree(&spec("a1", plain.path(), None, &[]))
            .await
            .unwrap_err(),
    );
    assert!(matches!(e, WorkspaceError::NotARepo { .. }), "{e}");
    assert!(e.to_string().contains("git init"), "{e}");
    // A repository with no commit.
    git(plain.path(), &["init", "-q", "-b", "main"]);
    let e = refusal(
        rt.runtime
            .prepare_worktree(&spec("a1", plain.path(), None, &[]))
            .await
            .unwrap_err(),
    );
    assert!(matches!(e, WorkspaceError::NoCommits { .. }), "{e}");
    // An unknown ref.
    let repo = Repo::new();
    let e = refusal(
        rt.runtime
            .prepare_worktree(&spec("a1", &repo.path, Some("nope"), &[]))
            .await
            .unwrap_err(),
    );
    assert!(
        matches!(e, WorkspaceError::UnknownRef { ref base, .. } if base == "nope"),
        "{e}"
    );
    // A branch that is someone else's.
    repo.git(&["branch", "relay/taken"]);
    let e = refusal(
        rt.runtime
            .prepare_worktree(&spec("taken", &repo.path, None, &[]))
            .await
            .unwrap_err(),
    );
    assert!(
        matches!(e, WorkspaceError::BranchTaken { ref branch, .. } if branch == "relay/taken"),
        "{e}"
    );
    assert!(e.to_string().contains("branch -D relay/taken"), "{e}");
    // A dirty default base; a named base is fine.
    std::fs::write(repo.path.join("README.md"), "changed\n").unwrap();
    let e = refusal(
        rt.runtime
            .prepare_worktree(&spec("a1", &repo.path, None, &[]))
            .await
            .unwrap_err(),
    );
    assert!(
        matches!(e, WorkspaceError::DirtyBase { ref files, .. } if files == "README.md"),
        "{e}"
    );
    let made = rt
        .runtime
        .prepare_worktree(&spec("a1", &repo.path, Some("main"), &[]))
        .await
        .unwrap();
    assert_eq!(made.base, "main");
    // Nothing of the refusals was left behind.
    assert_eq!(
        repo.git(&["branch", "--list", "relay/*"]).lines().count(),
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_head_is_a_base_by_its_commit() {
    let repo = Repo::new();
    let head = repo.head();
    repo.git(&["checkout", "-q", "--detach"]);
    let rt = rt();
    let state = rt
        .runtime
        .prepare_worktree(&spec("a1", &repo.path, None, &[]))
        .await
        .unwrap();
    assert_eq!(state.base, format!("HEAD@{}", &head[..12]));
    assert_eq!(state.base_commit, head);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removal_refuses_dirty_and_force_commits_the_leftovers_and_keeps_the_branch() {
    let repo = Repo::new();
    let rt = rt();
    let spec = spec("a1", &repo.path, None, &[]);
    let state = rt.runtime.prepare_worktree(&spec).await.unwrap();
    let path = std::path::PathBuf::from(&state.path);
    std::fs::write(path.join("new file.txt"), "left\n").unwrap();
    let a = agent(spec.clone());
    assert_eq!(
        rt.runtime.worktree_dirty(&a).await.unwrap(),
        vec!["new file.txt"]
    );
    // Without force the worktree stays (the broker refuses before asking).
    rt.runtime
        .control(Control::AgentRemoved {
            agent: "a1".into(),
            force: false,
        })
        .await
        .unwrap();
    assert!(path.join("new file.txt").exists());
    rt.runtime
        .control(Control::AgentRemoved {
            agent: "a1".into(),
            force: true,
        })
        .await
        .unwrap();
    assert!(!path.exists());
    assert_eq!(repo.git(&["show", "relay/a1:new file.txt"]), "left");
    assert!(repo
        .git(&["log", "-1", "--format=%s", "relay/a1"])
        .contains("work left in the worktree when agent a1 was removed"));
    assert!(repo.git(&["worktree", "list"]).lines().count() == 1);
    // Nothing left to find.
    assert!(rt
        .runtime
        .orphan_worktrees(&[], false)
        .await
        .unwrap()
        .is_empty());
    // Registered again under its name: its kept branch is taken up (not a recreation).
    let again = rt.runtime.prepare_worktree(&spec).await.unwrap();
    assert_eq!(again.recreated, 0);
    assert_eq!(again.head, repo.git(&["rev-parse", "relay/a1"]));
    assert_eq!(
        std::fs::read_to_string(path.join("new file.txt")).unwrap(),
        "left\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_is_found_and_fixed() {
    let repo = Repo::new();
    let rt = rt();
    let kept = spec("kept", &repo.path, None, &[]);
    rt.runtime.prepare_worktree(&kept).await.unwrap();
    let gone = rt
        .runtime
        .prepare_worktree(&spec("gone", &repo.path, None, &[]))
        .await
        .unwrap();
    std::fs::write(std::path::Path::new(&gone.path).join("wip.txt"), "wip\n").unwrap();
    let agents = [agent(kept)];
    let found = rt.runtime.orphan_worktrees(&agents, false).await.unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        (found[0].agent.as_str(), found[0].branch.as_str()),
        ("gone", "relay/gone")
    );
    assert!(found[0].fixed.is_none());
    assert!(std::path::Path::new(&gone.path).exists());
    let fixed = rt.runtime.orphan_worktrees(&agents, true).await.unwrap();
    assert!(
        fixed[0].fixed.as_deref().unwrap().contains("kept"),
        "{fixed:?}"
    );
    assert!(!std::path::Path::new(&gone.path).exists());
    assert_eq!(repo.git(&["show", "relay/gone:wip.txt"]), "wip");
    assert!(rt
        .runtime
        .orphan_worktrees(&agents, false)
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_diff_is_its_branch_against_its_base() {
    let repo = Repo::new();
    let rt = rt();
    let spec = spec("a1", &repo.path, None, &[]);
    let state = rt.runtime.prepare_worktree(&spec).await.unwrap();
    let path = std::path::Path::new(&state.path);
    std::fs::write(path.join("src/lib.txt"), "one\n2\nthree\nfour\n").unwrap();
    git(path, &["commit", "-q", "-am", "agent work"]);
    // The base moves on: the diff is still only the branch's own.
    std::fs::write(repo.path.join("README.md"), "main moved\n").unwrap();
    repo.git(&["commit", "-q", "-am", "main work"]);
    let diff = rt.runtime.agent_diff(&agent(spec.clone())).await.unwrap();
    assert_eq!(diff.files.len(), 1);
    assert_eq!(
        (diff.files[0].path.as_str(), diff.added, diff.removed),
        ("src/lib.txt", 2, 1)
    );
    assert!(diff.patch.contains("+four"), "{}", diff.patch);
    assert_eq!((diff.worktree.ahead, diff.worktree.behind), (1, 1));
    // An agent on another node is refused with where to look.
    let mut remote = agent(spec);
    remote.spec.node = Some("n1".into());
    let e = refusal(rt.runtime.agent_diff(&remote).await.unwrap_err());
    assert!(matches!(e, WorkspaceError::OnNode { .. }), "{e}");
}

/// A data dir reached through a symlink: the worktree's path is the same before and
/// after its directories exist, so the runtime finds its own record of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_dir_behind_a_symlink_names_the_worktree_one_way() {
    let repo = Repo::new();
    let base = tempfile::tempdir().unwrap();
    std::fs::create_dir(base.path().join("real")).unwrap();
    std::os::unix::fs::symlink(base.path().join("real"), base.path().join("link")).unwrap();
    let stop = CancellationToken::new();
    let (runtime, _reports) = Runtime::start_with(
        RuntimeConfig::new(base.path().join("link/data")),
        Harnesses::default(),
        stop,
    )
    .unwrap();
    let spec = spec("a1", &repo.path, None, &[]);
    let made = runtime.prepare_worktree(&spec).await.unwrap();
    let again = runtime.prepare_worktree(&spec).await.unwrap();
    assert_eq!(made.path, again.path);
    std::fs::write(std::path::Path::new(&made.path).join("wip.txt"), "x\n").unwrap();
    assert_eq!(
        runtime.worktree_dirty(&agent(spec)).await.unwrap(),
        vec!["wip.txt"]
    );
}

/// A worktree in a `--worktree-dir`, found by a runtime that has no record of it (its
/// database lost): taken up and recorded, with its work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worktree_found_without_a_record_is_taken_up() {
    let repo = Repo::new();
    let trees = tempfile::tempdir().unwrap();
    let mut spec = spec("a1", &repo.path, None, &[]);
    spec.worktree.as_mut().unwrap().dir = Some(trees.path().display().to_string());
    let first = rt();
    let made = first.runtime.prepare_worktree(&spec).await.unwrap();
    assert!(made.path.starts_with(
        &std::fs::canonicalize(trees.path())
            .unwrap()
            .display()
            .to_string()
    ));
    std::fs::write(std::path::Path::new(&made.path).join("wip.txt"), "x\n").unwrap();
    let second = rt();
    let found = second.runtime.prepare_worktree(&spec).await.unwrap();
    assert_eq!(
        (found.path.as_str(), found.recreated),
        (made.path.as_str(), 0)
    );
    assert_eq!(
        second.runtime.worktree_dirty(&agent(spec)).await.unwrap(),
        vec!["wip.txt"]
    );
}
