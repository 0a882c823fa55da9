//! One queue as a round sees it: its model, the run time and start delay a new job there is
//! expected to have, how long a queued job is likely to wait still, and whether it looks
//! stopped.
//!
//! A queue no job of which has started yet has nothing learned: a new job there is expected
//! to start as soon as its oldest queued job could still start (no sooner than that job has
//! waited already, or than the scheduler says for a job sent now). Optimistic, as the static
//! route is, and corrected every round the wait goes on; once it has waited three times what
//! the fastest known queue takes, it counts as stopped. A single trial job first (the way
//! before) cost the hours of that first wait on every new queue: measured in BENCHMARKS.md,
//! "Routing between queues".
//!
//! A known queue counts as stopped when it has started none of its queued jobs for three times
//! its usual start (from the later of its last start and its oldest queued job's submission)
//! while running fewer of the run's jobs than it has run at once: one job that waits long
//! while the queue starts others is a straggler, not a stopped queue (with long-tailed waits
//! one in ten waits seven times the median), and a queue that runs as many as it ever ran is
//! starting jobs as fast as the run's own end.

use std::collections::BTreeMap;

use super::model::SHAPE_SAMPLES;
use super::{OpenJob, QueueModel, QueueView, Round, Router};

/// The run time assumed before any job of the run has finished (the study's batch took ~40 min).
pub(super) const DEFAULT_RUN_S: f64 = 3600.0;
/// The largest loss share planned with: a queue that loses every job would cost infinitely.
const MAX_LOSS: f64 = 0.9;
/// A known queue that has started none of its queued jobs for this many times its learned
/// start delay (plus [`STOPPED_SLACK_S`]), while running fewer of the run's jobs than it has at
/// once, is taken to have stopped starting jobs.
pub(super) const STOPPED_FACTOR: f64 = 3.0;
pub(super) const STOPPED_SLACK_S: f64 = 60.0;
/// A wait longer than all but this share of the learned shape's is not taken to be one of
/// them (see [`Assessed::left_by_model_s`]).
const BEYOND_SHAPE: f64 = 1e-3;

/// One queue as this round assesses it.
#[derive(Debug, Clone)]
pub(super) struct Assessed<'a> {
    pub view: &'a QueueView,
    pub model: QueueModel,
    pub run_s: f64,
    /// The longest any queued (not started) job has waited.
    pub longest_wait_s: f64,
    /// Seconds since the queue last started a job or, when later, since its oldest queued
    /// job was sent (0 with nothing queued).
    pub quiet_s: f64,
    /// The start a new job there is expected to wait: from what was learned, or, while no job
    /// of it has started, the optimistic guess of the module's header.
    pub start_s: f64,
    pub stopped: bool,
    /// It runs as many of the run's jobs as it ever ran at once: its queued jobs may wait for
    /// the run's own to end, not for the queue.
    pub at_limit: bool,
    /// The scheduler's start estimates of its queued jobs, by job name.
    pub estimates: BTreeMap<String, f64>,
    /// The scheduler's estimate of when a job sent there now would start (unix seconds).
    pub new_job_estimate: Option<f64>,
}

impl Assessed<'_> {
    /// Whether a job of it has started: its start delay is learned, not guessed.
    pub fn known(&self) -> bool {
        self.model.known()
    }

    /// Seconds from sending a job here to its batch's end, counting the rework of losses:
    /// each try costs a start and a run, and a share `p` of tries are lost (1/(1-p) tries).
    pub fn cost_s(&self) -> f64 {
        let loss = self.model.loss_estimate().min(MAX_LOSS);
        (self.start_s + self.run_s) / (1.0 - loss)
    }

    /// [`Self::cost_s`] of a new job whose wait is the mean of the shape of the queue's waits
    /// (once it has one): what a straggler sent again is weighed at, beside what is left of its
    /// wait by the same kind of estimate.
    pub fn fresh_cost_s(&self) -> f64 {
        if self.model.wait_shape.samples < SHAPE_SAMPLES {
            return self.cost_s();
        }
        let loss = self.model.loss_estimate().min(MAX_LOSS);
        (self.model.wait_shape.mean_s() + self.run_s) / (1.0 - loss)
    }

    /// Seconds until queued job `job` is expected to start. From the model: with enough waits
    /// learned, what is left of a wait as long as this job's has been by the shape of the
    /// queue's waits; before that, what is left of the learned mean or, past it, as long
    /// again as it has overstayed. With the scheduler's own estimate, a blend of the two, the
    /// estimate weighing more the closer the queue's earlier estimates came (half and half
    /// before any could be checked).
    pub fn start_left_s(&self, job: &OpenJob, now: f64) -> f64 {
        let from_model = self.left_by_model_s(job, now);
        let Some(estimate) = self.estimates.get(&job.name) else {
            return from_model;
        };
        blend(&self.model, (estimate - now).max(0.0), from_model)
    }

    /// [`Self::start_left_s`] from the model alone.
    pub fn left_by_model_s(&self, job: &OpenJob, now: f64) -> f64 {
        let waited = (now - job.submitted_s).max(0.0);
        let shape = &self.model.wait_shape;
        let left = if shape.samples >= SHAPE_SAMPLES {
            // A wait the shape all but rules out (one in a thousand) is not one of its waits:
            // a held job, a queue that changed. It is then expected to overstay as long again.
            let beyond = shape.longer_than(waited) < BEYOND_SHAPE;
            let overstayed = if beyond { waited - shape.mean_s() } else { 0.0 };
            shape.left_after_s(waited).max(overstayed)
        } else {
            let learned = self.model.start_delay.get().unwrap_or(0.0);
            (learned - waited).abs()
        };
        // The shape is of a queue that starts jobs: one that stopped is expected to stay
        // stopped at least as long again.
        if self.stopped {
            left.max(self.quiet_s)
        } else {
            left
        }
    }

    /// Whether queued job `job` was passed over: the queue started a job sent no earlier than
    /// it, so it waits for more than a place of the run's own.
    pub fn passed_over(&self, job: &OpenJob) -> bool {
        job.started_s.is_none()
            && self
                .model
                .newest_started_submit_s
                .is_some_and(|s| s >= job.submitted_s)
    }

    pub fn usable(&self) -> bool {
        self.view.usable && self.view.cap > 0
    }
}

/// The scheduler's estimate of a wait blended with the model's: the estimate weighs more the
/// closer the queue's earlier estimates came (half and half before any could be checked).
fn blend(model: &QueueModel, estimated_s: f64, from_model_s: f64) -> f64 {
    let scale = model.start_delay.get().unwrap_or(0.0).max(60.0);
    let trust = match model.estimate_error.get() {
        None => 0.5,
        Some(error) => scale / (scale + error),
    };
    trust * estimated_s + (1.0 - trust) * from_model_s
}

/// The start a queue's jobs usually take, to tell a stopped queue by. While few of its jobs
/// have started, those are the quick ones (the long waits are still going), so its queued
/// jobs' waits so far count too, as waits at least that long: the total time on test over the
/// starts seen (the mean of a censored sample).
fn typical_start(model: &QueueModel, mean: f64, queued: &[&OpenJob], now: f64) -> f64 {
    let n = model.start_delay.samples;
    if n >= SHAPE_SAMPLES {
        return mean;
    }
    let waiting: f64 = queued.iter().map(|j| (now - j.submitted_s).max(0.0)).sum();
    (mean * n as f64 + waiting) / n as f64
}

pub(super) fn assess<'a>(router: &Router, round: &Round<'a>) -> Vec<Assessed<'a>> {
    let known_runs: Vec<f64> = round
        .queues
        .iter()
        .filter_map(|q| router.model(&q.name)?.run_time.get())
        .collect();
    let run_default = if known_runs.is_empty() {
        DEFAULT_RUN_S
    } else {
        known_runs.iter().sum::<f64>() / known_runs.len() as f64
    };
    // What a queue with nothing learned is measured against to count as stopped: the fastest
    // start any queue of the run has shown.
    let fastest_start = round
        .queues
        .iter()
        .filter_map(|q| router.model(&q.name)?.start_delay.get())
        .reduce(f64::min);
    round
        .queues
        .iter()
        .map(|view| assess_one(router, round, view, run_default, fastest_start))
        .collect()
}

fn assess_one<'a>(
    router: &Router,
    round: &Round<'a>,
    view: &'a QueueView,
    run_default: f64,
    fastest_start: Option<f64>,
) -> Assessed<'a> {
    let now = round.now_s;
    let model = router.model(&view.name).cloned().unwrap_or_default();
    let queued: Vec<&OpenJob> = view
        .jobs
        .iter()
        .filter(|j| j.started_s.is_none() && !j.cancelling)
        .collect();
    let oldest_sent = queued.iter().map(|j| j.submitted_s).reduce(f64::min);
    let longest_wait_s = oldest_sent.map_or(0.0, |s| (now - s).max(0.0));
    // A stop found earlier goes on until the queue starts a job, whatever was moved away.
    let stopped_for = match model.stop {
        Some(stop) if stop.until.is_none() => (now - stop.from).max(0.0),
        _ => 0.0,
    };
    let quiet_s = oldest_sent
        .map_or(0.0, |sent| {
            (now - model.last_start_s.map_or(sent, |s| s.max(sent))).max(0.0)
        })
        .max(stopped_for);
    let running = view
        .jobs
        .iter()
        .filter(|j| j.started_s.is_some() && !j.cancelling)
        .count() as u32;
    // As many running as it ever ran at once: its queued jobs wait for the run's own.
    let at_limit = model.most_running > 0 && running >= model.most_running;
    let learned = model.start_delay.get();
    let stopped = match learned {
        Some(d) => {
            !at_limit
                && quiet_s
                    > STOPPED_FACTOR * typical_start(&model, d, &queued, now) + STOPPED_SLACK_S
        }
        None => fastest_start.is_some_and(|d| quiet_s > STOPPED_FACTOR * d + STOPPED_SLACK_S),
    };
    let estimates = queued
        .iter()
        .filter_map(|j| Some((j.name.clone(), router.estimate(&j.name)?)))
        .collect();
    // The scheduler's own estimate for a job sent now (`sbatch --test-only`) is blended in.
    let new_job_estimate = router.new_job_estimate(&view.name);
    let new_job = new_job_estimate.map(|at| (at - now).max(0.0));
    let start_s = match learned {
        // Stopped: a new job waits at least as long as the queue has started nothing.
        Some(d) => {
            let from_model = if stopped { d.max(quiet_s) } else { d };
            new_job.map_or(from_model, |e| blend(&model, e, from_model))
        }
        // Nothing learned: no sooner than its oldest queued job could still start.
        None => new_job.map_or(quiet_s, |e| e.max(quiet_s)),
    };
    Assessed {
        view,
        estimates,
        new_job_estimate,
        run_s: model.run_time.get().unwrap_or(run_default),
        longest_wait_s,
        quiet_s,
        start_s,
        stopped,
        at_limit,
        model,
    }
}
