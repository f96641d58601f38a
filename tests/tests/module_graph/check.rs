//! The crates' headers read (`Depends on:`, `Tests also depend on:`, the `Layering`
//! block) and held against their manifests and module graphs.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::graph::{cycle, graph, ident, Graph};

/// One workspace crate as the check reads it: where it is (for messages), its
/// `Cargo.toml`, and its sources under `src/` (path under `src/`, text).
pub struct Crate {
    pub dir: String,
    pub manifest: String,
    pub sources: Vec<(PathBuf, String)>,
}

impl Crate {
    fn name(&self) -> String {
        package_name(&self.manifest).unwrap_or_else(|| self.dir.clone())
    }

    /// The root file whose header declares the crate's edges: `lib.rs`, else `main.rs`.
    fn root(&self) -> Option<(String, &str)> {
        ["lib.rs", "main.rs"].iter().find_map(|r| {
            self.sources
                .iter()
                .find(|(p, _)| p == Path::new(r))
                .map(|(_, t)| (format!("{}/src/{r}", self.dir), t.as_str()))
        })
    }
}

/// `name = "..."` of the manifest's `[package]` table.
pub fn package_name(manifest: &str) -> Option<String> {
    let mut in_package = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if in_package {
            if let Some(v) = line.strip_prefix("name") {
                let v = v.trim_start().strip_prefix('=')?.trim();
                return Some(v.trim_matches('"').to_string());
            }
        }
    }
    None
}

/// The workspace crates a manifest depends on: (`[dependencies]` and
/// `[build-dependencies]`, `[dev-dependencies]`), target-specific tables included. A
/// renamed dependency counts by its `package = "..."`.
pub fn workspace_deps(
    manifest: &str,
    workspace: &BTreeSet<String>,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut normal, mut dev) = (BTreeSet::new(), BTreeSet::new());
    let mut table = String::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            table = line.trim_matches(|c| c == '[' || c == ']').to_string();
            // `[dependencies.relay-x]`: the table names the dependency.
            if let Some((kind, dep)) = table.rsplit_once("dependencies.") {
                let into = if kind.ends_with("dev-") {
                    &mut dev
                } else {
                    &mut normal
                };
                if workspace.contains(dep.trim_matches('"')) {
                    into.insert(dep.trim_matches('"').to_string());
                }
            }
            continue;
        }
        let Some(into) = (if table.ends_with("dev-dependencies") {
            Some(&mut dev)
        } else if table.ends_with("dependencies") {
            Some(&mut normal)
        } else {
            None
        }) else {
            continue;
        };
        if line.starts_with('#') || !line.contains('=') {
            continue;
        }
        let key = line
            .split(['=', '.'])
            .next()
            .unwrap_or("")
            .trim()
            .trim_matches('"');
        let package = line
            .split("package")
            .nth(1)
            .and_then(|p| p.split('"').nth(1))
            .unwrap_or(key);
        if workspace.contains(package) {
            into.insert(package.to_string());
        }
    }
    (normal, dev)
}

/// The leading `//!` lines of a file, without the `//!` and its one space.
pub fn header(text: &str) -> Vec<String> {
    text.lines()
        .take_while(|l| l.starts_with("//!"))
        .map(|l| {
            let l = &l[3..];
            l.strip_prefix(' ').unwrap_or(l).to_string()
        })
        .collect()
}

/// Names in `a, `b`, c.` form (backticks, the final `.` and `none` dropped).
pub fn names(list: &str) -> BTreeSet<String> {
    list.split(',')
        .map(|n| {
            n.trim()
                .trim_end_matches(['.', ';'])
                .trim_matches('`')
                .trim()
        })
        .filter(|n| !n.is_empty() && *n != "none")
        .map(str::to_string)
        .collect()
}

/// The list after `label` in the header, up to the `.` that ends it (it may wrap onto
/// the next lines); `None` when the header has no such line.
pub fn declared(header: &[String], label: &str) -> Option<BTreeSet<String>> {
    let at = header.iter().position(|l| l.starts_with(label))?;
    let mut list = String::new();
    for line in &header[at..] {
        let part = line.strip_prefix(label).unwrap_or(line);
        list.push_str(part);
        list.push(' ');
        if part.trim_end().ends_with('.') {
            break;
        }
    }
    Some(names(&list))
}

/// The `Layering` block: each item `- a, b -> c, d` (continued on lines indented by
/// two spaces), read into module -> the modules it may use. `None`: no block.
pub fn layering(header: &[String]) -> Option<Result<Graph, String>> {
    let at = header.iter().position(|l| l.starts_with("Layering"))?;
    let mut items: Vec<String> = Vec::new();
    for line in header[at..]
        .iter()
        .skip_while(|l| !l.starts_with("- ") && !l.is_empty())
    {
        if let Some(item) = line.strip_prefix("- ") {
            items.push(item.to_string());
        } else if let (Some(last), true) = (items.last_mut(), line.starts_with("  ")) {
            last.push(' ');
            last.push_str(line.trim());
        } else {
            break;
        }
    }
    if items.is_empty() {
        return Some(Err(
            "its `Layering` paragraph is not followed by `- `a` -> `b`, `c`` items".into(),
        ));
    }
    let mut g = Graph::new();
    for item in items {
        let Some((from, to)) = item.split_once("->") else {
            return Some(Err(format!(
                "the layering item `- {item}` has no `->` (write `- `module` -> `used`, ..` or `-> none`)"
            )));
        };
        let to = names(to);
        for m in names(from) {
            if g.insert(m.clone(), to.clone()).is_some() {
                return Some(Err(format!("module `{m}` has two layering lines")));
            }
        }
    }
    for (m, to) in &g {
        if let Some(bad) = to
            .iter()
            .chain(std::iter::once(m))
            .find(|n| n.is_empty() || ident(n) != n.as_str())
        {
            return Some(Err(format!(
                "`{bad}` in the layering is not a module name (keep prose out of the `- ` items)"
            )));
        }
    }
    Some(Ok(g))
}

/// A layering item as a header writes it.
pub fn layering_line(module: &str, uses: &BTreeSet<String>) -> String {
    let uses = if uses.is_empty() {
        "none".to_string()
    } else {
        uses.iter()
            .map(|u| format!("`{u}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!("//! - `{module}` -> {uses}")
}

pub fn list_line(label: &str, crates: &BTreeSet<String>) -> String {
    let list = if crates.is_empty() {
        "none".to_string()
    } else {
        crates.iter().cloned().collect::<Vec<_>>().join(", ")
    };
    format!("//! {label} {list}.")
}

/// Every way the crates leave what their headers declare, each message saying what to
/// write (or to move); empty when they all keep to it.
pub fn check(crates: &[Crate]) -> Vec<String> {
    let mut errors = Vec::new();
    let workspace: BTreeSet<String> = crates.iter().map(Crate::name).collect();
    let mut declared_graph = Graph::new();
    for krate in crates {
        let name = krate.name();
        let Some((root, text)) = krate.root() else {
            errors.push(format!(
                "{name} ({}): no src/lib.rs or src/main.rs to hold its header",
                krate.dir
            ));
            continue;
        };
        let header = header(text);
        let (deps, dev_deps) = workspace_deps(&krate.manifest, &workspace);

        // Crate level.
        for (label, actual, dev) in [
            ("Depends on:", &deps, false),
            ("Tests also depend on:", &dev_deps, true),
        ] {
            match declared(&header, label) {
                None if actual.is_empty() && dev => {}
                None => errors.push(format!(
                    "{root}: the header has no `{label}` line; add `{}` ({}/Cargo.toml's workspace dependencies)",
                    list_line(label, actual),
                    krate.dir
                )),
                Some(allowed) => {
                    for d in actual.difference(&allowed) {
                        let mut fixed = allowed.clone();
                        fixed.insert(d.clone());
                        errors.push(format!(
                            "{name} depends on {d} ({}/Cargo.toml) but {root} does not declare that edge: make its line `{}`, or drop the dependency",
                            krate.dir,
                            list_line(label, &fixed)
                        ));
                    }
                    for d in allowed.difference(&workspace) {
                        errors.push(format!(
                            "{root}: `{label}` names {d}, which is no crate of the workspace; remove it"
                        ));
                    }
                    if !dev {
                        declared_graph.insert(name.clone(), allowed);
                    }
                }
            }
        }

        // Module level.
        let actual = graph(krate.sources.iter().map(|(p, t)| (p.clone(), t.as_str())));
        let today = || {
            actual
                .iter()
                .map(|(m, uses)| layering_line(m, uses))
                .collect::<Vec<_>>()
                .join("\n")
        };
        let allowed = match layering(&header) {
            None => {
                errors.push(format!(
                    "{root}: the header has no `Layering` block; add one, from what the modules use today:\n//! Layering (a module uses only the modules after its arrow):\n{}",
                    today()
                ));
                continue;
            }
            Some(Err(e)) => {
                errors.push(format!(
                    "{root}: {e}; what the modules use today:\n{}",
                    today()
                ));
                continue;
            }
            Some(Ok(g)) => g,
        };
        for (module, uses) in &actual {
            let Some(may) = allowed.get(module) else {
                errors.push(format!(
                    "{root}: module `{module}` has no line in the `Layering` block; add `{}`",
                    layering_line(module, uses)
                ));
                continue;
            };
            for used in uses.difference(may) {
                let mut fixed = may.clone();
                fixed.insert(used.clone());
                errors.push(format!(
                    "{name}: module `{module}` uses `crate::{used}`, an edge {root} does not declare: make its line `{}`, or move what `{module}` needs below it",
                    layering_line(module, &fixed)
                ));
            }
        }
        for (module, may) in &allowed {
            if !actual.contains_key(module) {
                errors.push(format!(
                    "{root}: the `Layering` block names `{module}`, which is no module of {name}; remove its line"
                ));
            }
            for m in may.iter().filter(|m| !actual.contains_key(*m)) {
                errors.push(format!(
                    "{root}: the `Layering` line of `{module}` names `{m}`, which is no module of {name}; remove it"
                ));
            }
        }
        if let Some(c) = cycle(&allowed) {
            errors.push(format!(
                "{root}: the declared layering has a cycle: {}; move what both need into a module below both",
                c.join(" -> ")
            ));
        }
    }
    if let Some(c) = cycle(&declared_graph) {
        errors.push(format!(
            "the crates' declared `Depends on:` edges have a cycle: {}",
            c.join(" -> ")
        ));
    }
    errors
}
