/*!
Which queue each free job slot gives which batch: the submit loop asks a [`Router`] once per
round, and tells it what it saw of each job (started, ended and how), through [`Routing`]: the
loop's side of it, without I/O. The simulator (`cargo bench -p embedfleet-orchestrator --bench
route_sim`) drives the same `Routing` through queues of its own, so what it measures is this
code, not a copy of it.

Two routes:
- [`Route::Static`]: every queue kept filled to its cap ([`fill_queues`]): what embedfleet did
  before it learned queues.
- [`Route::Adaptive`]: each free slot takes the batch that finishes soonest where it goes,
  from a [`QueueModel`] of each queue learned from the run's own jobs ([`adaptive`]); a queue
  with no history is expected to start jobs as soon as its queued ones could; the pending
  jobs of a queue that stopped starting jobs are moved when that is worth a new wait; a job
  the queue passed over that, by the shape of the queue's waits, is likely to wait longer
  than a new job would is sent again (long-tailed waits); and at the tail a batch whose job
  waits far longer than another queue's start gets a speculative twin there ([`tail`]).

Caps stay upper bounds in both, and so does the run's limit over all queues (`--max-jobs`):
a route decides where, never more than the user or the site allows. Under that limit the
adaptive route decides which queue gets each scarce place: the one that finishes a batch
soonest with it.
*/

mod adaptive;
mod assess;
mod fill;
mod loop_side;
mod model;
mod tail;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use embedfleet_core::status_snapshot::QueueOutlook;
pub use fill::{fill_queues, PlannedJob};
pub use loop_side::{Routing, Seen};
pub use model::{JobEnd, QueueModel, RecentMean, WaitShape, SETUP_EXIT_CODES};

/// How free job slots are given batches (`submit --route`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Route {
    /// Every queue filled to its cap, queues taking turns.
    Static,
    /// Each slot takes the batch that finishes soonest there, from each queue's learned model.
    #[default]
    Adaptive,
}

impl Route {
    pub fn name(self) -> &'static str {
        match self {
            Route::Static => "static",
            Route::Adaptive => "adaptive",
        }
    }
}

impl std::fmt::Display for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Route {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "static" => Ok(Route::Static),
            "adaptive" => Ok(Route::Adaptive),
            other => Err(format!(
                "unknown route {other:?}: `adaptive` (learn each queue) or `static` (fill every queue to its cap)"
            )),
        }
    }
}

/// One open job (queued or running), as the router sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenJob {
    pub name: String,
    pub batches: Vec<i64>,
    /// Unix seconds (or the simulator's clock): when it was sent, or when the scheduler put it
    /// back in its queue after it ran (a requeue): when its present wait began.
    pub submitted_s: f64,
    pub started_s: Option<f64>,
    /// Cancelled by the loop (moved, or the slower twin), not yet ended by the scheduler: it
    /// holds its queue's place, and is neither moved again nor given a twin.
    pub cancelling: bool,
}

/// One queue this round: its cap, whether it takes jobs now (not refused, not cooling off
/// after a failed submission), the batches a job of it takes (one per node), and its open jobs.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueView {
    pub name: String,
    pub cap: u32,
    pub usable: bool,
    pub nodes: usize,
    pub jobs: Vec<OpenJob>,
}

/// What a round is decided from.
#[derive(Debug, Clone)]
pub struct Round<'a> {
    pub now_s: f64,
    pub queues: &'a [QueueView],
    /// Batches with no open job: all of them, or the first of them.
    pub pending: Pending<'a>,
    /// Whether the tail may get speculative twins (`--speculate`).
    pub speculate: bool,
    /// The most jobs the run may hold queued or running over all its queues together (a
    /// site's per-user limit, `--max-jobs`): every queue's cap still holds too.
    pub max_jobs: Option<u32>,
}

impl Round<'_> {
    /// Open jobs over every queue: each holds one of the `max_jobs` places, a job being
    /// cancelled too until the scheduler says it ended.
    pub fn open_jobs(&self) -> usize {
        self.queues.iter().map(|q| q.jobs.len()).sum()
    }

    /// Places left under `max_jobs` (no limit: as many as there could be).
    pub fn places(&self) -> usize {
        match self.max_jobs {
            Some(max) => (max as usize).saturating_sub(self.open_jobs()),
            None => usize::MAX,
        }
    }
}

/// The batches with no open job a round is decided from, in order: all of them, or the first
/// of them (`cut`: more follow). The loop reads only as many as a round uses (2,075 wait at the
/// start of the study's run; a round that sends nothing needs a few); a plan that walks to the
/// end of a cut list says so ([`RoutePlan::cut_short`]).
#[derive(Debug, Clone, Copy)]
pub struct Pending<'a> {
    pub batches: &'a [i64],
    pub cut: bool,
}

impl<'a> Pending<'a> {
    pub fn all(batches: &'a [i64]) -> Self {
        Self {
            batches,
            cut: false,
        }
    }

    /// How many a round reads first: every queue's cap in batches, and one more. That is
    /// enough for any round that fills the free places; a plan that walks further (batches set
    /// to wait on paper for a faster queue's slots) says so, and the loop reads
    /// [`Pending::more`] of them.
    pub fn to_read_first(caps: &BTreeMap<String, u32>, nodes: impl Fn(&str) -> usize) -> usize {
        caps.iter()
            .map(|(queue, cap)| (*cap as usize).saturating_mul(nodes(queue).max(1)))
            .fold(1usize, usize::saturating_add)
    }

    /// Whether more than `n` batches wait for a job; `Err` where the cut list is too short to
    /// tell.
    pub fn more_than(&self, n: usize) -> Result<bool, CutShort> {
        match (self.batches.len() > n, self.cut) {
            (true, _) => Ok(true),
            (false, true) => Err(CutShort),
            (false, false) => Ok(false),
        }
    }

    /// How many to read after a plan from `read` of them was cut short.
    pub fn more(read: usize) -> usize {
        read.saturating_mul(4)
    }
}

/// A round's decision needs batches past the end of a cut `pending` list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CutShort;

/// Why a queued job is cancelled and its batches sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveKind {
    /// Its queue stopped starting jobs.
    Stopped,
    /// Its queue starts others (it was passed over), and by the shape of the queue's waits
    /// one that has waited this long is likely to wait longer than a new job would.
    Straggler,
}

/// A job to cancel so that its batches go where they finish sooner.
#[derive(Debug, Clone, PartialEq)]
pub struct Move {
    pub job: String,
    pub queue: String,
    pub kind: MoveKind,
    pub why: String,
}

/// A round's decision.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RoutePlan {
    /// New jobs of batches that had none.
    pub jobs: Vec<PlannedJob>,
    /// Second jobs of batches whose first waits too long (the tail; adaptive only).
    pub twins: Vec<PlannedJob>,
    /// Queued jobs to cancel: their batches are routed again once they ended (adaptive only).
    pub moves: Vec<Move>,
    pub outlook: Vec<QueueOutlook>,
    /// Where the next batch goes and why, in words.
    pub next: Option<String>,
    /// The plan walked to the end of a cut `pending` list ([`Pending::cut`]): what it
    /// would decide past it is unknown, so it is not to be carried out; the loop plans again
    /// from more of the batches.
    pub cut_short: bool,
}

/// The route and what it has learned of each queue.
#[derive(Debug, Clone, Default)]
pub struct Router {
    pub route: Route,
    models: BTreeMap<String, QueueModel>,
    /// The scheduler's latest start estimate of each queued job: (queue, unix seconds).
    estimates: BTreeMap<String, (String, f64)>,
    /// The scheduler's estimate of when a job sent to each queue now would start (unix
    /// seconds; Slurm's `sbatch --test-only`).
    new_job_estimates: BTreeMap<String, f64>,
}

impl Router {
    pub fn new(route: Route) -> Self {
        Self {
            route,
            models: BTreeMap::new(),
            estimates: BTreeMap::new(),
            new_job_estimates: BTreeMap::new(),
        }
    }

    pub fn model(&self, queue: &str) -> Option<&QueueModel> {
        self.models.get(queue)
    }

    /// A job of `queue` submitted at `submitted_s` was seen running at `started_s`.
    pub fn started(&mut self, queue: &str, submitted_s: f64, started_s: f64) {
        self.model_mut(queue).started_at(submitted_s, started_s);
    }

    /// The scheduler expects queued job `job` of `queue` to start at `start_s`.
    pub fn estimated(&mut self, job: &str, queue: &str, start_s: f64) {
        self.estimates
            .insert(job.to_string(), (queue.to_string(), start_s));
    }

    /// The scheduler expects a job sent to `queue` now to start at `start_s`.
    pub fn new_job_estimated(&mut self, queue: &str, start_s: f64) {
        self.new_job_estimates.insert(queue.to_string(), start_s);
    }

    /// The scheduler's latest estimate of when a job sent to `queue` now would start.
    pub fn new_job_estimate(&self, queue: &str) -> Option<f64> {
        self.new_job_estimates.get(queue).copied()
    }

    /// Job `job` was sent to `queue`: the scheduler's estimate for a new job there is its
    /// own until the scheduler gives one of the job itself, and is checked when it starts.
    pub fn submitted(&mut self, job: &str, queue: &str) {
        if let Some(&start) = self.new_job_estimates.get(queue) {
            self.estimated(job, queue, start);
        }
    }

    /// The scheduler's latest start estimate of queued job `job`.
    pub fn estimate(&self, job: &str) -> Option<f64> {
        self.estimates.get(job).map(|(_, s)| *s)
    }

    /// Job `job` of `queue` was seen running at `started_s`: its start delay is learned, and
    /// how far the scheduler's last estimate of its start was off.
    pub fn job_started(&mut self, job: &str, queue: &str, submitted_s: f64, started_s: f64) {
        self.started(queue, submitted_s, started_s);
        if let Some((q, estimate)) = self.estimates.remove(job) {
            self.model_mut(&q)
                .estimate_error
                .add((started_s - estimate).abs());
        }
    }

    /// Job `job` ended or left its queue: its estimate is of no more use.
    pub fn forget(&mut self, job: &str) {
        self.estimates.remove(job);
    }

    /// A job of `queue` ended at `ended_s` (started at `started_s`, if it did).
    pub fn ended(&mut self, queue: &str, end: JobEnd, started_s: Option<f64>, ended_s: f64) {
        self.model_mut(queue)
            .ended(end, started_s.map(|s| ended_s - s));
    }

    /// A queued job of `queue` that the queue passed over was cancelled after waiting
    /// `waited_s`, to be sent again: its wait would have been longer, and the shape of the
    /// queue's waits learns it so (see [`WaitShape::add_censored`]).
    pub fn gave_up_straggling(&mut self, queue: &str, waited_s: f64) {
        self.model_mut(queue)
            .wait_shape
            .add_censored(waited_s.max(0.0));
    }

    /// This round's running jobs of each queue: the most seen at once is the run's running
    /// limit there, as far as the run can tell.
    pub fn saw_running(&mut self, queues: &[QueueView]) {
        for q in queues {
            let running = q
                .jobs
                .iter()
                .filter(|j| j.started_s.is_some() && !j.cancelling)
                .count() as u32;
            if running > self.model(&q.name).map_or(0, |m| m.most_running) {
                self.model_mut(&q.name).most_running = running;
            }
        }
    }

    /// The round at `now_s` found `queue` stopped, its longest queued job waiting
    /// `longest_wait_s`: the jobs caught in the stop are not learned into the shape of its
    /// waits.
    pub fn saw_stopped(&mut self, queue: &str, now_s: f64, longest_wait_s: f64) {
        let model = self.model_mut(queue);
        let since = model
            .last_start_s
            .map_or(now_s - longest_wait_s, |s| s.max(now_s - longest_wait_s));
        model.stopped_since(since);
    }

    fn model_mut(&mut self, queue: &str) -> &mut QueueModel {
        self.models.entry(queue.to_string()).or_default()
    }

    /// This round's jobs, twins and moves.
    pub fn plan(&self, round: &Round<'_>) -> RoutePlan {
        match self.route {
            Route::Static => {
                let (jobs, cut_short) = static_jobs(round);
                RoutePlan {
                    jobs,
                    cut_short,
                    outlook: adaptive::outlook(self, round),
                    ..RoutePlan::default()
                }
            }
            Route::Adaptive => adaptive::plan(self, round),
        }
    }
}

/// The static route's jobs, and whether it ran out of a cut `pending` list.
fn static_jobs(round: &Round<'_>) -> (Vec<PlannedJob>, bool) {
    fill_queues(round)
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_limits;
