//! Every crate's modules depend on each other one way: no module reaches, through
//! `crate::` paths, a module that reaches it back. The layering each crate's `//!` header
//! states is checked here, crudely but without a tool: a module is a top-level file or
//! folder of `src/` (not `lib.rs`, `main.rs` or `bin/`), and its dependencies are the
//! `crate::X` and `use crate::{X, ..}` paths outside comment lines and `#[cfg(test)]`
//! modules (tests may reach anything).

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

/// The top-level modules a piece of code names through `crate::`.
fn references(text: &str) -> BTreeSet<String> {
    let code = code(text);
    let mut found = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `crate::{a::X, b, c::{..}}`: the first name of each item at depth 1.
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
    found.retain(|m| !m.is_empty());
    found
}

/// The module graph of one crate's sources, given as (path under `src/`, text).
fn graph<'a>(files: impl IntoIterator<Item = (PathBuf, &'a str)>) -> Graph {
    let mut g = Graph::new();
    for (rel, text) in files {
        if let Some(module) = module_of(&rel) {
            g.entry(module).or_default().extend(references(text));
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

#[test]
fn no_crate_has_a_module_cycle() -> anyhow::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let members = members(&root)?;
    assert!(members.len() >= 5, "members: {members:?}");
    for member in members {
        let src = member.join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files)?;
        let texts = files
            .iter()
            .map(|f| {
                Ok((
                    f.strip_prefix(&src)?.to_path_buf(),
                    std::fs::read_to_string(f)?,
                ))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let g = graph(texts.iter().map(|(p, t)| (p.clone(), t.as_str())));
        if let Some(c) = cycle(&g) {
            panic!(
                "{}: modules depend on each other in a cycle: {}; move what both need (a port, a type) into a module below both (see the crate's `//!` header)",
                member.display(),
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
        ("broker/mod.rs", "use crate::Store;\n"),
        (
            "error.rs",
            "#[cfg(test)]\nmod tests {\n    use crate::http::x;\n}\n",
        ),
        ("lib.rs", "pub mod http;\npub use crate::ops::steer;\n"),
        ("bin/tool.rs", "use crate::http;\n"),
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
