//! The exit codes of `relay`, one per kind of outcome a script needs to tell apart
//! (documented in `relay --help` and README.md), and how an error maps to one.
//!
//! | code | meaning |
//! | --- | --- |
//! | 0 | done (an ask's or a watched flight's flight completed) |
//! | 1 | failed: the flight failed (`relay doctor`: the data dir has a problem) |
//! | 2 | usage: bad arguments, or a request the broker refused as invalid |
//! | 3 | not found: no such agent, flight, conversation, message or approval |
//! | 4 | refused: not allowed (the token), or in conflict (exists already, a cycle, too deep, already ended; `relay doctor`: a running relay holds the data dir) |
//! | 5 | unavailable: no broker running, not reachable, or overloaded (try again) |
//! | 6 | the flight was cancelled or interrupted (or an approval it needed declined) |
//! | 70 | anything else: an unexpected answer or an internal error (a bug to report) |
//! | 130 | stopped by Ctrl-C |

use std::process::ExitCode;

use relay_client::ClientError;
use relay_protocol::api::ErrorCode;
use relay_protocol::domain::FlightState;

/// One kind of outcome (see the module's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Ok,
    Failed,
    Usage,
    NotFound,
    Refused,
    Unavailable,
    Cancelled,
    Internal,
    Interrupted,
}

impl Exit {
    pub fn code(self) -> u8 {
        match self {
            Exit::Ok => 0,
            Exit::Failed => 1,
            Exit::Usage => 2,
            Exit::NotFound => 3,
            Exit::Refused => 4,
            Exit::Unavailable => 5,
            Exit::Cancelled => 6,
            Exit::Internal => 70,
            Exit::Interrupted => 130,
        }
    }

    /// How a flight that ended in `state` ends the command that followed it.
    pub fn of_flight(state: FlightState) -> Exit {
        match state {
            FlightState::Completed => Exit::Ok,
            FlightState::Cancelled => Exit::Cancelled,
            _ => Exit::Failed,
        }
    }

    /// The kind of a broker's typed error.
    pub fn of_code(code: ErrorCode) -> Exit {
        match code {
            ErrorCode::InvalidRequest | ErrorCode::PayloadTooLarge => Exit::Usage,
            ErrorCode::UnknownAgent
            | ErrorCode::UnknownConversation
            | ErrorCode::UnknownFlight
            | ErrorCode::UnknownMessage
            | ErrorCode::UnknownApproval
            | ErrorCode::UnknownRule
            | ErrorCode::NotFound => Exit::NotFound,
            ErrorCode::Unauthorized
            | ErrorCode::AgentExists
            | ErrorCode::ConversationExists
            | ErrorCode::IllegalTransition
            | ErrorCode::FlightTerminal
            | ErrorCode::ApprovalClosed
            | ErrorCode::DepthLimit
            | ErrorCode::BudgetExceeded
            | ErrorCode::Cycle => Exit::Refused,
            ErrorCode::Overloaded | ErrorCode::Unavailable | ErrorCode::StorageFull => {
                Exit::Unavailable
            }
            ErrorCode::Internal => Exit::Internal,
        }
    }

    /// The kind of an error a command returned: the client's error wherever it is in the
    /// chain, else a usage error for what the CLI itself refused ([`UsageError`]), else
    /// [`Exit::Internal`].
    pub fn of_error(e: &anyhow::Error) -> Exit {
        for cause in e.chain() {
            if let Some(c) = cause.downcast_ref::<ClientError>() {
                return match c {
                    ClientError::NotFound(_)
                    | ClientError::Unreachable { .. }
                    | ClientError::Closed { .. }
                    | ClientError::Overloaded { .. } => Exit::Unavailable,
                    ClientError::Api(api) => Exit::of_code(api.code),
                    ClientError::Protocol(_) | ClientError::Stream(_) => Exit::Internal,
                };
            }
            if cause.downcast_ref::<UsageError>().is_some() {
                return Exit::Usage;
            }
        }
        Exit::Internal
    }
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e.code())
    }
}

/// An argument the CLI refuses itself, after clap took it (exit 2, like clap's own).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// `Err(UsageError)` with a formatted message.
macro_rules! usage {
    ($($t:tt)*) => { return Err($crate::exit::UsageError(format!($($t)*)).into()) };
}
pub(crate) use usage;

#[cfg(test)]
mod tests {
    use super::*;
    use relay_protocol::api::ApiError;

    #[test]
    fn each_kind_of_error_has_its_code() {
        let api = |code| {
            anyhow::Error::from(ClientError::Api(ApiError {
                code,
                message: "m".into(),
            }))
        };
        assert_eq!(Exit::of_error(&api(ErrorCode::UnknownAgent)).code(), 3);
        assert_eq!(Exit::of_error(&api(ErrorCode::InvalidRequest)).code(), 2);
        assert_eq!(Exit::of_error(&api(ErrorCode::Cycle)).code(), 4);
        assert_eq!(Exit::of_error(&api(ErrorCode::Unauthorized)).code(), 4);
        assert_eq!(Exit::of_error(&api(ErrorCode::Overloaded)).code(), 5);
        let busy = anyhow::Error::from(ClientError::Overloaded {
            url: "http://127.0.0.1:1".into(),
            retry_after: None,
            error: ApiError {
                code: ErrorCode::Unavailable,
                message: "m".into(),
            },
        });
        assert_eq!(Exit::of_error(&busy).code(), 5);
        assert_eq!(Exit::of_error(&api(ErrorCode::Internal)).code(), 70);
        let missing = anyhow::Error::from(ClientError::NotFound("no api.json".into()));
        assert_eq!(Exit::of_error(&missing.context("while asking")).code(), 5);
        let usage = anyhow::Error::from(UsageError("--socket is for tmux".into()));
        assert_eq!(Exit::of_error(&usage).code(), 2);
        assert_eq!(Exit::of_error(&anyhow::anyhow!("other")).code(), 70);
        assert_eq!(Exit::of_flight(FlightState::Completed).code(), 0);
        assert_eq!(Exit::of_flight(FlightState::Failed).code(), 1);
        assert_eq!(Exit::of_flight(FlightState::Cancelled).code(), 6);
    }
}
