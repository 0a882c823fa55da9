//! `run`: the whole pipeline on this machine (`crate::run`), printed as it goes.

use super::plan::{print_plan_report, report_code};
use super::{submit, upload};
use crate::flags::RunFlags;
use crate::run::{RunOutcome, RunRequest, RunSteps, RUN_COLLECTION};
use crate::settings::plan::plan_options;
use crate::settings::{LoopOptions, SubmitFlags};
use anyhow::{Context, Result};
use embedfleet_core::exit;
use embedfleet_core::rundb::RunStatus;
use embedfleet_core::RunLayout;
use embedfleet_orchestrator::plan::PlanReport;
use embedfleet_vectordb::query::QueryHit;
use embedfleet_vectordb::UploadReport;
use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::Path;

/// Plans (if not planned), embeds every batch as local jobs through the submit loop, uploads
/// into the embedded Qdrant, runs one query and prints the status.
pub fn run_all(args: &RunFlags) -> Result<i32> {
    let run_dir = &args.corpus.run_dir;
    let request = RunRequest {
        plan: plan_options(
            args.corpus.corpus.clone(),
            run_dir.clone(),
            &args.plan,
            None,
        ),
        submit: preset_flags(args),
        query: args.query.clone(),
        exe: std::env::current_exe().context("failed to find the embedfleet binary")?,
        progress: std::io::stderr().is_terminal(),
    };
    let mut printer = Printer {
        run_dir,
        query: &args.query,
    };
    let done = crate::run::run(&request, &mut printer)?;
    if let Err(e) = done.record_command(&super::invoke::command_line()) {
        tracing::warn!("could not record the command line in run.db: {e}");
    }
    let code = submit::summarise_status(&done.status, &done.options, &done.submit, true);
    if code != exit::SUCCESS {
        return Ok(code);
    }
    print!("{}", where_and_next(run_dir, &done));
    Ok(report_code(&done.plan))
}

/// `run` is `submit` with a preset of its flags, through the same set-up and preflight: local
/// jobs, two attempts a batch, a quick poll, and no breaker (`run` is unattended and ends on
/// its own: a pause would wait for a `resume` nobody types; two attempts per batch bound the
/// cost of a setup that always fails).
fn preset_flags(args: &RunFlags) -> SubmitFlags {
    SubmitFlags {
        run_dir: args.corpus.run_dir.clone(),
        queues: vec![("local".to_string(), args.local_jobs.max(1) as u32)],
        devices: Some(args.devices.clone()),
        model_dir: args.model_dir.clone(),
        dim: args.dim,
        shard_papers: Some(args.shard_papers),
        loop_options: LoopOptions {
            max_attempts: Some(2),
            breaker_after: Some(0),
            poll_interval_s: Some(0.5),
            lost_after_s: Some(10.0),
            route: None,
            speculate: Some(true),
            max_jobs: None,
        },
        preset: true,
        ..SubmitFlags::default()
    }
}

/// Prints each stage's end as the run goes.
struct Printer<'a> {
    run_dir: &'a Path,
    query: &'a str,
}

impl RunSteps for Printer<'_> {
    fn planned(&mut self, report: &PlanReport) {
        print_plan_report(report, self.run_dir);
    }

    fn note(&mut self, line: &str) {
        eprintln!("{line}");
    }

    fn uploaded(&mut self, upload: &UploadReport, hits: &[QueryHit]) {
        upload::print_report(RUN_COLLECTION, upload);
        if upload.ensured.is_none() {
            return;
        }
        super::query::print_hits(self.query, hits);
    }
}

/// The end of a finished `run`: where its results are (the collection, the parquet shards,
/// the report page, written now so it holds the upload and the query too) and the commands
/// that come next.
fn where_and_next(run_dir: &Path, done: &RunOutcome) -> String {
    let layout = RunLayout::new(run_dir);
    let dir = run_dir.display();
    let page = match done.write_report_page() {
        Ok(path) => path.display().to_string(),
        Err(e) => {
            format!("not written ({e}); `embedfleet report --run-dir {dir} --html FILE` writes one")
        }
    };
    let status: &RunStatus = &done.status;
    // After the status, which ends with a blank line.
    let mut out = String::from("results\n");
    let _ = writeln!(
        out,
        "  collection  `{RUN_COLLECTION}` in the embedded Qdrant, {}",
        layout.edge_dir().display()
    );
    let _ = writeln!(
        out,
        "  shards      {} ({} parquet shard{}, {} papers)",
        layout.shard_dir().display(),
        status.shards,
        if status.shards == 1 { "" } else { "s" },
        status.rows_in_shards
    );
    let _ = writeln!(out, "  report      {page}");
    let _ = writeln!(out, "next");
    let _ = writeln!(
        out,
        "  embedfleet query --run-dir {dir} \"protein folding\"  # the top papers of a term"
    );
    let _ = writeln!(
        out,
        "  embedfleet query --run-dir {dir} --terms terms.txt --output hits.parquet  # a term a line"
    );
    let _ = writeln!(out, "  embedfleet eval --run-dir {dir}");
    let _ = writeln!(out, "  embedfleet publish --run-dir {dir} --out dataset");
    out
}
