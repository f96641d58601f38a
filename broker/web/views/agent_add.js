// "Add agent" (`agent.add`, as `relay agent add`): name, harness, working directory,
// model, wake mode, program, environment, and the workspace options (`--worktree`, its
// base, its directory, the untracked files copied in). The broker checks the agent
// (its cwd, program, credentials) and its error is shown as it says it; its warnings
// are shown beside the new agent's link.
//
// Test hooks: `form[data-action="add-agent"]` with `input.add-name`, `select.add-harness`,
// `input.add-cwd`, `input.add-model`, `select.add-wake`, `input.add-command`,
// `textarea.add-env`, `input.add-worktree`, `input.add-base`, `input.add-dir`,
// `input.add-copy`; `button[data-action="submit-agent"]`; `.add-result` (the link or
// the error).

import { HARNESSES, WAKE_POLICIES } from "/api.gen.js";
import { agentHref, errorNode, h, muted } from "/lib/dom.js";
import { call } from "/lib/api.js";

/** `K=V` lines as an object; throws naming a line without `=`. */
function parseEnv(textValue) {
  const env = {};
  for (const line of textValue.split("\n")) {
    const l = line.trim();
    if (!l) continue;
    const eq = l.indexOf("=");
    if (eq <= 0) throw new Error(`environment: "${l}" is not K=V`);
    env[l.slice(0, eq)] = l.slice(eq + 1);
  }
  return env;
}

function field(label, input, hint) {
  return h("div", { class: "field" }, h("label", { for: input.id }, label), input, hint ? muted(hint) : null);
}

function addAgentForm() {
  const input = (cls, props = {}) => h("input", { type: "text", id: cls, class: cls, autocomplete: "off", ...props });
  const name = input("add-name", { required: true, pattern: "[A-Za-z0-9_-]+", placeholder: "reviewer" });
  const harness = h("select", { id: "add-harness", class: "add-harness", required: true },
    HARNESSES.map((v) => h("option", { value: v }, v)));
  const cwd = input("add-cwd", { required: true, placeholder: "/path/to/project" });
  const model = input("add-model", { placeholder: "the harness's default" });
  const wake = h("select", { id: "add-wake", class: "add-wake" }, WAKE_POLICIES.map((v) => h("option", { value: v }, v)));
  const command = input("add-command", { placeholder: "the harness's own program" });
  const env = h("textarea", { id: "add-env", class: "add-env", rows: "2", placeholder: "K=V, one a line" });
  const worktree = h("input", { type: "checkbox", id: "add-worktree", class: "add-worktree" });
  const base = input("add-base", { placeholder: "the repository's current branch" });
  const dir = input("add-dir", { placeholder: "the runtime's data dir" });
  const copy = input("add-copy", { placeholder: ".env config/*.local" });
  const wtFields = h("fieldset", { class: "worktree-fields", disabled: true },
    h("legend", null, "Worktree"),
    field("Base", base, "the branch, tag or commit its branch relay/NAME starts from"),
    field("Directory", dir, "made in DIR/NAME"),
    field("Copy", copy, "untracked files copied in, space-separated paths or globs"));
  worktree.addEventListener("change", () => {
    wtFields.disabled = !worktree.checked;
  });
  const submit = h("button", { type: "submit", dataset: { action: "submit-agent" } }, "Add agent");
  const result = h("div", { class: "add-result", "aria-live": "polite" });
  const form = h("form", { class: "add-agent", dataset: { action: "add-agent" }, hidden: true, "aria-label": "Add an agent" },
    h("div", { class: "fields" },
      field("Name", name), field("Harness", harness), field("Working directory", cwd),
      field("Model", model), field("Wake", wake), field("Program", command), field("Environment", env)),
    h("div", { class: "field check" }, h("label", null, worktree,
      " In a git worktree of its own (branch relay/NAME, made from the repository of its working directory)")),
    wtFields,
    h("div", { class: "row" }, submit), result);

  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    result.replaceChildren();
    let spec;
    try {
      spec = { name: name.value.trim(), harness: harness.value, cwd: cwd.value.trim(), wake: wake.value };
      if (model.value.trim()) spec.model = model.value.trim();
      if (command.value.trim()) spec.command = command.value.trim();
      const vars = parseEnv(env.value);
      if (Object.keys(vars).length) spec.env = vars;
      if (worktree.checked) {
        spec.worktree = {};
        if (base.value.trim()) spec.worktree.base = base.value.trim();
        if (dir.value.trim()) spec.worktree.dir = dir.value.trim();
        const globs = copy.value.split(/\s+/).filter(Boolean);
        if (globs.length) spec.worktree.copy = globs;
      }
    } catch (err) {
      result.append(errorNode(err));
      return;
    }
    submit.disabled = true;
    try {
      const added = await call("agent.add", [], { body: spec });
      result.append(h("p", { class: "ok" }, "Added ", h("a", { href: agentHref(added.name) }, added.name), "."),
        ...(added.warnings || []).map((w) => h("p", { class: "warning" }, w)));
      name.value = "";
    } catch (err) {
      result.append(errorNode(err));
    } finally {
      submit.disabled = false;
    }
  });
  return { el: form, focus: () => name.focus() };
}

export {
  addAgentForm,
};
