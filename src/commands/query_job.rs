//! The query workload's cluster step: `query --submit` (the run's owner: writes the work,
//! submits `query-job` through the run's stored scheduler config, waits, collects the vectors)
//! and `query-job` (the job, on a GPU node: embeds the terms into files; never opens run.db).
//! See `embedfleet_query::vectors` for the files and `embedfleet_orchestrator::oneshot` for
//! the job.

use super::query::{instruction, query_model_dir};
use crate::cli::{QueryArgs, QueryJobArgs};
use anyhow::{bail, Context, Result};
use embedfleet_core::rundb::RunDb;
use embedfleet_core::{atomic, exit, RunLayout};
use embedfleet_models::DeviceSpec;
use embedfleet_orchestrator::oneshot::{self, OneShot, OneShotJob};
use embedfleet_orchestrator::scheduler::{Backend, JobState};
use embedfleet_orchestrator::stored_config::{self, GivenConfig, Origin};
use embedfleet_query::{PrecomputedVectors, QueryModel, QueryWork, QueryWorkDir};
use std::path::Path;
use std::time::{Duration, Instant};

/// Where the owner keeps the job it submitted for a work folder (to find it after a restart).
const JOB_RECORD: &str = "job.json";

/// `query --submit`: the query vectors of `terms`, made by a scheduler job.
pub fn embed_on_cluster(
    db: &RunDb,
    args: &QueryArgs,
    terms: &[String],
) -> Result<PrecomputedVectors> {
    let chosen = stored_config::choose(db, &GivenConfig::default())?;
    if chosen.origin == Origin::First {
        eprintln!(
            "this run has no stored run config (no `submit` has run yet): the query job goes to the local backend"
        );
    }
    let scheduler_config = chosen.config.scheduler;
    let backend = scheduler_config.backend;
    let local = backend == Backend::Local;
    let run_dir = std::path::absolute(&args.run_dir)?;
    let model_dir = std::path::absolute(query_model_dir(&run_dir, &args.model)?)?;
    let devices = args
        .model
        .devices
        .clone()
        .unwrap_or_else(|| if local { "cpu" } else { "cuda" }.to_string());
    check_setup(
        &devices,
        &model_dir,
        scheduler_config.script.embedfleet.as_deref(),
    )?;
    let work = QueryWork::new(
        model_dir,
        args.model.dim,
        instruction(&args.model),
        args.part_terms,
        terms,
    );
    let key = work.key();
    let wd = QueryWorkDir::prepare(&run_dir, work, terms.to_vec())?;
    let parts = wd.work.parts();
    if !wd.missing_parts().is_empty() {
        let scheduler = scheduler_config.build();
        let record = wd.root.join(JOB_RECORD);
        let earlier = read_record(&record);
        let open = earlier.as_ref().and_then(|job| {
            oneshot::state(scheduler.as_ref(), job)
                .ok()
                .filter(|s| matches!(s, JobState::Pending | JobState::Running))
        });
        let job = match (earlier, open) {
            (Some(job), Some(state)) => {
                eprintln!(
                    "query job {} ({}) of an earlier `query --submit` is {state}: waiting for it",
                    job.name, job.scheduler_id
                );
                job
            }
            (earlier, _) => {
                let layout = RunLayout::new(&run_dir);
                let exe =
                    std::env::current_exe().context("failed to find the embedfleet binary")?;
                let kind = format!("q{}-a", &key[..8]);
                let mut one = OneShot {
                    run_dir: &run_dir,
                    scheduler: &scheduler_config,
                    exe: &exe,
                    queue: args
                        .queue
                        .as_deref()
                        .expect("clap requires --queue with --submit"),
                    kind: &kind,
                    attempt: earlier.map_or(1, |j| j.attempt + 1),
                    args: vec![
                        "query-job".into(),
                        "--work".into(),
                        wd.root.display().to_string(),
                        "--devices".into(),
                        devices.clone(),
                    ],
                };
                // A name is never used twice (its script, log and marker are its own).
                while layout.job_script(&one.name()).exists() {
                    one.attempt += 1;
                }
                let job = one.submit(scheduler.as_ref())?;
                let json = serde_json::to_vec_pretty(&job).expect("a job record serialises");
                atomic::write(&record, &json)
                    .with_context(|| format!("failed to write {}", record.display()))?;
                eprintln!(
                    "submitted query job {} ({}) to {backend} queue {} on {devices}: {} terms in {} parts of {}; log: {}",
                    job.name,
                    job.scheduler_id,
                    job.queue,
                    terms.len(),
                    parts,
                    wd.work.part_terms,
                    job.log.display()
                );
                job
            }
        };
        let secs = |v: Option<f64>, local_default: f64, default: f64| {
            Duration::from_secs_f64(v.unwrap_or(if local { local_default } else { default }))
        };
        let mut shown = usize::MAX;
        let end = oneshot::wait(
            scheduler.as_ref(),
            &job,
            secs(args.poll_interval, 1.0, 30.0),
            secs(None, 10.0, 300.0),
            |state| {
                let done = parts - wd.missing_parts().len();
                if done != shown {
                    shown = done;
                    eprintln!("query job {}: {state}, {done}/{parts} parts", job.name);
                }
            },
        )?;
        let missing = wd.missing_parts();
        if !missing.is_empty() {
            bail!(
                "the query job {} ended ({end}) with {} of {parts} parts written; its log: {}. \
                 Run the same command again to go on: the parts written are kept",
                job.name,
                parts - missing.len(),
                job.log.display()
            );
        }
    }
    eprintln!(
        "collecting the query vectors ({parts} parts) from {}",
        wd.root.display()
    );
    Ok(wd.load_vectors()?)
}

/// A setup that would make the job fail at once: refused before it is queued.
fn check_setup(devices: &str, model_dir: &Path, binary: Option<&str>) -> Result<()> {
    let mut problems = Vec::new();
    match embedfleet_embed::parse_devices(devices) {
        Err(e) => problems.push(format!("--devices: {e}")),
        Ok(list) => {
            let gpus = list.iter().any(|d| matches!(d, DeviceSpec::Cuda(_)));
            super::preflight::check_binary(binary, gpus, devices, &mut problems);
        }
    }
    if let Err(e) = embedfleet_models::verify_model_dir(model_dir) {
        problems.push(format!(
            "the model directory {} is not usable: {e}",
            model_dir.display()
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(super::preflight::Refused { problems }.into())
    }
}

fn read_record(path: &Path) -> Option<OneShotJob> {
    let bytes = std::fs::read(path).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// `query-job`: embeds the work folder's missing parts on this node.
pub fn query_job(args: &QueryJobArgs) -> Result<i32> {
    let wd = QueryWorkDir::open(&args.work)?;
    let devices = embedfleet_embed::parse_devices(&args.devices)?;
    let mut model = QueryModel::new(wd.work.model_dir.clone(), devices, wd.work.dim);
    let started = Instant::now();
    let before = wd.work.parts() - wd.missing_parts().len();
    let written = wd.embed_missing(&mut model, |index, parts| {
        eprintln!("query-job: part {index} of {parts} written");
    })?;
    eprintln!(
        "query-job: {written} parts embedded on {} ({before} were done before) in {:.1} s",
        args.devices,
        started.elapsed().as_secs_f64()
    );
    Ok(exit::SUCCESS)
}
