//! A host without git: a worktree is refused with how to get git. A binary of its own:
//! it takes git off this process's PATH.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use relay_harnesses::Harnesses;
use relay_runtime::workspace::WorkspaceError;
use relay_runtime::{Runtime, RuntimeConfig, RuntimeError};
use support::repo::{spec, Repo};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_git_a_worktree_is_refused_with_how_to_get_it() {
    let repo = Repo::new();
    let empty = tempfile::tempdir().unwrap();
    // The only test of this binary: no other test sees the changed PATH.
    std::env::set_var("PATH", empty.path());
    let dir = tempfile::tempdir().unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let (runtime, _reports) =
        Runtime::start_with(RuntimeConfig::new(dir.path()), Harnesses::default(), stop).unwrap();
    let e = runtime
        .prepare_worktree(&spec("a1", &repo.path, None, &[]))
        .await
        .unwrap_err();
    assert!(
        matches!(e, RuntimeError::Workspace(WorkspaceError::GitMissing)),
        "{e}"
    );
    assert!(e.to_string().contains("apt install git"), "{e}");
    assert!(!dir.path().join("worktrees/a1").exists());
}
