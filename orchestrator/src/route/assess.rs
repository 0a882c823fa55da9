//! One queue as a round sees it: its model, the run time and start delay a new job there is
//! expected to have (the learned delay, or longer while its queued jobs already wait longer),
//! and whether it looks stopped.
//!
//! A queue no job of which has started yet has nothing learned: a new job there is expected
//! to start as soon as its oldest queued job could still start (no sooner than that job has
//! waited already, or than the scheduler says for a job sent now). Optimistic, as the static
//! route is, and corrected every round the wait goes on; once it has waited three times what
//! the fastest known queue takes, it counts as stopped like a known queue. A single trial job
//! first (the way before) cost the hours of that first wait on every new queue: measured in
//! BENCHMARKS.md, "Routing between queues".

use std::collections::BTreeMap;

use super::{OpenJob, QueueModel, QueueView, Round, Router};

/// The run time assumed before any job of the run has finished (the study's batch took ~40 min).
pub(super) const DEFAULT_RUN_S: f64 = 3600.0;
/// The largest loss share planned with: a queue that loses every job would cost infinitely.
const MAX_LOSS: f64 = 0.9;
/// A known queue whose oldest queued job has waited this many times its learned start delay
/// (plus [`STOPPED_SLACK_S`]) is taken to have stopped starting jobs.
pub(super) const STOPPED_FACTOR: f64 = 3.0;
pub(super) const STOPPED_SLACK_S: f64 = 60.0;

/// One queue as this round assesses it.
#[derive(Debug, Clone)]
pub(super) struct Assessed<'a> {
    pub view: &'a QueueView,
    pub model: QueueModel,
    pub run_s: f64,
    /// The longest any queued (not started) job has waited.
    pub longest_wait_s: f64,
    /// The start a new job there is expected to wait: from what was learned, or, while no job
    /// of it has started, the optimistic guess of the module's header.
    pub start_s: f64,
    pub stopped: bool,
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
        let loss = self.model.loss_share().min(MAX_LOSS);
        (self.start_s + self.run_s) / (1.0 - loss)
    }

    /// Seconds until queued job `job` is expected to start. From the model: what is left of
    /// the learned delay, or, past it, as long again as it has overstayed (waits are
    /// heavy-tailed: a job that overstays is likely to overstay more). With the scheduler's
    /// own estimate, a blend of the two, the estimate weighing more the closer the queue's
    /// earlier estimates came (half and half before any could be checked).
    pub fn start_left_s(&self, job: &OpenJob, now: f64) -> f64 {
        let waited = now - job.submitted_s;
        let learned = self.model.start_delay.get().unwrap_or(0.0);
        let from_model = (learned - waited).abs();
        let Some(estimate) = self.estimates.get(&job.name) else {
            return from_model;
        };
        blend(&self.model, (estimate - now).max(0.0), from_model)
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
        .map(|view| {
            let model = router.model(&view.name).cloned().unwrap_or_default();
            let longest_wait_s = view
                .jobs
                .iter()
                .filter(|j| j.started_s.is_none())
                .map(|j| (round.now_s - j.submitted_s).max(0.0))
                .fold(0.0, f64::max);
            let learned = model.start_delay.get();
            let stopped = learned
                .or(fastest_start)
                .is_some_and(|d| longest_wait_s > STOPPED_FACTOR * d + STOPPED_SLACK_S);
            let estimates = view
                .jobs
                .iter()
                .filter(|j| j.started_s.is_none())
                .filter_map(|j| Some((j.name.clone(), router.estimate(&j.name)?)))
                .collect();
            // A new job waits at least as long as the queue's oldest queued one has; the
            // scheduler's own estimate for a job sent now (`sbatch --test-only`) is blended in.
            let new_job_estimate = router.new_job_estimate(&view.name);
            let new_job = new_job_estimate.map(|at| (at - round.now_s).max(0.0));
            let start_s = match learned {
                Some(d) => {
                    let from_model = d.max(longest_wait_s);
                    new_job.map_or(from_model, |e| blend(&model, e, from_model))
                }
                None => new_job.map_or(longest_wait_s, |e| e.max(longest_wait_s)),
            };
            Assessed {
                view,
                estimates,
                new_job_estimate,
                run_s: model.run_time.get().unwrap_or(run_default),
                longest_wait_s,
                start_s,
                stopped,
                model,
            }
        })
        .collect()
}
