//! `manifest.json`: the folder described for programs — every file with its rows, bytes and
//! checksum, the counts, the model, and what is missing. `format_version` goes up when a
//! change matters; fields are only ever added.

use crate::facts::Facts;
use crate::PublishOptions;
use serde_json::json;
use std::collections::BTreeMap;

pub const MANIFEST_FORMAT_VERSION: u32 = 1;
/// What `generator` starts with: how a later publish knows a folder is one of ours.
pub const GENERATOR: &str = "embedfleet publish";

/// `manifest.json`'s text. Holds nothing that changes between two publishes of the same
/// shards (no time, no paths of this machine), so a resumed publish makes the same bytes.
pub fn render(facts: &Facts, options: &PublishOptions) -> String {
    let model: BTreeMap<&str, &str> = facts
        .source
        .meta
        .iter()
        .map(|(k, v)| (k.trim_start_matches("embedfleet."), v.as_str()))
        .collect();
    let status = &facts.status;
    let value = json!({
        "format_version": MANIFEST_FORMAT_VERSION,
        "generator": format!("{GENERATOR} {}", env!("CARGO_PKG_VERSION")),
        "plan_sha256": facts.source.plan_sha256,
        "embedfleet_version": facts.meta("version"),
        "license": options.license,
        "model": model,
        "vectors": {
            "dim": facts.source.dim,
            "dtype": facts.source.vector_type(),
            "compute_dtype": facts.meta("compute_dtype"),
            "pooling": facts.meta("pooling"),
            "normalized": facts.meta("normalized"),
        },
        "query_instruction": options.instruction,
        "with_text": options.with_text,
        "rows": facts.rows(),
        "counts": {
            "papers_planned": status.papers_planned,
            "papers_embedded": facts.rows(),
            "rows_in_shards": status.rows_in_shards,
            "papers_quarantined": status.papers_quarantined,
            "quarantined_by_reason": status.quarantined_by_reason,
            "papers_missing": facts.papers_missing(),
            "papers_deleted": facts.source.deleted_rows(),
            "rows_withheld_by_releases": facts.source.withheld,
            "batches": status.batches,
            "batches_by_state": status.batches_by_state,
            "shards": status.shards,
        },
        // A new version with each corpus release (`plan --update`); the changelog is the
        // releases, each with what it added, changed and withdrew, and the command.
        "version": status.releases.last().map_or(1, |r| r.release),
        "releases": status.releases.iter().map(|r| json!({
            "release": r.release,
            "added": r.counts.added,
            "changed": r.counts.changed,
            "withdrawn": r.counts.withdrawn,
            "unchanged": r.counts.unchanged,
            "restamped": r.counts.restamped,
            "command": r.command,
        })).collect::<Vec<_>>(),
        "partial": !facts.missing.is_empty(),
        "missing_batches": facts.missing,
        "files": facts.data.iter().chain(facts.queries).collect::<Vec<_>>(),
        "data_files": facts.data.iter().map(|f| &f.path).collect::<Vec<_>>(),
        "query_files": facts.queries.iter().map(|f| &f.path).collect::<Vec<_>>(),
    });
    let mut text =
        serde_json::to_string_pretty(&value).expect("a JSON value serialises. This is a bug.");
    text.push('\n');
    text
}
