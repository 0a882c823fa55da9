//! The dataset card (`README.md`, with the YAML header the Hugging Face Hub reads) and
//! `manifest.json`: the facts a user of the embeddings needs, from run.db and the data files.

use crate::data::{DataFile, Written};
use crate::{MissingBatch, PublishError, PublishOptions};
use embedfleet_core::rundb::RunDb;
use serde_json::json;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Everything the card and the manifest say.
pub struct Facts<'a> {
    pub written: &'a Written,
    pub queries: &'a [DataFile],
    pub missing: &'a [MissingBatch],
    pub rows: u64,
    pub papers_planned: u64,
    pub papers_quarantined: u64,
    pub quarantined_by_reason: BTreeMap<String, u64>,
}

impl<'a> Facts<'a> {
    pub fn gather(
        db: &RunDb,
        written: &'a Written,
        queries: &'a [DataFile],
        missing: &'a [MissingBatch],
    ) -> Result<Self, PublishError> {
        let status = db.status()?;
        Ok(Facts {
            written,
            queries,
            missing,
            rows: written.files.iter().map(|f| f.rows).sum(),
            papers_planned: status.papers_planned,
            papers_quarantined: status.papers_quarantined,
            quarantined_by_reason: status.quarantined_by_reason.into_iter().collect(),
        })
    }

    fn meta(&self, key: &str) -> &str {
        let key = format!("embedfleet.{key}");
        self.written
            .meta
            .iter()
            .find(|(k, _)| *k == key)
            .map_or("unknown", |(_, v)| v.as_str())
    }
}

/// The Hub's size buckets.
pub fn size_category(rows: u64) -> &'static str {
    match rows {
        0..1_000 => "n<1K",
        1_000..10_000 => "1K<n<10K",
        10_000..100_000 => "10K<n<100K",
        100_000..1_000_000 => "100K<n<1M",
        1_000_000..10_000_000 => "1M<n<10M",
        10_000_000..100_000_000 => "10M<n<100M",
        100_000_000..1_000_000_000 => "100M<n<1B",
        _ => "n>1T",
    }
}

fn yaml_header(facts: &Facts, options: &PublishOptions) -> String {
    let mut out = format!(
        "---\nlicense: {}\ntask_categories:\n- feature-extraction\ntags:\n- embeddings\n- embedfleet\nsize_categories:\n- {}\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/*.parquet\n",
        options.license,
        size_category(facts.rows)
    );
    if !facts.queries.is_empty() {
        out.push_str(
            "- config_name: queries\n  data_files:\n  - split: train\n    path: queries/*.parquet\n",
        );
    }
    out.push_str("---\n");
    out
}

/// The card: YAML header, then what the vectors are, how many, what is missing, how they were
/// made, timings and recall.
pub fn render(facts: &Facts, options: &PublishOptions) -> String {
    let mut out = yaml_header(facts, options);
    let w = facts.written;
    let _ = write!(
        out,
        "\n# Embeddings of {model}\n\n{rows} papers embedded with `{model}` (revision `{revision}`), made by embedfleet {version}.\n\n| | |\n|---|---|\n| model | `{model}` |\n| model revision | `{revision}` |\n| pooling | {pooling} |\n| normalised (L2) | {normalized} |\n| dimension | {dim} |\n| stored as | {vtype} |\n| computed in | {compute} |\n| query instruction | {instruction} |\n\nColumns: `id` (the corpus id), `embedding`, `n_chars`, `n_tokens`, `n_chunks` (papers longer than the model's context are embedded in chunks and combined, never cut), `source`, `created`, `added`, `version`, `extra`{text}.\n",
        model = facts.meta("model"),
        revision = facts.meta("model_revision"),
        version = facts.meta("version"),
        rows = facts.rows,
        pooling = facts.meta("pooling"),
        normalized = facts.meta("normalized"),
        dim = w.dim,
        vtype = w.vector_type,
        compute = facts.meta("compute_dtype"),
        instruction = options
            .instruction
            .as_deref()
            .map_or("none".to_string(), |i| format!("`Instruct: {i}\\nQuery:{{query}}`")),
        text = if options.with_text { ", `text`" } else { "" },
    );
    counts(&mut out, facts);
    if !facts.queries.is_empty() {
        let rows: u64 = facts.queries.iter().map(|q| q.rows).sum();
        let _ = write!(out, "\n## Queries\n\nThe `queries` config: {rows} result rows (`term`, `query_id`, `rank`, `paper_id`, `score`, `year`, `source`) in {} file(s).\n", facts.queries.len());
    }
    if !options.commands.is_empty() {
        out.push_str("\n## How it was made\n\n```sh\n");
        for c in &options.commands {
            let _ = writeln!(out, "{c}");
        }
        out.push_str("```\n");
    }
    if let Some(table) = &options.report_table {
        let _ = write!(out, "\n## Timings\n\n```text\n{}\n```\n", table.trim_end());
    }
    if let Some(eval) = &options.eval_summary {
        let _ = write!(out, "\n## Recall\n\n{}\n", eval.trim_end());
    }
    out.push_str("\n## Files\n\n`SHA256SUMS` lists every file (`sha256sum -c SHA256SUMS`); `manifest.json` lists them with their rows.\n");
    out
}

fn counts(out: &mut String, facts: &Facts) {
    let _ = write!(
        out,
        "\n## Counts\n\n| | |\n|---|---|\n| papers planned | {} |\n| papers embedded (rows) | {} |\n| papers quarantined | {} |\n",
        facts.papers_planned, facts.rows, facts.papers_quarantined
    );
    for (reason, n) in &facts.quarantined_by_reason {
        let _ = writeln!(out, "| quarantined: {reason} | {n} |");
    }
    if facts.missing.is_empty() {
        out.push_str("\nEvery planned batch is embedded.\n");
        return;
    }
    let papers: u64 = facts.missing.iter().map(|b| b.papers).sum();
    let _ = write!(
        out,
        "\n**Partial:** {} batch(es) are missing, {papers} papers in all:\n\n",
        facts.missing.len()
    );
    for b in facts.missing {
        let _ = writeln!(out, "- batch {} ({}, {} papers)", b.id, b.state, b.papers);
    }
}

/// `manifest.json`.
pub fn manifest(facts: &Facts, options: &PublishOptions) -> String {
    let model: BTreeMap<&str, &str> = facts
        .written
        .meta
        .iter()
        .map(|(k, v)| (k.trim_start_matches("embedfleet."), v.as_str()))
        .collect();
    let value = json!({
        "format_version": 1,
        "license": options.license,
        "model": model,
        "dim": facts.written.dim,
        "vector_type": facts.written.vector_type,
        "rows": facts.rows,
        "papers_planned": facts.papers_planned,
        "papers_quarantined": facts.papers_quarantined,
        "quarantined_by_reason": facts.quarantined_by_reason,
        "partial": !facts.missing.is_empty(),
        "missing_batches": facts.missing,
        "with_text": options.with_text,
        "data_files": facts.written.files,
        "query_files": facts.queries,
    });
    serde_json::to_string_pretty(&value).expect("the manifest serialises. This is a bug.")
}

#[cfg(test)]
mod tests {
    use super::size_category;

    #[test]
    fn size_categories_follow_the_hub_buckets() {
        assert_eq!(size_category(0), "n<1K");
        assert_eq!(size_category(999), "n<1K");
        assert_eq!(size_category(1_000), "1K<n<10K");
        assert_eq!(size_category(8_300_000), "1M<n<10M");
    }
}
