//! `submit`, `pause`, `resume`, `queues`, `status`: the scheduler-facing commands.

use super::group_builds::{GroupBuilds, GroupBuildsSetting, GROUP_BUILDS_SETTING};
use super::preflight;
use crate::cli::{
    EmbedJobSettings, ModelArgs, QueuesArgs, QueuesCommand, RunDirArgs, StatusArgs, SubmitArgs,
    TakeOverArgs, VectorDtypeArg,
};
use anyhow::{bail, Context, Result};
use embedfleet_core::exit;
use embedfleet_core::handoff::OutputSettings;
use embedfleet_core::owner;
use embedfleet_core::rundb::{RunDb, StallRule};
use embedfleet_core::shardfile::VectorDtype;
use embedfleet_core::state::{BatchState, JobStatus};
use embedfleet_core::RunLayout;
use embedfleet_orchestrator::config::RunConfig;
use embedfleet_orchestrator::status;
use embedfleet_orchestrator::stored_config::{self, ChosenConfig, GivenConfig, Origin};
use embedfleet_orchestrator::submit::{self, SubmitOptions, SubmitReport};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::Duration;

/// The run.db setting that keeps the last `submit --devices` (see [`submit`]).
const DEVICES_SETTING: &str = "submit.devices";

/// The run.db setting that keeps the loop options a submit was given (see [`submit`]).
const LOOP_SETTINGS: &str = "submit.loop";

/// The submit loop's options as given to the run's submits: `None` where none gave one.
#[derive(Debug, Default, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct LoopSettings {
    max_attempts: Option<u32>,
    breaker_after: Option<u32>,
    poll_interval_s: Option<f64>,
    lost_after_s: Option<f64>,
}

pub fn submit(args: &SubmitArgs) -> Result<i32> {
    // A dry run writes nothing: run.db opened read-only (no ingest, no migration, no -wal or
    // -shm file), the output settings compared and not pinned, the run config not stored.
    let db = if args.dry_run {
        RunDb::open_read_only(&args.run_dir)?
    } else {
        RunDb::open(&args.run_dir)?
    };
    let given = GivenConfig {
        file: args.config.as_deref().map(RunConfig::load).transpose()?,
        backend: args.backend,
        replace: args.replace_config,
    };
    let chosen = stored_config::choose(&db, &given)?;
    if !args.dry_run {
        eprintln!("{}", chosen.describe());
    }
    let config = chosen.config.clone();
    // What the backend uses where neither the command line nor the run says.
    let defaults = config.scheduler.backend.kind().defaults(&config.scheduler);
    // The jobs' devices: as given, else as the run's last submit was given them (a restart
    // typed without --devices keeps `--devices cpu` or `cuda:0,1`), else the backend's default.
    let stored_devices: Option<String> = db.setting(DEVICES_SETTING)?;
    let devices = args
        .devices
        .clone()
        .or(stored_devices)
        .unwrap_or_else(|| defaults.devices.clone());
    // The output options: as given, else as the run's first submit fixed them, so that a
    // restart typed with none of them (after a crash, from notes) embeds as the run did.
    let pinned = OutputSettings::read(&db.layout())?;
    let model_dir = match (&args.model_dir, &pinned) {
        (Some(dir), _) => dir.clone(),
        (None, Some(p)) => p.model_dir.clone().into(),
        (None, None) => bail!(
            "give --model-dir: this run's first submit chooses its model (later ones use the run's)"
        ),
    };
    let job = EmbedJobSettings {
        devices,
        model: ModelArgs {
            // Absolute: jobs start in the run directory.
            model_dir: std::path::absolute(&model_dir)?,
            dim: args.dim.or(pinned.as_ref().and_then(|p| p.dim)),
            vector_dtype: args
                .vector_dtype
                .or(pinned.as_ref().map(|p| match p.vector_dtype {
                    VectorDtype::F32 => VectorDtypeArg::F32,
                    VectorDtype::F16 => VectorDtypeArg::F16,
                }))
                .unwrap_or(VectorDtypeArg::F32),
            max_tokens: args
                .max_tokens
                .or(pinned.as_ref().and_then(|p| p.max_tokens)),
        },
        shard_papers: args
            .shard_papers
            .or(pinned.as_ref().map(|p| p.shard_papers))
            .unwrap_or(embedfleet_embed::job::DEFAULT_SHARD_PAPERS),
        memory_limit: None,
        build_shard: args.build_shard,
    };
    if args.build_shard && !args.dry_run {
        // Shards built beside the GPUs hold one batch each: the run's keys are a key per batch
        // (unless a grouped load pinned them already; then the jobs leave the building to it).
        let keys = embedfleet_upload::shard_keys::ShardKeys::pin(
            &embedfleet_core::RunLayout::new(&args.run_dir),
            1,
        )?;
        if keys.batches_per_group > 1 {
            eprintln!(
                "note: this run's shard keys hold {} batches each (snapshots/keys.json): the embed jobs build no shards; `upload --mode snapshot` builds each group's",
                keys.batches_per_group
            );
        }
    }
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
        pin: !args.dry_run,
    };
    preflight::check_submit(&db, &setup)?;
    if !args.dry_run {
        if chosen.to_store() {
            stored_config::check_renders(&config)?;
            stored_config::store(&db, &config)?;
        }
        if let Some(devices) = &args.devices {
            db.set_setting(DEVICES_SETTING, devices)?;
        }
    }
    let mut queues =
        (!args.queues.is_empty()).then(|| args.queues.iter().cloned().collect::<BTreeMap<_, _>>());
    if let Some((caps, described)) = &defaults.queues {
        if queues.is_none() && db.queue_caps()?.is_empty() {
            eprintln!("no queues given: using {described}");
            queues = Some(caps.clone());
        }
    }
    // The loop's options: as given, else as the run's last submit was given them (a restart
    // typed with none keeps `--poll-interval 2 --max-attempts 5`), else the defaults.
    let stored: LoopSettings = db.setting(LOOP_SETTINGS)?.unwrap_or_default();
    let given = LoopSettings {
        max_attempts: args.max_attempts.or(stored.max_attempts),
        breaker_after: args.breaker_after.or(stored.breaker_after),
        poll_interval_s: args.poll_interval.or(stored.poll_interval_s),
        lost_after_s: args.lost_after.or(stored.lost_after_s),
    };
    if !args.dry_run && args.trial.is_none() && given != stored {
        db.set_setting(LOOP_SETTINGS, &given)?;
    }
    let kept: Vec<String> = [
        (
            args.poll_interval.is_none(),
            stored
                .poll_interval_s
                .map(|s| format!("--poll-interval {s}")),
        ),
        (
            args.max_attempts.is_none(),
            stored.max_attempts.map(|n| format!("--max-attempts {n}")),
        ),
        (
            args.lost_after.is_none(),
            stored.lost_after_s.map(|s| format!("--lost-after {s}")),
        ),
        (
            args.breaker_after.is_none(),
            stored.breaker_after.map(|k| format!("--breaker-after {k}")),
        ),
    ]
    .into_iter()
    .filter_map(|(not_given, value)| value.filter(|_| not_given))
    .collect();
    if !kept.is_empty() && !args.dry_run {
        eprintln!("using the run's loop options: {}", kept.join(" "));
    }
    let secs =
        |given: Option<f64>, default: Duration| given.map_or(default, Duration::from_secs_f64);
    let options = SubmitOptions {
        run_dir: args.run_dir.clone(),
        scheduler: config.scheduler.clone(),
        queues,
        max_attempts: given.max_attempts.unwrap_or(3).max(1),
        poll_interval: secs(given.poll_interval_s, defaults.poll_interval),
        lost_after: secs(given.lost_after_s, defaults.lost_after),
        watch: args.watch,
        embed_args: job.to_args(),
        exe: std::env::current_exe().context("failed to find the embedfleet binary")?,
        progress: std::io::stderr().is_terminal(),
        trial: args.trial.clone(),
        stall: StallRule {
            shard_times: args.stalled_after_shards,
            min_idle_s: args.stalled_min,
        },
        kill_stalled: args.kill_stalled,
        breaker_after: given
            .breaker_after
            .unwrap_or(embedfleet_orchestrator::submit::breaker::DEFAULT_BREAKER_AFTER),
        notify: config.notify,
    };
    if args.dry_run {
        print_would_pin(&db, &chosen, &setup.output)?;
        let unread = manifests_not_taken_in(&db)?;
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
        drop(db);
        let scripts = submit::dry_run(&options)?;
        if scripts.is_empty() {
            eprintln!("nothing to submit: every batch is done or has a job, or no queue has room");
        }
        for (name, script) in scripts {
            println!("# ---- job {name} ----\n{script}");
        }
        return Ok(exit::SUCCESS);
    }
    // A trial is one embed job whose end the user waits for: no group builds.
    let group_builds = group_builds_setting(&db, args)?.filter(|_| args.trial.is_none());
    let mut builds = match &group_builds {
        Some(setting) => Some(GroupBuilds::new(
            &db,
            &args.run_dir,
            &config.scheduler,
            setting,
            args.group_count,
            options.max_attempts,
            options.lost_after,
        )?),
        None => None,
    };
    if let (Some(setting), Some(builds)) = (&group_builds, &builds) {
        eprintln!(
            "group builds: each group of {} batches gets its shard built on {} ({} cores) once its batches are done",
            builds.keys().batches_per_group,
            if setting.queue == "local" {
                "this host".to_string()
            } else {
                format!("queue {}", setting.queue)
            },
            setting.cpus
        );
    }
    drop(db);
    let report = match builds.as_mut() {
        Some(builds) => submit::submit_with(&options, builds)?,
        None => submit::submit(&options)?,
    };
    if args.trial.is_some() {
        return trial_summary(&options, &report);
    }
    summarise(&options, &report)
}

/// `--group-builds` as given (stored for the run's later submits; `off` forgets it), else as
/// the run's last submit was given it.
fn group_builds_setting(db: &RunDb, args: &SubmitArgs) -> Result<Option<GroupBuildsSetting>> {
    let stored: Option<GroupBuildsSetting> = db
        .setting::<Option<GroupBuildsSetting>>(GROUP_BUILDS_SETTING)?
        .flatten();
    let setting = match args.group_builds.as_deref() {
        None => stored,
        Some("off") => None,
        Some(queue) => Some(GroupBuildsSetting {
            queue: queue.to_string(),
            cpus: args.build_cpus,
        }),
    };
    if args.group_builds.is_some() {
        db.set_setting(GROUP_BUILDS_SETTING, &setting)?;
    }
    Ok(setting)
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

/// Batches not done in run.db that have result manifests in `results/`.
fn manifests_not_taken_in(db: &RunDb) -> Result<Vec<i64>> {
    let mut out = Vec::new();
    let mut ids = Vec::new();
    for state in [BatchState::Planned, BatchState::Running, BatchState::Failed] {
        ids.extend(db.batch_ids(state)?);
    }
    ids.sort_unstable();
    for id in ids {
        let dir = db.layout().batch_results_dir(id);
        let has_manifest = std::fs::read_dir(&dir).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| e.path().extension().is_some_and(|x| x == "json"))
        });
        if has_manifest {
            out.push(id);
        }
    }
    Ok(out)
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
    if report.rounds > 0 {
        eprintln!(
            "owner: {} polls, {:.1} ms CPU and {:.1} result-file operations per poll",
            report.rounds,
            report.owner_cpu.as_secs_f64() * 1e3 / report.rounds as f64,
            report.result_file_ops as f64 / report.rounds as f64
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
    let this = owner::Host::this();
    if let Some(record) = owner::read_owner(&args.run_dir)? {
        if record.host.hostname != this.hostname {
            return status_from_snapshot(args, &record);
        }
    }
    let status = RunDb::open(&args.run_dir)?.status()?;
    // Each look on the owner refreshes what the other hosts see.
    let snapshot = match owner::snapshot::write_snapshot(&args.run_dir, &status, None) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!("status snapshot not written: {e}");
            None
        }
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&status).context("failed to serialise the status")?
        );
    } else {
        if let Some(line) = snapshot
            .as_ref()
            .and_then(|s| s.submit_loop.as_ref())
            .map(status::loop_line)
        {
            println!("{line}");
        }
        print!("{}", status::render(&status));
    }
    Ok(exit::SUCCESS)
}

/// `status` on a host that does not own the run: the owner's last snapshot, never run.db.
fn status_from_snapshot(args: &StatusArgs, record: &owner::OwnerRecord) -> Result<i32> {
    let Some(snapshot) = owner::snapshot::read_snapshot(&args.run_dir)? else {
        bail!(
            "{} belongs to host {}, which has written no status snapshot yet (an older embedfleet): \
             run `embedfleet status` there once",
            args.run_dir.display(),
            record.host.hostname
        );
    };
    if args.json {
        // The status itself, and where it comes from, so scripts can tell its age.
        #[derive(serde::Serialize)]
        struct FromSnapshot<'a> {
            snapshot: SnapshotOrigin<'a>,
            #[serde(flatten)]
            status: &'a embedfleet_core::rundb::RunStatus,
        }
        #[derive(serde::Serialize)]
        struct SnapshotOrigin<'a> {
            host: &'a str,
            written_unix_s: f64,
            age_s: f64,
            submit_loop: Option<&'a owner::LoopState>,
        }
        let out = FromSnapshot {
            snapshot: SnapshotOrigin {
                host: &snapshot.host.hostname,
                written_unix_s: snapshot.written_unix_s,
                age_s: snapshot.age_s().max(0.0),
                submit_loop: snapshot.submit_loop.as_ref(),
            },
            status: &snapshot.status,
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&out).context("failed to serialise the status")?
        );
    } else {
        println!(
            "as of {} ago: the snapshot written by the run's owner, host {} (this host, {}, does not open run.db)",
            owner::describe_age(snapshot.age_s()),
            snapshot.host.hostname,
            owner::Host::this().hostname
        );
        if let Some(state) = &snapshot.submit_loop {
            println!("{}", status::loop_line(state));
        }
        print!("{}", status::render(&snapshot.status));
    }
    Ok(exit::SUCCESS)
}

/// `take-over`: moves the run to this host once its owner host is silent.
pub fn take_over(args: &TakeOverArgs) -> Result<i32> {
    if !RunLayout::new(&args.run_dir).db().is_file() {
        bail!(
            "{} is not a run directory (no run.db): nothing to take over",
            args.run_dir.display()
        );
    }
    let stale = Duration::from_secs_f64(args.stale_after);
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
                .unwrap_or_else(|| "no heartbeat ever recorded".into());
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
