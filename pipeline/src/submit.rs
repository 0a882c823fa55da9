//! The submit set-up: `submit`'s settings resolved, checked against this build and the run
//! (preflight), what the run keeps stored, and the loop's options made — everything before the
//! submit loop's first round. The binary prints, runs the loop and summarises.

use std::path::PathBuf;

use embedfleet_core::rundb::RunDb;
use embedfleet_orchestrator::stored_config;
use embedfleet_orchestrator::submit::SubmitOptions;

use crate::error::Result;
use crate::group_builds::GroupBuilds;
use crate::preflight::{self, JobSetup};
use crate::settings::submit::{DEVICES_SETTING, GROUP_BUILDS_SETTING, LOOP_SETTING};
use crate::settings::{SubmitFlags, SubmitSettings};

/// A submit ready to loop.
pub struct PreparedSubmit {
    pub settings: SubmitSettings,
    pub options: SubmitOptions,
    /// The follow-up work of `--group-builds` (never in a dry run or a trial).
    pub builds: Option<GroupBuilds>,
    /// What the set-up did that the user should hear of.
    pub notes: Vec<String>,
}

/// Resolves `flags` against the run, checks the set-up, and (unless a dry run) pins the run's
/// output settings and stores its run config and kept options. `exe` is the binary the jobs
/// run when the run config names none.
pub fn prepare(
    db: &RunDb,
    flags: &SubmitFlags,
    exe: PathBuf,
    progress: bool,
) -> Result<PreparedSubmit> {
    let settings = SubmitSettings::resolve(db, flags)?;
    let mut notes = settings.notes.clone();
    let write = !flags.dry_run;
    if flags.build_shard && write {
        // Shards built beside the GPUs hold one batch each: the run's keys are a key per
        // batch (unless a grouped load pinned them already; then the jobs leave the building
        // to it).
        let keys = crate::shard_keys::for_batch_builds(db)?;
        if keys.batches_per_group > 1 {
            notes.push(format!(
                "note: this run's shard keys hold {} batches each (snapshots/keys.json): the embed jobs build no shards; `upload --mode snapshot` builds each group's",
                keys.batches_per_group
            ));
        }
    }
    let config = &settings.config.config;
    notes.extend(check_setup(db, flags, &settings, &notes)?);
    // Kept for the run's later submits only once a job went out with them: a first submit
    // that fails before any (no queue given, a refused partition) leaves the run as it was.
    let keep_on_first_job = if write && !flags.preset {
        kept_settings(db, flags, &settings)?
    } else {
        Vec::new()
    };
    let options = SubmitOptions {
        run_dir: flags.run_dir.clone(),
        config: config.clone(),
        queues: settings.queues.clone(),
        policy: settings.policy.clone(),
        session: flags.session.clone(),
        embed_args: settings.job.to_args(),
        exe,
        progress,
        bytes_per_paper: crate::room::bytes_per_paper(&settings.job.output_settings()).unwrap_or(0),
        keep_on_first_job,
    };
    // A trial is one embed job whose end the user waits for: no group builds.
    let builds = match (
        &settings.group_builds,
        write && flags.session.trial.is_none(),
    ) {
        (Some(setting), true) => {
            let builds = GroupBuilds::new(
                db,
                &flags.run_dir,
                &config.scheduler,
                setting,
                flags.group_count,
                settings.policy.max_attempts,
                settings.policy.lost_after,
            )?;
            notes.push(format!(
                "group builds: each group of {} batches gets its shard built on {} ({} cores) once its batches are done",
                builds.keys().batches_per_group,
                if setting.queue == "local" {
                    "this host".to_string()
                } else {
                    format!("queue {}", setting.queue)
                },
                setting.cpus
            ));
            Some(builds)
        }
        _ => None,
    };
    Ok(PreparedSubmit {
        settings,
        options,
        builds,
        notes,
    })
}

/// The checks before anything is stored or sent, the dry run's included: the backend asked for
/// recorded (unless a dry run), the queues against the scheduler's, the jobs' binary, devices,
/// model and output settings (`preflight::check_submit`, which pins the output settings unless
/// a dry run). Returns what the user should hear of.
fn check_setup(
    db: &RunDb,
    flags: &SubmitFlags,
    settings: &SubmitSettings,
    notes: &[String],
) -> Result<Vec<String>> {
    let write = !flags.dry_run;
    let config = &settings.config.config;
    if write && !flags.preset {
        // Before anything can refuse this submit: a restart given no config must not take the
        // run for a local one (nothing else is stored until a job goes out).
        stored_config::record_asked_backend(db, config.scheduler.backend)?;
    }
    // The queues the jobs would go to, against those the scheduler has: a misspelt one is
    // refused here, the dry run included, rather than left out of the run at its first job.
    let stored_caps = db.queue_caps()?;
    let queues: Vec<&String> = match (&flags.session.trial, &settings.queues) {
        (Some(trial), _) => vec![trial],
        (None, Some(caps)) => caps.keys().collect(),
        (None, None) => stored_caps.keys().collect(),
    };
    let unknown = config.scheduler.unknown_queues(queues);
    if !unknown.is_empty() {
        return Err(preflight::Refused { problems: unknown }.into());
    }
    let checked = preflight::check_submit(
        db,
        &JobSetup {
            binary: config.scheduler.script.embedfleet.as_deref(),
            devices: &settings.job.devices,
            model_dir: &settings.job.model_dir,
            output: settings.job.output_settings(),
            pin: write,
        },
    )
    .map_err(|mut refused| {
        // Where the devices came from is part of the fix (the backend's GPU default).
        let devices_note = notes.iter().find(|n| n.contains("gpus_per_node"));
        refused.problems.extend(devices_note.cloned());
        refused
    })?;
    let mut checked = checked;
    checked.extend(check_room(
        db,
        &flags.run_dir,
        &settings.job.output_settings(),
    )?);
    Ok(checked)
}

/// The room the rest of the run needs against what is free at the run directory, before any
/// job: a warning with the numbers where it falls short (the loop waits for room as it goes),
/// refused where the rest is larger than the whole filesystem.
fn check_room(
    db: &RunDb,
    run_dir: &std::path::Path,
    output: &embedfleet_core::handoff::OutputSettings,
) -> Result<Option<String>> {
    use embedfleet_core::space::Fit;
    let Some(per_paper) = crate::room::bytes_per_paper(output) else {
        return Ok(None);
    };
    let status = db.status()?;
    let Ok(room) = crate::room::room_of(run_dir, &status, db.largest_batch_papers()?, per_paper)
    else {
        return Ok(None);
    };
    let Some(advice) = room.advice() else {
        return Ok(None);
    };
    let said = format!("disk: {}: {advice}", room.describe());
    if room.fit() == Fit::Never {
        return Err(preflight::Refused {
            problems: vec![said],
        }
        .into());
    }
    Ok(Some(match room.fit() {
        Fit::Full => format!("warning: {said}; the jobs wait until there is room"),
        _ => format!("warning: {said}"),
    }))
}

/// What later submits of the run take when given nothing, as run.db settings for the loop to
/// store with its first job: the run config (the first submit's, or a replacement), the
/// devices, the loop options, the group builds.
fn kept_settings(
    db: &RunDb,
    flags: &SubmitFlags,
    settings: &SubmitSettings,
) -> Result<Vec<(String, serde_json::Value)>> {
    let mut kept = Vec::new();
    if settings.config.to_store() {
        stored_config::check_renders(&settings.config.config)?;
        kept.push((
            stored_config::RUN_CONFIG_SETTING.to_string(),
            json(&settings.config.config),
        ));
    }
    if let Some(devices) = &flags.devices {
        kept.push((DEVICES_SETTING.to_string(), json(devices)));
    }
    if flags.session.trial.is_none() && settings.loop_options_changed(db)? {
        kept.push((LOOP_SETTING.to_string(), json(&settings.loop_options)));
    }
    if flags.group_builds.is_some() {
        kept.push((
            GROUP_BUILDS_SETTING.to_string(),
            json(&settings.group_builds),
        ));
    }
    Ok(kept)
}

/// A kept setting as the JSON run.db stores.
fn json<T: serde::Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).expect("settings serialise. This is a bug.")
}
