//! The binary is a map (ARCHITECTURE.md, "Rules the tests keep"): it depends on
//! `embedfleet-pipeline` and `embedfleet-core` only, as `cargo metadata` reads its manifest, so
//! no command can call into a stage crate; and `src/commands` only maps clap's flags onto the
//! pipeline's: at most 1,500 lines, no function over 40 (`code_rules`).

use crate::code_rules::{functions, non_test_sources};
use std::path::Path;
use std::process::Command;

/// The workspace crates a command may reach directly.
const BINARY_MAY_DEPEND_ON: [&str; 2] = ["embedfleet-core", "embedfleet-pipeline"];
const MAX_COMMANDS_LINES: usize = 1_500;

/// `cargo metadata` of this workspace, its own packages only (no network, no lock change).
fn metadata() -> serde_json::Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The workspace crates `package` depends on for its build (not dev- or build-dependencies)
/// beyond `allowed`.
fn workspace_dependencies_beyond(
    metadata: &serde_json::Value,
    package: &str,
    allowed: &[&str],
) -> Vec<String> {
    let packages = metadata["packages"].as_array().unwrap();
    let members: Vec<&str> = packages
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    let this = packages
        .iter()
        .find(|p| p["name"] == package)
        .unwrap_or_else(|| panic!("no package {package} in the workspace"));
    this["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["kind"].is_null())
        .map(|d| d["name"].as_str().unwrap())
        .filter(|name| members.contains(name) && !allowed.contains(name))
        .map(String::from)
        .collect()
}

#[test]
fn the_binary_depends_on_pipeline_and_core_only() {
    let metadata = metadata();
    let beyond = workspace_dependencies_beyond(&metadata, "embedfleet", &BINARY_MAY_DEPEND_ON);
    assert!(
        beyond.is_empty(),
        "the binary depends on {beyond:?}: reach a stage through `embedfleet-pipeline` (a command's policy lives there)"
    );
    // The rule sees a dependency where there is one: the pipeline reaches every stage.
    let pipeline = workspace_dependencies_beyond(&metadata, "embedfleet-pipeline", &[]);
    for stage in [
        "embedfleet-orchestrator",
        "embedfleet-vectordb",
        "embedfleet-embed",
    ] {
        assert!(pipeline.iter().any(|d| d == stage), "{pipeline:?}");
    }
}

#[test]
fn a_dependency_beyond_the_allowed_is_named_and_dev_dependencies_are_not() {
    let metadata = serde_json::json!({"packages": [
        {"name": "embedfleet", "dependencies": [
            {"name": "embedfleet-pipeline", "kind": null},
            {"name": "embedfleet-vectordb", "kind": null},
            {"name": "embedfleet-query", "kind": "dev"},
            {"name": "anyhow", "kind": null},
        ]},
        {"name": "embedfleet-pipeline", "dependencies": []},
        {"name": "embedfleet-vectordb", "dependencies": []},
        {"name": "embedfleet-query", "dependencies": []},
    ]});
    assert_eq!(
        workspace_dependencies_beyond(&metadata, "embedfleet", &BINARY_MAY_DEPEND_ON),
        vec!["embedfleet-vectordb".to_string()]
    );
}

/// What `src/commands` breaks of its size rules, given its files and their text.
fn commands_size_problems(files: &[(String, String)]) -> Vec<String> {
    let total: usize = files.iter().map(|(_, src)| src.lines().count()).sum();
    let mut problems = Vec::new();
    if total > MAX_COMMANDS_LINES {
        problems.push(format!(
            "src/commands has {total} lines (at most {MAX_COMMANDS_LINES}): what is more than mapping flags belongs in pipeline"
        ));
    }
    problems
}

#[test]
fn src_commands_stays_a_map_of_at_most_1500_lines() {
    let files: Vec<(String, String)> = non_test_sources()
        .into_iter()
        .filter(|rel| rel.starts_with("src/commands"))
        .map(|rel| {
            let src = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(&rel));
            (rel.display().to_string(), src.unwrap())
        })
        .collect();
    assert!(!files.is_empty());
    let problems = commands_size_problems(&files);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The rule counts: one more file of 1,500 lines breaks it.
    let mut more = files.clone();
    more.push(("src/commands/x.rs".into(), "fn f() {}\n".repeat(1_500)));
    assert_eq!(commands_size_problems(&more).len(), 1);
    // And the function scanner it leans on sees each mapping function.
    let (_, mod_rs) = files.iter().find(|(p, _)| p.ends_with("mod.rs")).unwrap();
    assert!(functions(mod_rs)
        .iter()
        .any(|(name, _, _)| name == "dispatch"));
}
