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

mod check;
mod graph;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use check::{check, Crate};
use graph::{cycle, graph, Graph};

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
