//! `run`: the whole pipeline on this machine.

use super::plan::{plan_run, report_code};
use super::{submit, upload};
use crate::cli::RunArgs;
use anyhow::{Context, Result};
use embedfleet_core::exit;
use embedfleet_core::RunLayout;
use embedfleet_pipeline::settings::{LoopOptions, SubmitFlags};
use std::io::IsTerminal;

/// Plans (if not planned), embeds every batch as local jobs through the submit loop, uploads
/// into the embedded Qdrant, runs one query and prints the status.
pub fn run_all(args: &RunArgs) -> Result<i32> {
    let run_dir = &args.corpus.run_dir;
    let plan_report = plan_run(args.corpus.corpus.clone(), run_dir.clone(), &args.plan)?;
    // A run a cluster `submit` started keeps its scheduler config: `run` would send its
    // batches to this machine instead.
    let db = embedfleet_core::rundb::RunDb::open(run_dir)?;
    embedfleet_orchestrator::stored_config::check_local(&db)?;
    let model_dir = match &args.model_dir {
        Some(dir) => dir.clone(),
        None => {
            let dir = RunLayout::new(run_dir).tiny_model_dir();
            if !dir.join("model.safetensors").is_file() {
                embedfleet_models::write_tiny_model(&dir, 0)?;
                eprintln!(
                    "no --model-dir: using a tiny random Qwen3 written to {}",
                    dir.display()
                );
            }
            dir
        }
    };
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
    let code = submit::summarise(&options, &report)?;
    if code != exit::SUCCESS {
        return Ok(code);
    }
    Ok(report_code(&plan_report))
}
