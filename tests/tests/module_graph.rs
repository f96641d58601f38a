//! Every crate keeps to the edges its `//!` header declares, at two levels, checked here
//! without a tool:
//!
//! - crates: the header's `Depends on: relay-a, relay-b.` line (`none.` for none) bounds the
//!   workspace crates its `Cargo.toml` depends on, and `Tests also depend on: ...` its
//!   dev-dependencies. The declared `Depends on` graph is acyclic (dev-dependencies may
//!   close a cycle through the tests crate: they build only into tests).
//! - modules: the header's `Layering` block has one line per top-level module, `- `a` ->
//!   `b`, `c`` (or `-> none`; several modules may share a line: `- `a`, `b` -> none`),
//!   and every `crate::X` a module's code names is on its line. The declared graph is
//!   acyclic, so the modules depend on each other one way.
//!
//! A module is a top-level file or folder of `src/` (not `lib.rs`, `main.rs` or `bin/`),
//! and its dependencies are the `crate::X` and `use crate::{X, ..}` paths (and `super::X`
//! reaching the crate root) outside comment lines and `#[cfg(test)]` modules (tests may
//! reach anything). A new crate or module fails the check until its header line is
//! written, and every failure says the line to write.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The module a file under `src/` belongs to (`None`: the crate root or a binary).
fn module_of(rel: &Path) -> Option<String> {
    let mut parts = rel.components().map(|c| c.as_os_str().to_string_lossy());
    let first = parts.next()?;
    if parts.next().is_some() {
        return (first != "bin").then(|| first.into_owned());
    }
    let stem = first.strip_suffix(".rs")?;
    (stem != "lib" && stem != "main").then(|| stem.to_string())
}

/// How many `super::` reach the crate root from a file under `src/` (`a.rs` and
/// `a/mod.rs`: one; `a/b.rs`: two).
fn depth(rel: &Path) -> usize {
    let n = rel.components().count();
    if rel.file_name().is_some_and(|f| f == "mod.rs") {
        n - 1
    } else {
        n
    }
}

/// The source without comment lines and `#[cfg(test)] mod x { .. }` blocks.
fn code(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("//") {
            continue;
        }
        if t == "#[cfg(test)]"
            && lines
                .peek()
                .is_some_and(|l| l.trim_start().starts_with("mod "))
        {
            // Skip to the end of the module's braces (or of the file).
            let mut depth = 0usize;
            let mut opened = false;
            for l in lines.by_ref() {
                for c in l.chars() {
                    match c {
                        '{' => {
                            depth += 1;
                            opened = true;
                        }
                        '}' => depth = depth.saturating_sub(1),
                        _ => {}
                    }
                }
                if (opened && depth == 0) || (!opened && l.trim_end().ends_with(';')) {
                    break;
                }
            }
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The first names of a path's tail: `x::Y` gives `x`, `{a::X, b, c::{..}}` gives `a`,
/// `b` and `c`.
fn first_names(rest: &str, found: &mut BTreeSet<String>) {
    if let Some(group) = rest.strip_prefix('{') {
        let mut depth = 1usize;
        let mut item_start = true;
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                ',' if depth == 1 => item_start = true,
                c if depth == 1 && item_start && !c.is_whitespace() => {
                    item_start = false;
                    found.insert(ident(&group[i..]).to_string());
                }
                _ => {}
            }
        }
    } else {
        found.insert(ident(rest).to_string());
    }
}

/// The top-level modules a piece of code names through `crate::` (or, from a file
/// `depth` modules down, through that many `super::`).
fn references_at(text: &str, depth: usize) -> BTreeSet<String> {
    let code = code(text);
    let mut found = BTreeSet::new();
    let starts_path = |at: usize| {
        let before = code[..at].chars().next_back();
        !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    };
    for (at, _) in code.match_indices("crate::") {
        if starts_path(at) {
            first_names(&code[at + "crate::".len()..], &mut found);
        }
    }
    if depth > 0 {
        let supers = "super::".repeat(depth);
        for (at, _) in code.match_indices(&supers) {
            let rest = &code[at + supers.len()..];
            if starts_path(at) && !rest.starts_with("super::") {
                first_names(rest, &mut found);
            }
        }
    }
    found.retain(|m| !m.is_empty());
    found
}

/// The files of the modules a file declares `#[cfg(test)] mod x;` (`x.rs` and `x/`
/// beside it, or under its own folder): test code, which may reach anything.
fn test_only_files(rel: &Path, text: &str) -> Vec<PathBuf> {
    let dir = match rel.file_name().and_then(|f| f.to_str()) {
        Some("lib.rs" | "main.rs" | "mod.rs") => rel.parent().map(Path::to_path_buf),
        _ => Some(rel.with_extension("")),
    }
    .unwrap_or_default();
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    lines
        .windows(2)
        .filter(|w| w[0] == "#[cfg(test)]" && w[1].ends_with(';'))
        .filter_map(|w| {
            let name = w[1].strip_prefix("pub ").unwrap_or(w[1]);
            let name = name.strip_prefix("mod ")?.trim_end_matches(';').trim();
            Some(dir.join(name))
        })
        .collect()
}

/// The module graph of one crate's sources, given as (path under `src/`, text).
fn graph<'a>(files: impl IntoIterator<Item = (PathBuf, &'a str)>) -> Graph {
    let files: Vec<(PathBuf, &str)> = files.into_iter().collect();
    let tests: Vec<PathBuf> = files
        .iter()
        .flat_map(|(rel, text)| test_only_files(rel, text))
        .collect();
    let is_test = |rel: &Path| {
        tests
            .iter()
            .any(|t| rel.starts_with(t) || rel == t.with_extension("rs"))
    };
    let mut g = Graph::new();
    for (rel, text) in files {
        if is_test(&rel) {
            continue;
        }
        if let Some(module) = module_of(&rel) {
            g.entry(module)
                .or_default()
                .extend(references_at(text, depth(&rel)));
        }
    }
    let modules: BTreeSet<String> = g.keys().cloned().collect();
    for (module, deps) in g.iter_mut() {
        // Items of the crate root (`crate::SomeType`) and the module itself are no edge.
        deps.retain(|d| d != module && modules.contains(d));
    }
    g
}

/// A cycle of the graph, as the path that closes it (`a -> b -> a`), if there is one.
fn cycle(g: &Graph) -> Option<Vec<String>> {
    fn visit(
        g: &Graph,
        m: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == m) {
            let mut c = path[i..].to_vec();
            c.push(m.to_string());
            return Some(c);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for d in g.get(m).into_iter().flatten() {
            if let Some(c) = visit(g, d, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    g.keys()
        .find_map(|m| visit(g, m, &mut Vec::new(), &mut done))
}

/// One workspace crate as the check reads it: where it is (for messages), its
/// `Cargo.toml`, and its sources under `src/` (path under `src/`, text).
struct Crate {
    dir: String,
    manifest: String,
    sources: Vec<(PathBuf, String)>,
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
fn package_name(manifest: &str) -> Option<String> {
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
fn workspace_deps(
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
fn header(text: &str) -> Vec<String> {
    text.lines()
        .take_while(|l| l.starts_with("//!"))
        .map(|l| {
            let l = &l[3..];
            l.strip_prefix(' ').unwrap_or(l).to_string()
        })
        .collect()
}

/// Names in `a, `b`, c.` form (backticks, the final `.` and `none` dropped).
fn names(list: &str) -> BTreeSet<String> {
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
fn declared(header: &[String], label: &str) -> Option<BTreeSet<String>> {
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
fn layering(header: &[String]) -> Option<Result<Graph, String>> {
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
fn layering_line(module: &str, uses: &BTreeSet<String>) -> String {
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

fn list_line(label: &str, crates: &BTreeSet<String>) -> String {
    let list = if crates.is_empty() {
        "none".to_string()
    } else {
        crates.iter().cloned().collect::<Vec<_>>().join(", ")
    };
    format!("//! {label} {list}.")
}

/// Every way the crates leave what their headers declare, each message saying what to
/// write (or to move); empty when they all keep to it.
fn check(crates: &[Crate]) -> Vec<String> {
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

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            rust_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// The workspace's members, from its `Cargo.toml` (`members = [..]` on one line).
fn members(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml"))?;
    let line = manifest
        .lines()
        .find(|l| l.trim_start().starts_with("members"))
        .ok_or_else(|| anyhow::anyhow!("no `members = [..]` line in the workspace manifest"))?;
    Ok(line
        .split('"')
        .skip(1)
        .step_by(2)
        .map(|m| root.join(m))
        .collect())
}

fn workspace() -> anyhow::Result<Vec<Crate>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let members = members(&root)?;
    assert!(members.len() >= 5, "members: {members:?}");
    members
        .iter()
        .map(|member| {
            let src = member.join("src");
            let mut files = Vec::new();
            rust_files(&src, &mut files)?;
            Ok(Crate {
                dir: member.strip_prefix(&root)?.display().to_string(),
                manifest: std::fs::read_to_string(member.join("Cargo.toml"))?,
                sources: files
                    .iter()
                    .map(|f| {
                        Ok((
                            f.strip_prefix(&src)?.to_path_buf(),
                            std::fs::read_to_string(f)?,
                        ))
                    })
                    .collect::<anyhow::Result<Vec<_>>>()?,
            })
        })
        .collect()
}

#[test]
fn every_crate_keeps_to_the_edges_its_header_declares() -> anyhow::Result<()> {
    let crates = workspace()?;
    let errors = check(&crates);
    assert!(
        errors.is_empty(),
        "{} edge(s) outside the crates' headers:\n\n{}",
        errors.len(),
        errors.join("\n\n")
    );
    Ok(())
}

#[test]
fn no_crate_has_a_module_cycle() -> anyhow::Result<()> {
    for krate in workspace()? {
        let g = graph(krate.sources.iter().map(|(p, t)| (p.clone(), t.as_str())));
        if let Some(c) = cycle(&g) {
            panic!(
                "{}: modules depend on each other in a cycle: {}; move what both need (a port, a type) into a module below both (see the crate's `//!` header)",
                krate.dir,
                c.join(" -> ")
            );
        }
    }
    Ok(())
}

#[test]
fn the_check_finds_cycles_and_only_real_references() {
    let files = [
        (
            "http.rs",
            "//! Calls [`crate::ops`].\nuse crate::broker::Broker;\nuse crate::ops::steer;\n",
        ),
        (
            "ops.rs",
            "use crate::{broker::{self, Broker}, error::E};\nfn f() { crate::http::x() }\n",
        ),
        (
            "broker/mod.rs",
            "use crate::Store;\n#[cfg(test)]\nmod tests;\n",
        ),
        (
            "error.rs",
            "#[cfg(test)]\nmod tests {\n    use crate::http::x;\n}\n",
        ),
        ("lib.rs", "pub mod http;\npub use crate::ops::steer;\n"),
        ("bin/tool.rs", "use crate::http;\n"),
        // Test-only files, declared `#[cfg(test)] mod x;`: a module's own and the crate's.
        ("broker/tests.rs", "use crate::http;\n"),
        ("lib.rs", "#[cfg(test)]\nmod fixtures;\n"),
        ("fixtures/mod.rs", "use crate::http;\n"),
    ];
    let g = graph(files.iter().map(|(p, t)| (PathBuf::from(p), *t)));
    let set = |ms: &[&str]| ms.iter().map(|m| m.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(
        g,
        Graph::from([
            ("broker".into(), set(&[])),
            ("error".into(), set(&[])),
            ("http".into(), set(&["broker", "ops"])),
            ("ops".into(), set(&["broker", "error", "http"])),
        ])
    );
    assert_eq!(
        cycle(&g),
        Some(vec!["http".into(), "ops".into(), "http".into()])
    );
    let mut one_way = g.clone();
    one_way.insert("ops".into(), set(&["broker", "error"]));
    assert_eq!(cycle(&one_way), None);
}

#[test]
fn super_paths_that_reach_the_crate_root_are_edges_and_inner_ones_are_not() {
    let files = [
        ("a.rs", "use super::b::X;\n"),
        ("b/mod.rs", "use super::c;\nuse self::inner::Y;\n"),
        (
            "b/inner.rs",
            "use super::sibling::Z;\nuse super::super::d::W;\n",
        ),
        ("c.rs", ""),
        ("d.rs", ""),
    ];
    let g = graph(files.iter().map(|(p, t)| (PathBuf::from(p), *t)));
    let set = |ms: &[&str]| ms.iter().map(|m| m.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(g["a"], set(&["b"]));
    assert_eq!(g["b"], set(&["c", "d"]));
}

/// Two crates in memory: `relay-base` (modules `a`, `b`) and `relay-top` on it.
fn planted(base_header: &str, a: &str, base_manifest_tail: &str) -> Vec<Crate> {
    vec![
        Crate {
            dir: "base".into(),
            manifest: format!(
                "[package]\nname = \"relay-base\"\n\n[dependencies]\nserde = {{ workspace = true }}\n{base_manifest_tail}"
            ),
            sources: vec![
                ("lib.rs".into(), format!("{base_header}\npub mod a;\npub mod b;\n")),
                ("a.rs".into(), a.into()),
                ("b.rs".into(), "pub struct B;\n".into()),
            ],
        },
        Crate {
            dir: "top".into(),
            manifest: "[package]\nname = \"relay-top\"\n\n[dependencies]\nrelay-base.workspace = true\n\n[dev-dependencies]\ntempfile = \"3\"\n".into(),
            sources: vec![
                (
                    "lib.rs".into(),
                    "//! Top.\n//!\n//! Depends on: relay-base.\n//!\n//! Layering: none.\n//! - `x` -> none\n".into(),
                ),
                ("x.rs".into(), "use relay_base::a;\n".into()),
            ],
        },
    ]
}

const BASE_HEADER: &str = "//! Base.\n//!\n//! Depends on: none.\n//!\n//! Layering (one way):\n//! - `a` -> `b`\n//! - `b` -> none\n";

#[test]
fn a_planted_forbidden_edge_fails_the_check_naming_it() {
    // As declared: no error.
    let ok = planted(BASE_HEADER, "use crate::b::B;\n", "");
    assert_eq!(check(&ok), Vec::<String>::new());

    // `b` uses `a`, which its line does not allow.
    let mut crates = planted(BASE_HEADER, "pub struct A;\n", "");
    crates[0].sources[2].1 = "use crate::a::A;\npub struct B;\n".into();
    assert_eq!(
        check(&crates),
        vec!["relay-base: module `b` uses `crate::a`, an edge base/src/lib.rs does not declare: make its line `//! - `b` -> `a``, or move what `b` needs below it".to_string()]
    );

    // A dependency of the manifest the header does not declare (renamed, in a target table).
    let crates = planted(
        BASE_HEADER,
        "use crate::b::B;\n",
        "\n[target.'cfg(unix)'.dependencies]\nupper = { package = \"relay-top\", path = \"../top\" }\n",
    );
    assert_eq!(
        check(&crates),
        vec![
            "relay-base depends on relay-top (base/Cargo.toml) but base/src/lib.rs does not declare that edge: make its line `//! Depends on: relay-top.`, or drop the dependency".to_string()
        ]
    );

    // A module with no line, a declared cycle, and declared crates that form a cycle.
    let header = "//! Base.\n//!\n//! Depends on: relay-top.\n//!\n//! Layering:\n//! - `b` -> `a`\n//! - `a` ->\n//!   `b`\n";
    let mut crates = planted(header, "use crate::b::B;\n", "");
    crates[0]
        .sources
        .push(("c/mod.rs".into(), "use crate::a;\n".into()));
    assert_eq!(
        check(&crates),
        vec![
            "base/src/lib.rs: module `c` has no line in the `Layering` block; add `//! - `c` -> `a``".to_string(),
            "base/src/lib.rs: the declared layering has a cycle: a -> b -> a; move what both need into a module below both".to_string(),
            "the crates' declared `Depends on:` edges have a cycle: relay-base -> relay-top -> relay-base".to_string(),
        ]
    );

    // No header lines at all: the messages give the lines to write.
    assert_eq!(
        check(&planted("//! Base.\n", "use crate::b::B;\n", "")),
        vec![
            "base/src/lib.rs: the header has no `Depends on:` line; add `//! Depends on: none.` (base/Cargo.toml's workspace dependencies)".to_string(),
            "base/src/lib.rs: the header has no `Layering` block; add one, from what the modules use today:\n//! Layering (a module uses only the modules after its arrow):\n//! - `a` -> `b`\n//! - `b` -> none".to_string(),
        ]
    );
}
