//! `embedfleet report`: the study's Table 2 for one run — where a batch's time goes (model
//! load, I/O, tokenisation, inference), throughput, padding and fallbacks — from the timings
//! the embed jobs recorded in run.db, plus PNG plots.
//!
//! Each batch counts once, by its latest successful run (`RunDb::latest_batch_runs`). A re-run
//! that only finished the parts a killed job left counts those papers only, as it should: its
//! time was spent on them.
//!
//! Beside the table: `report --html` (a self-contained page: `figures` computed from the
//! attempt `history`, drawn by `html`), `report --trace` (`trace`), and what the run's owner
//! keeps fresh beside run.db (`owner`: `report.html`, `metrics.prom`; `listen` for
//! `submit --metrics-listen`).

pub mod activity;
mod clock;
mod escape;
pub mod figures;
pub mod history;
mod html;
pub mod listen;
mod logline;
pub mod metrics;
pub mod owner;
pub mod plot;
pub mod table;
pub mod trace;

use embedfleet_core::rundb::{RunDb, RunDbError};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
pub use table::{BatchLine, Fallbacks, Stat, Summary};

/// Goes up when a field of the JSON form changes meaning or goes away (fields are only added
/// otherwise).
pub const REPORT_FORMAT_VERSION: u32 = 1;

/// The report of one run, in the form `report --json` prints.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub format_version: u32,
    pub run_dir: PathBuf,
    /// The plan's mini-batch rule, as stored in run.db.
    pub minibatch: Option<embedfleet_core::settings::MiniBatchRule>,
    pub batches: Vec<BatchLine>,
    /// `None` when no batch has finished.
    pub summary: Option<Summary>,
    /// Planned papers not in a parquet shard yet.
    pub papers_to_go: u64,
    /// Those papers at the per-job rate so far, in node-hours (one job per node).
    pub node_hours_to_go: Option<f64>,
    /// The corpus releases (`plan --update`), with what each changed and cost.
    pub releases: Vec<embedfleet_core::rundb::ReleaseStatus>,
    /// Papers the newest release serves, and the rows earlier releases' batches hold that it
    /// withheld (as in `status`).
    pub papers_live: u64,
    pub rows_withheld: embedfleet_core::rundb::WithheldRows,
}

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    RunDb(#[from] RunDbError),
    #[error(
        "no batch of {0} has finished yet: run `embedfleet run` (or `embedfleet embed-job`) first"
    )]
    NothingFinished(PathBuf),
    #[error("failed to write the plot {path}: {reason}")]
    Plot { path: PathBuf, reason: String },
}

/// Reads the timings of the run in `run_dir` (its run.db `db`, open) and computes the report.
pub fn load(db: &RunDb, run_dir: &Path) -> Result<Report, ReportError> {
    let runs = db.latest_batch_runs()?;
    let batches = table::lines(&runs);
    let summary = table::summarize(&batches);
    let status = db.status()?;
    let papers_to_go = status.papers_planned.saturating_sub(status.rows_in_shards);
    let node_hours_to_go = summary
        .as_ref()
        .filter(|s| s.job_papers_per_s > 0.0)
        .map(|s| papers_to_go as f64 / s.job_papers_per_s / 3600.0);
    Ok(Report {
        papers_live: status.papers_live,
        rows_withheld: status.rows_withheld,
        releases: status.releases,
        papers_to_go,
        node_hours_to_go,
        format_version: REPORT_FORMAT_VERSION,
        run_dir: run_dir.to_path_buf(),
        minibatch: db.plan_settings()?.map(|s| s.minibatch),
        batches,
        summary,
    })
}

fn pm(s: &Stat) -> String {
    format!("{:>9.2} ± {:<8.2}", s.mean, s.std)
}

fn bytes(n: u64) -> String {
    format!("{:.1} MiB", n as f64 / (1024.0 * 1024.0))
}

/// The human form: the per-batch lines, then Table 2 and the run's totals.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let Some(s) = &report.summary else {
        return format!(
            "no batch of {} has finished yet\n",
            report.run_dir.display()
        );
    };
    render_batches(&mut out, report);
    render_table(&mut out, report, s);
    render_totals(&mut out, s);
    if report.releases.len() > 1 {
        let _ = writeln!(out, "\nreleases");
        for r in &report.releases {
            let _ = writeln!(out, "  {}", crate::status::release_line(r));
        }
        let w = &report.rows_withheld;
        let _ = writeln!(
            out,
            "  live: {} papers; {} rows withheld ({} superseded, {} withdrawn)",
            report.papers_live,
            w.total(),
            w.superseded,
            w.withdrawn
        );
    }
    if let Some(hours) = report.node_hours_to_go {
        let _ = writeln!(
            out,
            "  to go: {} papers, {hours:.1} node-hours at this rate",
            report.papers_to_go
        );
    }
    out
}

/// A line per batch.
fn render_batches(out: &mut String, report: &Report) {
    let _ = writeln!(
        out,
        "{:>6} {:>7} {:>8} {:>8} {:>8} {:>9} {:>8} {:>9} {:>10} {:>8} {:>10}",
        "batch",
        "papers",
        "load s",
        "I/O s",
        "tok s",
        "infer s",
        "total s",
        "tokens",
        "padding",
        "papers/s",
        "tokens/s"
    );
    for b in &report.batches {
        let _ = writeln!(
            out,
            "{:>6} {:>7} {:>8.2} {:>8.2} {:>8.2} {:>9.2} {:>8.2} {:>9} {:>10} {:>8.1} {:>10.0}",
            b.batch_id,
            b.timings.papers,
            b.timings.model_load_s,
            b.timings.io_s,
            b.timings.tokenize_s,
            b.timings.inference_s,
            b.timings.total_s,
            b.timings.tokens,
            b.timings.padding_tokens,
            b.papers_per_s,
            b.tokens_per_s
        );
    }
}

/// Table 2: each timing per batch, mean ± std.
fn render_table(out: &mut String, report: &Report, s: &Summary) {
    let rule = match &report.minibatch {
        Some(embedfleet_core::settings::MiniBatchRule::Chars {
            max_chars,
            max_papers,
        }) => format!("chars (≤ {max_chars} chars, ≤ {max_papers} papers, corpus order)"),
        Some(embedfleet_core::settings::MiniBatchRule::TokenBudget { max_tokens }) => {
            format!("token budget ({max_tokens} tokens, length-sorted)")
        }
        None => "unknown".into(),
    };
    let _ = writeln!(
        out,
        "\nper batch, mean ± std over {} batches (mini-batches: {rule})",
        s.batches
    );
    for (name, stat) in [
        ("model load s", &s.model_load_s),
        ("I/O s", &s.io_s),
        ("tokenisation s", &s.tokenize_s),
        ("inference s", &s.inference_s),
        ("total s", &s.total_s),
        ("papers/s", &s.papers_per_s),
        ("tokens/s", &s.tokens_per_s),
    ] {
        let _ = writeln!(out, "  {name:<16}{}", pm(stat));
    }
    let _ = writeln!(
        out,
        "  {:<16}{:>9.1} %",
        "inference share",
        100.0 * s.inference_share
    );
}

/// The run's totals.
fn render_totals(out: &mut String, s: &Summary) {
    let _ = writeln!(out, "\nrun");
    let _ = writeln!(
        out,
        "  papers {}, tokens {}, padding {} ({:.1} % of real tokens, what a padded forward would compute)",
        s.papers,
        s.tokens,
        s.padding_tokens,
        100.0 * s.padding_share
    );
    let _ = writeln!(
        out,
        "  per job: {:.2} papers/s, {:.0} tokens/s; whole run: {:.1} s wall, {:.2} papers/s",
        s.job_papers_per_s, s.job_tokens_per_s, s.wall_s, s.wall_papers_per_s
    );
    let f = &s.fallbacks;
    let _ = writeln!(
        out,
        "  fallbacks: {} split, {} sequential, {} chunked; {} long papers chunked",
        f.split, f.sequential, f.chunked, f.long_papers_chunked
    );
    let _ = writeln!(
        out,
        "  peak memory: {}",
        s.peak_memory_bytes
            .map_or_else(|| "not recorded".into(), bytes)
    );
    let _ = writeln!(
        out,
        "  {:.1} M papers at this rate: {:.0} job-hours (node-hours)",
        s.full_corpus_papers as f64 / 1e6,
        s.full_corpus_job_hours
    );
}

/// The HTML page of the run in `run_dir` (its run.db `db`, open) as it stands (`report --html`).
pub fn html_page(db: &RunDb, run_dir: &Path) -> Result<String, ReportError> {
    let status = db.status()?;
    let history = history::AttemptHistory::load(db)?;
    let quarantined = db.quarantine_sample(50)?;
    let mut cache = std::collections::HashMap::new();
    let mut figures = figures::compute(&status, &history, quarantined, |a| {
        owner::first_error(run_dir, &mut cache, a)
    });
    figures.eval = embedfleet_core::eval_tables::latest(run_dir);
    figures.compare = embedfleet_core::eval_tables::compare(run_dir);
    figures.activity = activity::Activity::read(db);
    Ok(html::render(&figures))
}

/// The trace of the run whose run.db `db` is: a line per job attempt (`report --trace`).
pub fn trace_file(db: &RunDb) -> Result<String, ReportError> {
    Ok(trace::render(&history::AttemptHistory::load(db)?))
}

/// Writes the plots of [`plot::write_all`] into `dir` (created if needed); returns their paths.
pub fn write_plots(report: &Report, dir: &Path) -> Result<Vec<PathBuf>, ReportError> {
    std::fs::create_dir_all(dir).map_err(|e| ReportError::Plot {
        path: dir.to_path_buf(),
        reason: e.to_string(),
    })?;
    plot::write_all(&report.batches, dir)
}
