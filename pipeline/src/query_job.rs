//! `query --submit`: the query vectors of a list of terms, made by a scheduler job
//! (`embedfleet query-job`, on a GPU node) through the run's stored run config. The owner
//! writes the work (`queries/KEY/`), submits the job (or finds the one an earlier call left
//! queued or running), waits, and collects the vectors; the job never opens run.db. See
//! `embedfleet_query::vectors` for the files and `embedfleet_orchestrator::oneshot` for the job.

use std::path::{Path, PathBuf};

use embedfleet_core::rundb::RunDb;
use embedfleet_models::DeviceSpec;
use embedfleet_orchestrator::oneshot::{self, OneShot, OneShotJob};
use embedfleet_orchestrator::scheduler::{Scheduler, SchedulerConfig};
use embedfleet_query::{PrecomputedVectors, QueryWork, QueryWorkDir};

use crate::error::{io, PipelineError, Result};
use crate::job_record;
use crate::preflight::{self, Refused};
use crate::settings::{QueryJobSettings, QueryModelSettings};

/// Where the owner keeps the job it submitted for a work folder (to find it after a restart).
const JOB_RECORD: &str = "job.json";

/// A query job to run.
#[derive(Debug, Clone)]
pub struct QueryJobRequest {
    pub run_dir: PathBuf,
    pub model: QueryModelSettings,
    /// The queue (PBS) or partition (Slurm) of the job.
    pub queue: String,
    /// Terms per part, each written as soon as it is embedded.
    pub part_terms: usize,
    /// Seconds between polls (default: the backend's: 30, or 1 for local).
    pub poll_interval_s: Option<f64>,
}

/// The query vectors of `terms`, made by a scheduler job. `say` hears what happens (the job
/// submitted, its parts done).
pub fn embed_on_cluster(
    db: &RunDb,
    request: &QueryJobRequest,
    terms: &[String],
    say: &mut dyn FnMut(String),
) -> Result<PrecomputedVectors> {
    let settings =
        QueryJobSettings::resolve(db, request.model.devices.clone(), request.poll_interval_s)?;
    for note in &settings.notes {
        say(note.clone());
    }
    let config = settings.scheduler;
    let devices = settings.devices.value;
    let run_dir = absolute(&request.run_dir)?;
    let model_dir = absolute(&request.model.model_dir)?;
    check_setup(&devices, &model_dir, config.script.embedfleet.as_deref())?;
    let work = QueryWork::new(
        model_dir,
        request.model.dim,
        request.model.instruction.clone(),
        request.part_terms,
        terms,
    )
    .with_precision(request.model.precision)
    .with_text_rule(request.model.text_rule);
    let wd = QueryWorkDir::prepare(&run_dir, work, terms.to_vec())?;
    let parts = wd.work.parts();
    if !wd.missing_parts().is_empty() {
        let scheduler = config.build();
        let job = open_or_submit(
            &wd,
            &run_dir,
            &config,
            scheduler.as_ref(),
            request,
            &devices,
            say,
        )?;
        let mut shown = usize::MAX;
        let end = oneshot::wait(
            scheduler.as_ref(),
            &job,
            settings.poll_interval.value,
            settings.lost_after,
            |state| {
                let done = parts - wd.missing_parts().len();
                if done != shown {
                    shown = done;
                    say(format!(
                        "query job {}: {state}, {done}/{parts} parts",
                        job.name
                    ));
                }
            },
        )?;
        let missing = wd.missing_parts();
        if !missing.is_empty() {
            return Err(PipelineError::QueryJobIncomplete {
                job: job.name.clone(),
                end,
                written: parts - missing.len(),
                parts,
                log: job.log.clone(),
            });
        }
    }
    say(format!(
        "collecting the query vectors ({parts} parts) from {}",
        wd.root.display()
    ));
    Ok(wd.load_vectors()?)
}

/// The job an earlier call left queued or running for this work, else a new one.
fn open_or_submit(
    wd: &QueryWorkDir,
    run_dir: &Path,
    config: &SchedulerConfig,
    scheduler: &dyn Scheduler,
    request: &QueryJobRequest,
    devices: &str,
    say: &mut dyn FnMut(String),
) -> Result<OneShotJob> {
    let record = wd.root.join(JOB_RECORD);
    let earlier = job_record::recorded(&record, scheduler);
    if let Some(job_record::Recorded {
        job,
        open: Some(state),
    }) = &earlier
    {
        say(format!(
            "query job {} ({}) of an earlier `query --submit` is {state}: waiting for it",
            job.name, job.scheduler_id
        ));
        return Ok(job.clone());
    }
    let exe = crate::current_exe()?;
    let kind = format!("q{}-a", &wd.work.key()[..8]);
    let one = OneShot {
        run_dir,
        scheduler: config,
        exe: &exe,
        queue: &request.queue,
        kind: &kind,
        attempt: earlier.map_or(1, |r| r.job.attempt + 1),
        args: vec![
            "query-job".into(),
            "--work".into(),
            wd.root.display().to_string(),
            "--devices".into(),
            devices.to_string(),
        ],
    };
    let job = job_record::submit(one, scheduler, &record)?;
    say(format!(
        "submitted query job {} ({}) to {} queue {} on {devices}: {} terms in {} parts of {}; log: {}",
        job.name,
        job.scheduler_id,
        config.backend,
        job.queue,
        wd.work.terms,
        wd.work.parts(),
        wd.work.part_terms,
        job.log.display()
    ));
    Ok(job)
}

/// A setup that would make the job fail at once: refused before it is queued.
fn check_setup(devices: &str, model_dir: &Path, binary: Option<&str>) -> Result<()> {
    let mut problems = Vec::new();
    match embedfleet_embed::parse_devices(devices) {
        Err(e) => problems.push(format!("--devices: {e}")),
        Ok(list) => {
            let gpus = list.iter().any(|d| matches!(d, DeviceSpec::Cuda(_)));
            preflight::check_binary(binary, gpus, devices, &mut problems);
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
        Err(Refused { problems }.into())
    }
}

fn absolute(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).map_err(io("find the absolute path of", path))
}
