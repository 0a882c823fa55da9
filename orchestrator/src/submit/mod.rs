/*!
The submit loop: keeps every queue filled up to its cap with embed jobs until every batch is
done or given up on.

Each round it (1) settles jobs left `submitting` by a crash between recording a job and hearing
back from the scheduler (looked up by name: adopted if queued, forgotten if not), (2) polls the
open jobs and records their states, retrying a batch whose job ended without finishing it,
(3) unless paused, submits pending batches to queues with room. Caps, the pause switch and the
jobs live in run.db, so `pause`, `resume` and `queues set` from another shell reach a running
loop within one poll, and a restarted loop adopts the jobs its predecessor left queued.

Whether a batch is done is decided by run.db (the embed job marks it), never by the job's exit
status alone: a job that ends with "partial" (some papers quarantined) finished its batch, and
a job reported "completed" whose batch is not done is retried.

Jobs in a row that fail alike pause the run ([`breaker`]); the events a user wants to hear of
(finished, paused, a batch failed for good) go to the run config's notify hook
([`crate::notify`]); both are wired in by `alerts`.
*/

mod alerts;
pub mod breaker;
mod console;
mod follow_up;
mod round;
mod watch;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use embedfleet_core::rundb::{JobRow, NewJob, RunDb, RunDbError, RunStatus, StallRule};
use embedfleet_core::state::{BatchState, JobStatus};
use embedfleet_core::{fsops, BatchId, RunLayout};

use crate::notify::{Notifier, NotifyConfig};
use crate::scheduler::{
    marker_state, render_job_script, Backend, JobHandle, JobScript, JobState, JobSubmission,
    QueuedJob, Scheduler, SchedulerConfig, SchedulerError, SchedulerJobId, ScriptJob,
    TemplateError,
};
pub use console::Console;
pub use follow_up::{FollowUp, FollowUpRound};
pub use round::{fill_queues, PlannedJob};
use watch::OwnerWatch;
pub use watch::LOOP_LOCK_FILE;

/// Exit codes of `embed-job` that mean "this will fail the same way again" (usage error,
/// refused: the run directory does not match), so they are not retried.
const NOT_RETRIED_EXIT_CODES: [i32; 2] = [2, 4];

/// What `embedfleet submit` was asked to do.
#[derive(Debug, Clone)]
pub struct SubmitOptions {
    pub run_dir: PathBuf,
    /// Backend, command settings, job script template.
    pub scheduler: SchedulerConfig,
    /// Queue caps to set before starting (replacing the stored ones); `None` keeps run.db's.
    pub queues: Option<BTreeMap<String, u32>>,
    /// Jobs per batch in this invocation before the batch is marked failed.
    pub max_attempts: u32,
    pub poll_interval: Duration,
    /// How long a job may be unknown to the scheduler (and have left no completion marker)
    /// before it counts as lost and its batch is retried.
    pub lost_after: Duration,
    /// Keep running after every batch is settled (new batches from a later `plan` are picked up).
    pub watch: bool,
    /// Arguments after `embed-job --run-dir DIR --batch N` in every job script.
    pub embed_args: Vec<String>,
    /// The embedfleet binary jobs run, when the run config does not name one.
    pub exe: PathBuf,
    /// Draw a progress bar (stderr is a terminal).
    pub progress: bool,
    /// A trial: one job of the first batch that needs one, on this queue (cap 1; the run's
    /// stored queues are left as they are), then the loop ends.
    pub trial: Option<String>,
    /// When a running job counts as stalled (shown, reported once).
    pub stall: StallRule,
    /// Cancel stalled jobs (their batches are retried like any cancelled job's).
    pub kill_stalled: bool,
    /// Jobs in a row failing alike that pause the run ([`breaker`]); 0: never.
    pub breaker_after: u32,
    /// The notify hook (`[notify]` of the run config).
    pub notify: NotifyConfig,
}

/// How a submit loop ended.
#[derive(Debug, Default, Clone)]
pub struct SubmitReport {
    pub submitted: u64,
    /// Jobs found queued or running from an earlier loop.
    pub adopted: u64,
    /// Jobs that ended without finishing their batch and were submitted again.
    pub retried: u64,
    pub batches_done: u64,
    /// (batch, why) for batches given up on.
    pub failed: Vec<(i64, String)>,
    pub elapsed: Duration,
    /// Rounds (poll + submit) run, and the time they took without the sleeps between them.
    pub rounds: u64,
    pub busy: Duration,
    /// Of `busy`: polling (with settling), submitting, redrawing the progress.
    pub busy_poll: Duration,
    pub busy_submit: Duration,
    pub busy_progress: Duration,
    /// This process's CPU time (user + system) over the loop: the owner's own cost, jobs and
    /// scheduler commands excluded.
    pub owner_cpu: Duration,
    /// Filesystem operations on the files jobs write (`embedfleet_core::fsops`) over the loop.
    pub result_file_ops: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error(transparent)]
    RunDb(#[from] RunDbError),
    #[error("{0} is not planned completely: run `embedfleet plan` on it first")]
    NotPlanned(PathBuf),
    #[error(
        "no queues to submit to: give them with `--queue NAME=CAP` (repeatable), or \
         `embedfleet queues set --run-dir DIR NAME=CAP`"
    )]
    NoQueues,
    #[error("every queue was refused by the scheduler ({0}); fix the queue names with `embedfleet queues set`")]
    AllQueuesRefused(String),
    #[error("the job script template does not work: {0}")]
    Template(#[from] TemplateError),
    #[error(transparent)]
    Scheduler(#[from] SchedulerError),
    #[error("failed to {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Owner(#[from] embedfleet_core::owner::OwnerError),
    #[error(
        "{} was taken over by another host (`embedfleet take-over`): this submit loop stops; the new owner's loop goes on",
        .0.display()
    )]
    NotOwner(PathBuf),
    #[error(
        "a submit loop (pid {pid}) is already running for {}: watch it with `embedfleet status`, or stop it first",
        run_dir.display()
    )]
    LoopRunning { run_dir: PathBuf, pid: String },
}

pub type Result<T> = std::result::Result<T, SubmitError>;

/// The longest a queue whose submissions fail is left out of the rounds before it is tried again.
const QUEUE_COOLING_MAX: Duration = Duration::from_secs(300);

/// Runs the submit loop until every batch is done or failed (or forever with `watch`).
pub fn submit(options: &SubmitOptions) -> Result<SubmitReport> {
    SubmitLoop::new(options)?.run()
}

/// [`submit`], driving `follow_up` once per round as well (see [`FollowUp`]): the loop ends
/// when every batch is settled and the follow-up work is not busy.
pub fn submit_with<'a>(
    options: &'a SubmitOptions,
    follow_up: &'a mut dyn FollowUp,
) -> Result<SubmitReport> {
    let mut lp = SubmitLoop::new(options)?;
    lp.follow_up = Some(follow_up);
    lp.run()
}

/// The job scripts the next round would submit, without submitting or recording anything:
/// (job name, script text).
pub fn dry_run(options: &SubmitOptions) -> Result<Vec<(String, String)>> {
    // The run config's `env` values may be secrets (tokens, keys): printed as ***.
    let mut masked = options.clone();
    for value in masked.scheduler.script.env.values_mut() {
        *value = "***".into();
    }
    let options = &masked;
    let lp = SubmitLoop::new_read_only(options)?;
    let caps = match &options.queues {
        Some(q) => q.clone(),
        None => lp.db.queue_caps()?,
    };
    if caps.is_empty() {
        return Err(SubmitError::NoQueues);
    }
    let open = lp.db.open_jobs()?;
    let pending = lp.db.batches_without_job()?;
    let planned = fill_queues(
        &caps,
        &active_per_queue(&open),
        &BTreeSet::new(),
        &pending,
        lp.nodes(),
    );
    planned
        .iter()
        .map(|job| {
            let attempt = lp.next_attempt(&job.batches)?;
            let (name, script) = lp.render(job, attempt)?;
            Ok((name, script))
        })
        .collect()
}

struct SubmitLoop<'a> {
    opts: &'a SubmitOptions,
    /// The run directory, absolute: job scripts run elsewhere (a compute node, another cwd).
    run_dir: PathBuf,
    db: RunDb,
    scheduler: Box<dyn Scheduler>,
    /// Part of every job name, from the run directory: tells this run's jobs from others'.
    tag: String,
    /// Jobs started for each batch by this invocation (adopted ones count).
    attempts: HashMap<i64, u32>,
    /// Jobs the scheduler did not know at the last poll, since when.
    unknown_since: HashMap<String, Instant>,
    /// Queues the scheduler refused this run (e.g. no such partition).
    refused: BTreeMap<String, String>,
    /// Queues whose last submission failed in a way worth waiting out (a drained partition, a
    /// slow controller): until when their jobs go to the other queues, and how many failed in
    /// a row (the wait doubles with each, from one poll interval up to five minutes).
    cooling: BTreeMap<String, (Instant, u32)>,
    /// The batch a trial runs (see [`SubmitOptions::trial`]).
    trial_batch: Option<i64>,
    /// Counts jobs in a row failing alike.
    breaker: breaker::Breaker,
    /// The run is paused by the breaker (this loop's or an earlier one's): a resume tries the
    /// batches that failed during the streak again.
    tripped: bool,
    notifier: Notifier,
    /// Jobs that ended in this loop, and their number at the last `finished` event: a loop that
    /// had nothing to do sends none.
    jobs_ended: u64,
    jobs_ended_at_finish: u64,
    console: Console,
    report: SubmitReport,
    /// The owner's side of the loop (snapshot, stalls, the loop lock); none in a dry run.
    watch: Option<OwnerWatch>,
    /// A later stage's work driven between rounds ([`submit_with`]).
    follow_up: Option<&'a mut dyn FollowUp>,
}

impl<'a> SubmitLoop<'a> {
    /// For a dry run: run.db opened read-only (no ingest, no file created or changed).
    fn new_read_only(opts: &'a SubmitOptions) -> Result<Self> {
        Self::with_db(opts, RunDb::open_read_only(&opts.run_dir)?)
    }

    fn with_db(opts: &'a SubmitOptions, db: RunDb) -> Result<Self> {
        if !db.is_planned()? {
            return Err(SubmitError::NotPlanned(opts.run_dir.clone()));
        }
        Ok(Self {
            opts,
            run_dir: absolute(&opts.run_dir),
            db,
            scheduler: opts.scheduler.build(),
            tag: run_tag(&opts.run_dir),
            attempts: HashMap::new(),
            unknown_since: HashMap::new(),
            refused: BTreeMap::new(),
            cooling: BTreeMap::new(),
            trial_batch: None,
            // A trial is one job whose end the user waits for: nothing to break.
            breaker: breaker::Breaker::new(if opts.trial.is_some() {
                0
            } else {
                opts.breaker_after
            }),
            tripped: false,
            notifier: Notifier::new(&opts.notify),
            jobs_ended: 0,
            jobs_ended_at_finish: 0,
            console: Console::new(false),
            report: SubmitReport::default(),
            watch: None,
            follow_up: None,
        })
    }

    fn new(opts: &'a SubmitOptions) -> Result<Self> {
        let mut lp = Self::with_db(opts, RunDb::open(&opts.run_dir)?)?;
        lp.console = Console::new(opts.progress);
        let rebooted = match lp.db.ownership() {
            embedfleet_core::owner::Ownership::Rebooted { previous } => {
                Some(previous.hostname.clone())
            }
            _ => None,
        };
        let watch = OwnerWatch::start(
            &lp.run_dir,
            opts.poll_interval.as_secs_f64(),
            rebooted.as_deref(),
        )?;
        if let Some(why) = &watch.restart {
            lp.console.say(format!("restart: {why}"));
            lp.notify(&crate::notify::Event::OwnerRestarted {
                host: embedfleet_core::owner::Host::this().hostname,
                reason: why.clone(),
            });
        }
        lp.watch = Some(watch);
        lp.db.set_stall_rule(&opts.stall)?;
        if opts.trial.is_some() {
            lp.trial_batch = lp.db.batches_without_job()?.first().copied();
        } else if let Some(queues) = &opts.queues {
            lp.db.set_queue_caps(queues, true)?;
        }
        if lp.caps()?.is_empty() {
            return Err(SubmitError::NoQueues);
        }
        let layout = RunLayout::new(&lp.run_dir);
        for path in [layout.job_dir(), layout.log_dir()] {
            std::fs::create_dir_all(&path).map_err(|source| SubmitError::Io {
                action: "create",
                path,
                source,
            })?;
        }
        if embedfleet_core::handoff::PlanManifest::is_stale(&lp.db) {
            // Planned by an older embedfleet (no plan.json, or one without the plan's id): the
            // jobs read plan.json, not run.db.
            embedfleet_core::handoff::PlanManifest::write_for(&lp.db).map_err(|e| {
                SubmitError::Io {
                    action: "write",
                    path: layout.plan_file(),
                    source: std::io::Error::other(e),
                }
            })?;
        }
        lp.tripped = lp.paused_by_breaker()?;
        let reset = lp.db.reset_failed_batches()?;
        if reset > 0 {
            lp.console.say(format!(
                "{reset} batches that failed before are tried again"
            ));
        }
        Ok(lp)
    }

    fn nodes(&self) -> usize {
        self.opts.scheduler.script.nodes.max(1) as usize
    }

    fn run(mut self) -> Result<SubmitReport> {
        let started = Instant::now();
        let (cpu_before, ops_before) = (embedfleet_core::process::own_cpu(), fsops::total());
        let adopted: BTreeSet<String> = self
            .db
            .open_jobs()?
            .into_iter()
            .filter(|j| j.state != JobStatus::Submitting)
            .map(|j| {
                *self.attempts.entry(j.batch_id).or_default() += 1;
                j.name
            })
            .collect();
        self.report.adopted = adopted.len() as u64;
        if !adopted.is_empty() {
            self.console.say(format!(
                "adopting {} jobs already submitted by an earlier `submit`",
                adopted.len()
            ));
        }
        loop {
            let round = Instant::now();
            self.ingest(None)?;
            self.settle_submitting()?;
            self.poll()?;
            let polled = Instant::now();
            let paused = self.db.paused()?;
            if self.tripped && !paused {
                self.resumed_after_trip()?;
            }
            if !paused {
                self.submit_round()?;
            }
            let follow_up_busy = match self.follow_up.as_mut() {
                Some(work) => {
                    let round = work.round(&self.db, paused);
                    for line in round.said {
                        self.console.say(line);
                    }
                    round.busy
                }
                None => false,
            };
            let submitted = Instant::now();
            let open = self.db.open_jobs()?;
            let pending = self.in_scope(self.db.batches_without_job()?);
            match self.db.status() {
                Ok(status) => {
                    self.console.update(&status, &open, paused);
                    self.watched(&status, &open)?;
                }
                // A failed read only skips this poll's redraw and snapshot.
                Err(e) => tracing::warn!("status not read this poll: {e}"),
            }
            let open: Vec<JobRow> = open
                .into_iter()
                .filter(|j| self.is_in_scope(j.batch_id))
                .collect();
            self.report.busy_poll += polled - round;
            self.report.busy_submit += submitted - polled;
            self.report.busy_progress += submitted.elapsed();
            self.report.rounds += 1;
            self.report.busy += round.elapsed();
            // Paused by the breaker, the loop waits for `resume` even with every batch
            // settled: the batches that failed during the streak are tried again then.
            if open.is_empty() && pending.is_empty() && !self.tripped && !follow_up_busy {
                self.settled()?;
                if !self.opts.watch {
                    break;
                }
            }
            if open.is_empty() && !pending.is_empty() && !paused && self.all_refused()? {
                return Err(SubmitError::AllQueuesRefused(self.refused_text()));
            }
            std::thread::sleep(self.opts.poll_interval);
        }
        self.console.finish();
        self.wait_for_notify();
        self.report.elapsed = started.elapsed();
        self.report.owner_cpu = embedfleet_core::process::own_cpu().saturating_sub(cpu_before);
        self.report.result_file_ops = fsops::total() - ops_before;
        Ok(self.report)
    }

    /// The owner's chores after a poll: the snapshot, and stalled jobs reported (and cancelled
    /// when asked).
    fn watched(&mut self, status: &RunStatus, open: &[JobRow]) -> Result<()> {
        let newly_stalled = match self.watch.as_mut() {
            Some(watch) => {
                watch.polled(status)?;
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
            if self.opts.kill_stalled {
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
    fn ingest(&mut self, only: Option<&[i64]>) -> Result<()> {
        let report = match only {
            None => self.db.ingest_results()?,
            Some(batches) => self.db.ingest_batches(batches)?,
        };
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
    fn settle_submitting(&mut self) -> Result<()> {
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
    fn give_up_uncertain(&mut self, name: &str) -> Result<()> {
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

    fn poll(&mut self) -> Result<()> {
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
        Ok(())
    }

    fn observe(&mut self, name: &str, rows: &[&JobRow], state: JobState) -> Result<()> {
        if state == JobState::Unknown {
            let since = *self
                .unknown_since
                .entry(name.to_string())
                .or_insert_with(Instant::now);
            if since.elapsed() < self.opts.lost_after {
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
                    self.opts.lost_after
                ),
            };
            return self.ended(name, rows, &lost, JobStatus::Lost);
        }
        self.unknown_since.remove(name);
        if state.is_terminal() {
            return self.ended(name, rows, &state, state.status());
        }
        if rows[0].state != state.status() {
            self.db.set_job_state(name, state.status(), None)?;
        }
        Ok(())
    }

    /// A job ended: each of its batches is done (run.db says so), retried, or given up on.
    fn ended(
        &mut self,
        name: &str,
        rows: &[&JobRow],
        state: &JobState,
        status: JobStatus,
    ) -> Result<()> {
        let reason = match state {
            JobState::Completed => None,
            other => Some(other.to_string()),
        };
        // The job wrote its result manifest before it ended: take its batches' in before
        // deciding (the other batches wait for the next round's ingest).
        let batches: Vec<i64> = rows.iter().map(|r| r.batch_id).collect();
        self.ingest(Some(&batches))?;
        self.db.set_job_state(name, status, reason.as_deref())?;
        let retriable = !matches!(state, JobState::Failed { exit_code: Some(c), .. } if NOT_RETRIED_EXIT_CODES.contains(c));
        self.jobs_ended += 1;
        let mut all_done = true;
        for row in rows {
            let batch = row.batch_id;
            if self.db.batch_state(BatchId(batch))? == Some(BatchState::Done) {
                self.report.batches_done += 1;
                continue;
            }
            all_done = false;
            let why = match &reason {
                Some(r) => r.clone(),
                None => "the job ended with exit code 0 but the batch is not done".to_string(),
            };
            let tries = self.attempts.get(&batch).copied().unwrap_or(0);
            if retriable && tries < self.opts.max_attempts {
                self.report.retried += 1;
                self.console.say(format!(
                    "batch {batch}: job {name} {why}; submitting it again ({tries}/{} attempts used)",
                    self.opts.max_attempts
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

    fn submit_round(&mut self) -> Result<()> {
        let caps = self.caps()?;
        let open = self.db.open_jobs()?;
        let pending = self.in_scope(self.db.batches_without_job()?);
        let now = Instant::now();
        // A queue that is refused, or cooling after a failed submission, gets no job this
        // round: its batches go to the queues that take them.
        let disabled: BTreeSet<String> = self
            .refused
            .keys()
            .chain(
                self.cooling
                    .iter()
                    .filter(|(_, (until, _))| *until > now)
                    .map(|(q, _)| q),
            )
            .cloned()
            .collect();
        let planned = fill_queues(
            &caps,
            &active_per_queue(&open),
            &disabled,
            &pending,
            self.nodes(),
        );
        let mut failed_now: BTreeSet<String> = BTreeSet::new();
        for job in planned {
            if self.refused.contains_key(&job.queue) || failed_now.contains(&job.queue) {
                continue;
            }
            if self.submit_job(&job)? {
                self.cooling.remove(&job.queue);
            } else {
                // This queue is not taking jobs now (a drained partition, say): the others
                // still are. Its batches wait for the next round, when they go elsewhere.
                failed_now.insert(job.queue.clone());
                let failures = self.cooling.get(&job.queue).map_or(0, |(_, n)| *n) + 1;
                let wait = self
                    .opts
                    .poll_interval
                    .saturating_mul(1 << (failures - 1).min(16))
                    .min(QUEUE_COOLING_MAX);
                self.cooling
                    .insert(job.queue.clone(), (Instant::now() + wait, failures));
                let when = if wait <= self.opts.poll_interval {
                    "at the next poll".to_string()
                } else {
                    format!("in {}", crate::status::duration(wait.as_secs_f64()))
                };
                self.console.say(format!(
                    "queue {}: not taking jobs now; tried again {when}, its batches go to the \
                     other queues meanwhile",
                    job.queue
                ));
            }
        }
        Ok(())
    }

    /// Submits one job; false if the scheduler failed in a way worth waiting out.
    fn submit_job(&mut self, job: &PlannedJob) -> Result<bool> {
        let attempt = self.next_attempt(&job.batches)?;
        let (name, text) = self.render(job, attempt)?;
        let layout = RunLayout::new(&self.run_dir);
        let script = layout.job_script(&name);
        let log = layout.job_log(&name);
        let marker = layout.job_marker(&name);
        write_private(&script, &text).map_err(|source| SubmitError::Io {
            action: "write job script",
            path: script.clone(),
            source,
        })?;
        let _ = std::fs::remove_file(&marker);
        let text = |p: &Path| p.display().to_string();
        self.db.insert_job(&NewJob {
            batches: &job.batches,
            attempt,
            backend: self.scheduler.backend().name(),
            queue: &job.queue,
            name: &name,
            script: &text(&script),
            log: &text(&log),
            marker: &text(&marker),
        })?;
        let submission = JobSubmission::new(&name, &job.queue, JobScript::Path(script))
            .workdir(&self.run_dir)
            .log(&log)
            .marker(&marker);
        match self.scheduler.submit(&submission) {
            Ok(id) => {
                self.db.set_job_submitted(&name, id.as_str())?;
                for b in &job.batches {
                    *self.attempts.entry(*b).or_default() += 1;
                }
                self.report.submitted += 1;
                tracing::info!(job = %name, id = %id, queue = %job.queue, "submitted");
                Ok(true)
            }
            Err(SchedulerError::SubmitUncertain { .. }) => {
                // Maybe queued: `settle_submitting` looks it up by name next round.
                self.console.say(format!(
                    "submitting {name} timed out; looking for it in the queue next round"
                ));
                Ok(false)
            }
            Err(SchedulerError::InvalidJob { reason, .. }) => {
                self.not_submitted(&name, &reason)?;
                self.console.say(format!(
                    "queue {}: the scheduler refused it ({reason}); no more jobs go there in this \
                     run (fix it with `embedfleet queues set`)",
                    job.queue
                ));
                self.refused.insert(job.queue.clone(), reason);
                Ok(true)
            }
            Err(e) if e.is_transient() => {
                self.not_submitted(&name, &e.to_string())?;
                self.console
                    .say(format!("submitting {name} failed ({e}); will try again"));
                Ok(false)
            }
            Err(e @ SchedulerError::UnexpectedOutput { .. }) => {
                // The scheduler took the submission but its answer made no sense: the job may
                // be queued. It stays `submitting`, for the next `submit` to look up by name.
                Err(e.into())
            }
            Err(e) => {
                self.not_submitted(&name, &e.to_string())?;
                Err(e.into())
            }
        }
    }

    /// The scheduler refused job `name`. Its rows stay, as failed, so that their attempt number
    /// is never taken again (see [`Self::next_attempt`]).
    fn not_submitted(&self, name: &str, why: &str) -> Result<()> {
        let reason = format!("not submitted: {why}");
        Ok(self
            .db
            .set_job_state(name, JobStatus::Failed, Some(&reason))?)
    }

    /// The attempt number of a new job of `batches`: above every number a job of any of them
    /// was recorded under, whether it ran, was refused or its submission was uncertain (those
    /// rows are kept for this). Two submissions thus never share a name, and so never a script,
    /// a log or an exit marker that an untracked twin could write for the tracked job. Numbers
    /// whose script is already in `jobs/` are skipped too: run.db of runs submitted before
    /// this rule lost the rows of failed submissions, not their files.
    fn next_attempt(&self, batches: &[i64]) -> Result<u32> {
        let mut attempt = 0;
        for b in batches {
            attempt = attempt.max(self.db.last_attempt(*b)?);
        }
        let layout = RunLayout::new(&self.run_dir);
        loop {
            attempt += 1;
            let name = self.job_name(batches[0], attempt);
            if !layout.job_script(&name).exists() {
                return Ok(attempt);
            }
        }
    }

    fn job_name(&self, first_batch: i64, attempt: u32) -> String {
        job_name(&self.tag, self.scheduler.backend(), first_batch, attempt)
    }

    /// The job's name and script text.
    fn render(&self, job: &PlannedJob, attempt: u32) -> Result<(String, String)> {
        let name = self.job_name(job.batches[0], attempt);
        let mut config = self.opts.scheduler.script.clone();
        if config.embedfleet.is_none() {
            config.embedfleet = Some(self.opts.exe.display().to_string());
        }
        let script_job = ScriptJob {
            job_name: name.clone(),
            queue: job.queue.clone(),
            run_dir: self.run_dir.clone(),
            batches: job.batches.iter().map(|b| *b as u64).collect(),
            output: RunLayout::new(&self.run_dir).job_log(&name),
            error: None,
            marker: Some(RunLayout::new(&self.run_dir).job_marker(&name)),
            embed_args: self.opts.embed_args.clone(),
        };
        let text = render_job_script(self.scheduler.backend(), &config, &script_job)?;
        Ok((name, text))
    }

    /// The queues and caps this loop fills: the run's, or the trial's one queue of cap 1.
    fn caps(&self) -> Result<BTreeMap<String, u32>> {
        match &self.opts.trial {
            Some(queue) => Ok(BTreeMap::from([(queue.clone(), 1)])),
            None => Ok(self.db.queue_caps()?),
        }
    }

    /// The batches this loop is about: all of them, or the trial's one.
    fn in_scope(&self, mut batches: Vec<i64>) -> Vec<i64> {
        batches.retain(|&b| self.is_in_scope(b));
        batches
    }

    fn is_in_scope(&self, batch: i64) -> bool {
        self.opts.trial.is_none() || self.trial_batch == Some(batch)
    }

    fn all_refused(&self) -> Result<bool> {
        let caps = self.caps()?;
        Ok(caps
            .iter()
            .filter(|(_, cap)| **cap > 0)
            .all(|(q, _)| self.refused.contains_key(q)))
    }

    fn refused_text(&self) -> String {
        let parts: Vec<String> = self
            .refused
            .iter()
            .map(|(q, why)| format!("{q}: {why}"))
            .collect();
        parts.join("; ")
    }
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Writes a job script readable by its owner only: it holds the run config's `env` values,
/// which may be secrets.
pub(crate) fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o700)
        .open(path)?;
    // An existing file keeps its mode at open: set it.
    file.set_permissions(std::fs::Permissions::from_mode(0o700))?;
    file.write_all(text.as_bytes())
}

/// The tag in every job name of the run in `run_dir`: 16 hex digits, all 64 bits of a hash of
/// its absolute path. A restarted loop adopts a job by its name, so the tag must tell this
/// run's jobs from every other run's of the same user; 16 bits did not.
pub fn run_tag(run_dir: &Path) -> String {
    let path = absolute(run_dir);
    let hash = xxhash_rust::xxh3::xxh3_64(path.as_os_str().as_encoded_bytes());
    format!("{hash:016x}")
}

/// Some PBS servers (older PBS Pro and Torque releases) refuse or cut job names longer than
/// this.
const PBS_NAME_MAX: usize = 15;

/// The name of attempt `attempt` of the job whose first batch is `first_batch`, in the run
/// tagged `tag`: `ef<tag>-b<batch, 6 digits>-a<attempt>`, unique to the run, the batch and
/// the attempt (e.g. `ef0123456789abcdef-b000042-a2`).
///
/// PBS gets a short form, `e` and 14 hex digits of a hash of that name (56 bits), to fit
/// [`PBS_NAME_MAX`]: a name the server cut would not be found again by a restarted loop, and
/// cutting our own would drop the tag or the attempt. The short form is as unique in practice
/// but says nothing to a reader; the job's rows in run.db say which batch and attempt it is.
/// Slurm and the local backend have no such limit and keep the readable name.
pub fn job_name(tag: &str, backend: Backend, first_batch: i64, attempt: u32) -> String {
    fit_job_name(backend, format!("ef{tag}-b{first_batch:06}-a{attempt}"))
}

/// `name` as `backend` keeps it whole: PBS gets the short hashed form (see [`job_name`]).
pub fn fit_job_name(backend: Backend, name: String) -> String {
    match backend {
        Backend::Pbs => {
            let hash = xxhash_rust::xxh3::xxh3_64(name.as_bytes());
            let short = format!("e{:014x}", hash >> 8);
            debug_assert_eq!(short.len(), PBS_NAME_MAX);
            short
        }
        Backend::Local | Backend::Slurm => name,
    }
}

/// Open job rows grouped by job name (a multi-node job has one row per batch).
fn by_name(rows: &[JobRow]) -> BTreeMap<String, Vec<&JobRow>> {
    let mut jobs: BTreeMap<String, Vec<&JobRow>> = BTreeMap::new();
    for row in rows {
        jobs.entry(row.name.clone()).or_default().push(row);
    }
    jobs
}

fn handle(row: &JobRow) -> Option<JobHandle> {
    let id = row.scheduler_id.as_deref()?;
    let mut h = JobHandle::new(SchedulerJobId::new(id)).with_name(&row.name);
    if let Some(marker) = &row.marker {
        h = h.with_marker(marker);
    }
    Some(h)
}

/// Jobs (not batches) each queue holds.
fn active_per_queue(open: &[JobRow]) -> BTreeMap<String, u32> {
    let mut names: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
    for row in open {
        names
            .entry(row.queue.clone())
            .or_default()
            .insert(&row.name);
    }
    names
        .into_iter()
        .map(|(q, n)| (q, n.len() as u32))
        .collect()
}

/// The last lines of a job log, on one line: read from its last 16 KiB only (a week-long job's
/// log can be large, and it sits on the shared filesystem).
pub(crate) fn log_tail(path: &str) -> String {
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

#[cfg(test)]
mod tests;
