//! The registry of launchers a runtime has, one per [`Harness`]: above the seam and
//! every adapter, so that the seam never names one.

use std::collections::HashMap;
use std::sync::Arc;

use relay_protocol::domain::Harness;

use crate::error::HarnessError;
use crate::seam::Launcher;

/// The launchers of a runtime, one per [`Harness`].
#[derive(Clone, Default)]
pub struct Harnesses {
    launchers: HashMap<Harness, Arc<dyn Launcher>>,
}

impl Harnesses {
    /// The adapters this build has: Codex app-server, Claude Code stream-json, Pi RPC,
    /// tmux panes, and ACP agents (the generic one and each preset).
    pub fn builtin() -> Harnesses {
        let mut harnesses = Harnesses::default()
            .with(Arc::new(crate::codex::CodexLauncher))
            .with(Arc::new(crate::claude::ClaudeLauncher))
            .with(Arc::new(crate::pi::PiLauncher))
            .with(Arc::new(crate::tmux::TmuxLauncher));
        for h in Harness::ALL.into_iter().filter(|h| h.is_acp()) {
            harnesses = harnesses.with(Arc::new(crate::acp::AcpLauncher::new(h)));
        }
        harnesses
    }

    /// These launchers and `launcher`, which replaces any other of its harness.
    pub fn with(mut self, launcher: Arc<dyn Launcher>) -> Harnesses {
        self.launchers.insert(launcher.info().harness, launcher);
        self
    }

    /// The launcher of `harness`; [`HarnessError::Unsupported`] when there is none.
    pub fn get(&self, harness: Harness) -> Result<Arc<dyn Launcher>, HarnessError> {
        self.launchers
            .get(&harness)
            .cloned()
            .ok_or_else(|| HarnessError::Unsupported {
                harness,
                supported: Harness::ALL
                    .iter()
                    .filter(|h| self.launchers.contains_key(h))
                    .map(|h| h.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_harness_has_a_builtin_launcher() {
        let harnesses = Harnesses::builtin();
        for harness in Harness::ALL {
            assert_eq!(
                harnesses.get(harness).map(|l| l.info().harness).ok(),
                Some(harness)
            );
        }
    }

    #[test]
    fn a_harness_without_a_launcher_is_refused_with_the_ones_there_are() {
        let harnesses = Harnesses::default()
            .with(Arc::new(crate::codex::CodexLauncher))
            .with(Arc::new(crate::pi::PiLauncher));
        match harnesses.get(Harness::Tmux) {
            Err(e @ HarnessError::Unsupported { .. }) => assert_eq!(
                e.to_string(),
                "harness tmux is not supported by this runtime yet (only codex_app_server, pi_rpc)"
            ),
            Err(other) => panic!("{other:?}"),
            Ok(_) => panic!("tmux has no launcher here"),
        }
    }
}
