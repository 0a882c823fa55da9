//! `plan` and `sample-corpus`.

use crate::flags::{PlanFlags, SampleCorpusFlags};
use crate::settings;
use anyhow::{Context, Result};
use embedfleet_core::exit;
use embedfleet_core::RunLayout;
use embedfleet_orchestrator::plan::{self, PlanReport};
use embedfleet_orchestrator::sample::{self, SampleOptions};
use std::path::Path;

pub fn plan(args: &PlanFlags, slot: &mut super::invoke::RunDbSlot) -> Result<super::invoke::Ended> {
    let typed = std::env::args().collect::<Vec<_>>().join(" ");
    let options = settings::plan::plan_command_options(args, &typed);
    let (report, db) = plan::plan_keeping_db(&options)?;
    print_plan_report(&report, &options.run_dir);
    // The plan made or opened run.db: the command line is recorded through the same handle.
    slot.keep(db);
    let code = report_code(&report);
    Ok(if report.already_planned {
        super::invoke::Ended::nothing_written(code)
    } else {
        code.into()
    })
}

pub fn report_code(report: &PlanReport) -> i32 {
    if report.corrupt.is_empty() && report.unused.is_empty() {
        exit::SUCCESS
    } else {
        exit::PARTIAL
    }
}

/// What a plan did, on stderr.
pub fn print_plan_report(report: &PlanReport, run_dir: &Path) {
    let secs = report.elapsed.as_secs_f64().max(1e-9);
    match (report.release, report.counts) {
        (1, _) | (_, None) if report.already_planned => eprintln!(
            "already planned: {} papers in {} batches ({} quarantined); nothing to do",
            report.papers, report.batches, report.quarantined
        ),
        (1, _) | (_, None) => eprintln!(
            "planned {} papers into {} batches from {} files in {:.1} s ({:.0} papers/s); {} quarantined ({} duplicates), see {}",
            report.papers,
            report.batches,
            report.files,
            secs,
            report.papers as f64 / secs,
            report.quarantined,
            report.duplicates,
            RunLayout::new(run_dir).quarantine_file().display()
        ),
        (release, Some(counts)) => eprintln!(
            "release {release}{}: {} added, {} changed, {} withdrawn, {} unchanged{}: {} papers to embed in {} new batches ({} quarantined in the run, see {})",
            if report.already_planned { " already planned" } else { "" },
            counts.added,
            counts.changed,
            counts.withdrawn,
            counts.unchanged,
            restamped_note(counts.restamped),
            counts.to_embed(),
            report.release_batches,
            report.quarantined,
            RunLayout::new(run_dir).quarantine_file().display()
        ),
    }
    if !report.already_planned {
        eprintln!("{}", disk_estimate(run_dir, report.papers));
    }
    for (file, why) in &report.corrupt {
        eprintln!("warning: {file} is corrupt: {why}; the records before it were planned");
    }
    for (file, why) in &report.unused {
        eprintln!(
            "warning: {file}: no record could be used: {why}; its records are quarantined ({}), the plan went on without it",
            RunLayout::new(run_dir).quarantine_file().display()
        );
    }
}

pub fn sample_corpus(args: &SampleCorpusFlags) -> Result<i32> {
    let options = SampleOptions {
        papers: args.papers,
        seed: args.seed,
        mean_chars: args.mean_chars,
        files: args.files,
    };
    let files = sample::write(&args.out, &options)
        .with_context(|| format!("failed to write {}", args.out.display()))?;
    eprintln!(
        "wrote {} papers to {} file(s) under {}",
        args.papers,
        files.len(),
        args.out.display()
    );
    Ok(exit::SUCCESS)
}

/// What the run will need on disk: the batch files as written, the parquet shards as they will
/// be (docs/sizing.md, "Sizing a run").
fn disk_estimate(run_dir: &std::path::Path, papers: u64) -> String {
    let batches: u64 = std::fs::read_dir(RunLayout::new(run_dir).batch_dir())
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0);
    // A parquet shard row: the vector, plus ~200 bytes of id, counts and metadata.
    let shards = |dim: u64, bytes: u64| size(papers * (dim * bytes + 200));
    format!(
        "disk: the batch files take {}; the parquet shards will take about {} at 2,560-d f32 \
         (Qwen3-Embedding-4B), {} with --vector-dtype f16, {} at 1,024-d f32",
        size(batches),
        shards(2560, 4),
        shards(2560, 2),
        shards(1024, 4)
    )
}

/// Bytes in MB or GB, whichever reads better.
fn size(bytes: u64) -> String {
    if bytes >= 1_000_000_000 {
        format!("{:.1} GB", bytes as f64 / 1e9)
    } else {
        format!("{:.1} MB", bytes as f64 / 1e6)
    }
}

/// `" (N with new metadata)"` when a release restamped papers, else nothing.
pub fn restamped_note(restamped: u64) -> String {
    if restamped == 0 {
        String::new()
    } else {
        format!(" ({restamped} with new metadata)")
    }
}
