//! The dataset card, `README.md`: the YAML header the Hugging Face Hub reads (licence, configs,
//! size category, task), then what a user of the vectors needs to know — which model made
//! them and how, how many papers and which are missing, how the run was made, its timings and
//! recall. The card holds nothing that changes between two publishes of the same shards.

use crate::facts::Facts;
use crate::PublishOptions;
use std::fmt::Write as _;

/// The Hub's size buckets (`size_categories`).
pub fn size_category(rows: u64) -> &'static str {
    const BUCKETS: [(u64, &str); 10] = [
        (1_000, "n<1K"),
        (10_000, "1K<n<10K"),
        (100_000, "10K<n<100K"),
        (1_000_000, "100K<n<1M"),
        (10_000_000, "1M<n<10M"),
        (100_000_000, "10M<n<100M"),
        (1_000_000_000, "100M<n<1B"),
        (10_000_000_000, "1B<n<10B"),
        (100_000_000_000, "10B<n<100B"),
        (1_000_000_000_000, "100B<n<1T"),
    ];
    BUCKETS
        .iter()
        .find(|(below, _)| rows < *below)
        .map_or("n>1T", |(_, name)| name)
}

/// A YAML scalar: plain when it is a simple id, else a double-quoted (JSON) string.
fn yaml_scalar(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c));
    if plain {
        text.to_string()
    } else {
        serde_json::to_string(text).expect("a string serialises. This is a bug.")
    }
}

fn yaml_header(facts: &Facts, options: &PublishOptions) -> String {
    let mut out = format!(
        "---\nlicense: {}\ntask_categories:\n- feature-extraction\ntags:\n- embeddings\n- embedfleet\nsize_categories:\n- {}\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/*.parquet\n",
        yaml_scalar(&options.license),
        size_category(facts.rows())
    );
    if !facts.queries.is_empty() {
        out.push_str(
            "- config_name: queries\n  data_files:\n  - split: train\n    path: queries/*.parquet\n",
        );
    }
    out.push_str("---\n");
    out
}

/// Markdown table cell text: `|` would end the cell.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

/// The card (see the module docs).
pub fn render(facts: &Facts, options: &PublishOptions) -> String {
    let mut out = yaml_header(facts, options);
    let model = facts.meta("model");
    let _ = write!(
        out,
        "\n# Embeddings of {model}\n\n{} papers embedded with `{model}` by embedfleet {}{}.\n",
        facts.rows(),
        facts.meta("version"),
        if facts.missing.is_empty() {
            ""
        } else {
            " — **partial**: see Counts for the batches missing"
        }
    );
    vectors(&mut out, facts, options);
    counts(&mut out, facts);
    releases(&mut out, facts);
    columns(&mut out, options);
    if !facts.queries.is_empty() {
        let rows: u64 = facts.queries.iter().map(|q| q.rows).sum();
        let _ = write!(
            out,
            "\n## Queries\n\nThe `queries` config: {rows} rows of query results in {} file(s) under `queries/`, as `embedfleet query` wrote them.\n",
            facts.queries.len()
        );
    }
    made(&mut out, options);
    out.push_str("\n## Files\n\n`data/*.parquet` (`embedfleet.*` key-value metadata on each file says how the vectors were made), `manifest.json` (every file with its rows, bytes and SHA-256; the counts), `SHA256SUMS` (check the folder with `sha256sum -c SHA256SUMS`).\n\n```python\nfrom datasets import load_dataset\nds = load_dataset(\"parquet\", data_dir=\"data\", split=\"train\")  # or the Hub repository's name\n```\n");
    out.push_str(NEW_VERSION);
    out
}

/// The card's paragraph on a version published into the folder of an earlier one. Hugging
/// Face `datasets` keeps a folder's first load in its cache: `load_dataset(folder)` returns
/// that version again, and forcing a fresh read (`download_mode="force_redownload"`) fails on
/// what the cache recorded (the rows, the columns) unless told not to check, and still when
/// the columns changed (both seen with datasets 5.2). Reading the data files themselves sees
/// their change.
const NEW_VERSION: &str = "\n**A new version in the same folder.** `embedfleet publish` into the folder of an earlier version (after `plan --update` and a new run) replaces its files. `load_dataset(\"parquet\", data_dir=...)`, as above, reads the new version; `load_dataset(folder)` goes on returning the version `datasets` cached first. To load the folder itself afresh, `load_dataset(folder, split=\"train\", download_mode=\"force_redownload\", verification_mode=\"no_checks\")` (while the columns stay the same), or publish each version into a folder of its own.\n";

/// What `publish` says about loading the folder at `out`: what the card's paragraph on a new
/// version says, with the folder's own path.
pub fn load_hint(out: &std::path::Path) -> String {
    let data = out.join("data");
    format!(
        "load it with `datasets.load_dataset(\"parquet\", data_dir=\"{}\", split=\"train\")`: \
         that reads a version published into this folder again, where `load_dataset(\"{}\")` \
         returns the one `datasets` cached first (or use `download_mode=\"force_redownload\"`, \
         or a new folder per version: the dataset card says how)",
        data.display(),
        out.display()
    )
}

fn vectors(out: &mut String, facts: &Facts, options: &PublishOptions) {
    let instruction = options
        .instruction
        .as_deref()
        .map_or_else(|| "none recorded".to_string(), |i| format!("`{}`", cell(i)));
    let prompt = facts
        .meta_given("document_prompt")
        .filter(|p| !p.is_empty());
    let family = options
        .query_format
        .as_ref()
        .map_or("unknown", |f| f.family.as_str());
    let _ = write!(
        out,
        "\n## Vectors\n\n| | |\n|---|---|\n| model | `{}` |\n| model family | {} |\n| model revision | `{}` |\n| pooling | {} |\n| document prompt | {} |\n| texts read | {} |\n| L2-normalised | {} |\n| dimension | {} |\n| stored as | {} |\n| computed in | {} |\n| query instruction | {instruction} |\n| embedfleet version | {} |\n",
        cell(facts.meta("model")),
        cell(family),
        cell(facts.meta("model_revision")),
        cell(facts.meta("pooling")),
        prompt.map_or_else(|| "none".to_string(), |p| format!("`{}`", cell(p))),
        text_rule_words(facts.meta_given("text_rule")),
        cell(facts.meta("normalized")),
        facts.source.dim,
        facts.source.vector_type(),
        cell(facts.meta("compute_dtype")),
        cell(facts.meta("version")),
    );
    let query = match &options.query_format {
        Some(format) => format!(
            "as `{}` ({}'s format)",
            format.example.replace('\n', "\\n"),
            format.family
        ),
        None => "in its model family's query format, with the query instruction".into(),
    };
    let papers = match prompt {
        Some(p) => format!("with the prompt `{p}` before their text"),
        None => "as they are, with no instruction".into(),
    };
    let _ = writeln!(
        out,
        "\nPapers are embedded {papers}; a query is embedded {query}. Papers longer than the model's context are embedded in chunks (each framed by the model's special tokens, the prompt in the first) and combined by a mean weighted by their lengths (`n_chunks`), never cut."
    );
}

/// How the papers' texts were prepared before they were tokenised, in the card's words, with
/// the sentence-transformers releases a query side must match (`embedfleet.text_rule`).
fn text_rule_words(rule: Option<&str>) -> String {
    match rule {
        Some("as-given") => "as given (`as-given`), as sentence-transformers 5.4 and later read a text".into(),
        Some("stripped") => "stripped of leading and trailing whitespace, `do_lower_case` by `str.lower()` (`stripped`), as sentence-transformers 5.3 and earlier read a text".into(),
        Some(other) => format!("`{}`", cell(other)),
        None => "not recorded (a run fixed before embedfleet recorded it: the encoder families' texts stripped, as sentence-transformers 5.3 and earlier read them; Qwen3's as given)".into(),
    }
}

fn counts(out: &mut String, facts: &Facts) {
    let s = &facts.status;
    let _ = write!(
        out,
        "\n## Counts\n\n| | |\n|---|---|\n| papers planned | {} |\n| papers embedded (rows) | {} |\n| papers quarantined | {} |\n",
        s.papers_planned,
        facts.rows(),
        s.papers_quarantined
    );
    for (reason, n) in &s.quarantined_by_reason {
        let _ = writeln!(out, "| quarantined: {} | {n} |", cell(reason));
    }
    let _ = writeln!(out, "| batches | {} |", s.batches);
    for (state, n) in &s.batches_by_state {
        let _ = writeln!(out, "| batches {} | {n} |", cell(state));
    }
    let _ = writeln!(out, "| papers missing | {} |", facts.papers_missing());
    let deleted = facts.source.deleted_rows();
    if deleted > 0 {
        let _ = writeln!(out, "| papers deleted (left out) | {deleted} |");
    }
    if facts.source.withheld > 0 {
        let _ = writeln!(
            out,
            "| older copies left out (changed or withdrawn by a later release) | {} |",
            facts.source.withheld
        );
    }
    if facts.missing.is_empty() {
        out.push_str(if deleted > 0 {
            "\nEvery planned batch is embedded: each planned paper is a row, quarantined (the reasons above) or deleted (`embedfleet delete`).\n"
        } else {
            "\nEvery planned batch is embedded: each planned paper is a row or quarantined (the reasons above).\n"
        });
        return;
    }
    let planned: u64 = facts.missing.iter().map(|b| b.papers).sum();
    let _ = write!(
        out,
        "\n**Partial.** {} batch(es) are not done or fall short; {} of their {planned} papers are missing from this dataset:\n\n",
        facts.missing.len(),
        facts.papers_missing()
    );
    for b in facts.missing {
        let _ = writeln!(out, "- {b}");
    }
}

/// The changelog: one row per corpus release, when the run followed more than one.
fn releases(out: &mut String, facts: &Facts) {
    let releases = &facts.status.releases;
    if releases.len() < 2 {
        return;
    }
    let _ = write!(
        out,
        "\n## Releases\n\nVersion {} of this dataset: the corpus in {} releases. Each release re-embedded only the papers it added or changed; a file of `data/` changes only when a release changed, withdrew or gave new metadata to one of its papers (release R's papers are in `data/train-rRRRR-*`; a paper whose metadata alone changed keeps its vector and gets the release's `source`, `created`, `added` and `version`).\n\n| release | added | changed | withdrawn | unchanged | new metadata | planned with |\n|---|---|---|---|---|---|---|\n",
        releases.last().map_or(1, |r| r.release),
        releases.len()
    );
    for r in releases {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | `{}` |",
            r.release,
            r.counts.added,
            r.counts.changed,
            r.counts.withdrawn,
            r.counts.unchanged,
            r.counts.restamped,
            cell(r.command.as_deref().unwrap_or("-"))
        );
    }
}

fn columns(out: &mut String, options: &PublishOptions) {
    let _ = write!(
        out,
        "\n## Columns\n\n| column | what |\n|---|---|\n| `id` | the paper's corpus id |\n| `embedding` | the vector |\n| `n_chars` | characters of the paper's text |\n| `n_tokens` | tokens the model read |\n| `n_chunks` | pieces the paper was embedded in (1 when it fit the context) |\n| `source`, `created`, `added`, `version` | the corpus record's fields |\n| `extra` | other kept fields, as a JSON object |\n{}",
        if options.with_text {
            "| `text` | the paper's full text, as embedded |\n"
        } else {
            ""
        }
    );
}

fn made(out: &mut String, options: &PublishOptions) {
    if !options.commands.is_empty() {
        out.push_str("\n## How it was made\n\n```sh\n");
        for c in &options.commands {
            let _ = writeln!(out, "{}", c.trim_end());
        }
        out.push_str("```\n");
    }
    if let Some(table) = &options.report_table {
        let _ = write!(
            out,
            "\n## Timings\n\n```text\n{}\n```\n",
            table.trim_end().replace("```", "'''")
        );
    }
    if let Some(eval) = &options.eval_summary {
        let _ = write!(out, "\n## Recall\n\n{}\n", eval.trim_end());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_categories_follow_the_hub_buckets() {
        assert_eq!(size_category(0), "n<1K");
        assert_eq!(size_category(999), "n<1K");
        assert_eq!(size_category(1_000), "1K<n<10K");
        assert_eq!(size_category(8_300_000), "1M<n<10M");
        assert_eq!(size_category(100_000_000), "100M<n<1B");
        assert_eq!(size_category(5_000_000_000_000), "n>1T");
    }

    #[test]
    fn licences_that_are_not_plain_ids_are_quoted() {
        assert_eq!(yaml_scalar("odc-by"), "odc-by");
        assert_eq!(yaml_scalar("cc-by-4.0"), "cc-by-4.0");
        assert_eq!(yaml_scalar("a: b"), "\"a: b\"");
    }
}
