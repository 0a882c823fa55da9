//! The submit loop itself: its state between rounds, its set-up on a run, and its rounds
//! (poll, settle, submit) until every batch is settled. Its steps live beside it: sending jobs
//! (`launch.rs`), following them (`follow.rs`), routing (`routing.rs`), the breaker and notify
//! (`alerts.rs`), a signal's end (`interrupt.rs`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use embedfleet_core::rundb::RunDb;
use embedfleet_core::state::JobStatus;
use embedfleet_core::{fsops, RunLayout};

use super::breaker;
use super::console::Console;
use super::error::{Result, SubmitError};
use super::follow_up::FollowUp;
use super::naming::run_tag;
use super::options::SubmitOptions;
use super::outcome::SubmitReport;
use super::watch::OwnerWatch;
use crate::notify::Notifier;
use crate::scheduler::Scheduler;

pub(super) struct SubmitLoop<'a> {
    pub(super) opts: &'a SubmitOptions,
    /// The run directory, absolute: job scripts run elsewhere (a compute node, another cwd).
    pub(super) run_dir: PathBuf,
    pub(super) db: RunDb,
    pub(super) scheduler: Box<dyn Scheduler>,
    /// Part of every job name, from the run directory: tells this run's jobs from others'.
    pub(super) tag: String,
    /// The jobs this loop follows: each batch's jobs, and jobs the scheduler did not list.
    pub(super) following: Following,
    /// Queues the scheduler refused this run (e.g. no such partition).
    pub(super) refused: BTreeMap<String, String>,
    /// Why a queue cooled off last (a failed submission, a server that did not answer).
    pub(super) unusable_why: BTreeMap<String, String>,
    /// The batch a trial runs (see [`SubmitOptions::trial`]).
    pub(super) trial_batch: Option<i64>,
    /// The run's breaker and each queue's: what they counted and what they tripped.
    pub(super) trips: Trips,
    pub(super) notifier: Notifier,
    /// What this loop saw end and took in.
    pub(super) counts: LoopCounts,
    pub(super) console: Console,
    pub(super) report: SubmitReport,
    /// The owner's side of the loop (snapshot, stalls, the loop lock); none in a dry run.
    pub(super) watch: Option<OwnerWatch>,
    /// A later stage's work driven between rounds ([`submit`]'s `follow_up`).
    pub(super) follow_up: Option<&'a mut dyn FollowUp>,
    /// Where batches go ([`crate::route`]), and what routing did in this loop.
    pub(super) routing: crate::route::Routing,
    /// What routing asked of the scheduler: start estimates, and the job limit it states.
    pub(super) asked: SchedulerAsked,
    /// The room on the run directory's filesystem ([`super::disk`]).
    pub(super) disk: super::disk::DiskWatch,
}

/// The jobs a loop follows.
#[derive(Debug, Default)]
pub(super) struct Following {
    /// Jobs started for each batch by this invocation (adopted ones count).
    pub(super) attempts: HashMap<i64, u32>,
    /// Jobs the scheduler did not know at the last poll, since when.
    pub(super) unknown_since: HashMap<String, Instant>,
}

/// What routing asked of the scheduler, kept between rounds.
#[derive(Debug, Default)]
pub(super) struct SchedulerAsked {
    /// When start estimates were last asked (queued jobs, a new job per queue).
    pub(super) estimates: EstimatesAsked,
    /// The limit of jobs over the run's queues the scheduler states, if it does.
    pub(super) job_limit: Option<crate::scheduler::JobLimit>,
}

/// When the scheduler was last asked for start estimates.
#[derive(Debug, Default, Clone)]
pub(super) struct EstimatesAsked {
    /// Of the queued jobs.
    pub queued: Option<Instant>,
    /// When a new job would start, per queue.
    pub new_job: BTreeMap<String, Instant>,
}

/// Folders of the run directory whose files are not written by embedfleet's atomic writes (the
/// embedded Qdrant's own), which the start's clean-up leaves alone.
const LEFTOVERS_NOT_OURS: &[&str] = &["qdrant"];

/// Another host's temporary file untouched this long is a dead writer's: a job writes a shard in
/// minutes, and a node that crashed mid-write never comes back for it.
const LEFTOVERS_STALE_AFTER: Duration = Duration::from_secs(24 * 3600);

impl<'a> SubmitLoop<'a> {
    pub(super) fn with_db(opts: &'a SubmitOptions, db: RunDb) -> Result<Self> {
        if !db.is_planned()? {
            return Err(SubmitError::NotPlanned(opts.run_dir.clone()));
        }
        let disk = super::disk::DiskWatch::new(opts.bytes_per_paper, db.largest_batch_papers()?);
        Ok(Self {
            disk,
            opts,
            run_dir: absolute(&opts.run_dir),
            db,
            scheduler: opts.config.scheduler.build(),
            tag: run_tag(&opts.run_dir),
            following: Following::default(),
            refused: BTreeMap::new(),
            unusable_why: BTreeMap::new(),
            trial_batch: None,
            // A trial is one job whose end the user waits for: nothing to break.
            trips: Trips::new(if opts.session.trial.is_some() {
                0
            } else {
                opts.policy.breaker_after
            }),
            notifier: Notifier::new(&opts.config.notify),
            counts: LoopCounts::default(),
            console: Console::new(false),
            report: SubmitReport::default(),
            watch: None,
            follow_up: None,
            routing: crate::route::Routing::new(
                opts.policy.route,
                opts.policy.speculate,
                opts.policy.max_jobs,
            ),
            asked: SchedulerAsked::default(),
        })
    }

    #[cfg(test)]
    pub(super) fn new(opts: &'a SubmitOptions) -> Result<Self> {
        Self::new_on(opts, RunDb::open(&opts.run_dir)?)
    }

    pub(super) fn new_on(opts: &'a SubmitOptions, db: RunDb) -> Result<Self> {
        let mut lp = Self::with_db(opts, db)?;
        lp.console = Console::new(opts.progress);
        let rebooted = match lp.db.ownership() {
            embedfleet_core::owner::Ownership::Rebooted { previous } => {
                Some(previous.hostname.clone())
            }
            _ => None,
        };
        let mut watch = OwnerWatch::start(
            &lp.run_dir,
            opts.policy.poll_interval.as_secs_f64(),
            rebooted.as_deref(),
        )?;
        if let Some(addr) = opts.session.metrics_listen {
            let bound = watch.listen(addr)?;
            lp.console.say(format!("metrics: http://{bound}/metrics"));
        }
        if let Some(why) = &watch.restart {
            lp.console.say(format!("restart: {why}"));
            lp.notify(&crate::notify::Event::OwnerRestarted {
                host: embedfleet_core::owner::Host::this().hostname,
                reason: why.clone(),
            });
        }
        lp.watch = Some(watch);
        // The halves of files whose writers are gone (a job or loop killed mid-write, a write
        // that met a full disk before it could clean up): they only take room.
        let removed = embedfleet_core::atomic::remove_dead_writers_leftovers(
            &lp.run_dir,
            LEFTOVERS_NOT_OURS,
            LEFTOVERS_STALE_AFTER,
        );
        if removed > 0 {
            lp.console.say(format!(
                "removed {removed} temporary files that writers no longer running left behind"
            ));
        }
        lp.db.set_stall_rule(&opts.session.stall)?;
        if opts.session.trial.is_none() {
            if let Some(queues) = &opts.queues {
                lp.db.set_queue_caps(queues, true)?;
            }
        }
        if lp.caps()?.is_empty() {
            return Err(SubmitError::NoQueues);
        }
        let layout = RunLayout::new(&lp.run_dir);
        let reach = embedfleet_core::access::Reach::of_run_dir(&lp.run_dir);
        for path in [layout.job_dir(), layout.log_dir()] {
            embedfleet_core::access::create_dir_in_run(&path, reach).map_err(|source| {
                SubmitError::Io {
                    action: "create",
                    path,
                    cause: source,
                }
            })?;
        }
        if lp.db.plan_manifest_is_stale() {
            // Planned by an older embedfleet (no plan.json, or one without the plan's id): the
            // jobs read plan.json, not run.db.
            lp.db.write_plan_manifest().map_err(|e| SubmitError::Io {
                action: "write",
                path: layout.plan_file(),
                cause: std::io::Error::other(e),
            })?;
        }
        lp.read_job_limit()?;
        lp.routing = lp.learned_routing()?;
        lp.preflight_queues();
        lp.trips.tripped = lp.paused_by_breaker()?;
        lp.trips.resumes_seen = lp.db.resumes()?;
        let reset = lp.db.reset_failed_batches()?;
        if reset > 0 {
            lp.console.say(format!(
                "{reset} batches that failed before are tried again"
            ));
        }
        // Chosen once the failed batches are back: a trial after a failed one tries the same
        // batch again, as it says.
        if opts.session.trial.is_some() {
            lp.trial_batch = lp.db.batches_without_job()?.first().copied();
        }
        Ok(lp)
    }

    pub(super) fn nodes(&self) -> usize {
        self.opts.config.scheduler.script.nodes.max(1) as usize
    }

    /// The most jobs the run may hold over all queues: `--max-jobs`, or the scheduler's
    /// stated limit where lower.
    pub(super) fn max_jobs(&self) -> Option<u32> {
        let stated = self.asked.job_limit.as_ref().and_then(|l| l.jobs);
        match (self.opts.policy.max_jobs, stated) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Reads the limit of jobs the scheduler states over the run's queues (once per loop; a
    /// failure only says so: `--max-jobs` still holds).
    pub(super) fn read_job_limit(&mut self) -> Result<()> {
        let queues: Vec<String> = self.caps()?.into_keys().collect();
        match self.scheduler.job_limit(&queues) {
            Ok(Some(limit)) => {
                self.console
                    .say(stated_limit_line(&limit, self.opts.policy.max_jobs));
                self.asked.job_limit = Some(limit);
            }
            Ok(None) => {}
            Err(e) => tracing::info!("no job limit read from the scheduler: {e}"),
        }
        Ok(())
    }

    /// Jobs found ended, jobs submitted and results taken in so far: unchanged over a round,
    /// the round was quiet (nothing arrived), and its CPU is the poll's fixed cost. (Not "run.db
    /// unchanged": a job seen starting, or the scheduler's start estimates, write rows in rounds
    /// where nothing arrives.)
    pub(super) fn events(&self) -> (u64, u64, u64) {
        (
            self.counts.jobs_ended,
            self.report.submitted,
            self.counts.results_taken_in,
        )
    }

    pub(super) fn run_keeping_db(mut self) -> Result<(SubmitReport, RunDb)> {
        let started = Instant::now();
        let (cpu_before, ops_before) = (embedfleet_core::process::own_cpu(), fsops::total());
        self.adopt_open_jobs()?;
        // Ctrl-C and SIGTERM end the loop at a round's edge, saying what they leave running.
        let _signals = embedfleet_core::stop_signal::StopSignals::catch();
        loop {
            if let Some(signal) = embedfleet_core::stop_signal::requested() {
                self.interrupted(signal)?;
            }
            match self.round() {
                Ok(RoundEnd::Settled) => break,
                Ok(RoundEnd::GoOn) => self.round_went_through(),
                // A full disk waits for room: the round is tried again next poll.
                Err(e) => self.round_failed(e)?,
            }
            if let Some(signal) =
                embedfleet_core::stop_signal::sleep_unless_stopped(self.opts.policy.poll_interval)
            {
                self.interrupted(signal)?;
            }
        }
        self.console.finish();
        if self.report.submitted == 0 {
            // An orderly end with nothing to send (every batch done): the settings were not
            // refused by anything, and later commands (`query --submit`) take them.
            for (key, value) in &self.opts.keep_on_first_job {
                self.db.set_setting(key, value)?;
            }
        }
        if let Some(watch) = self.watch.as_mut() {
            watch.last_poll(&self.db);
        }
        self.wait_for_notify();
        self.report.elapsed = started.elapsed();
        self.report.owner_cpu = embedfleet_core::process::own_cpu().saturating_sub(cpu_before);
        self.report.result_file_ops = fsops::total() - ops_before;
        self.report.route = self.opts.policy.route;
        self.report.twins = self.routing.twins;
        self.report.moves = self.routing.moves;
        self.report.twin_node_hours = self.routing.twin_node_hours;
        self.report.move_node_hours = self.routing.move_node_hours;
        // The owner's watch (its heartbeat, the loop lock) ends with the loop.
        drop(self.watch.take());
        Ok((self.report, self.db))
    }

    /// The jobs an earlier loop submitted and did not see end: followed, not sent again.
    pub(super) fn adopt_open_jobs(&mut self) -> Result<()> {
        let adopted: BTreeSet<String> = self
            .db
            .open_jobs()?
            .into_iter()
            .filter(|j| j.state != JobStatus::Submitting)
            .map(|j| {
                *self.following.attempts.entry(j.batch_id).or_default() += 1;
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
        Ok(())
    }

    /// One poll: take in results, follow the jobs, send what fits, redraw. Its wall and CPU
    /// time are kept by part (poll, submit, progress) for the report and the watch.
    pub(super) fn round(&mut self) -> Result<RoundEnd> {
        let mut clock = RoundClock::start();
        let events_at_round = self.events();
        self.ingest(None)?;
        self.settle_submitting()?;
        self.poll()?;
        clock.mark();
        let paused = self.db.paused()?;
        if self.trips.tripped && !paused {
            self.resumed_after_trip()?;
        }
        self.bring_back_set_aside()?;
        let held_for_room = self.hold_for_room()?;
        if !paused && !held_for_room {
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
        clock.mark();
        let open = self.db.open_jobs()?;
        let pending = self.any_pending_in_scope()?;
        match self.db.status() {
            Ok(status) => {
                self.console.update(&status, &open, paused);
                self.watched(&status, &open)?;
            }
            // A failed read only skips this poll's redraw and snapshot.
            Err(e) => tracing::warn!("status not read this poll: {e}"),
        }
        let open_in_scope = open.iter().any(|j| self.is_in_scope(j.batch_id));
        let quiet = self.events() == events_at_round;
        clock.end(&mut self.report, self.watch.as_mut(), quiet);
        // Paused by the breaker, the loop waits for `resume` even with every batch
        // settled: the batches that failed during the streak are tried again then.
        if !open_in_scope && !pending && !self.trips.tripped && !follow_up_busy {
            self.settled()?;
            if !self.opts.session.watch {
                return Ok(RoundEnd::Settled);
            }
        }
        if !open_in_scope && pending && !paused && self.all_refused()? {
            return Err(SubmitError::AllQueuesRefused(self.refused_text()));
        }
        Ok(RoundEnd::GoOn)
    }
}

/// The run's breaker and each queue's.
pub(super) struct Trips {
    /// Counts jobs in a row failing alike.
    pub(super) breaker: breaker::Breaker,
    /// The run is paused by the breaker (this loop's or an earlier one's): a resume tries the
    /// batches that failed during the streak again.
    pub(super) tripped: bool,
    /// Counts jobs in a row failing alike on each queue, and the queues set aside by it (their
    /// reason is in `refused` too, so no job goes there) until a `resume` (`resumes_seen`).
    pub(super) queues: breaker::QueueBreakers,
    pub(super) set_aside: BTreeMap<String, String>,
    pub(super) resumes_seen: u64,
}

impl Trips {
    /// Breakers that trip after `after` jobs in a row fail alike (0: never).
    pub(super) fn new(after: u32) -> Self {
        Self {
            breaker: breaker::Breaker::new(after),
            tripped: false,
            queues: breaker::QueueBreakers::new(after),
            set_aside: BTreeMap::new(),
            resumes_seen: 0,
        }
    }
}

/// What a loop saw end and took in.
#[derive(Debug, Default)]
pub(super) struct LoopCounts {
    /// Jobs that ended in this loop, and their number at the last `finished` event: a loop that
    /// had nothing to do sends none.
    pub(super) jobs_ended: u64,
    pub(super) jobs_ended_at_finish: u64,
    /// Results the ingests accepted in this loop (a round that took none in, found no job
    /// ended and submitted nothing is a quiet round).
    pub(super) results_taken_in: u64,
}

/// Whether the loop ends after a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RoundEnd {
    /// Every batch in scope settled and no `--watch`: the loop's orderly end.
    Settled,
    GoOn,
}

/// A round's wall and CPU time at its two edges (after the poll part, after the submit part),
/// handed to the report's busy times and the watch's CPU split when the round ends.
pub(super) struct RoundClock {
    pub(super) wall: [Instant; 3],
    pub(super) cpu: [Duration; 3],
    pub(super) marks: usize,
}

impl RoundClock {
    pub(super) fn start() -> Self {
        let (now, cpu) = (Instant::now(), embedfleet_core::process::own_cpu());
        Self {
            wall: [now; 3],
            cpu: [cpu; 3],
            marks: 0,
        }
    }

    /// The end of the round's poll part (first call), then of its submit part.
    pub(super) fn mark(&mut self) {
        self.marks = (self.marks + 1).min(2);
        self.wall[self.marks] = Instant::now();
        self.cpu[self.marks] = embedfleet_core::process::own_cpu();
    }

    /// `quiet`: nothing arrived this round, so its CPU is the poll's fixed cost.
    pub(super) fn end(
        self,
        report: &mut SubmitReport,
        watch: Option<&mut OwnerWatch>,
        quiet: bool,
    ) {
        let [round, polled, submitted] = self.wall;
        let [cpu_at_round, cpu_at_polled, cpu_at_submitted] = self.cpu;
        if let Some(watch) = watch {
            let cpu_now = embedfleet_core::process::own_cpu();
            watch.spent("poll", cpu_at_polled.saturating_sub(cpu_at_round));
            watch.spent("submit", cpu_at_submitted.saturating_sub(cpu_at_polled));
            watch.spent("progress", cpu_now.saturating_sub(cpu_at_submitted));
            if quiet {
                watch.quiet_round(cpu_now.saturating_sub(cpu_at_round));
            }
        }
        report.busy_poll += polled - round;
        report.busy_submit += submitted - polled;
        report.busy_progress += submitted.elapsed();
        report.rounds += 1;
        report.busy += round.elapsed();
    }
}

pub(super) fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// What the loop says of a limit the scheduler states, and what it keeps under.
pub(super) fn stated_limit_line(
    limit: &crate::scheduler::JobLimit,
    max_jobs: Option<u32>,
) -> String {
    let mut line = match limit.jobs {
        Some(jobs) => format!(
            "the scheduler limits your jobs over these queues to {jobs} ({}); the run keeps under {}",
            limit.said,
            max_jobs.map_or(jobs, |m| m.min(jobs))
        ),
        None => format!("the scheduler limits your jobs ({})", limit.said),
    };
    if !limit.queues.is_empty() {
        let queues: Vec<String> = limit
            .queues
            .iter()
            .map(|(q, n)| format!("{q} at most {n}"))
            .collect();
        line.push_str(&format!(
            "; queues kept under their own: {}",
            queues.join(", ")
        ));
    }
    line
}
