//! docs/commands.md names every field of `status --json` and `report --json`: the objects are
//! serialized from the types the commands print, and each key must appear, in backticks, in
//! its section.

use embedfleet_core::rundb::{ReleaseStatus, RunStatus, WithheldRows};
use embedfleet_orchestrator::report::Report;
use std::path::Path;

/// The text of the `## heading` section of docs/commands.md.
fn section(heading: &str) -> String {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/commands.md"))
            .unwrap();
    let start = text
        .find(&format!("## {heading}\n"))
        .unwrap_or_else(|| panic!("docs/commands.md has a section `{heading}`"));
    let rest = &text[start + heading.len() + 4..];
    rest[..rest.find("\n## ").unwrap_or(rest.len())].to_owned()
}

/// The keys of `value`'s object.
fn keys(value: &serde_json::Value) -> Vec<String> {
    value.as_object().unwrap().keys().cloned().collect()
}

fn missing(keys: &[String], section: &str) -> Vec<String> {
    keys.iter()
        .filter(|k| !section.contains(&format!("`{k}`")))
        .cloned()
        .collect()
}

#[test]
fn every_field_of_status_json_and_report_json_is_documented() {
    let release = serde_json::to_value(ReleaseStatus::default()).unwrap();
    let status = serde_json::to_value(RunStatus::default()).unwrap();
    let withheld = serde_json::to_value(WithheldRows::default()).unwrap();
    let doc = section("`status --json`");
    let mut all = keys(&status);
    all.extend(keys(&release));
    all.extend(keys(&withheld));
    let routing = embedfleet_core::status_snapshot::RoutingState {
        next: Some("batch 1 goes to debug".into()),
        max_jobs: Some(24),
        scheduler_limit: Some("24 jobs (Slurm: QOS normal MaxSubmitJobsPerUser=24)".into()),
        ..Default::default()
    };
    all.extend(keys(&serde_json::to_value(&routing).unwrap()));
    all.extend(keys(
        &serde_json::to_value(embedfleet_core::status_snapshot::QueueOutlook::default()).unwrap(),
    ));
    all.push("routing".into());
    let gaps = missing(&all, &doc);
    assert!(
        gaps.is_empty(),
        "docs/commands.md, `status --json`, does not name {gaps:?}"
    );

    let report = Report {
        format_version: 1,
        run_dir: "run".into(),
        minibatch: None,
        batches: Vec::new(),
        summary: None,
        papers_to_go: 0,
        node_hours_to_go: None,
        releases: Vec::new(),
        papers_live: 0,
        rows_withheld: WithheldRows::default(),
    };
    let report = serde_json::to_value(report).unwrap();
    let gaps = missing(&keys(&report), &section("`report --json`"));
    assert!(
        gaps.is_empty(),
        "docs/commands.md, `report --json`, does not name {gaps:?}"
    );
}
