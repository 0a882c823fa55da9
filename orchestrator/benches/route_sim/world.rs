//! The made-up cluster, and the loop's part of each poll and round as `embedfleet submit` does
//! it: job rows as run.db holds them (one per batch of a job), each state change told to
//! [`Routing`] as the loop tells it, cancelled jobs holding their place until the next poll
//! sees them ended, refused submissions cooling their queue off.

use std::collections::{BTreeMap, BTreeSet};

use embedfleet_core::rundb::JobRow;
use embedfleet_core::state::JobStatus;
use embedfleet_orchestrator::route::{Pending, PlannedJob, Route, Routing};
use embedfleet_orchestrator::sample::Rng;

use super::{BATCHES, POLL_S, RUN_S};

/// One queue of the made-up cluster.
#[derive(Clone, Debug)]
pub struct QueueSpec {
    pub name: String,
    /// Jobs the run may hold there, queued or running (the user's cap, `--queue NAME=CAP`).
    pub cap: u32,
    /// Jobs of ours it runs at once (a per-user limit of running jobs): the rest wait behind.
    pub running: u32,
    /// The wait for a node apart from our own jobs ahead: log-normal, this median and sigma.
    pub wait_median_s: f64,
    pub wait_sigma: f64,
    /// Share of started jobs preempted, at a uniform point of their run.
    pub preempt: f64,
    /// A preempted job is put back in the queue by the scheduler (Slurm's `PreemptMode=
    /// REQUEUE`, a rerunnable PBS job), rather than ended.
    pub requeue: bool,
    /// Starts no job for this long from when half the batches are done (a maintenance window
    /// mid-run).
    pub closed_for_s: Option<f64>,
    /// Refuses submissions for this long from when a quarter of the batches are done (a
    /// reservation, a drained partition): the loop cools the queue off.
    pub refuses_for_s: Option<f64>,
    /// Batches per job (one per node).
    pub nodes: usize,
}

#[derive(Clone, Debug)]
pub struct Scenario {
    pub label: String,
    pub queues: Vec<QueueSpec>,
    /// `--max-jobs`: jobs over all queues.
    pub max_jobs: Option<u32>,
    /// The scheduler gives start estimates (rough, and blind to each job's own wait).
    pub estimates: bool,
}

impl Scenario {
    /// The same queues, named so that their name order is reversed: the static route fills
    /// queues in name order, and which goes first can matter.
    pub fn queue_order_reversed(&self) -> Self {
        let mut names: Vec<String> = self.queues.iter().map(|q| q.name.clone()).collect();
        names.sort();
        let mut s = self.clone();
        for q in &mut s.queues {
            let rank = names.iter().position(|n| *n == q.name).unwrap();
            q.name = format!("{}-{}", names.len() - 1 - rank, q.name);
        }
        s
    }
}

#[derive(Default, Debug, Clone)]
pub struct Outcome {
    pub wall_h: f64,
    pub node_h: f64,
    /// Node-hours of jobs cancelled because their batch's twin finished first, and of moved
    /// jobs that had started (as the loop counts them).
    pub twin_node_h: f64,
    pub move_node_h: f64,
    pub twins: f64,
    pub moves: f64,
    /// Jobs routing cancelled (moves and slower twins).
    pub cancelled: f64,
    /// Rounds whose plan walked past the batches first read and was made again from more.
    pub cut_short: f64,
    pub rounds: f64,
}

/// One run for each of seeds 1 to `seeds`.
pub fn runs(seeds: u64, run: impl Fn(u64) -> Outcome) -> Vec<Outcome> {
    (1..=seeds).map(run).collect()
}

/// Means over runs.
pub fn mean(runs: &[Outcome]) -> Outcome {
    let mut sum = Outcome::default();
    let n = runs.len() as f64;
    for o in runs {
        sum.wall_h += o.wall_h / n;
        sum.node_h += o.node_h / n;
        sum.twin_node_h += o.twin_node_h / n;
        sum.move_node_h += o.move_node_h / n;
        sum.twins += o.twins / n;
        sum.moves += o.moves / n;
        sum.cancelled += o.cancelled / n;
        sum.cut_short += o.cut_short / n;
        sum.rounds += o.rounds / n;
    }
    sum
}

/// The world's draws: a log-normal wait around a median.
pub fn lognormal(rng: &mut Rng, median: f64, sigma: f64) -> f64 {
    median * (sigma * rng.normal()).exp()
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum End {
    Finished,
    Preempted,
}

/// What the world knows of a job the loop sent.
struct JobWorld {
    queue: usize,
    batches: usize,
    /// When its wait for a node is over; it starts then if the queue has room for it.
    ready: f64,
    started: Option<f64>,
    ends: Option<(f64, End)>,
    cancelled_at: Option<f64>,
}

struct Sim<'a> {
    s: &'a Scenario,
    routing: Routing,
    rng: Rng,
    t: f64,
    /// The open jobs' rows, as run.db's `open_jobs` gives them.
    rows: Vec<JobRow>,
    world: BTreeMap<String, JobWorld>,
    pending: BTreeSet<i64>,
    done: BTreeSet<i64>,
    next_id: u64,
    out: Outcome,
    half_done_at: Option<f64>,
    quarter_done_at: Option<f64>,
}

pub fn simulate(s: &Scenario, route: Route, speculate: bool, seed: u64) -> Outcome {
    let mut sim = Sim {
        s,
        routing: Routing::new(route, speculate, s.max_jobs),
        rng: Rng(seed),
        t: 0.0,
        rows: Vec::new(),
        world: BTreeMap::new(),
        pending: (1..=BATCHES).collect(),
        done: BTreeSet::new(),
        next_id: 0,
        out: Outcome::default(),
        half_done_at: None,
        quarter_done_at: None,
    };
    while sim.done.len() < BATCHES as usize {
        sim.t += POLL_S;
        sim.milestones();
        sim.world();
        sim.poll();
        if sim.done.len() == BATCHES as usize {
            break;
        }
        if s.estimates {
            sim.estimates();
        }
        sim.round();
        sim.out.rounds += 1.0;
        assert!(
            sim.t < 3600.0 * 24.0 * 60.0,
            "the simulated run did not end in 60 days"
        );
    }
    let r = &sim.routing;
    Outcome {
        wall_h: sim.t / 3600.0,
        twin_node_h: r.twin_node_hours,
        move_node_h: r.move_node_hours,
        twins: r.twins as f64,
        moves: r.moves as f64,
        ..sim.out
    }
}

impl Sim<'_> {
    fn milestones(&mut self) {
        let done = self.done.len() as i64;
        if self.quarter_done_at.is_none() && done >= BATCHES / 4 {
            self.quarter_done_at = Some(self.t);
        }
        if self.half_done_at.is_none() && done >= BATCHES / 2 {
            self.half_done_at = Some(self.t);
        }
    }

    fn within(&self, from: Option<f64>, for_s: Option<f64>) -> bool {
        matches!((from, for_s), (Some(f), Some(d)) if self.t >= f && self.t < f + d)
    }

    /// The made-up cluster: puts preempted jobs back in their queue where it requeues them,
    /// starts ready jobs (first ready, first started) within each queue's running limit and
    /// outside its closed window, and decides how each started job ends.
    fn world(&mut self) {
        let t = self.t;
        for j in self.world.values_mut() {
            let spec = &self.s.queues[j.queue];
            if let (Some((at, End::Preempted)), true, None) = (j.ends, spec.requeue, j.cancelled_at)
            {
                if at <= t {
                    self.out.node_h += (at - j.started.unwrap()) / 3600.0 * j.batches as f64;
                    j.started = None;
                    j.ends = None;
                    j.ready = at + lognormal(&mut self.rng, spec.wait_median_s, spec.wait_sigma);
                }
            }
        }
        for q in 0..self.s.queues.len() {
            if !self.within(self.half_done_at, self.s.queues[q].closed_for_s) {
                self.start_ready(q);
            }
        }
    }

    /// Starts queue `q`'s ready jobs, first ready first, in its free running places: each no
    /// sooner than it was ready and than its place freed (a job that ended since the last
    /// poll frees its place when it ended; the world moves a poll at a time).
    fn start_ready(&mut self, q: usize) {
        let t = self.t;
        let spec = &self.s.queues[q];
        let live = |j: &JobWorld| j.queue == q && j.cancelled_at.is_none();
        let running = self
            .world
            .values()
            .filter(|j| live(j) && j.started.is_some() && j.ends.is_some_and(|(at, _)| at > t))
            .count();
        let free = (spec.running as usize).saturating_sub(running);
        // When each free place freed: jobs that ended or were cancelled since the last poll,
        // the latest last (they are still here until the loop polls them), the rest before.
        let mut freed: Vec<f64> = self
            .world
            .values()
            .filter(|j| j.queue == q && j.started.is_some())
            .filter_map(|j| match (j.cancelled_at, j.ends) {
                (Some(c), _) => Some(c),
                (None, Some((at, _))) if at <= t => Some(at),
                _ => None,
            })
            .filter(|at| *at > t - POLL_S)
            .collect();
        freed.sort_by(f64::total_cmp);
        let mut places = vec![t - POLL_S; free.saturating_sub(freed.len())];
        places.extend(freed.into_iter().rev().take(free).rev());
        places.sort_by(f64::total_cmp);
        let mut ready: Vec<(f64, String)> = self
            .world
            .iter()
            .filter(|(_, j)| live(j) && j.started.is_none() && j.ready <= t)
            .map(|(n, j)| (j.ready, n.clone()))
            .collect();
        ready.sort_by(|a, b| a.0.total_cmp(&b.0));
        let preempt = spec.preempt;
        for ((ready_at, name), place) in ready.into_iter().zip(places) {
            let start = ready_at.max(place).max(t - POLL_S);
            let run = RUN_S * (1.0 + 0.03 * self.rng.normal()).max(0.5);
            let end = if self.rng.unit() < preempt {
                (start + run * self.rng.unit(), End::Preempted)
            } else {
                (start + run, End::Finished)
            };
            let j = self.world.get_mut(&name).unwrap();
            j.started = Some(start);
            j.ends = Some(end);
        }
    }

    /// What the scheduler says of each open job now.
    fn status(&self, j: &JobWorld) -> JobStatus {
        if j.cancelled_at.is_some_and(|c| c < self.t) {
            return JobStatus::Cancelled;
        }
        match j.ends {
            Some((at, End::Finished)) if at <= self.t => JobStatus::Completed,
            Some((at, End::Preempted)) if at <= self.t => JobStatus::Preempted,
            _ if j.started.is_some() => JobStatus::Running,
            _ => JobStatus::Pending,
        }
    }

    /// The loop's poll: each job whose state changed is told to routing and recorded; an
    /// ended one is settled.
    fn poll(&mut self) {
        let t = self.t;
        let names: Vec<String> = self.world.keys().cloned().collect();
        for name in names {
            let status = self.status(&self.world[&name]);
            let first = self.rows.iter().position(|r| r.name == name).unwrap();
            if !status.is_open() {
                self.ended(&name, status);
                continue;
            }
            if status != self.rows[first].state {
                self.routing.saw(&self.rows[first], status, t);
                for r in self.rows.iter_mut().filter(|r| r.name == name) {
                    r.state = status;
                    if status == JobStatus::Running && r.started_s.is_none() {
                        r.started_s = Some(t);
                    }
                }
            }
        }
    }

    /// A job ended, as the loop's `ended` settles it: routing hears why (its own cancel, or
    /// the scheduler's end), a batch it finished is done and its twin cancelled, any other is
    /// sent again.
    fn ended(&mut self, name: &str, status: JobStatus) {
        let t = self.t;
        let job = self.world.remove(name).unwrap();
        let rows: Vec<JobRow> = self
            .rows
            .iter()
            .filter(|r| r.name == name)
            .cloned()
            .collect();
        self.rows.retain(|r| r.name != name);
        let refs: Vec<&JobRow> = rows.iter().collect();
        if self.routing.ended_by_routing(&refs, t).is_some() {
            self.out.cancelled += 1.0;
        }
        self.routing.saw(&rows[0], status, t);
        if let Some(started) = job.started {
            let until = job.cancelled_at.or(job.ends.map(|e| e.0)).unwrap_or(t);
            self.out.node_h += (until - started).max(0.0) / 3600.0 * job.batches as f64;
        }
        let batches: Vec<i64> = rows.iter().map(|r| r.batch_id).collect();
        if status == JobStatus::Completed {
            let fresh: Vec<i64> = batches
                .iter()
                .copied()
                .filter(|b| self.done.insert(*b))
                .collect();
            let twins: Vec<Vec<JobRow>> = self
                .routing
                .twins_to_cancel(name, &fresh, &self.rows)
                .into_iter()
                .map(|rows| rows.into_iter().cloned().collect())
                .collect();
            for twin in twins {
                self.world.get_mut(&twin[0].name).unwrap().cancelled_at = Some(t);
                let refs: Vec<&JobRow> = twin.iter().collect();
                self.routing.twin_cancelled(&refs, name, t);
            }
            return;
        }
        for b in batches {
            if !self.done.contains(&b) && !self.rows.iter().any(|r| r.batch_id == b) {
                self.pending.insert(b);
            }
        }
    }

    /// The scheduler's start estimates, for each queued job and for a job sent now to each
    /// queue: rough, and blind to each job's own draw (a scheduler does not know when the
    /// nodes free): the queue's median wait from when the job was sent, times e^N(0,1), and
    /// no sooner than now. (Estimates that knew the draws would beat the bound, which assumes
    /// a rule that only knows how long a job has waited.)
    fn estimates(&mut self) {
        let t = self.t;
        let rows: Vec<(String, String, f64)> = self
            .world
            .iter()
            .filter(|(_, j)| j.started.is_none() && j.cancelled_at.is_none())
            .map(|(name, _)| {
                let first = self.rows.iter().find(|r| &r.name == name).unwrap();
                (
                    name.clone(),
                    first.queue.clone(),
                    first.submitted_s.unwrap_or(t),
                )
            })
            .collect();
        let median = |queue: &str| {
            let q = self.s.queues.iter().find(|q| q.name == queue).unwrap();
            q.wait_median_s
        };
        for (name, queue, sent) in rows {
            let at = sent + median(&queue) * self.rng.normal().exp();
            self.routing.router.estimated(&name, &queue, at.max(t));
        }
        for spec in &self.s.queues {
            let at = t + spec.wait_median_s * self.rng.normal().exp();
            self.routing.router.new_job_estimated(&spec.name, at);
        }
    }

    /// The loop's round: the plan from the open rows, the moved jobs cancelled, the jobs and
    /// twins sent (a queue refusing submissions cools off).
    fn round(&mut self) {
        let t = self.t;
        let caps: BTreeMap<String, u32> = self
            .s
            .queues
            .iter()
            .map(|q| (q.name.clone(), q.cap))
            .collect();
        let nodes: BTreeMap<&str, usize> = self
            .s
            .queues
            .iter()
            .map(|q| (q.name.as_str(), q.nodes))
            .collect();
        let disabled: BTreeSet<String> = self.routing.cooling(t).cloned().collect();
        // As the loop reads them: the first few, more while a plan walks to their end.
        let mut want = Pending::to_read_first(&caps, |q| nodes[q]);
        let plan = loop {
            let first: Vec<i64> = self.pending.iter().copied().take(want).collect();
            let pending = Pending {
                batches: &first,
                cut: self.pending.len() > want,
            };
            let plan = self
                .routing
                .round(&caps, |q| nodes[q], &self.rows, pending, &disabled, t);
            if !plan.cut_short {
                break plan;
            }
            self.out.cut_short += 1.0;
            want = Pending::more(want);
        };
        for mv in &plan.moves {
            if self.routing.cancelling(&mv.job) {
                continue;
            }
            let Some(row) = self.rows.iter().find(|r| r.name == mv.job).cloned() else {
                continue;
            };
            self.world.get_mut(&mv.job).unwrap().cancelled_at = Some(t);
            self.routing.moved(mv, &row, t);
        }
        let mut failed_now = BTreeSet::new();
        for (k, job) in plan.jobs.iter().chain(&plan.twins).enumerate() {
            if failed_now.contains(&job.queue) {
                continue;
            }
            let q = self
                .s
                .queues
                .iter()
                .position(|s| s.name == job.queue)
                .unwrap();
            if self.within(self.quarter_done_at, self.s.queues[q].refuses_for_s) {
                failed_now.insert(job.queue.clone());
                self.routing.submission_failed(&job.queue, t, POLL_S);
                continue;
            }
            let name = self.send(q, job);
            self.routing.sent(&name, &job.queue, k >= plan.jobs.len());
        }
    }

    /// A job of `planned`'s batches on queue `q`: its rows (as `insert_job` and
    /// `set_job_submitted` leave them) and its world.
    fn send(&mut self, q: usize, planned: &PlannedJob) -> String {
        let spec = &self.s.queues[q];
        self.next_id += 1;
        let name = format!("j{:07}", self.next_id);
        for &b in &planned.batches {
            self.pending.remove(&b);
            self.rows.push(JobRow {
                batch_id: b,
                attempt: 1,
                backend: "sim".into(),
                queue: spec.name.clone(),
                name: name.clone(),
                scheduler_id: Some(name.clone()),
                state: JobStatus::Pending,
                exit_reason: None,
                log: None,
                marker: None,
                submitted_s: Some(self.t),
                started_s: None,
            });
        }
        let ready = self.t + lognormal(&mut self.rng, spec.wait_median_s, spec.wait_sigma);
        self.world.insert(
            name.clone(),
            JobWorld {
                queue: q,
                batches: planned.batches.len(),
                ready,
                started: None,
                ends: None,
                cancelled_at: None,
            },
        );
        name
    }
}
