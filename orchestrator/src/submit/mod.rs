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
mod error;
mod follow;
mod follow_up;
mod interrupt;
mod job_files;
mod launch;
mod naming;
mod policy;
mod routing;
mod watch;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use embedfleet_core::rundb::RunDb;
use embedfleet_core::state::JobStatus;
use embedfleet_core::{fsops, RunLayout};

use crate::config::RunConfig;
use crate::notify::Notifier;
use crate::route::Pending;
pub use crate::route::{fill_queues, PlannedJob};
use crate::scheduler::Scheduler;
pub use console::Console;
pub use error::{Result, SubmitError};
pub use follow_up::{FollowUp, FollowUpRound};
pub(crate) use job_files::{with_binary, JobFiles};
pub use naming::{fit_job_name, job_name, run_tag};
pub use policy::{LoopPolicy, SessionOptions};
use watch::OwnerWatch;
pub use watch::LOOP_LOCK_FILE;

/// What `embedfleet submit` was asked to do.
#[derive(Debug, Clone)]
pub struct SubmitOptions {
    pub run_dir: PathBuf,
    /// The run config: the scheduler (backend, command settings, job script template) and
    /// the notify hook.
    pub config: RunConfig,
    /// Queue caps to set before starting (replacing the stored ones); `None` keeps run.db's.
    pub queues: Option<BTreeMap<String, u32>>,
    /// Attempts, polling, lost jobs, the breaker, routing.
    pub policy: LoopPolicy,
    /// Watching, a trial, stalled jobs, the metrics endpoint: this session's own.
    pub session: SessionOptions,
    /// Arguments after `embed-job --run-dir DIR --batch N` in every job script.
    pub embed_args: Vec<String>,
    /// The embedfleet binary jobs run, when the run config does not name one.
    pub exe: PathBuf,
    /// Draw a progress bar (stderr is a terminal).
    pub progress: bool,
    /// run.db settings this submit keeps for the run's later ones (its run config, devices,
    /// loop options), stored when its first job is submitted, or at the loop's orderly end
    /// when it had none to send: a submit that fails before any job keeps nothing.
    pub keep_on_first_job: Vec<(String, serde_json::Value)>,
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
    /// Jobs seen back in their queue after running: the scheduler requeued them (preempted).
    pub requeued: u64,
    /// Queues the breaker set aside in this loop (their jobs failed alike, the others' not).
    pub set_aside: Vec<String>,
    /// The route, the speculative twins it sent, the queued jobs it moved, and what the slower
    /// twins ran before they were cancelled.
    pub route: crate::route::Route,
    pub twins: u64,
    pub moves: u64,
    pub twin_node_hours: f64,
    /// What moved jobs ran before their cancel took effect (they had just started).
    pub move_node_hours: f64,
}

/// What a submit did: the loop's report, or (a dry run) the job scripts its next round would
/// send, (job name, script text), without submitting or recording anything.
#[derive(Debug)]
pub enum Submitted {
    Ran(Box<SubmitReport>),
    WouldSend(Vec<(String, String)>),
}

/// The submit stage's one entry point: on `db` (the run's run.db, open already; read-only for
/// a dry run), runs the submit loop until every batch is done or failed (or forever with
/// `watch`), driving `follow_up` once per round as well (see [`FollowUp`]: the loop then ends
/// when every batch is settled and the follow-up work is not busy); or, with `dry_run`, only
/// renders the next round's job scripts. `db` is handed back (`run` holds one handle for all
/// its stages; a command records its line with it).
pub fn submit<'a>(
    db: RunDb,
    options: &'a SubmitOptions,
    follow_up: Option<&'a mut dyn FollowUp>,
    dry_run: bool,
) -> Result<(Submitted, RunDb)> {
    if dry_run {
        return would_send(db, options);
    }
    let mut lp = SubmitLoop::new_on(options, db)?;
    lp.follow_up = follow_up;
    let (report, db) = lp.run_keeping_db()?;
    Ok((Submitted::Ran(Box::new(report)), db))
}

/// The job scripts the next round would submit, without submitting or recording anything.
fn would_send(db: RunDb, options: &SubmitOptions) -> Result<(Submitted, RunDb)> {
    // The run config's `env` values may be secrets (tokens, keys): printed as ***.
    let mut masked = options.clone();
    for value in masked.config.scheduler.script.env.values_mut() {
        *value = "***".into();
    }
    let options = &masked;
    let mut lp = SubmitLoop::with_db(options, db)?;
    let caps = match &options.queues {
        Some(q) => q.clone(),
        None => lp.db.queue_caps()?,
    };
    if caps.is_empty() {
        return Err(SubmitError::NoQueues);
    }
    lp.routing = lp.learned_routing()?;
    let open = lp.db.open_jobs()?;
    let pending = lp.db.batches_without_job()?;
    let plan = lp.route_round(&caps, &open, Pending::all(&pending), &BTreeSet::new());
    let scripts = plan
        .jobs
        .iter()
        .map(|job| {
            let attempt = lp.next_attempt(&job.batches)?;
            let (files, script) = lp.render(job, attempt)?;
            Ok((files.name, script))
        })
        .collect::<Result<_>>()?;
    Ok((Submitted::WouldSend(scripts), lp.db))
}

struct SubmitLoop<'a> {
    opts: &'a SubmitOptions,
    /// The run directory, absolute: job scripts run elsewhere (a compute node, another cwd).
    run_dir: PathBuf,
    db: RunDb,
    scheduler: Box<dyn Scheduler>,
    /// Part of every job name, from the run directory: tells this run's jobs from others'.
    tag: String,
    /// The jobs this loop follows: each batch's jobs, and jobs the scheduler did not list.
    following: Following,
    /// Queues the scheduler refused this run (e.g. no such partition).
    refused: BTreeMap<String, String>,
    /// Why a queue cooled off last (a failed submission, a server that did not answer).
    unusable_why: BTreeMap<String, String>,
    /// The batch a trial runs (see [`SubmitOptions::trial`]).
    trial_batch: Option<i64>,
    /// The run's breaker and each queue's: what they counted and what they tripped.
    trips: Trips,
    notifier: Notifier,
    /// What this loop saw end and took in.
    counts: LoopCounts,
    console: Console,
    report: SubmitReport,
    /// The owner's side of the loop (snapshot, stalls, the loop lock); none in a dry run.
    watch: Option<OwnerWatch>,
    /// A later stage's work driven between rounds ([`submit`]'s `follow_up`).
    follow_up: Option<&'a mut dyn FollowUp>,
    /// Where batches go ([`crate::route`]), and what routing did in this loop.
    routing: crate::route::Routing,
    /// What routing asked of the scheduler: start estimates, and the job limit it states.
    asked: SchedulerAsked,
}

/// The jobs a loop follows.
#[derive(Debug, Default)]
struct Following {
    /// Jobs started for each batch by this invocation (adopted ones count).
    attempts: HashMap<i64, u32>,
    /// Jobs the scheduler did not know at the last poll, since when.
    unknown_since: HashMap<String, Instant>,
}

/// What routing asked of the scheduler, kept between rounds.
#[derive(Debug, Default)]
struct SchedulerAsked {
    /// When start estimates were last asked (queued jobs, a new job per queue).
    estimates: routing::EstimatesAsked,
    /// The limit of jobs over the run's queues the scheduler states, if it does.
    job_limit: Option<crate::scheduler::JobLimit>,
}

impl<'a> SubmitLoop<'a> {
    fn with_db(opts: &'a SubmitOptions, db: RunDb) -> Result<Self> {
        if !db.is_planned()? {
            return Err(SubmitError::NotPlanned(opts.run_dir.clone()));
        }
        Ok(Self {
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
    fn new(opts: &'a SubmitOptions) -> Result<Self> {
        Self::new_on(opts, RunDb::open(&opts.run_dir)?)
    }

    fn new_on(opts: &'a SubmitOptions, db: RunDb) -> Result<Self> {
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

    fn nodes(&self) -> usize {
        self.opts.config.scheduler.script.nodes.max(1) as usize
    }

    /// The most jobs the run may hold over all queues: `--max-jobs`, or the scheduler's
    /// stated limit where lower.
    fn max_jobs(&self) -> Option<u32> {
        let stated = self.asked.job_limit.as_ref().and_then(|l| l.jobs);
        match (self.opts.policy.max_jobs, stated) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Reads the limit of jobs the scheduler states over the run's queues (once per loop; a
    /// failure only says so: `--max-jobs` still holds).
    fn read_job_limit(&mut self) -> Result<()> {
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
    fn events(&self) -> (u64, u64, u64) {
        (
            self.counts.jobs_ended,
            self.report.submitted,
            self.counts.results_taken_in,
        )
    }

    fn run_keeping_db(mut self) -> Result<(SubmitReport, RunDb)> {
        let started = Instant::now();
        let (cpu_before, ops_before) = (embedfleet_core::process::own_cpu(), fsops::total());
        self.adopt_open_jobs()?;
        // Ctrl-C and SIGTERM end the loop at a round's edge, saying what they leave running.
        let _signals = embedfleet_core::stop_signal::StopSignals::catch();
        loop {
            if let Some(signal) = embedfleet_core::stop_signal::requested() {
                self.interrupted(signal)?;
            }
            if self.round()? == RoundEnd::Settled {
                break;
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
    fn adopt_open_jobs(&mut self) -> Result<()> {
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
    fn round(&mut self) -> Result<RoundEnd> {
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
struct Trips {
    /// Counts jobs in a row failing alike.
    breaker: breaker::Breaker,
    /// The run is paused by the breaker (this loop's or an earlier one's): a resume tries the
    /// batches that failed during the streak again.
    tripped: bool,
    /// Counts jobs in a row failing alike on each queue, and the queues set aside by it (their
    /// reason is in `refused` too, so no job goes there) until a `resume` (`resumes_seen`).
    queues: breaker::QueueBreakers,
    set_aside: BTreeMap<String, String>,
    resumes_seen: u64,
}

impl Trips {
    /// Breakers that trip after `after` jobs in a row fail alike (0: never).
    fn new(after: u32) -> Self {
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
struct LoopCounts {
    /// Jobs that ended in this loop, and their number at the last `finished` event: a loop that
    /// had nothing to do sends none.
    jobs_ended: u64,
    jobs_ended_at_finish: u64,
    /// Results the ingests accepted in this loop (a round that took none in, found no job
    /// ended and submitted nothing is a quiet round).
    results_taken_in: u64,
}

/// Whether the loop ends after a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RoundEnd {
    /// Every batch in scope settled and no `--watch`: the loop's orderly end.
    Settled,
    GoOn,
}

/// A round's wall and CPU time at its two edges (after the poll part, after the submit part),
/// handed to the report's busy times and the watch's CPU split when the round ends.
struct RoundClock {
    wall: [Instant; 3],
    cpu: [Duration; 3],
    marks: usize,
}

impl RoundClock {
    fn start() -> Self {
        let (now, cpu) = (Instant::now(), embedfleet_core::process::own_cpu());
        Self {
            wall: [now; 3],
            cpu: [cpu; 3],
            marks: 0,
        }
    }

    /// The end of the round's poll part (first call), then of its submit part.
    fn mark(&mut self) {
        self.marks = (self.marks + 1).min(2);
        self.wall[self.marks] = Instant::now();
        self.cpu[self.marks] = embedfleet_core::process::own_cpu();
    }

    /// `quiet`: nothing arrived this round, so its CPU is the poll's fixed cost.
    fn end(self, report: &mut SubmitReport, watch: Option<&mut OwnerWatch>, quiet: bool) {
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

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// What the loop says of a limit the scheduler states, and what it keeps under.
fn stated_limit_line(limit: &crate::scheduler::JobLimit, max_jobs: Option<u32>) -> String {
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

#[cfg(test)]
mod tests;
