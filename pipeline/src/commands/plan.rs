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
/// be (docs/sizing.md, "Sizing a run") at the width of the run's model where a submit fixed it,
/// else at the study's (Qwen3-Embedding-4B's 2,560), against the room at the run directory: a
/// warning with the numbers where the shards will not fit.
fn disk_estimate(run_dir: &std::path::Path, papers: u64) -> String {
    use embedfleet_core::space::{shard_bytes, size, space_of};
    let batches: u64 = std::fs::read_dir(RunLayout::new(run_dir).batch_dir())
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0);
    let pinned = embedfleet_core::handoff::OutputSettings::read(&RunLayout::new(run_dir))
        .ok()
        .flatten()
        .and_then(|s| crate::room::bytes_per_paper(&s));
    let (shards, width, said) = match pinned {
        Some(per_paper) => {
            let shards = papers.saturating_mul(per_paper);
            let said = format!("about {} at the run's width", size(shards));
            (shards, "at the run's width", said)
        }
        None => {
            let shards = shard_bytes(papers, 2560, 4);
            let said = format!(
                "about {} at 2,560-d f32 (Qwen3-Embedding-4B), {} with --vector-dtype f16, {} at \
                 1,024-d f32, {} at 384-d f32 (all-MiniLM-L6-v2)",
                size(shards),
                size(shard_bytes(papers, 2560, 2)),
                size(shard_bytes(papers, 1024, 4)),
                size(shard_bytes(papers, 384, 4)),
            );
            (shards, "at 2,560-d f32", said)
        }
    };
    let mut text = format!(
        "disk: the batch files take {}; the parquet shards will take {said}",
        size(batches)
    );
    if let Ok(space) = space_of(run_dir) {
        let dir = std::path::absolute(run_dir).unwrap_or_else(|_| run_dir.to_path_buf());
        if space.free < shards {
            text.push_str(&format!(
                "\nwarning: {} free at {} (of {}): the shards {width} ({}) will not fit there; \
                 free space or raise the quota before `submit` (the jobs wait for room when \
                 there is none), or plan into a run directory on a larger filesystem",
                size(space.free),
                dir.display(),
                size(space.total),
                size(shards)
            ));
        }
    }
    text
}

/// `" (N with new metadata)"` when a release restamped papers, else nothing.
pub fn restamped_note(restamped: u64) -> String {
    if restamped == 0 {
        String::new()
    } else {
        format!(" ({restamped} with new metadata)")
    }
}
