//! Signals to shutdown, for the processes `relay up` and `relay node`: the first
//! SIGINT/SIGTERM drains in-flight work, a second one exits at once.

use tokio_util::sync::CancellationToken;

/// Cancels `shutdown` at the first SIGINT/SIGTERM; exits the process (status 130) at the
/// second. Call it from within the tokio runtime.
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
        tokio::select! { _ = int.recv() => {}, _ = term.recv() => {} }
        eprintln!("relay: forced exit");
        std::process::exit(130);
    });
}
