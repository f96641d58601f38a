//! JSON-RPC 2.0 as ACP uses it: one message per line.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// A request id: a number or a string. `0` is a real id (the first request an agent sends).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RequestId {
    Number(i64),
    Str(String),
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestId::Number(n) => write!(f, "{n}"),
            RequestId::Str(s) => f.write_str(s),
        }
    }
}

/// A JSON-RPC error object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl RpcError {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL_ERROR: i64 = -32603;

    pub fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
            data: None,
        }
    }

    /// `-32601` for `method`.
    pub fn method_not_found(method: &str) -> RpcError {
        RpcError::new(
            Self::METHOD_NOT_FOUND,
            format!("method not found: {method}"),
        )
    }
}

impl fmt::Display for RpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (code {})", self.message, self.code)
    }
}

/// One JSON-RPC message, as read from a line.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    Request {
        id: RequestId,
        method: String,
        params: Value,
    },
    Notification {
        method: String,
        params: Value,
    },
    Response {
        id: RequestId,
        result: Result<Value, RpcError>,
    },
}

/// Why a line is not a JSON-RPC message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LineError {
    /// Not JSON at all (`-32700`).
    NotJson(String),
    /// JSON, but no JSON-RPC message (`-32600`); carries the id when there was one, so
    /// a request can still be answered.
    NotRpc {
        id: Option<RequestId>,
        why: &'static str,
    },
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LineError::NotJson(e) => write!(f, "not JSON: {e}"),
            LineError::NotRpc { why, .. } => write!(f, "not a JSON-RPC message: {why}"),
        }
    }
}

impl std::error::Error for LineError {}

impl LineError {
    /// The error to answer it with.
    pub fn rpc_error(&self) -> RpcError {
        match self {
            LineError::NotJson(_) => RpcError::new(RpcError::PARSE_ERROR, self.to_string()),
            LineError::NotRpc { .. } => RpcError::new(RpcError::INVALID_REQUEST, self.to_string()),
        }
    }
}

impl Message {
    /// Reads one line. `params` absent reads as `null`.
    pub fn parse(line: &str) -> Result<Message, LineError> {
        let value: Value =
            serde_json::from_str(line).map_err(|e| LineError::NotJson(e.to_string()))?;
        Message::from_value(value)
    }

    /// Reads one parsed JSON value.
    pub fn from_value(value: Value) -> Result<Message, LineError> {
        let Value::Object(mut map) = value else {
            return Err(LineError::NotRpc {
                id: None,
                why: "not an object",
            });
        };
        let id =
            match map.remove("id") {
                None | Some(Value::Null) => None,
                Some(id) => Some(serde_json::from_value::<RequestId>(id).map_err(|_| {
                    LineError::NotRpc {
                        id: None,
                        why: "an id that is neither a number nor a string",
                    }
                })?),
            };
        let params = map.remove("params").unwrap_or(Value::Null);
        match (map.remove("method"), id) {
            (Some(Value::String(method)), Some(id)) => Ok(Message::Request { id, method, params }),
            (Some(Value::String(method)), None) => Ok(Message::Notification { method, params }),
            (Some(_), id) => Err(LineError::NotRpc {
                id,
                why: "a method that is not a string",
            }),
            (None, Some(id)) => {
                if let Some(error) = map.remove("error") {
                    let error = serde_json::from_value::<RpcError>(error).map_err(|_| {
                        LineError::NotRpc {
                            id: Some(id.clone()),
                            why: "an error without code and message",
                        }
                    })?;
                    return Ok(Message::Response {
                        id,
                        result: Err(error),
                    });
                }
                match map.remove("result") {
                    Some(result) => Ok(Message::Response {
                        id,
                        result: Ok(result),
                    }),
                    None => Err(LineError::NotRpc {
                        id: Some(id),
                        why: "a response with neither result nor error",
                    }),
                }
            }
            (None, None) => Err(LineError::NotRpc {
                id: None,
                why: "neither a method nor an id",
            }),
        }
    }

    /// The message as one line, without its newline (JSON escapes every newline inside).
    pub fn to_line(&self) -> String {
        let value = match self {
            Message::Request { id, method, params } => {
                json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
            }
            Message::Notification { method, params } => {
                json!({"jsonrpc": "2.0", "method": method, "params": params})
            }
            Message::Response { id, result: Ok(r) } => {
                json!({"jsonrpc": "2.0", "id": id, "result": r})
            }
            Message::Response { id, result: Err(e) } => {
                json!({"jsonrpc": "2.0", "id": id, "error": e})
            }
        };
        value.to_string()
    }

    /// A request of `method` with `params` (serialised; a type that cannot be is `null`).
    pub fn request(id: RequestId, method: &str, params: impl Serialize) -> Message {
        Message::Request {
            id,
            method: method.to_string(),
            params: serde_json::to_value(params).unwrap_or(Value::Null),
        }
    }

    pub fn notification(method: &str, params: impl Serialize) -> Message {
        Message::Notification {
            method: method.to_string(),
            params: serde_json::to_value(params).unwrap_or(Value::Null),
        }
    }

    pub fn ok(id: RequestId, result: impl Serialize) -> Message {
        Message::Response {
            id,
            result: Ok(serde_json::to_value(result).unwrap_or(Value::Null)),
        }
    }

    pub fn error(id: RequestId, error: RpcError) -> Message {
        Message::Response {
            id,
            result: Err(error),
        }
    }
}
