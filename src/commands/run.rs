//! `run`: the whole pipeline on this machine.

use super::plan::{plan_run, report_code};
use super::{submit, upload};
use crate::cli::RunArgs;
use anyhow::{Context, Result};
use embedfleet_core::exit;
use embedfleet_core::rundb::RunDb;
use embedfleet_core::RunLayout;
use embedfleet_orchestrator::report;
use embedfleet_pipeline::run::RUN_COLLECTION;
use embedfleet_pipeline::settings::{LoopOptions, SubmitFlags};
use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::Path;

/// Plans (if not planned), embeds every batch as local jobs through the submit loop, uploads
/// into the embedded Qdrant, runs one query and prints the status.
pub fn run_all(args: &RunArgs) -> Result<i32> {
    let run_dir = &args.corpus.run_dir;
    let plan_report = plan_run(args.corpus.corpus.clone(), run_dir.clone(), &args.plan)?;
    // A run a cluster `submit` started keeps its scheduler config: `run` would send its
    // batches to this machine instead.
    let db = embedfleet_core::rundb::RunDb::open(run_dir)?;
    embedfleet_orchestrator::stored_config::check_local(&db)?;
    let model_dir = model_dir_or_tiny(args.model_dir.as_deref(), run_dir)?;
    // `run` is `submit` with a preset of its flags, through the same set-up and preflight:
    // local jobs, two attempts a batch, a quick poll, and no breaker (`run` is unattended and
    // ends on its own: a pause would wait for a `resume` nobody types; two attempts per batch
    // bound the cost of a setup that always fails).
    let flags = SubmitFlags {
        run_dir: run_dir.clone(),
        queues: vec![("local".to_string(), args.local_jobs.max(1) as u32)],
        devices: Some(args.devices.clone()),
        // Absolute: jobs start in the run directory.
        model_dir: Some(std::path::absolute(&model_dir)?),
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
    };
    let exe = std::env::current_exe().context("failed to find the embedfleet binary")?;
    let prepared =
        embedfleet_pipeline::submit::prepare(&db, &flags, exe, std::io::stderr().is_terminal())?;
    for note in &prepared.notes {
        eprintln!("{note}");
    }
    drop(db);
    let options = prepared.options;
    let report = embedfleet_orchestrator::submit::submit(&options)?;
    upload::upload_and_query(run_dir, &model_dir, args.dim, &args.query)?;
    let code = submit::summarise(&options, &report, true)?;
    if code != exit::SUCCESS {
        return Ok(code);
    }
    print!("{}", where_and_next(run_dir)?);
    Ok(report_code(&plan_report))
}

/// The model given, else a tiny random one written into the run directory (once).
fn model_dir_or_tiny(given: Option<&Path>, run_dir: &Path) -> Result<std::path::PathBuf> {
    if let Some(dir) = given {
        return Ok(dir.to_path_buf());
    }
    let dir = RunLayout::new(run_dir).tiny_model_dir();
    if !dir.join("model.safetensors").is_file() {
        embedfleet_models::write_tiny_model(&dir, 0)?;
        eprintln!(
            "no --model-dir: using a tiny random {} written to {}",
            embedfleet_models::default_family().name(),
            dir.display()
        );
    }
    Ok(dir)
}

/// The end of a finished `run`: where its results are (the collection, the parquet shards,
/// the report page, written now so it holds the upload and the query too) and the commands
/// that come next.
fn where_and_next(run_dir: &Path) -> Result<String> {
    let layout = RunLayout::new(run_dir);
    let dir = run_dir.display();
    let path = layout.report_page();
    let written = report::html_page(run_dir)
        .map_err(|e| e.to_string())
        .and_then(|html| {
            embedfleet_core::atomic::write(&path, html.as_bytes()).map_err(|e| e.to_string())
        });
    let page = match written {
        Ok(()) => path.display().to_string(),
        Err(e) => {
            format!("not written ({e}); `embedfleet report --run-dir {dir} --html FILE` writes one")
        }
    };
    let status = RunDb::open(run_dir)?.status()?;
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
    Ok(out)
}
