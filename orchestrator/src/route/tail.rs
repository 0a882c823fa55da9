//! The slots of the known queues, and what the adaptive route does beyond sending new jobs:
//! moving the queued jobs of a queue that stopped starting jobs, and, at the tail, a
//! speculative twin of a batch whose job waits far longer than another queue's start.

use std::collections::BTreeMap;

use super::assess::Assessed;
use super::model::SHAPE_SAMPLES;
use super::{Move, MoveKind, OpenJob, PlannedJob, Round};

/// A move must save at least this share of the time left where the job waits: cancelling
/// and sending again costs a new wait, and the estimate of either side is rough.
const MOVE_SAVES: f64 = 0.25;
/// A straggler is sent again when a new job would finish its batch in this share of the time
/// it is expected to take where it waits, or less.
const STRAGGLER_SAVES: f64 = 0.25;
/// A queued job gets a twin once it has waited this many times the other queue's expected
/// start (and the twin is expected to finish first).
const TWIN_AFTER_STARTS: f64 = 2.0;

/// When each slot of each usable queue is expected to be free.
pub(super) struct Slots {
    free: Vec<Vec<f64>>,
    now: f64,
}

/// How soon, at the earliest, an open job's slot frees: after this round.
const HELD_S: f64 = 1.0;

impl Slots {
    pub fn of(queues: &[Assessed], now: f64) -> Self {
        let free = queues
            .iter()
            .map(|q| {
                if !q.usable() {
                    return Vec::new();
                }
                let room = (q.view.cap as usize).saturating_sub(q.view.jobs.len());
                let mut slots = vec![now; room];
                // An open job holds its slot until the scheduler says it ended, however long
                // past its expected end: a slot free "now" would send a job over the cap (and
                // over PBS's `max_queued`, which refuses it).
                slots.extend(q.view.jobs.iter().map(|j| match j.started_s {
                    Some(started) => (started + q.run_s).max(now + HELD_S),
                    None => (now + q.start_left_s(j, now) + q.run_s).max(now + HELD_S),
                }));
                slots
            })
            .collect();
        Self { free, now }
    }

    pub fn earliest(&self, i: usize) -> Option<f64> {
        self.free[i].iter().copied().reduce(f64::min)
    }

    /// The slot of a queue `keep` keeps where a batch would finish soonest: (when it frees,
    /// which queue).
    pub fn best_among(
        &self,
        queues: &[Assessed],
        keep: impl Fn(usize) -> bool,
    ) -> Option<(f64, usize)> {
        (0..queues.len())
            .filter(|&i| keep(i))
            .filter_map(|i| Some((self.earliest(i)?, i)))
            .min_by(|(a, i), (b, j)| {
                let fa = a.max(self.now) + queues[*i].cost_s();
                let fb = b.max(self.now) + queues[*j].cost_s();
                fa.total_cmp(&fb)
            })
    }

    pub fn free_now(&self, i: usize) -> bool {
        self.earliest(i).is_some_and(|t| t <= self.now + 1e-9)
    }

    /// The earliest slot of queue `i` is taken by a job that holds it for `cost_s`.
    pub fn take(&mut self, i: usize, cost_s: f64) {
        let slots = &mut self.free[i];
        if let Some(k) = (0..slots.len()).min_by(|&a, &b| slots[a].total_cmp(&slots[b])) {
            slots[k] = slots[k].max(self.now) + cost_s;
        }
    }
}

pub(super) fn moves_and_twins(
    queues: &[Assessed],
    slots: &mut Slots,
    round: &Round<'_>,
    no_batch_waiting: bool,
    places: usize,
) -> (Vec<Move>, Vec<PlannedJob>) {
    let jobs_of = jobs_per_batch(round);
    let mut moves = stopped_moves(queues, slots, round.now_s, &jobs_of);
    moves.extend(straggler_moves(queues, slots, round.now_s, &moves));
    let twins = if round.speculate && no_batch_waiting {
        twins(queues, slots, round, &moves, &jobs_of, places)
    } else {
        Vec::new()
    };
    (moves, twins)
}

/// How many open jobs each batch has: two while a speculative twin runs beside the first.
fn jobs_per_batch(round: &Round<'_>) -> BTreeMap<i64, u32> {
    let mut jobs_of: BTreeMap<i64, u32> = BTreeMap::new();
    for q in round.queues {
        for j in &q.jobs {
            for b in &j.batches {
                *jobs_of.entry(*b).or_default() += 1;
            }
        }
    }
    jobs_of
}

/// Whether `job`'s batches have no other open job (no twin).
fn alone(job: &OpenJob, jobs_of: &BTreeMap<i64, u32>) -> bool {
    job.batches.iter().all(|b| jobs_of.get(b) == Some(&1))
}

/// The queued jobs of stopped queues, oldest first, that would finish sooner sent elsewhere.
/// Each stopped queue keeps its newest queued job, to notice when it starts jobs again. A job
/// whose batch has a twin already is not moved: the twin is the batch's second job, and a
/// move would send a third.
fn stopped_moves(
    queues: &[Assessed],
    slots: &mut Slots,
    now: f64,
    jobs_of: &BTreeMap<i64, u32>,
) -> Vec<Move> {
    let mut moves = Vec::new();
    for q in queues.iter().filter(|q| q.stopped && q.usable()) {
        let mut queued: Vec<_> = q
            .view
            .jobs
            .iter()
            .filter(|j| j.started_s.is_none() && !j.cancelling)
            .collect();
        queued.sort_by(|a, b| a.submitted_s.total_cmp(&b.submitted_s));
        queued.pop();
        for job in queued.into_iter().filter(|j| alone(j, jobs_of)) {
            let waited = now - job.submitted_s;
            let here = q.start_left_s(job, now) + q.run_s;
            // A slot free now: a slot that frees later is taken by the batches without a job
            // in turn, and the moved one would take it only by making another wait.
            let other = |i: usize| {
                !queues[i].stopped && queues[i].view.name != q.view.name && slots.free_now(i)
            };
            let Some((at, i)) = slots.best_among(queues, other) else {
                break;
            };
            let there = at.max(now) - now + queues[i].cost_s();
            if there > (1.0 - MOVE_SAVES) * here {
                break;
            }
            slots.take(i, queues[i].cost_s());
            let usually = match q.model.start_delay.get() {
                Some(d) => format!("it usually starts jobs in {}", duration(d)),
                None => "it has started none of the run's jobs yet".to_string(),
            };
            moves.push(Move {
                job: job.name.clone(),
                queue: q.view.name.clone(),
                kind: MoveKind::Stopped,
                why: format!(
                    "queued on {} for {} ({usually}): done sooner on {} (~{} against ~{})",
                    q.view.name,
                    duration(waited),
                    queues[i].view.name,
                    duration(there),
                    duration(here),
                ),
            });
        }
    }
    moves
}

/// The stragglers of queues that still start jobs: a queued job the queue passed over (it
/// started a job sent no earlier), that by the shape of the queue's waits is likely to wait
/// so much longer still that a new job finishes its batch sooner: sent again to its own queue
/// (a new wait in the place it leaves) or to another queue's slot free now, while the queue
/// runs fewer of the run's jobs than it has at once (else they wait for those). Long-tailed waits
/// make this pay: the longer such a job has waited, the longer it is likely to wait. What is
/// left is the shape's alone: a scheduler's estimate that is off (they often are) would pick
/// the jobs it happens to overstate. (Not to
/// a slot that frees later: the batches without a job take those in turn, so the moved
/// batch would finish sooner only by making another later.)
fn straggler_moves(
    queues: &[Assessed],
    slots: &mut Slots,
    now: f64,
    stopped: &[Move],
) -> Vec<Move> {
    let mut moves = Vec::new();
    for (home, q) in queues.iter().enumerate() {
        // At its running limit, a queue's queued jobs wait for the run's own: no straggler
        // is told by its wait there.
        if q.stopped || q.at_limit || !q.usable() || q.model.wait_shape.samples < SHAPE_SAMPLES {
            continue;
        }
        // A twin may straggle too: cancelled, its batch keeps its other job, or (both
        // cancelled) is sent again.
        for job in q
            .view
            .jobs
            .iter()
            .filter(|j| !j.cancelling && q.passed_over(j))
        {
            if stopped.iter().any(|m| m.job == job.name) {
                continue;
            }
            let here = q.left_by_model_s(job, now) + q.run_s;
            // Sent again to its own queue: a new wait in the place it leaves, by the same
            // shape as what is left of this one.
            let mut there = q.fresh_cost_s();
            let mut to = home;
            // Another queue's slot free now, for jobs of as many batches (the moved job's
            // batches go back to the others without a job otherwise).
            let other = |i: usize| {
                i != home
                    && !queues[i].stopped
                    && slots.free_now(i)
                    && queues[i].view.nodes == q.view.nodes
            };
            if let Some((at, i)) = slots.best_among(queues, other) {
                // Elsewhere when it does as well: a queue that passed a job over once may again.
                let t = at.max(now) - now + queues[i].fresh_cost_s();
                if t <= there {
                    (there, to) = (t, i);
                }
            }
            if there > (1.0 - STRAGGLER_SAVES) * here {
                continue;
            }
            if to != home {
                slots.take(to, queues[to].cost_s());
            }
            moves.push(Move {
                job: job.name.clone(),
                queue: q.view.name.clone(),
                kind: MoveKind::Straggler,
                why: format!(
                    "queued on {} for {} while it started jobs sent after it: one that has \
                     waited this long there waits ~{} more; a new job on {} is done in ~{} \
                     (against ~{})",
                    q.view.name,
                    duration(now - job.submitted_s),
                    duration(q.left_by_model_s(job, now)),
                    queues[to].view.name,
                    duration(there),
                    duration(here),
                ),
            });
        }
    }
    moves
}

/// Second jobs for the tail: a queued job whose batches have no other job, that has waited
/// [`TWIN_AFTER_STARTS`] times another queue's expected start while that queue has a free
/// slot (and the run a free place) and would finish it first.
fn twins(
    queues: &[Assessed],
    slots: &mut Slots,
    round: &Round<'_>,
    moves: &[Move],
    jobs_of: &BTreeMap<i64, u32>,
    mut places: usize,
) -> Vec<PlannedJob> {
    let now = round.now_s;
    let mut waiting: Vec<(usize, &OpenJob)> = queues
        .iter()
        .enumerate()
        .flat_map(|(i, q)| q.view.jobs.iter().map(move |j| (i, j)))
        .filter(|(_, j)| j.started_s.is_none() && !j.cancelling)
        .filter(|(_, j)| alone(j, jobs_of))
        .filter(|(_, j)| !moves.iter().any(|m| m.job == j.name))
        .collect();
    waiting.sort_by(|(_, a), (_, b)| a.submitted_s.total_cmp(&b.submitted_s));
    let mut twins = Vec::new();
    for (home, job) in waiting {
        if places == 0 {
            break;
        }
        let waited = now - job.submitted_s;
        let here = queues[home].start_left_s(job, now) + queues[home].run_s;
        let free_elsewhere = |i: usize| {
            i != home
                && !queues[i].stopped
                && slots.free_now(i)
                && queues[i].view.nodes.max(1) >= job.batches.len()
        };
        let Some((_, i)) = slots.best_among(queues, free_elsewhere) else {
            break;
        };
        let there = &queues[i];
        if waited < TWIN_AFTER_STARTS * there.start_s || there.cost_s() >= here {
            continue;
        }
        slots.take(i, there.cost_s());
        places -= 1;
        twins.push(PlannedJob {
            queue: there.view.name.clone(),
            batches: job.batches.clone(),
        });
    }
    twins
}

fn duration(s: f64) -> String {
    crate::status::duration(s)
}
