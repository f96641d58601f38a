//! The module graph of one crate's sources: which top-level modules each names through
//! `crate::` (or `super::` up to the root), and its cycles.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// The module a file under `src/` belongs to (`None`: the crate root or a binary).
pub fn module_of(rel: &Path) -> Option<String> {
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
pub fn depth(rel: &Path) -> usize {
    let n = rel.components().count();
    if rel.file_name().is_some_and(|f| f == "mod.rs") {
        n - 1
    } else {
        n
    }
}

/// The source without comment lines and `#[cfg(test)] mod x { .. }` blocks.
pub fn code(text: &str) -> String {
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

pub fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The first names of a path's tail: `x::Y` gives `x`, `{a::X, b, c::{..}}` gives `a`,
/// `b` and `c`.
pub fn first_names(rest: &str, found: &mut BTreeSet<String>) {
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
pub fn references_at(text: &str, depth: usize) -> BTreeSet<String> {
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
pub fn test_only_files(rel: &Path, text: &str) -> Vec<PathBuf> {
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
pub fn graph<'a>(files: impl IntoIterator<Item = (PathBuf, &'a str)>) -> Graph {
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
pub fn cycle(g: &Graph) -> Option<Vec<String>> {
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
