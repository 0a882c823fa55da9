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

#[test]
fn forbidden_dependencies_are_absent() {
    let rules: &[(&str, &[&str])] = &[
        (
            "jobs/embed/Cargo.toml",
            &[
                "embedfleet-upload",
                "qdrant-edge",
                "qdrant-client",
                "tonic",
                "tokio",
            ],
        ),
        (
            "jobs/upload/Cargo.toml",
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
                "embedfleet-upload",
                "embedfleet-query",
                "embedfleet-models",
                "qdrant-edge",
            ],
        ),
        (
            "orchestrator/Cargo.toml",
            &["embedfleet-embed", "embedfleet-upload", "embedfleet-models"],
        ),
        (
            "core/Cargo.toml",
            &[
                "embedfleet-orchestrator",
                "embedfleet-embed",
                "embedfleet-upload",
                "embedfleet-models",
            ],
        ),
        (
            "models/Cargo.toml",
            &[
                "embedfleet-core",
                "embedfleet-orchestrator",
                "embedfleet-embed",
                "embedfleet-upload",
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
    // The stages do depend on what the arrows say.
    assert!(dependencies("jobs/embed/Cargo.toml").contains(&"embedfleet-models".to_string()));
    assert!(dependencies("jobs/upload/Cargo.toml").contains(&"qdrant-edge".to_string()));
}
