//! `run`: the whole pipeline on this machine.

use super::plan::{plan_run, report_code};
use super::{submit, upload};
use crate::cli::RunArgs;
use anyhow::{Context, Result};
use embedfleet_core::exit;
use embedfleet_core::shardfile::VectorDtype;
use embedfleet_core::RunLayout;
use embedfleet_orchestrator::notify::NotifyConfig;
use embedfleet_orchestrator::scheduler::SchedulerConfig;
use embedfleet_orchestrator::submit::SubmitOptions;
use embedfleet_pipeline::settings::JobSettings;
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::Duration;

/// Plans (if not planned), embeds every batch as local jobs through the submit loop, uploads
/// into the embedded Qdrant, runs one query and prints the status.
pub fn run_all(args: &RunArgs) -> Result<i32> {
    let run_dir = &args.corpus.run_dir;
    let plan_report = plan_run(args.corpus.corpus.clone(), run_dir.clone(), &args.plan)?;
    // A run a cluster `submit` started keeps its scheduler config: `run` would send its
    // batches to this machine instead.
    let db = embedfleet_core::rundb::RunDb::open(run_dir)?;
    embedfleet_orchestrator::stored_config::check_local(&db)?;
    drop(db);
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
    let job = JobSettings {
        devices: args.devices.clone(),
        // Absolute: jobs start in the run directory.
        model_dir: std::path::absolute(&model_dir)?,
        dim: args.dim,
        vector_dtype: VectorDtype::F32,
        max_tokens: None,
        shard_papers: args.shard_papers,
        memory_limit: None,
        build_shard: false,
    };
    let options = SubmitOptions {
        run_dir: run_dir.clone(),
        scheduler: SchedulerConfig::default(),
        queues: Some(BTreeMap::from([(
            "local".to_string(),
            args.local_jobs.max(1) as u32,
        )])),
        max_attempts: 2,
        poll_interval: Duration::from_millis(500),
        lost_after: Duration::from_secs(10),
        watch: false,
        embed_args: job.to_args(),
        exe: std::env::current_exe().context("failed to find the embedfleet binary")?,
        progress: std::io::stderr().is_terminal(),
        trial: None,
        stall: Default::default(),
        kill_stalled: false,
        // `run` is unattended and ends on its own: a pause would wait for a `resume` nobody
        // types; its two attempts per batch bound the cost of a setup that always fails.
        breaker_after: 0,
        notify: NotifyConfig::default(),
        metrics_listen: None,
        route: Default::default(),
        speculate: true,
    };
    let report = embedfleet_orchestrator::submit::submit(&options)?;
    upload::upload_and_query(run_dir, &model_dir, args.dim, &args.query)?;
    let code = submit::summarise(&options, &report)?;
    if code != exit::SUCCESS {
        return Ok(code);
    }
    Ok(report_code(&plan_report))
}
