//! `submit`, `pause`, `resume`, `queues`, `status`: the scheduler-facing commands.

use crate::flags::{QueuesFlags, RunDirFlags, StatusFlags, TakeOverFlags};
use crate::settings::SubmitFlags;
use crate::submit as pipeline_submit;
use anyhow::{bail, Context, Result};
use embedfleet_core::exit;
use embedfleet_core::handoff::OutputSettings;
use embedfleet_core::owner;
use embedfleet_core::rundb::{RunDb, RunStatus};
use embedfleet_core::state::JobStatus;
use embedfleet_core::RunLayout;
use embedfleet_orchestrator::status;
use embedfleet_orchestrator::stored_config::{self, ChosenConfig, Origin};
use embedfleet_orchestrator::submit::{self, SubmitOptions, SubmitReport, Submitted};
use std::io::IsTerminal;
use std::time::Duration;

pub fn submit(
    args: &SubmitFlags,
    slot: &mut super::invoke::RunDbSlot,
) -> Result<super::invoke::Ended> {
    // A dry run writes nothing: run.db opened read-only (no ingest, no migration, no -wal or
    // -shm file), the output settings compared and not pinned, the run config not stored.
    let db = if args.dry_run {
        RunDb::open_read_only(&args.run_dir)?
    } else {
        slot.take(&args.run_dir)?
    };
    let exe = crate::current_exe()?;
    let mut prepared = pipeline_submit::prepare(&db, args, exe, std::io::stderr().is_terminal())?;
    let settings = &prepared.settings;
    if !args.dry_run {
        eprintln!("{}", settings.config.describe());
    }
    for note in &prepared.notes {
        eprintln!("{note}");
    }
    if !settings.kept.is_empty() && !args.dry_run {
        eprintln!("using the run's loop options: {}", settings.kept.join(" "));
    }
    let options = &prepared.options;
    if args.dry_run {
        return dry_run(db, settings, options).map(Into::into);
    }
    let follow_up = prepared
        .builds
        .as_mut()
        .map(|b| b as &mut dyn submit::FollowUp);
    let (submitted, db) = submit::submit(db, options, follow_up, false)?;
    let Submitted::Ran(report) = submitted else {
        unreachable!("a submit that is not a dry run runs the loop")
    };
    let code = if args.session.trial.is_some() {
        trial_summary(&db, &report)?
    } else {
        summarise_status(&db.status()?, options, &report, false)
    };
    slot.keep(db);
    // Every batch was done already: not a step of the dataset card's "How it was made".
    let nothing = report.submitted == 0 && report.adopted == 0 && report.batches_done == 0;
    Ok(if nothing && args.session.trial.is_none() {
        super::invoke::Ended::nothing_written(code)
    } else {
        code.into()
    })
}

/// `submit --dry-run`: what the first submit would pin, and each job script it would send.
fn dry_run(
    db: RunDb,
    settings: &crate::settings::SubmitSettings,
    options: &submit::SubmitOptions,
) -> Result<i32> {
    print_would_pin(&db, &settings.config, &settings.job.output_settings())?;
    let unread = crate::preflight::manifests_not_taken_in(&db)?;
    if !unread.is_empty() {
        println!(
            "# batches {} have result manifests that run.db has not taken in (a dry run \
             reads nothing in): a real submit takes them in first, and may send none of \
             the jobs below for them",
            unread
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let Submitted::WouldSend(scripts) = submit::submit(db, options, None, true)?.0 else {
        unreachable!("a dry run renders scripts")
    };
    if scripts.is_empty() {
        eprintln!("nothing to submit: every batch is done or has a job, or no queue has room");
    }
    for (name, script) in scripts {
        println!("# ---- job {name} ----\n{script}");
    }
    Ok(exit::SUCCESS)
}

/// What a real submit would fix for the run, as `--dry-run` shows it: the run config it would
/// store (or the stored one it uses) and the output settings the first job would pin.
fn print_would_pin(db: &RunDb, chosen: &ChosenConfig, output: &OutputSettings) -> Result<()> {
    let head = match &chosen.origin {
        Origin::First => {
            "the run config this submit would store in run.db (the run's first submit)"
        }
        Origin::Stored => "the run's stored run config, which this submit would use",
        Origin::Replacing(_) => "the run config --replace-config would store in run.db",
    };
    println!("# ---- {head} ----");
    if let Origin::Replacing(differences) = &chosen.origin {
        for d in differences {
            println!("# replaces {d}");
        }
    }
    print!("{}", stored_config::to_toml(&chosen.config));
    let pinned = OutputSettings::read(&db.layout())?;
    let head = match pinned {
        None => "output settings the first job would pin (output-settings.json)",
        Some(_) => "output settings (output-settings.json has them already)",
    };
    println!(
        "# ---- {head} ----\n{}",
        serde_json::to_string_pretty(output).context("failed to serialise the output settings")?
    );
    Ok(())
}

/// How the trial job went, and the walltime its batch time suggests.
fn trial_summary(db: &RunDb, report: &SubmitReport) -> Result<i32> {
    if let Some((batch, why)) = report.failed.first() {
        eprintln!("trial: batch {batch} failed: {why}");
        return Ok(exit::PARTIAL);
    }
    let runs = db.latest_batch_runs()?;
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
/// was embedded. `run` passes `jobs_behind_verbose`: its user asked for results, not for the
/// loop's job counts and the owner's costs, which `-v` shows.
pub fn summarise_status(
    status: &RunStatus,
    options: &SubmitOptions,
    report: &SubmitReport,
    jobs_behind_verbose: bool,
) -> i32 {
    print!("{}", status::render(status));
    let mut lines = vec![format!(
        "submitted {} jobs ({} retries, {} adopted) in {}; {} batches finished now",
        report.submitted,
        report.retried,
        report.adopted,
        status::duration(report.elapsed.as_secs_f64()),
        report.batches_done
    )];
    if report.rounds > 0 {
        lines.push(format!(
            "owner: {} polls, {:.1} ms CPU and {:.1} result-file operations per poll",
            report.rounds,
            report.owner_cpu.as_secs_f64() * 1e3 / report.rounds as f64,
            report.result_file_ops as f64 / report.rounds as f64
        ));
    }
    for line in lines {
        if jobs_behind_verbose {
            tracing::info!("{line}");
        } else {
            eprintln!("{line}");
        }
    }
    if report.twins + report.moves + report.requeued > 0 {
        eprintln!(
            "routing ({}): {} speculative twins ({:.2} node-hours run by the slower ones), {} queued jobs moved, {} jobs requeued by the scheduler",
            report.route, report.twins, report.twin_node_hours, report.moves, report.requeued
        );
    }
    if !report.set_aside.is_empty() {
        eprintln!(
            "the breaker set aside {} (their jobs failed alike while the other queues' did not; \
             `embedfleet status` says why); `embedfleet resume` sends jobs there again",
            report.set_aside.join(", ")
        );
    }
    if !report.failed.is_empty() {
        let ids: Vec<String> = report.failed.iter().map(|(b, _)| b.to_string()).collect();
        eprintln!(
            "{} batches failed ({}); their logs are in {}; `embedfleet submit` again retries them",
            ids.len(),
            ids.join(", "),
            RunLayout::new(&options.run_dir).log_dir().display()
        );
    }
    if report.failed.is_empty() {
        exit::SUCCESS
    } else {
        exit::PARTIAL
    }
}

pub fn pause(args: &RunDirFlags, paused: bool) -> Result<i32> {
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

pub fn queues(args: &QueuesFlags) -> Result<i32> {
    let db = match args {
        QueuesFlags::Show { run_dir: Some(dir) } => RunDb::open(dir)?,
        QueuesFlags::Set { run_dir, caps } => {
            let mut db = RunDb::open(run_dir)?;
            db.set_queue_caps(&caps.iter().cloned().collect(), false)?;
            db
        }
        QueuesFlags::Remove { run_dir, names } => {
            let db = RunDb::open(run_dir)?;
            let known = db.queue_caps()?;
            if let Some(unknown) = names.iter().find(|n| !known.contains_key(*n)) {
                bail!(
                    "the run has no queue `{unknown}` (it has: {})",
                    known.keys().cloned().collect::<Vec<_>>().join(", ")
                );
            }
            db.remove_queues(names)?;
            db
        }
        QueuesFlags::Show { run_dir: None } => {
            bail!("give the run directory: `embedfleet queues --run-dir DIR`")
        }
    };
    let status = db.status()?;
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

pub fn status(args: &StatusFlags) -> Result<i32> {
    let this = owner::Host::this();
    if let Some(record) = owner::read_owner(&args.run_dir)? {
        if record.host.hostname != this.hostname {
            return status_from_snapshot(args, &record);
        }
    }
    let status = RunDb::open(&args.run_dir)?.status()?;
    // Each look on the owner refreshes what the other hosts see.
    let snapshot =
        match embedfleet_core::status_snapshot::write_snapshot(&args.run_dir, &status, None) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!("status snapshot not written: {e}");
                None
            }
        };
    let submit_loop = snapshot.as_ref().and_then(|s| s.submit_loop.as_ref());
    let routing = submit_loop.and_then(|l| l.routing.as_ref());
    if args.json {
        // The status, and the loop's routing beside it while a loop has run.
        #[derive(serde::Serialize)]
        struct WithRouting<'a> {
            #[serde(flatten)]
            status: &'a embedfleet_core::rundb::RunStatus,
            #[serde(skip_serializing_if = "Option::is_none")]
            routing: Option<&'a embedfleet_core::status_snapshot::RoutingState>,
            #[serde(skip_serializing_if = "Option::is_none")]
            set_aside: Option<&'a std::collections::BTreeMap<String, String>>,
        }
        let out = WithRouting {
            status: &status,
            routing,
            set_aside: submit_loop.map(|l| &l.set_aside).filter(|s| !s.is_empty()),
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&out).context("failed to serialise the status")?
        );
    } else {
        // The run's headline first; how the loop routes its jobs after it.
        print!("{}", status::render(&status));
        if let Some(state) = submit_loop {
            println!("{}", status::loop_line(state, &status, true));
        }
        if let Some(routing) = routing {
            print!("{}", status::routing_lines(routing));
        }
        if let Some(state) = submit_loop {
            print!("{}", status::set_aside_lines(state));
        }
    }
    Ok(exit::SUCCESS)
}

/// `status` on a host that does not own the run: the owner's last snapshot, never run.db.
fn status_from_snapshot(args: &StatusFlags, record: &owner::OwnerRecord) -> Result<i32> {
    let Some(snapshot) = embedfleet_core::status_snapshot::read_snapshot(&args.run_dir)? else {
        bail!(
            "{} belongs to host {}, which has written no status snapshot yet (an older embedfleet): \
             run `embedfleet status` there once",
            args.run_dir.display(),
            record.host.hostname
        );
    };
    if args.json {
        println!("{}", snapshot_json(&snapshot)?);
    } else {
        println!(
            "as of {} ago: the snapshot written by the run's owner, host {} (this host, {}, does not open run.db)",
            owner::describe_age(snapshot.age_s()),
            snapshot.host.hostname,
            owner::Host::this().hostname
        );
        print!("{}", status::render(&snapshot.status));
        if let Some(state) = &snapshot.submit_loop {
            println!("{}", status::loop_line(state, &snapshot.status, false));
            if let Some(routing) = &state.routing {
                print!("{}", status::routing_lines(routing));
            }
            print!("{}", status::set_aside_lines(state));
        }
    }
    Ok(exit::SUCCESS)
}

/// The owner's snapshot as `status --json` prints it: the status itself, and where it comes
/// from, so scripts can tell its age.
fn snapshot_json(snapshot: &embedfleet_core::status_snapshot::StatusSnapshot) -> Result<String> {
    #[derive(serde::Serialize)]
    struct FromSnapshot<'a> {
        snapshot: SnapshotOrigin<'a>,
        #[serde(flatten)]
        status: &'a embedfleet_core::rundb::RunStatus,
        #[serde(skip_serializing_if = "Option::is_none")]
        routing: Option<&'a embedfleet_core::status_snapshot::RoutingState>,
    }
    #[derive(serde::Serialize)]
    struct SnapshotOrigin<'a> {
        host: &'a str,
        written_unix_s: f64,
        age_s: f64,
        submit_loop: Option<&'a embedfleet_core::status_snapshot::LoopState>,
    }
    let out = FromSnapshot {
        snapshot: SnapshotOrigin {
            host: &snapshot.host.hostname,
            written_unix_s: snapshot.written_unix_s,
            age_s: snapshot.age_s().max(0.0),
            submit_loop: snapshot.submit_loop.as_ref(),
        },
        status: &snapshot.status,
        routing: snapshot
            .submit_loop
            .as_ref()
            .and_then(|l| l.routing.as_ref()),
    };
    serde_json::to_string_pretty(&out).context("failed to serialise the status")
}

/// `take-over`: moves the run to this host once its owner host is silent.
pub fn take_over(args: &TakeOverFlags) -> Result<i32> {
    if !RunLayout::new(&args.run_dir).db().is_file() {
        bail!(
            "{} is not a run directory (no run.db): nothing to take over",
            args.run_dir.display()
        );
    }
    let stale = Duration::from_secs_f64(args.stale_after);
    let grace = owner::heartbeat::write_grace();
    if stale < grace + owner::heartbeat::heartbeat_interval() {
        tracing::warn!(
            "--stale-after {:.0} s is shorter than an owner process may go on writing run.db \
             with its heartbeat failing ({:.0} s) and one beat more: if one is still running \
             there, both hosts may write run.db",
            args.stale_after,
            grace.as_secs_f64()
        );
    }
    let this = owner::Host::this().hostname;
    match owner::take_over(&args.run_dir, stale)? {
        owner::TakeOver::AlreadyOwner => {
            eprintln!(
                "{this} owns {} already: nothing to do",
                args.run_dir.display()
            );
        }
        owner::TakeOver::Moved {
            previous,
            heartbeat_age_s,
        } => {
            let silent = heartbeat_age_s
                .map(|a| format!("silent for {}", owner::describe_age(a)))
                .unwrap_or_else(|| {
                    format!(
                        "no heartbeat appeared in {}",
                        owner::describe_age(args.stale_after)
                    )
                });
            eprintln!(
                "{} now belongs to {this} (it was {}'s, {silent}). Start the submit loop here \
                 (`embedfleet submit --run-dir {}` with its model options): it adopts the jobs still queued",
                args.run_dir.display(),
                previous.hostname,
                args.run_dir.display()
            );
        }
    }
    Ok(exit::SUCCESS)
}
