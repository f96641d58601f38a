//! The file-writing tool calls the mock makes each CLI run: through its shell tool
//! ([`Reply::write_file`], one approval rule accepts it everywhere: [`WRITE_FILE_RULE`]),
//! or through its own edit tool ([`Reply::edit_file`]: Codex's `apply_patch`, Claude
//! Code's `Write`), which the CLIs report as file changes of their own (Codex's
//! `fileChange` items and `turn/diff/updated`, Claude Code's `Write` tool use). Both are
//! turned into the CLI's call once the request shows which API and tools it has
//! ([`Reply::for_request`]).

use serde_json::{json, Value};

use crate::{RecordedRequest, Reply, Wire};

/// The shell script [`Reply::write_file`] runs: `sh -c SCRIPT sh CONTENT PATH` writes
/// CONTENT to PATH. A fixed script with the data as arguments, so one approval rule
/// ([`WRITE_FILE_RULE`]) accepts exactly these writes and nothing else.
pub const WRITE_FILE_SCRIPT: &str = r#"printf %s "$1" > "$2""#;

/// The `--auto-accept` rule that accepts the commands of [`Reply::write_file`] (content
/// and path plain arguments: no leading `-`, no `=`), and nothing else.
pub const WRITE_FILE_RULE: &str = r#"sh -c 'printf %s "$1" > "$2"' sh * *"#;

/// A model slug for which Codex (0.169) offers its `apply_patch` tool. Codex decides a
/// model's tools from its bundled model list: an unknown slug such as the mock's
/// `mock-model` (or `gpt-5-codex`) gets `exec_command` and no `apply_patch`; `gpt-5.5`
/// gets `apply_patch` as a freeform ("custom") tool whose input is the patch text.
pub const CODEX_APPLY_PATCH_MODEL: &str = "gpt-5.5";

/// The command line [`Reply::write_file`] asks the CLI to run, quoted as the approval
/// rules read it (each word exactly its shell quoting); `None` when it cannot be quoted
/// (a NUL byte).
pub fn write_file_command(path: &str, content: &str) -> Option<String> {
    shlex::try_join(["sh", "-c", WRITE_FILE_SCRIPT, "sh", content, path]).ok()
}

/// The `apply_patch` patch that adds the file `path` holding `content`'s lines: each
/// line a `+` line. apply_patch ends every added line with `\n`, so the file it writes
/// is `content` with a final line break (added when `content` has none).
pub fn apply_patch_add_file_text(path: &str, content: &str) -> String {
    let mut patch = format!("*** Begin Patch\n*** Add File: {path}\n");
    for line in content.lines() {
        patch.push('+');
        patch.push_str(line);
        patch.push('\n');
    }
    patch.push_str("*** End Patch\n");
    patch
}

/// How the request declares a tool named `name`: its `type` (`function`, or `custom`
/// for a Responses freeform tool), `None` when it offers no such tool.
fn tool_type(req: &RecordedRequest, name: &str) -> Option<String> {
    let tools = req.body.get("tools").and_then(Value::as_array)?;
    let tool = tools.iter().find(|t| t["name"] == name)?;
    Some(tool["type"].as_str().unwrap_or("function").to_string())
}

impl Reply {
    /// A call of the CLI's shell tool that writes `content` to `path` in the agent's
    /// working directory (see [`WRITE_FILE_SCRIPT`]): Codex's `exec_command` asking to
    /// run outside its sandbox (Codex asks for approval; [`WRITE_FILE_RULE`] accepts it),
    /// Claude Code's `Bash` (it asks too), Pi's and OpenCode's `bash`, else
    /// `run_shell_command` (Gemini CLI, Qwen Code). Each CLI then runs `sh` in its cwd,
    /// so the file lands where the agent works. Give each call an id of its own (Claude
    /// Code drops a call whose id it saw before).
    pub fn write_file(call_id: impl Into<String>, path: &str, content: &str) -> Self {
        Self::WriteFile {
            call_id: call_id.into(),
            path: path.to_string(),
            content: content.to_string(),
        }
    }

    /// A new file `path` holding `content`, written with the CLI's own edit tool:
    /// Codex's `apply_patch` ([`Reply::apply_patch_add_file`]; offered only for some
    /// models: [`CODEX_APPLY_PATCH_MODEL`]), Claude Code's `Write`
    /// ([`Reply::claude_write`]; `path` must be absolute). A CLI that offers neither gets
    /// a failure saying so. Each CLI asks before the edit (a file change approval).
    pub fn edit_file(call_id: impl Into<String>, path: &str, content: &str) -> Self {
        Self::EditFile {
            call_id: call_id.into(),
            path: path.to_string(),
            content: content.to_string(),
        }
    }

    /// A Responses `custom_tool_call`: a call of a freeform tool, `input` its raw text.
    pub fn custom_tool_call(
        call_id: impl Into<String>,
        name: &str,
        input: impl Into<String>,
    ) -> Self {
        Self::CustomToolCall {
            call_id: call_id.into(),
            name: name.to_string(),
            input: input.into(),
        }
    }

    /// Codex's freeform `apply_patch` adding the file `path` (relative to the agent's
    /// cwd, or absolute) with `content` ([`apply_patch_add_file_text`]).
    pub fn apply_patch_add_file(call_id: impl Into<String>, path: &str, content: &str) -> Self {
        Self::custom_tool_call(
            call_id,
            "apply_patch",
            apply_patch_add_file_text(path, content),
        )
    }

    /// Claude Code's `Write` of `content` to `abs_path` (it takes absolute paths only,
    /// and refuses to overwrite a file it has not read in the session: write new files).
    pub fn claude_write(call_id: impl Into<String>, abs_path: &str, content: &str) -> Self {
        Self::function_call(
            call_id,
            "Write",
            &json!({"file_path": abs_path, "content": content}),
        )
    }

    /// The reply as the CLI that sent `req` on `wire` takes it: a [`Reply::WriteFile`]
    /// becomes that CLI's shell tool call, a [`Reply::EditFile`] its edit tool's call, a
    /// [`Reply::CustomToolCall`] anywhere but Responses a failure; every other reply is
    /// itself.
    pub(crate) fn for_request(self, wire: Wire, req: &RecordedRequest) -> Self {
        match self {
            Self::WriteFile {
                call_id,
                path,
                content,
            } => shell_write(wire, req, call_id, &path, &content),
            Self::EditFile {
                call_id,
                path,
                content,
            } => native_edit(wire, req, call_id, &path, &content),
            Self::CustomToolCall { name, .. } if wire != Wire::Responses => Self::failed(format!(
                "the mock sends a custom tool call ({name}) on the OpenAI Responses API only"
            )),
            other => other,
        }
    }
}

fn shell_write(
    wire: Wire,
    req: &RecordedRequest,
    call_id: String,
    path: &str,
    content: &str,
) -> Reply {
    let Some(cmd) = write_file_command(path, content) else {
        return Reply::failed(format!("the mock cannot quote a write of {path:?}"));
    };
    let args = json!({"command": cmd, "description": format!("write {path}")});
    match wire {
        Wire::Responses => Reply::exec_command_escalated(call_id, &cmd, "write a file"),
        _ if req.offers_tool("Bash") => Reply::function_call(call_id, "Bash", &args),
        _ if req.offers_tool("bash") => Reply::function_call(call_id, "bash", &args),
        _ => Reply::shell_command(call_id, &cmd, "write a file"),
    }
}

fn native_edit(
    wire: Wire,
    req: &RecordedRequest,
    call_id: String,
    path: &str,
    content: &str,
) -> Reply {
    match (
        wire,
        tool_type(req, "apply_patch"),
        req.offers_tool("Write"),
    ) {
        (Wire::Responses, Some(kind), _) if kind == "custom" => {
            Reply::apply_patch_add_file(call_id, path, content)
        }
        // A function tool takes the patch as its `input` argument.
        (Wire::Responses, Some(_), _) => Reply::function_call(
            call_id,
            "apply_patch",
            &json!({"input": apply_patch_add_file_text(path, content)}),
        ),
        (Wire::Messages, _, true) if path.starts_with('/') => {
            Reply::claude_write(call_id, path, content)
        }
        (Wire::Messages, _, true) => Reply::failed(format!(
            "the mock's Write needs an absolute path, not {path:?}"
        )),
        _ => Reply::failed(format!(
            "the mock found no edit tool of the CLI's own (apply_patch, Write) in the request \
             (for Codex, use model {CODEX_APPLY_PATCH_MODEL}); cannot write {path:?}"
        )),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn request(body: Value) -> RecordedRequest {
        RecordedRequest {
            method: "POST".into(),
            path: "/v1/responses".into(),
            query: String::new(),
            headers: Vec::new(),
            body,
        }
    }

    #[test]
    fn an_added_file_is_a_patch_of_plus_lines() {
        let patch = apply_patch_add_file_text("src/new.txt", "one\ntwo\n");
        assert_eq!(
            patch,
            "*** Begin Patch\n*** Add File: src/new.txt\n+one\n+two\n*** End Patch\n"
        );
        // No final line break: the same patch (apply_patch writes one anyway).
        assert_eq!(patch, apply_patch_add_file_text("src/new.txt", "one\ntwo"));
        assert_eq!(
            apply_patch_add_file_text("e", "a\n\nb\n"),
            "*** Begin Patch\n*** Add File: e\n+a\n+\n+b\n*** End Patch\n"
        );
    }

    #[test]
    fn an_edit_becomes_codex_apply_patch_as_the_request_declares_it() {
        let custom = request(json!({"tools": [
            {"type": "function", "name": "exec_command"},
            {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}},
        ]}));
        let reply = Reply::edit_file("c1", "a.txt", "hi\n").for_request(Wire::Responses, &custom);
        assert_eq!(
            reply,
            Reply::CustomToolCall {
                call_id: "c1".into(),
                name: "apply_patch".into(),
                input: apply_patch_add_file_text("a.txt", "hi\n"),
            }
        );
        let function = request(json!({"tools": [{"type": "function", "name": "apply_patch"}]}));
        let reply = Reply::edit_file("c2", "a.txt", "hi").for_request(Wire::Responses, &function);
        let Reply::FunctionCall {
            name, arguments, ..
        } = reply
        else {
            panic!("{reply:?}")
        };
        assert_eq!(name, "apply_patch");
        let args: Value = serde_json::from_str(&arguments).unwrap();
        assert_eq!(args["input"], apply_patch_add_file_text("a.txt", "hi"));
        // No apply_patch offered (Codex with an unknown model): a failure that says so.
        let plain = request(json!({"tools": [{"type": "function", "name": "exec_command"}]}));
        let reply = Reply::edit_file("c3", "a.txt", "hi").for_request(Wire::Responses, &plain);
        let Reply::Failed { message, .. } = reply else {
            panic!("{reply:?}")
        };
        assert!(message.contains(CODEX_APPLY_PATCH_MODEL), "{message}");
    }

    #[test]
    fn an_edit_becomes_claude_codes_write_of_an_absolute_path() {
        let claude = request(json!({"tools": [{"name": "Bash"}, {"name": "Write"}]}));
        let reply =
            Reply::edit_file("toolu_1", "/w/new.txt", "x\n").for_request(Wire::Messages, &claude);
        assert_eq!(reply, Reply::claude_write("toolu_1", "/w/new.txt", "x\n"));
        let Reply::FunctionCall {
            name, arguments, ..
        } = reply
        else {
            panic!("{reply:?}")
        };
        assert_eq!(name, "Write");
        let args: Value = serde_json::from_str(&arguments).unwrap();
        assert_eq!(args, json!({"file_path": "/w/new.txt", "content": "x\n"}));
        let relative = Reply::edit_file("t", "new.txt", "x").for_request(Wire::Messages, &claude);
        assert!(matches!(relative, Reply::Failed { .. }), "{relative:?}");
        // Pi offers no Write: a failure, never a shell write in disguise.
        let pi = request(json!({"tools": [{"name": "bash"}, {"name": "edit"}]}));
        let reply = Reply::edit_file("t", "/w/a", "x").for_request(Wire::Messages, &pi);
        assert!(matches!(reply, Reply::Failed { .. }), "{reply:?}");
    }

    #[test]
    fn a_custom_tool_call_is_responses_only() {
        let req = request(json!({}));
        let call = Reply::apply_patch_add_file("c", "a", "b");
        assert_eq!(call.clone().for_request(Wire::Responses, &req), call);
        let other = call.for_request(Wire::Chat, &req);
        assert!(matches!(other, Reply::Failed { .. }), "{other:?}");
    }
}
