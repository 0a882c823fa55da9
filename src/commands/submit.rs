//! `submit`, `pause`, `resume`, `queues`, `status`: the scheduler-facing commands.

use super::preflight;
use crate::cli::{
    BackendArg, EmbedJobSettings, ModelArgs, QueuesArgs, QueuesCommand, RunDirArgs, StatusArgs,
    SubmitArgs,
};
use anyhow::{bail, Context, Result};
use embedfleet_core::exit;
use embedfleet_core::rundb::RunDb;
use embedfleet_core::state::JobStatus;
use embedfleet_core::RunLayout;
use embedfleet_orchestrator::config::RunConfig;
use embedfleet_orchestrator::scheduler::Backend;
use embedfleet_orchestrator::status;
use embedfleet_orchestrator::submit::{self, SubmitOptions, SubmitReport};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::Duration;

pub fn submit(args: &SubmitArgs) -> Result<i32> {
    let mut config = match &args.config {
        Some(path) => RunConfig::load(path)?,
        None => RunConfig::default(),
    };
    if let Some(backend) = args.backend {
        config.scheduler.backend = match backend {
            BackendArg::Local => Backend::Local,
            BackendArg::Slurm => Backend::Slurm,
            BackendArg::Pbs => Backend::Pbs,
        };
    }
    let backend = config.scheduler.backend;
    let local = backend == Backend::Local;
    let devices = args.devices.clone().unwrap_or_else(|| {
        if local {
            "cpu".to_string()
        } else {
            // A node's GPUs: as many as the script asks for, else the four of the product's nodes.
            let gpus = config.scheduler.script.gpus_per_node.unwrap_or(4).max(1);
            let list: Vec<String> = (0..gpus).map(|g| g.to_string()).collect();
            format!("cuda:{}", list.join(","))
        }
    });
    let job = EmbedJobSettings {
        devices,
        model: ModelArgs {
            // Absolute: jobs start in the run directory.
            model_dir: std::path::absolute(&args.model.model_dir)?,
            ..args.model.clone()
        },
        shard_papers: args.shard_papers,
        memory_limit: None,
        build_shard: args.build_shard,
    };
    let setup = preflight::JobSetup {
        binary: config.scheduler.script.embedfleet.as_deref(),
        devices: &job.devices,
        model_dir: &job.model.model_dir,
        output: embedfleet_embed::job::output_settings(
            &job.model.model_dir,
            job.model.dim,
            super::embed::vector_dtype(job.model.vector_dtype),
            job.model.max_tokens,
            job.shard_papers,
        ),
    };
    preflight::check_submit(&RunDb::open(&args.run_dir)?, &setup)?;
    let mut queues =
        (!args.queues.is_empty()).then(|| args.queues.iter().cloned().collect::<BTreeMap<_, _>>());
    if queues.is_none() && local && RunDb::open(&args.run_dir)?.queue_caps()?.is_empty() {
        eprintln!("no queues given: using one local queue `local` of 2 jobs at once");
        queues = Some(BTreeMap::from([("local".to_string(), 2)]));
    }
    let secs = |v: Option<f64>, local_default: f64, default: f64| {
        Duration::from_secs_f64(v.unwrap_or(if local { local_default } else { default }))
    };
    let options = SubmitOptions {
        run_dir: args.run_dir.clone(),
        scheduler: config.scheduler,
        queues,
        max_attempts: args.max_attempts.max(1),
        poll_interval: secs(args.poll_interval, 1.0, 30.0),
        lost_after: secs(args.lost_after, 10.0, 300.0),
        watch: args.watch,
        embed_args: job.to_args(),
        exe: std::env::current_exe().context("failed to find the embedfleet binary")?,
        progress: std::io::stderr().is_terminal(),
        trial: args.trial.clone(),
        breaker_after: args.breaker_after,
        notify: config.notify,
    };
    if args.dry_run {
        let scripts = submit::dry_run(&options)?;
        if scripts.is_empty() {
            eprintln!("nothing to submit: every batch is done or has a job, or no queue has room");
        }
        for (name, script) in scripts {
            println!("# ---- job {name} ----\n{script}");
        }
        return Ok(exit::SUCCESS);
    }
    let report = submit::submit(&options)?;
    if args.trial.is_some() {
        return trial_summary(&options, &report);
    }
    summarise(&options, &report)
}

/// How the trial job went, and the walltime its batch time suggests.
fn trial_summary(options: &SubmitOptions, report: &SubmitReport) -> Result<i32> {
    if let Some((batch, why)) = report.failed.first() {
        eprintln!("trial: batch {batch} failed: {why}");
        return Ok(exit::PARTIAL);
    }
    let runs = RunDb::open(&options.run_dir)?.latest_batch_runs()?;
    let Some(run) = runs
        .iter()
        .max_by(|a, b| a.finished_unix_s.total_cmp(&b.finished_unix_s))
    else {
        eprintln!("trial: no batch was left to run (every batch is done or has a job)");
        return Ok(exit::SUCCESS);
    };
    let t = &run.timings;
    // Half as much again for slower nodes and longer batches, and a minute to start.
    let secs = (t.total_s * 1.5 + 60.0).ceil() as u64;
    let walltime = format!("{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60);
    println!(
        "trial: batch {} took {:.1} s on {} ({} papers, {:.1} papers/s; model load {:.1} s, inference {:.1} s); \
         per batch of a job, set `walltime = \"{walltime}\"` or more in the run config",
        run.batch_id,
        t.total_s,
        run.devices,
        t.papers,
        t.papers as f64 / t.total_s.max(1e-9),
        t.model_load_s,
        t.inference_s
    );
    Ok(exit::SUCCESS)
}

/// Prints how the loop ended and the run's status; the exit code says whether every batch
/// was embedded.
pub fn summarise(options: &SubmitOptions, report: &SubmitReport) -> Result<i32> {
    let status = RunDb::open(&options.run_dir)?.status()?;
    print!("{}", status::render(&status));
    eprintln!(
        "submitted {} jobs ({} retries, {} adopted) in {}; {} batches finished now",
        report.submitted,
        report.retried,
        report.adopted,
        status::duration(report.elapsed.as_secs_f64()),
        report.batches_done
    );
    if !report.failed.is_empty() {
        let ids: Vec<String> = report.failed.iter().map(|(b, _)| b.to_string()).collect();
        eprintln!(
            "{} batches failed ({}); their logs are in {}; `embedfleet submit` again retries them",
            ids.len(),
            ids.join(", "),
            RunLayout::new(&options.run_dir).log_dir().display()
        );
    }
    Ok(if report.failed.is_empty() {
        exit::SUCCESS
    } else {
        exit::PARTIAL
    })
}

pub fn pause(args: &RunDirArgs, paused: bool) -> Result<i32> {
    let db = RunDb::open(&args.run_dir)?;
    let breaker = db.pause_reason()?.filter(|r| r.by == "breaker");
    db.set_paused(paused)?;
    if paused {
        eprintln!("paused: the submit loop submits nothing new (running jobs go on); `embedfleet resume` undoes it");
    } else if let Some(reason) = breaker {
        eprintln!(
            "resumed after the breaker's pause ({}): the submit loop tries the batches that \
             failed again and submits at its next poll",
            reason.signature
        );
    } else {
        eprintln!("resumed: the submit loop submits again at its next poll");
    }
    Ok(exit::SUCCESS)
}

pub fn queues(args: &QueuesArgs) -> Result<i32> {
    let run_dir = match (&args.command, &args.run_dir) {
        (Some(QueuesCommand::Show(a)), _) => a.run_dir.clone(),
        (Some(QueuesCommand::Set { run_dir, caps }), _) => {
            let mut db = RunDb::open(run_dir)?;
            db.set_queue_caps(&caps.iter().cloned().collect(), false)?;
            run_dir.clone()
        }
        (Some(QueuesCommand::Remove { run_dir, names }), _) => {
            let db = RunDb::open(run_dir)?;
            let known = db.queue_caps()?;
            if let Some(unknown) = names.iter().find(|n| !known.contains_key(*n)) {
                bail!(
                    "the run has no queue `{unknown}` (it has: {})",
                    known.keys().cloned().collect::<Vec<_>>().join(", ")
                );
            }
            db.remove_queues(names)?;
            run_dir.clone()
        }
        (None, Some(dir)) => dir.clone(),
        (None, None) => bail!("give the run directory: `embedfleet queues --run-dir DIR`"),
    };
    let status = RunDb::open(&run_dir)?.status()?;
    if status.queue_caps.is_empty() {
        println!("no queues (set them with `embedfleet queues set --run-dir DIR NAME=CAP`)");
    }
    for (queue, cap) in &status.queue_caps {
        let jobs = status.jobs_by_queue.get(queue);
        let active: u64 = jobs
            .map(|s| {
                s.iter()
                    .filter(|(k, _)| JobStatus::parse(k).is_some_and(JobStatus::is_open))
                    .map(|(_, v)| v)
                    .sum()
            })
            .unwrap_or(0);
        println!("{queue:<16} cap {cap:<4} active {active}");
    }
    if status.paused {
        println!("(paused)");
    }
    Ok(exit::SUCCESS)
}

pub fn status(args: &StatusArgs) -> Result<i32> {
    let status = RunDb::open(&args.run_dir)?.status()?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&status).context("failed to serialise the status")?
        );
    } else {
        print!("{}", embedfleet_orchestrator::status::render(&status));
    }
    Ok(exit::SUCCESS)
}
