//! Secret environment variables of an agent: how they are kept, shown and recognised.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What a secret variable's value is shown as, everywhere.
pub const SECRET_SHOWN: &str = "***";

/// Secret environment variables, name -> value. Never printed by `Debug`.
#[derive(Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secrets(pub BTreeMap<String, String>);

impl Secrets {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set()
            .entries(self.0.keys().map(|k| format!("{k}={SECRET_SHOWN}")))
            .finish()
    }
}

/// Whether a variable's name says it holds a secret (`OPENAI_API_KEY`, `GH_TOKEN`,
/// `DB_PASSWORD`...): such `--env` values are kept as secrets without being asked.
pub fn looks_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    [
        "KEY",
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "PASS",
        "CREDENTIAL",
        "AUTH",
        "COOKIE",
        "SESSION",
        "PRIVATE",
        "SIGNATURE",
    ]
    .iter()
    .any(|w| upper.contains(w))
        || ["PWD", "DSN", "PAT", "CRED"]
            .iter()
            .any(|w| upper.ends_with(w) || upper.contains(&format!("{w}_")))
}

/// Whether a variable's value says it holds a secret: a URL with credentials in it
/// (`postgres://user:password@host/db`).
pub fn looks_secret_value(value: &str) -> bool {
    value
        .split_once("://")
        .and_then(|(_, rest)| rest.split(['/', '?', '#']).next())
        .is_some_and(|authority| authority.contains('@'))
}
