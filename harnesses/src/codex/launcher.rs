//! Codex behind the harness seam ([`crate::seam`]): [`CodexLauncher`] spawns
//! `codex app-server` for an agent, and its session opens the agent's thread (resumed,
//! or started with the loss said) and runs turns through [`CodexSession`].

use std::path::PathBuf;

use relay_protocol::domain::{AgentSpec, ApprovalDecision, Harness};

use super::{CodexConfig, CodexSession, ThreadOptions, CODEX_CLI};
use crate::access::RelayAccess;
use crate::error::HarnessError;
use crate::seam::{
    BoxFuture, Conversation, Endpoint, HarnessInfo, HarnessSession, Launcher, Spawned,
};

/// Codex app-server: everything the seam offers.
pub const CODEX_INFO: HarnessInfo = HarnessInfo {
    harness: Harness::CodexAppServer,
    name: "codex",
    program: "codex app-server",
    capabilities: Harness::CodexAppServer.capabilities(),
};

/// Spawns `codex app-server` sessions (the pinned program unless the agent names one).
#[derive(Debug, Clone, Copy, Default)]
pub struct CodexLauncher;

impl Launcher for CodexLauncher {
    fn info(&self) -> HarnessInfo {
        CODEX_INFO
    }

    fn spawn<'a>(
        &'a self,
        agent: &'a AgentSpec,
        relay: Option<&'a RelayAccess>,
    ) -> BoxFuture<'a, Result<Spawned, HarnessError>> {
        Box::pin(async move {
            let (session, events) =
                CodexSession::spawn(CodexConfig::for_agent(agent, &CODEX_CLI, relay)).await?;
            let options = ThreadOptions {
                cwd: Some(PathBuf::from(&agent.cwd)),
                model: agent.model.clone(),
                ..ThreadOptions::default()
            };
            Ok(Spawned {
                session: std::sync::Arc::new(CodexAgent { session, options }),
                events,
            })
        })
    }
}

/// One agent's `codex app-server`, with the settings of the threads it starts.
struct CodexAgent {
    session: CodexSession,
    options: ThreadOptions,
}

impl CodexAgent {
    async fn start_thread(&self) -> Result<String, HarnessError> {
        self.session
            .start_thread(&self.options)
            .await
            .map_err(|e| HarnessError::Conversation {
                action: "cannot start a codex thread".into(),
                source: Box::new(e),
            })
    }
}

impl HarnessSession for CodexAgent {
    fn open<'a>(
        &'a self,
        stored: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Conversation, HarnessError>> {
        Box::pin(async move {
            let Some(old) = stored else {
                let id = self.start_thread().await?;
                return Ok(Conversation { id, lost: None });
            };
            match self.session.resume_thread(old).await {
                Ok(t) => Ok(Conversation {
                    id: t.thread_id,
                    lost: None,
                }),
                Err(HarnessError::ThreadNotFound { .. }) => Ok(Conversation::replacing(
                    old,
                    self.start_thread().await?,
                    &format!("codex no longer has thread {old}"),
                )),
                Err(e) => Err(HarnessError::Conversation {
                    action: format!("cannot resume codex thread {old}"),
                    source: Box::new(e),
                }),
            }
        })
    }

    fn start_turn<'a>(
        &'a self,
        conversation: &'a str,
        text: &'a str,
        _relay_turn_id: &'a str,
    ) -> BoxFuture<'a, Result<String, HarnessError>> {
        Box::pin(self.session.start_turn(conversation, text))
    }

    fn steer<'a>(
        &'a self,
        conversation: &'a str,
        turn_id: &'a str,
        text: &'a str,
    ) -> BoxFuture<'a, Result<(), HarnessError>> {
        Box::pin(async move {
            self.session
                .steer(conversation, turn_id, text)
                .await
                .map_err(no_active_turn)
        })
    }

    fn interrupt<'a>(
        &'a self,
        conversation: &'a str,
        turn_id: &'a str,
    ) -> BoxFuture<'a, Result<(), HarnessError>> {
        Box::pin(async move {
            self.session
                .interrupt(conversation, turn_id)
                .await
                .map_err(no_active_turn)
        })
    }

    fn respond_approval<'a>(
        &'a self,
        request_id: &'a str,
        decision: ApprovalDecision,
    ) -> BoxFuture<'a, Result<(), HarnessError>> {
        Box::pin(self.session.respond_approval(request_id, decision))
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint::Process {
            pid: self.session.pid(),
        }
    }

    fn stderr_tail(&self) -> String {
        self.session.stderr_tail()
    }

    fn shutdown(&self) -> BoxFuture<'_, Result<(), HarnessError>> {
        Box::pin(self.session.shutdown())
    }
}

/// Codex's refusal of a steer or interrupt with no turn active (`no active turn to
/// steer`, `... to interrupt`; see the module docs of [`super`]), typed.
fn no_active_turn(err: HarnessError) -> HarnessError {
    match err {
        HarnessError::Rpc { ref message, .. } if message.contains("no active turn") => {
            HarnessError::NoActiveTurn {
                detail: err.to_string(),
            }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use relay_protocol::codex::error_code::INVALID_REQUEST;

    #[test]
    fn no_active_turn_refusals_are_typed_and_read_as_before() {
        let refusal = |message: &str| HarnessError::Rpc {
            code: INVALID_REQUEST,
            message: message.into(),
        };
        for message in ["no active turn to steer", "no active turn to interrupt"] {
            let err = no_active_turn(refusal(message));
            assert!(matches!(err, HarnessError::NoActiveTurn { .. }), "{err:?}");
            assert_eq!(err.to_string(), refusal(message).to_string());
        }
        assert!(matches!(
            no_active_turn(refusal("thread not found: t")),
            HarnessError::Rpc { .. }
        ));
    }
}
