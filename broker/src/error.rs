//! The broker's typed error, and the one place it maps to wire error codes.

use relay_protocol::api::{ApiError, ErrorCode};
use relay_protocol::domain::FlightState;

/// Errors of broker commands and storage. `Overloaded` and `Storage` are worth retrying;
/// the others will fail the same way again.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("{what} is {size} bytes, over the limit of {limit} bytes")]
    TooLarge {
        what: &'static str,
        size: usize,
        limit: usize,
    },
    #[error("unknown agent {0:?}")]
    UnknownAgent(String),
    #[error("unknown conversation {0:?}")]
    UnknownConversation(String),
    #[error("unknown flight {0:?}")]
    UnknownFlight(String),
    #[error("unknown message {0:?}")]
    UnknownMessage(String),
    #[error("unknown approval {0:?}")]
    UnknownApproval(String),
    #[error("agent {0:?} is already registered")]
    AgentExists(String),
    #[error("conversation {0:?} already exists")]
    ConversationExists(String),
    #[error("flight {flight}: illegal transition {from} -> {to}")]
    IllegalTransition {
        flight: String,
        from: FlightState,
        to: FlightState,
    },
    #[error("flight {flight} is {state}, a terminal state; it does not change any more")]
    FlightTerminal { flight: String, state: FlightState },
    #[error("approval {0} is already closed")]
    ApprovalClosed(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("invocation depth {depth} exceeds the limit of {limit}")]
    DepthLimit { depth: u32, limit: u32 },
    #[error("cycle: agent {agent:?} is already working on an ancestor flight")]
    Cycle { agent: String },
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    #[error("the broker is overloaded: {0}")]
    Overloaded(String),
    #[error("the data directory {0} is in use by another relay process")]
    Locked(String),
    #[error("the broker is shutting down")]
    ShuttingDown,
    #[error("storage: {0}")]
    Storage(#[from] sled::Error),
    /// The storage thread failed a job (a flush failed, or it is gone).
    #[error("storage: {0}")]
    StorageThread(#[from] relay_runtime::storage::StorageError),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    #[error("internal: {0}")]
    Internal(String),
    /// A sled transaction conflict; the transaction is retried, callers never see it.
    #[error("transaction conflict")]
    TxConflict,
}

impl BrokerError {
    pub fn code(&self) -> ErrorCode {
        match self {
            BrokerError::Invalid(_) | BrokerError::Json(_) => ErrorCode::InvalidRequest,
            BrokerError::TooLarge { .. } => ErrorCode::PayloadTooLarge,
            BrokerError::UnknownAgent(_) => ErrorCode::UnknownAgent,
            BrokerError::UnknownConversation(_) => ErrorCode::UnknownConversation,
            BrokerError::UnknownFlight(_) => ErrorCode::UnknownFlight,
            BrokerError::UnknownMessage(_) => ErrorCode::UnknownMessage,
            BrokerError::UnknownApproval(_) => ErrorCode::UnknownApproval,
            BrokerError::AgentExists(_) => ErrorCode::AgentExists,
            BrokerError::ConversationExists(_) => ErrorCode::ConversationExists,
            BrokerError::IllegalTransition { .. } => ErrorCode::IllegalTransition,
            BrokerError::FlightTerminal { .. } => ErrorCode::FlightTerminal,
            BrokerError::ApprovalClosed(_) => ErrorCode::ApprovalClosed,
            BrokerError::Unavailable(_) | BrokerError::ShuttingDown => ErrorCode::Unavailable,
            BrokerError::DepthLimit { .. } => ErrorCode::DepthLimit,
            BrokerError::Cycle { .. } => ErrorCode::Cycle,
            BrokerError::Overloaded(_) => ErrorCode::Overloaded,
            BrokerError::Unauthorized(_) => ErrorCode::Unauthorized,
            BrokerError::Locked(_)
            | BrokerError::Storage(_)
            | BrokerError::StorageThread(_)
            | BrokerError::Corrupt(_)
            | BrokerError::Internal(_)
            | BrokerError::TxConflict => ErrorCode::Internal,
        }
    }

    pub fn to_api(&self) -> ApiError {
        ApiError {
            code: self.code(),
            message: self.to_string(),
        }
    }
}
