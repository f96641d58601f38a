//! What the mock records of each request ([`RecordedRequest`]), and the readers of the
//! conversation a CLI sent in either API ([`all_input_text`]).

use serde_json::Value;

/// One request as the mock received it.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedRequest {
    pub method: String,
    /// The path, without the query string.
    pub path: String,
    /// The query string, without `?` (empty when none).
    pub query: String,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The body parsed as JSON; `Value::Null` when empty or not JSON.
    pub body: Value,
}

impl RecordedRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `input` items of a Responses request (empty when absent).
    pub fn input(&self) -> &[Value] {
        self.array("input")
    }

    /// The `messages` of a Messages request (empty when absent).
    pub fn messages(&self) -> &[Value] {
        self.array("messages")
    }

    fn array(&self, key: &str) -> &[Value] {
        self.body
            .get(key)
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// The text the user last typed: in a Responses request, the last `message` item
    /// with role `user`; in a Messages request, the last `text` block of a `user`
    /// message, skipping the `<system-reminder>` blocks Claude Code adds and messages
    /// that only carry tool results.
    pub fn last_user_text(&self) -> Option<String> {
        if !self.messages().is_empty() {
            return self.messages().iter().rev().find_map(|m| {
                if str_field(m, "role") != "user" {
                    return None;
                }
                match m.get("content") {
                    Some(Value::String(s)) => Some(s.clone()),
                    Some(Value::Array(blocks)) => blocks
                        .iter()
                        .rev()
                        .filter(|b| str_field(b, "type") == "text")
                        .map(|b| str_field(b, "text"))
                        .find(|t| !t.trim_start().starts_with("<system-reminder>"))
                        .map(str::to_string),
                    _ => None,
                }
            });
        }
        self.input()
            .iter()
            .rev()
            .find(|item| {
                item.get("type").and_then(Value::as_str) == Some("message")
                    && item.get("role").and_then(Value::as_str) == Some("user")
            })
            .map(message_text)
    }

    /// The output of the first tool result after the user's last prompt, if any: a
    /// scripted model asks for a tool once per prompt, and answers once it has the
    /// result. Either API.
    pub fn tool_output_since_prompt(&self) -> Option<String> {
        let input = self.input();
        if let Some(last_user) = input
            .iter()
            .rposition(|i| i["type"] == "message" && i["role"] == "user")
        {
            return input[last_user..]
                .iter()
                .find(|i| i["type"] == "function_call_output")
                .map(|i| output_text(i.get("output")));
        }
        let messages = self.messages();
        let prompt = messages.iter().rposition(|m| {
            m["role"] == "user"
                && match m.get("content") {
                    Some(Value::String(_)) => true,
                    Some(Value::Array(blocks)) => blocks.iter().any(|b| {
                        b["type"] == "text"
                            && !str_field(b, "text")
                                .trim_start()
                                .starts_with("<system-reminder>")
                    }),
                    _ => false,
                }
        })?;
        messages[prompt..]
            .iter()
            .filter_map(|m| m.get("content").and_then(Value::as_array))
            .flatten()
            .find(|b| b["type"] == "tool_result")
            .map(|b| output_text(b.get("content")))
    }

    /// Whether the request offers a tool of this name (`Bash` in Claude Code, `bash` in
    /// Pi, `exec_command` in Codex).
    pub fn offers_tool(&self, name: &str) -> bool {
        self.array("tools").iter().any(|t| t["name"] == name)
    }

    /// `(call id, output)` of every tool result, in order: Responses
    /// `function_call_output` items, or Messages `tool_result` blocks.
    pub fn function_call_outputs(&self) -> Vec<(String, String)> {
        let responses = self
            .input()
            .iter()
            .filter(|item| item.get("type").and_then(Value::as_str) == Some("function_call_output"))
            .map(|item| {
                let call_id = str_field(item, "call_id").to_string();
                (call_id, output_text(item.get("output")))
            });
        let messages = self
            .messages()
            .iter()
            .filter_map(|m| m.get("content").and_then(Value::as_array))
            .flatten()
            .filter(|b| str_field(b, "type") == "tool_result")
            .map(|b| {
                let id = str_field(b, "tool_use_id").to_string();
                (id, output_text(b.get("content")))
            });
        responses.chain(messages).collect()
    }
}

/// Every piece of text in a request's conversation, one line per item: message text
/// (user, developer, assistant), tool calls (`name arguments`) and their outputs, from a
/// Responses `input` or a Messages `messages` list. For asserting that a request carries
/// some earlier text.
pub fn all_input_text(req: &RecordedRequest) -> String {
    let mut out = Vec::new();
    for item in req.input() {
        match item.get("type").and_then(Value::as_str) {
            Some("message") => out.push(message_text(item)),
            Some("function_call") => out.push(format!(
                "{} {}",
                str_field(item, "name"),
                str_field(item, "arguments")
            )),
            Some("function_call_output") | Some("custom_tool_call_output") => {
                out.push(output_text(item.get("output")))
            }
            _ => {}
        }
    }
    for message in req.messages() {
        match message.get("content") {
            Some(Value::String(s)) => out.push(s.clone()),
            Some(Value::Array(blocks)) => {
                for b in blocks {
                    match str_field(b, "type") {
                        "text" => out.push(str_field(b, "text").to_string()),
                        "tool_use" => out.push(format!(
                            "{} {}",
                            str_field(b, "name"),
                            b.get("input").map(Value::to_string).unwrap_or_default()
                        )),
                        "tool_result" => out.push(output_text(b.get("content"))),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    out.join("\n")
}

fn str_field<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// A message's content: a string, or parts with `text` (`input_text`, `output_text`).
fn message_text(item: &Value) -> String {
    match item.get("content") {
        Some(v @ (Value::String(_) | Value::Array(_))) => output_text(Some(v)),
        _ => String::new(),
    }
}

/// A tool output: a string, or content parts with `text`.
fn output_text(output: Option<&Value>) -> String {
    match output {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        Some(other) => other.to_string(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use serde_json::json;

    use super::*;

    #[test]
    fn input_text_covers_messages_calls_and_outputs() {
        let req = RecordedRequest {
            method: "POST".into(),
            path: "/v1/responses".into(),
            query: String::new(),
            headers: vec![],
            body: json!({"input": [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]},
                {"type": "function_call", "name": "exec_command", "arguments": "{}", "call_id": "c1"},
                {"type": "function_call_output", "call_id": "c1", "output": "done"},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "again"}]},
            ]}),
        };
        assert_eq!(
            all_input_text(&req),
            "hello\nhi\nexec_command {}\ndone\nagain"
        );
        assert_eq!(req.last_user_text().as_deref(), Some("again"));
        assert_eq!(
            req.function_call_outputs(),
            vec![("c1".to_string(), "done".to_string())]
        );
    }
}
