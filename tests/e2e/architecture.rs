//! The dependency arrows of ARCHITECTURE.md: a stage never links what it must not.

use std::path::Path;

/// The names of a manifest's `[dependencies]` (not dev- or build-dependencies).
fn dependencies(manifest: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(manifest);
    let text = std::fs::read_to_string(&path).unwrap();
    let doc: toml::Table = text.parse().unwrap();
    doc.get("dependencies")
        .and_then(toml::Value::as_table)
        .map(|t| t.keys().cloned().collect())
        .unwrap_or_default()
}

/// Every crate of the workspace: (its manifest, its name).
fn workspace_crates() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc: toml::Table = std::fs::read_to_string(root.join("Cargo.toml"))
        .unwrap()
        .parse()
        .unwrap();
    let members = doc["workspace"]["members"].as_array().unwrap();
    members
        .iter()
        .map(|m| {
            let manifest = match m.as_str().unwrap() {
                "." => "Cargo.toml".to_string(),
                dir => format!("{dir}/Cargo.toml"),
            };
            let text = std::fs::read_to_string(root.join(&manifest)).unwrap();
            let doc: toml::Table = text.parse().unwrap();
            let name = doc["package"]["name"].as_str().unwrap().to_string();
            (manifest, name)
        })
        .collect()
}

#[test]
fn forbidden_dependencies_are_absent() {
    let rules: &[(&str, &[&str])] = &[
        (
            "jobs/embed/Cargo.toml",
            &[
                "embedfleet-vectordb",
                "qdrant-edge",
                "qdrant-client",
                "tonic",
                "tokio",
            ],
        ),
        (
            "vectordb/Cargo.toml",
            &[
                "embedfleet-embed",
                "embedfleet-models",
                "embedfleet-snapshot",
            ],
        ),
        (
            "jobs/snapshot/Cargo.toml",
            &[
                "embedfleet-embed",
                "embedfleet-models",
                "embedfleet-orchestrator",
            ],
        ),
        (
            "jobs/publish/Cargo.toml",
            &[
                "embedfleet-vectordb",
                "embedfleet-query",
                "embedfleet-models",
                "qdrant-edge",
            ],
        ),
        (
            "orchestrator/Cargo.toml",
            &[
                "embedfleet-embed",
                "embedfleet-vectordb",
                "embedfleet-models",
            ],
        ),
    ];
    for (manifest, forbidden) in rules {
        let deps = dependencies(manifest);
        assert!(!deps.is_empty(), "{manifest} has dependencies");
        for name in *forbidden {
            assert!(
                !deps.iter().any(|d| d == name),
                "{manifest} depends on {name}: ARCHITECTURE.md, \"The arrows\", forbids it"
            );
        }
    }
    // Below everything: core and the model know no other crate of the workspace, the pipeline
    // knows them all and no crate but the binary knows it.
    let siblings = workspace_crates();
    assert!(siblings.len() >= 9, "{siblings:?}");
    for (manifest, name) in &siblings {
        let deps = dependencies(manifest);
        let own: Vec<&String> = deps
            .iter()
            .filter(|d| d.starts_with("embedfleet-"))
            .collect();
        if name == "embedfleet-core" || name == "embedfleet-models" {
            assert!(
                own.is_empty(),
                "{manifest} depends on {own:?}: it is below every crate"
            );
        }
        if name != "embedfleet" {
            assert!(
                !deps.iter().any(|d| d == "embedfleet-pipeline"),
                "{manifest} depends on embedfleet-pipeline: only the binary may (ARCHITECTURE.md, \"The arrows\")"
            );
        }
    }
    assert!(dependencies("Cargo.toml").contains(&"embedfleet-pipeline".to_string()));
    // The stages do depend on what the arrows say.
    assert!(dependencies("jobs/embed/Cargo.toml").contains(&"embedfleet-models".to_string()));
    assert!(dependencies("vectordb/Cargo.toml").contains(&"qdrant-edge".to_string()));
}
