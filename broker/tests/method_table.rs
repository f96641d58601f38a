//! The method table (`relay_protocol::methods`) and what is written from it or about
//! it: the dashboard's generated constants (`broker/web/api.gen.js`) are what the table
//! writes now (a method added, moved or renamed without regenerating the file fails
//! here, with the command that regenerates it), and `broker/README.md`'s route table
//! lists exactly the table's routes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use relay_protocol::methods::js::{check, dashboard_constants, REGENERATE};
use relay_protocol::methods::{MethodId, METHODS};

fn checked_in() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("web/api.gen.js")
}

#[test]
fn the_checked_in_constants_are_the_method_tables() {
    let want = dashboard_constants(METHODS);
    if std::env::var_os("RELAY_REGENERATE").is_some() {
        std::fs::write(checked_in(), &want).expect("write broker/web/api.gen.js");
        return;
    }
    let have = std::fs::read_to_string(checked_in())
        .unwrap_or_else(|e| panic!("broker/web/api.gen.js: {e}; create it: {REGENERATE}"));
    if let Err(stale) = check(&have, &want) {
        panic!("{stale}");
    }
}

/// The check above is not one that cannot fail: the checked-in file, against a table
/// with one method more, or one route moved, is stale.
#[test]
fn a_changed_table_without_regenerating_is_caught() {
    let have = std::fs::read_to_string(checked_in()).unwrap();
    let mut added = METHODS.to_vec();
    let mut planted = added[MethodId::FlightShow as usize];
    planted.name = "flight.planted";
    planted.route = "/v1/flights/{id}/planted";
    added.push(planted);
    let err = check(&have, &dashboard_constants(&added)).unwrap_err();
    assert!(err.contains("flight.planted"), "{err}");
    assert!(err.contains(REGENERATE), "{err}");

    let mut moved = METHODS.to_vec();
    moved[MethodId::ApprovalDecide as usize].route = "/v1/approvals/{id}/decide";
    let err = check(&have, &dashboard_constants(&moved)).unwrap_err();
    assert!(err.contains("/v1/approvals/{id}/decide"), "{err}");
}

/// The page's modules take every route from the generated module: none spells one.
#[test]
fn the_page_imports_the_generated_module() {
    let web = checked_in().parent().unwrap().to_path_buf();
    let mut modules = Vec::new();
    for dir in [web.clone(), web.join("lib"), web.join("views")] {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "js") && path != checked_in() {
                modules.push(path);
            }
        }
    }
    assert!(modules.len() >= 10, "{modules:?}");
    let mut importers = 0;
    for path in &modules {
        let js = std::fs::read_to_string(path).unwrap();
        importers += usize::from(js.contains("from \"/api.gen.js\""));
        for quote in ['"', '\'', '`'] {
            assert!(
                !js.contains(&format!("{quote}/v1/")),
                "{} spells no route of its own: it takes them from api.gen.js (methodPath(name, ...params), call(name, ...))",
                path.display()
            );
        }
    }
    assert!(importers >= 3, "the page's modules import api.gen.js");
}

/// The manual's route table (`broker/README.md`, "Routes") documents each method of
/// the table, and no route the broker does not serve.
#[test]
fn the_readme_lists_exactly_the_methods_routes() {
    let readme = std::fs::read_to_string(
        checked_in()
            .parent()
            .unwrap()
            .parent()
            .unwrap()
            .join("README.md"),
    )
    .unwrap();
    let documented: std::collections::BTreeSet<String> = readme
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`').map(|(route, _)| route.to_string()))
        .filter(|r| r.contains(" /v1/"))
        .collect();
    let served: std::collections::BTreeSet<String> = METHODS
        .iter()
        .map(|m| format!("{} {}", m.verb.as_str(), m.route))
        .collect();
    let missing: Vec<_> = served.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&served).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "broker/README.md's routes: not documented {missing:?}; documented but not served {stale:?}"
    );
}
