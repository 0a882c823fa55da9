//! Following the jobs to their end: the result manifests they wrote are ingested, jobs whose
//! submission went unconfirmed are settled by name, the open ones polled, and a job that ended
//! (or was lost to the scheduler for `--lost-after`) has each of its batches marked done,
//! retried, or given up on. Stalled jobs are reported, and cancelled when asked.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Instant;

use embedfleet_core::rundb::{JobRow, RunStatus};
use embedfleet_core::state::{BatchState, JobStatus};
use embedfleet_core::BatchId;

use super::error::Result;
use super::submit_loop::SubmitLoop;
use crate::scheduler::{marker_state, JobHandle, JobState, QueuedJob, SchedulerJobId};

/// Exit codes of `embed-job` that mean "this will fail the same way again" (usage error,
/// refused: the run directory does not match), so they are not retried.
use crate::route::SETUP_EXIT_CODES as NOT_RETRIED_EXIT_CODES;

impl SubmitLoop<'_> {
    /// The owner's chores after a poll: the snapshot, and stalled jobs reported (and cancelled
    /// when asked).
    pub(super) fn watched(&mut self, status: &RunStatus, open: &[JobRow]) -> Result<()> {
        let mut routing = self.routing.state();
        routing.scheduler_limit = self.asked.job_limit.as_ref().map(|l| {
            let mut parts: Vec<String> = l.jobs.map(|j| format!("{j} jobs")).into_iter().collect();
            parts.extend(l.running.map(|r| format!("{r} running")));
            parts.extend(l.queues.iter().map(|(q, n)| format!("{n} in {q}")));
            format!("{} ({})", parts.join(", "), l.said)
        });
        let set_aside = self.set_aside().clone();
        let newly_stalled = match self.watch.as_mut() {
            Some(watch) => {
                watch.set_routing(routing);
                watch.set_set_aside(set_aside);
                watch.polled(&self.db, status)?;
                watch.newly_stalled(status)
            }
            None => return Ok(()),
        };
        for stalled in newly_stalled {
            let log = open
                .iter()
                .find(|j| j.name == stalled.job)
                .and_then(|j| j.log.clone())
                .unwrap_or_default();
            self.console.say(format!(
                "job {} (batch {} on {}) is stalled: nothing written for {} ({} shards of {} done; a shard takes ~{}). \
                 Look at its log {log}; `embedfleet submit --kill-stalled` cancels stalled jobs and retries their batches",
                stalled.job,
                stalled.batch,
                stalled.host,
                crate::status::duration(stalled.idle_s),
                stalled.shards_done,
                stalled.parts,
                stalled
                    .shard_time_s
                    .map(crate::status::duration)
                    .unwrap_or_else(|| "?".into()),
            ));
            self.notify(&crate::notify::Event::JobStalled {
                job: stalled.job.clone(),
                batch: Some(stalled.batch),
                host: Some(stalled.host.clone()),
                reason: format!(
                    "no shard for {} (allowed {}; {} of {} shards done)",
                    crate::status::duration(stalled.idle_s),
                    crate::status::duration(stalled.allowed_idle_s),
                    stalled.shards_done,
                    stalled.parts
                ),
            });
            if self.opts.session.kill_stalled {
                let stalled_job = open.iter().find(|j| j.name == stalled.job);
                if let Some((row, h)) = stalled_job.and_then(|row| Some((row, handle(row)?))) {
                    match self.scheduler.cancel(&h) {
                        Ok(()) => self.console.say(format!(
                            "cancelled stalled job {} (--kill-stalled); its batch is retried",
                            row.name
                        )),
                        Err(e) => self
                            .console
                            .say(format!("could not cancel stalled job {}: {e}", row.name)),
                    }
                }
            }
        }
        Ok(())
    }

    /// Takes in the result manifests jobs wrote since the last look — of every batch, or of
    /// `only` these — saying what became of each attempt.
    pub(super) fn ingest(&mut self, only: Option<&[i64]>) -> Result<()> {
        let cpu = embedfleet_core::process::own_cpu();
        let report = match only {
            None => self.db.ingest_results()?,
            Some(batches) => self.db.ingest_batches(batches)?,
        };
        self.counts.results_taken_in += report.accepted.len() as u64;
        if let Some(watch) = self.watch.as_mut() {
            let spent = embedfleet_core::process::own_cpu().saturating_sub(cpu);
            watch.took_in(spent, report.accepted.len());
        }
        for (batch, attempt) in &report.accepted {
            tracing::info!(batch, attempt, "result accepted");
        }
        for (batch, attempt, state, why) in &report.not_accepted {
            self.console
                .say(format!("batch {batch}: attempt {attempt} {state}: {why}"));
        }
        Ok(())
    }

    /// Jobs recorded as `submitting` whose submission this process did not see through (a crash,
    /// or a submit that timed out): adopted if the scheduler lists them, else forgotten so that
    /// their batches are submitted again.
    pub(super) fn settle_submitting(&mut self) -> Result<()> {
        let names: BTreeSet<String> = self
            .db
            .open_jobs()?
            .into_iter()
            .filter(|j| j.state == JobStatus::Submitting)
            .map(|j| j.name)
            .collect();
        if names.is_empty() {
            return Ok(());
        }
        let listed: Vec<QueuedJob> = match self.scheduler.list_jobs() {
            Ok(listed) => listed,
            Err(e) => {
                self.console.say(format!(
                    "cannot list the scheduler's jobs yet ({e}); will try again"
                ));
                return Ok(());
            }
        };
        let open = self.db.open_jobs()?;
        for name in names {
            let rows: Vec<&JobRow> = open.iter().filter(|j| j.name == name).collect();
            let finished = rows
                .first()
                .and_then(|r| r.marker.as_deref())
                .and_then(|m| marker_state(Path::new(m)));
            if let Some(state) = finished {
                // It ran and ended before anyone recorded its id: settle it as it ended.
                self.console
                    .say(format!("job {name} ran to its end unrecorded: {state}"));
                let status = state.status();
                self.ended(&name, &rows, &state, status)?;
            } else if let Some(found) = listed.iter().find(|j| j.name == name) {
                self.db.set_job_submitted(&name, found.id.as_str())?;
                self.console.say(format!(
                    "job {name} was queued as {} before a crash: adopted",
                    found.id
                ));
            } else {
                self.give_up_uncertain(&name)?;
            }
        }
        Ok(())
    }

    /// A job whose submission was uncertain and that the scheduler does not list: it never
    /// reached the queue, or it did and the listing missed it. Cancelled by name first, so no
    /// twin runs beside its batch's next job; then recorded as lost, not forgotten, so that its
    /// attempt number (and with it its name, script, log and exit marker) is never used again.
    /// If the cancel fails the job stays `submitting` and its batch waits for the next round.
    pub(super) fn give_up_uncertain(&mut self, name: &str) -> Result<()> {
        if let Err(e) = self.scheduler.cancel_named(name) {
            self.console.say(format!(
                "cannot cancel job {name} by name ({e}); its batch is submitted again once it is \
                 cancelled, next round"
            ));
            return Ok(());
        }
        self.db.set_job_state(
            name,
            JobStatus::Lost,
            Some(
                "its submission was uncertain and the scheduler did not list it; cancelled by name",
            ),
        )?;
        Ok(())
    }

    pub(super) fn poll(&mut self) -> Result<()> {
        let open = self.db.open_jobs()?;
        let jobs = by_name(&open);
        let handles: Vec<JobHandle> = jobs.values().filter_map(|rows| handle(rows[0])).collect();
        if handles.is_empty() {
            return Ok(());
        }
        let states = match self.scheduler.poll(&handles) {
            Ok(states) => states,
            Err(e) => {
                // A broken squeue is not a finished job: report it and ask again next round.
                self.console.say(format!(
                    "polling the scheduler failed ({e}); will try again"
                ));
                return Ok(());
            }
        };
        for (name, rows) in jobs {
            let Some(id) = rows[0].scheduler_id.as_deref() else {
                continue;
            };
            let state = states
                .get(&SchedulerJobId::new(id))
                .cloned()
                .unwrap_or(JobState::Unknown);
            self.observe(&name, &rows, state)?;
        }
        self.refresh_estimates()
    }

    pub(super) fn observe(&mut self, name: &str, rows: &[&JobRow], state: JobState) -> Result<()> {
        if state == JobState::Unknown {
            let since = *self
                .following
                .unknown_since
                .entry(name.to_string())
                .or_insert_with(Instant::now);
            if since.elapsed() < self.opts.policy.lost_after {
                return Ok(());
            }
            // Lost to our polls is not gone: a job the scheduler still runs (a slow
            // controller, a requeue) would race its replacement. Cancel it first.
            if let Some(job) = handle(rows[0]) {
                match self.scheduler.cancel(&job) {
                    Ok(()) => {
                        tracing::info!(job = %name, "cancelled the lost job before resubmitting")
                    }
                    Err(e) => tracing::info!(job = %name, "cancelling the lost job: {e}"),
                }
            }
            let lost = JobState::Failed {
                exit_code: None,
                reason: format!(
                    "lost: the scheduler has not known the job for {:?} and it left no completion marker",
                    self.opts.policy.lost_after
                ),
            };
            return self.ended(name, rows, &lost, JobStatus::Lost);
        }
        self.following.unknown_since.remove(name);
        if state.is_terminal() {
            return self.ended(name, rows, &state, state.status());
        }
        if rows[0].state != state.status() {
            self.route_saw(rows[0], state.status());
            self.db.set_job_state(name, state.status(), None)?;
        }
        Ok(())
    }

    /// A job ended: each of its batches is done (run.db says so), retried, or given up on.
    pub(super) fn ended(
        &mut self,
        name: &str,
        rows: &[&JobRow],
        state: &JobState,
        status: JobStatus,
    ) -> Result<()> {
        // A job this loop cancelled to move it, or as the slower twin, ended for that reason.
        let routed = self.cancelled_by_routing(rows);
        let reason = match (&routed, state) {
            (Some(why), _) => Some(why.clone()),
            (None, JobState::Completed) => None,
            (None, other) => Some(other.to_string()),
        };
        // The job wrote its result manifest before it ended: take its batches' in before
        // deciding (the other batches wait for the next round's ingest).
        let batches: Vec<i64> = rows.iter().map(|r| r.batch_id).collect();
        self.ingest(Some(&batches))?;
        let exit_code = match state {
            JobState::Failed { exit_code, .. } => *exit_code,
            _ => None,
        };
        let setup_error = exit_code.is_some_and(|c| NOT_RETRIED_EXIT_CODES.contains(&c));
        // Its node's device refused (5): retried, on another queue once the breaker sets this
        // one aside.
        let device_refused = exit_code == Some(embedfleet_core::exit::DEVICE_REFUSED);
        // No room on the run directory's filesystem (6, or any failure while it is full): the
        // environment's, not the batch's (`disk`).
        let no_room = !matches!(state, JobState::Completed)
            && routed.is_none()
            && (exit_code == Some(embedfleet_core::exit::DISK_FULL) || self.disk_full_now());
        if no_room {
            return self.ended_for_want_of_room(name, rows, reason.as_deref());
        }
        // A setup the job refused fails the same on every queue, and a device's refusal says
        // nothing of how fast the queue runs jobs: no loss of this queue's.
        self.route_saw_end(
            rows[0],
            if setup_error || device_refused {
                JobStatus::Cancelled
            } else {
                status
            },
        );
        self.db.set_job_state(name, status, reason.as_deref())?;
        self.cancel_twins_of(name, &batches)?;
        let retriable = !setup_error;
        self.counts.jobs_ended += 1;
        let mut all_done = true;
        for row in rows {
            let batch = row.batch_id;
            if self.db.batch_state(BatchId(batch))? == Some(BatchState::Done) {
                // A slower twin's batch was counted when its twin finished it.
                if routed.is_none() {
                    self.report.batches_done += 1;
                }
                continue;
            }
            all_done = false;
            let why = match &reason {
                Some(r) => r.clone(),
                None => "the job ended with exit code 0 but the batch is not done".to_string(),
            };
            let tries = self.following.attempts.get(&batch).copied().unwrap_or(0);
            if retriable && tries < self.opts.policy.max_attempts {
                self.report.retried += 1;
                self.console.say(format!(
                    "batch {batch}: job {name} {why}; submitting it again ({tries}/{} attempts used)",
                    self.opts.policy.max_attempts
                ));
            } else {
                let tail = row.log.as_deref().map(log_tail).unwrap_or_default();
                let why = format!("{why} after {tries} attempt(s); log: {tail}");
                self.console.say(format!("batch {batch} failed: {why}"));
                self.db
                    .set_batch_state(BatchId(batch), BatchState::Failed)?;
                self.batch_failed(batch, name, row.log.as_deref(), &why);
                self.report.failed.push((batch, why));
            }
        }
        self.judge(name, rows, state, status, all_done)
    }
}

impl SubmitLoop<'_> {
    /// A job that ended for want of room on the run directory's filesystem: its batches that
    /// are not done wait for room (`disk`), none of their attempts used, nothing said to the
    /// breakers or to routing (no queue's fault).
    fn ended_for_want_of_room(
        &mut self,
        name: &str,
        rows: &[&JobRow],
        reason: Option<&str>,
    ) -> Result<()> {
        let why = format!(
            "{}: no room on the run directory's filesystem (not counted as an attempt)",
            reason.unwrap_or("ended")
        );
        self.db.set_job_state(name, JobStatus::Failed, Some(&why))?;
        self.counts.jobs_ended += 1;
        for row in rows {
            let batch = row.batch_id;
            if self.db.batch_state(BatchId(batch))? == Some(BatchState::Done) {
                self.report.batches_done += 1;
                continue;
            }
            if let Some(tries) = self.following.attempts.get_mut(&batch) {
                *tries = tries.saturating_sub(1);
            }
            self.console.say(format!(
                "batch {batch}: job {name} {why}; its batch waits for room"
            ));
        }
        Ok(())
    }
}

/// Open job rows grouped by job name (a multi-node job has one row per batch).
pub(super) fn by_name(rows: &[JobRow]) -> BTreeMap<String, Vec<&JobRow>> {
    let mut jobs: BTreeMap<String, Vec<&JobRow>> = BTreeMap::new();
    for row in rows {
        jobs.entry(row.name.clone()).or_default().push(row);
    }
    jobs
}

pub(super) fn handle(row: &JobRow) -> Option<JobHandle> {
    let id = row.scheduler_id.as_deref()?;
    let mut h = JobHandle::new(SchedulerJobId::new(id)).with_name(&row.name);
    if let Some(marker) = &row.marker {
        h = h.with_marker(marker);
    }
    Some(h)
}

/// The last lines of a job log, on one line: read from its last 16 KiB only (a week-long job's
/// log can be large, and it sits on the shared filesystem).
pub(super) fn log_tail(path: &str) -> String {
    use std::io::{Read, Seek, SeekFrom};
    const TAIL_BYTES: u64 = 16 * 1024;
    let mut bytes = Vec::new();
    if let Ok(mut file) = std::fs::File::open(path) {
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = file.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES)));
        let _ = file.take(TAIL_BYTES).read_to_end(&mut bytes);
    }
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(3)..].join(" | ")
}
