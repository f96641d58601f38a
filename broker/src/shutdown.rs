//! Signals to shutdown, for the processes `relay up` and `relay node`: the first
//! SIGINT/SIGTERM drains in-flight work, a second one exits at once, and so does a
//! drain that has not ended after [`FORCE_EXIT_AFTER`]: a signal always ends the process.

use tokio_util::sync::CancellationToken;

/// How long the drain after a first signal may take before the process exits anyway:
/// longer than the storage stall bound (which ends a drain stuck on the disk with its
/// own clear error), and far longer than a drain takes.
pub const FORCE_EXIT_AFTER: std::time::Duration = std::time::Duration::from_secs(90);

/// Cancels `shutdown` at the first SIGINT/SIGTERM; exits the process (status 130) at the
/// second, or [`FORCE_EXIT_AFTER`] the first. Call it from within the tokio runtime.
pub fn on_signals(shutdown: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    // The one task not owned by a tracker ([`crate::tasks`]): it must outlive the drain
    // it starts, to force the exit at a second signal; it ends with the process.
    tokio::spawn(async move {
        let (Ok(mut int), Ok(mut term)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) else {
            tracing::error!("cannot install signal handlers");
            return;
        };
        tokio::select! { _ = int.recv() => {}, _ = term.recv() => {} }
        tracing::info!("shutting down (send the signal again to force)");
        shutdown.cancel();
        // Logged, not printed: with `--log-format json` every line of stderr is JSON.
        tokio::select! {
            _ = int.recv() => tracing::warn!("forced exit at a second signal"),
            _ = term.recv() => tracing::warn!("forced exit at a second signal"),
            _ = tokio::time::sleep(FORCE_EXIT_AFTER) => tracing::error!(
                "the shutdown did not finish within {} s; exiting anyway",
                FORCE_EXIT_AFTER.as_secs()
            ),
        }
        std::process::exit(130);
    });
}
