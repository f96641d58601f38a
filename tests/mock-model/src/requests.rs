//! What the mock records of each request ([`RecordedRequest`]), and the readers of the
//! conversation a CLI sent in any of the APIs ([`all_input_text`]): a Responses `input`,
//! a `messages` list (Anthropic Messages, or chat completions with `tool_calls` and
//! `role: "tool"` messages), or Gemini `contents` with `parts`.

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

    /// The `messages` of a Messages or chat completions request (empty when absent).
    pub fn messages(&self) -> &[Value] {
        self.array("messages")
    }

    /// The `contents` of a Gemini request (empty when absent).
    pub fn contents(&self) -> &[Value] {
        self.array("contents")
    }

    fn array(&self, key: &str) -> &[Value] {
        self.body
            .get(key)
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// Whether the conversation the request carries ([`all_input_text`]: messages, tool
    /// calls and their outputs) contains `text`: e.g. whether a resumed or forked
    /// session's request carries an earlier turn's prompt or answer.
    pub fn carries(&self, text: &str) -> bool {
        all_input_text(self).contains(text)
    }

    /// The text the user last typed: in a Responses request, the last `message` item
    /// with role `user`; in a Messages or chat request, the last `text` block of a `user`
    /// message, skipping the `<system-reminder>` blocks Claude Code adds and messages
    /// that only carry tool results; in a Gemini request, the last `text` part of the
    /// last `user` content that has one (a `functionResponse` is not typed text).
    ///
    /// Agents put their own context into user messages too, so a handler should look
    /// for a marker in this text rather than compare it whole.
    pub fn last_user_text(&self) -> Option<String> {
        if !self.contents().is_empty() {
            return self.contents().iter().rev().find_map(|c| {
                if str_field(c, "role") != "user" {
                    return None;
                }
                gemini_parts(c)
                    .iter()
                    .rev()
                    .find_map(|p| p.get("text").and_then(Value::as_str))
                    .map(str::to_string)
            });
        }
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
                .find(|i| is_call_output(i))
                .map(|i| output_text(i.get("output")));
        }
        let contents = self.contents();
        if !contents.is_empty() {
            let prompt = contents.iter().rposition(|c| {
                c["role"] == "user" && gemini_parts(c).iter().any(|p| p.get("text").is_some())
            })?;
            return contents[prompt..]
                .iter()
                .flat_map(gemini_parts)
                .find_map(|p| p.get("functionResponse"))
                .map(function_response_text);
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
        messages[prompt..].iter().find_map(|m| {
            if m["role"] == "tool" {
                // Chat completions: the result is a message of its own.
                return Some(output_text(m.get("content")));
            }
            m.get("content")
                .and_then(Value::as_array)?
                .iter()
                .find(|b| b["type"] == "tool_result")
                .map(|b| output_text(b.get("content")))
        })
    }

    /// Whether the request offers a tool of this name (`Bash` in Claude Code, `bash` in
    /// Pi and OpenCode, `exec_command` in Codex, `run_shell_command` in Gemini CLI and
    /// Qwen Code). Tools are `{name}` (Responses, Messages), `{function: {name}}` (chat
    /// completions) or `{functionDeclarations: [{name}]}` (Gemini).
    pub fn offers_tool(&self, name: &str) -> bool {
        self.array("tools").iter().any(|t| {
            t["name"] == name
                || t["function"]["name"] == name
                || t["functionDeclarations"]
                    .as_array()
                    .is_some_and(|decls| decls.iter().any(|d| d["name"] == name))
        })
    }

    /// `(call id, output)` of every tool result, in order: Responses
    /// `function_call_output` and `custom_tool_call_output` items, Messages `tool_result`
    /// blocks, chat `role: "tool"` messages (`tool_call_id`), or Gemini `functionResponse` parts (their `id`, else
    /// their `name`).
    pub fn function_call_outputs(&self) -> Vec<(String, String)> {
        let responses = self
            .input()
            .iter()
            .filter(|item| is_call_output(item))
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
        let chat = self
            .messages()
            .iter()
            .filter(|m| m["role"] == "tool")
            .map(|m| {
                let id = str_field(m, "tool_call_id").to_string();
                (id, output_text(m.get("content")))
            });
        let gemini = self
            .contents()
            .iter()
            .flat_map(gemini_parts)
            .filter_map(|p| p.get("functionResponse"))
            .map(|r| {
                let id = match str_field(r, "id") {
                    "" => str_field(r, "name"),
                    id => id,
                };
                (id.to_string(), function_response_text(r))
            });
        responses
            .chain(messages)
            .chain(chat)
            .chain(gemini)
            .collect()
    }
}

/// Every piece of text in a request's conversation, one line per item: message text
/// (user, developer, assistant; chat `system` messages too), tool calls (`name
/// arguments`) and their outputs, from a Responses `input`, a Messages or chat
/// completions `messages` list, or Gemini `contents` (Gemini's `systemInstruction`, like
/// Anthropic's `system`, is not conversation). For asserting that a request carries
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
            Some("custom_tool_call") => out.push(format!(
                "{} {}",
                str_field(item, "name"),
                str_field(item, "input")
            )),
            Some("function_call_output") | Some("custom_tool_call_output") => {
                out.push(output_text(item.get("output")))
            }
            _ => {}
        }
    }
    for message in req.messages() {
        // Chat completions: an assistant message's calls sit beside its content.
        for call in message
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            out.push(format!(
                "{} {}",
                str_field(&call["function"], "name"),
                str_field(&call["function"], "arguments")
            ));
        }
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
    for part in req.contents().iter().flat_map(gemini_parts) {
        if let Some(text) = part.get("text").and_then(Value::as_str) {
            out.push(text.to_string());
        } else if let Some(call) = part.get("functionCall") {
            out.push(format!(
                "{} {}",
                str_field(call, "name"),
                call.get("args").map(Value::to_string).unwrap_or_default()
            ));
        } else if let Some(response) = part.get("functionResponse") {
            out.push(function_response_text(response));
        }
    }
    out.join("\n")
}

/// A Gemini content's `parts` (empty when absent).
/// A Responses tool result: a function's, or a freeform (custom) tool's.
fn is_call_output(item: &Value) -> bool {
    matches!(
        item.get("type").and_then(Value::as_str),
        Some("function_call_output" | "custom_tool_call_output")
    )
}

fn gemini_parts(content: &Value) -> &[Value] {
    content
        .get("parts")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// A Gemini `functionResponse`'s output: `response.output` (Gemini CLI's shape), else
/// `response.error`, else the whole `response` as JSON.
fn function_response_text(response: &Value) -> String {
    let body = &response["response"];
    match (body.get("output"), body.get("error")) {
        (Some(out), _) => output_text(Some(out)),
        (None, Some(err)) => output_text(Some(err)),
        (None, None) => body.to_string(),
    }
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

    /// Codex's freeform `apply_patch`: its call is a `custom_tool_call`, its result a
    /// `custom_tool_call_output` (a result like any other to the scripted model).
    #[test]
    fn a_custom_tools_output_is_a_tool_output() {
        let req = request(json!({"input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "edit"}]},
            {"type": "custom_tool_call", "name": "apply_patch", "input": "*** Begin Patch", "call_id": "c9"},
            {"type": "custom_tool_call_output", "call_id": "c9", "output": "Success. Updated: A a.txt"},
        ]}));
        assert_eq!(
            req.tool_output_since_prompt().as_deref(),
            Some("Success. Updated: A a.txt")
        );
        assert_eq!(
            req.function_call_outputs(),
            vec![("c9".to_string(), "Success. Updated: A a.txt".to_string())]
        );
    }

    fn request(body: serde_json::Value) -> RecordedRequest {
        RecordedRequest {
            method: "POST".into(),
            path: "/".into(),
            query: String::new(),
            headers: vec![],
            body,
        }
    }

    /// Gemini CLI's second request of a turn, as recorded: the context part beside the
    /// typed text, the model's call (with the `thoughtSignature` Gemini CLI adds), and
    /// the result as a `functionResponse`; an earlier turn's rejected call carries
    /// `response.error`.
    #[test]
    fn gemini_contents_are_read() {
        let req = request(json!({"contents": [
            {"role": "user", "parts": [{"text": "<session_context>ctx</session_context>"}, {"text": "first"}]},
            {"role": "model", "parts": [{"functionCall": {"id": "c0", "name": "run_shell_command", "args": {"command": "rm x"}}}]},
            {"role": "user", "parts": [{"functionResponse": {"id": "c0", "name": "run_shell_command", "response": {"error": "canceled by the user"}}}]},
            {"role": "model", "parts": [{"text": "fine"}]},
            {"role": "user", "parts": [{"text": "exec: echo hi"}]},
            {"role": "model", "parts": [{"functionCall": {"id": "c1", "name": "run_shell_command", "args": {"command": "echo hi"}}, "thoughtSignature": "skip_thought_signature_validator"}]},
            {"role": "user", "parts": [{"functionResponse": {"id": "c1", "name": "run_shell_command", "response": {"output": "hi"}}}]},
        ], "tools": [{"functionDeclarations": [{"name": "read_file"}, {"name": "run_shell_command"}]}]}));
        assert_eq!(req.last_user_text().as_deref(), Some("exec: echo hi"));
        assert_eq!(req.tool_output_since_prompt().as_deref(), Some("hi"));
        assert_eq!(
            req.function_call_outputs(),
            vec![
                ("c0".to_string(), "canceled by the user".to_string()),
                ("c1".to_string(), "hi".to_string())
            ]
        );
        assert!(req.offers_tool("run_shell_command"));
        assert!(!req.offers_tool("bash"));
        assert_eq!(
            all_input_text(&req),
            "<session_context>ctx</session_context>\nfirst\nrun_shell_command {\"command\":\"rm x\"}\ncanceled by the user\nfine\nexec: echo hi\nrun_shell_command {\"command\":\"echo hi\"}\nhi"
        );
    }

    /// Qwen Code's request shape (OpenCode's is the same with string contents): the
    /// `<system-reminder>` parts before the typed text, an assistant message with
    /// `tool_calls`, the result as a `role: "tool"` message with content parts.
    #[test]
    fn chat_messages_are_read() {
        let req = request(json!({"messages": [
            {"role": "system", "content": "You are Qwen Code."},
            {"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>\nskills\n</system-reminder>"},
                {"type": "text", "text": "exec: echo hi"},
            ]},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "run_shell_command", "arguments": "{\"command\":\"echo hi\"}"}},
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "Output: hi"}]},
        ], "tools": [{"type": "function", "function": {"name": "run_shell_command"}}]}));
        assert_eq!(req.last_user_text().as_deref(), Some("exec: echo hi"));
        assert_eq!(
            req.tool_output_since_prompt().as_deref(),
            Some("Output: hi")
        );
        assert_eq!(
            req.function_call_outputs(),
            vec![("call_1".to_string(), "Output: hi".to_string())]
        );
        assert!(req.offers_tool("run_shell_command"));
        assert_eq!(
            all_input_text(&req),
            "You are Qwen Code.\n<system-reminder>\nskills\n</system-reminder>\nexec: echo hi\nrun_shell_command {\"command\":\"echo hi\"}\nOutput: hi"
        );

        // A new prompt after the tool turn: its output is no longer "since the prompt".
        let mut later = req.clone();
        later.body["messages"]
            .as_array_mut()
            .unwrap()
            .push(json!({"role": "user", "content": "next"}));
        assert_eq!(later.last_user_text().as_deref(), Some("next"));
        assert_eq!(later.tool_output_since_prompt(), None);
    }
}
