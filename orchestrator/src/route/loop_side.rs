//! The submit loop's side of routing, without its I/O: what the loop tells the [`Router`] when
//! it sees a job start, end, go back to its queue (a requeue) or get a start estimate; the
//! round's plan from the run's open job rows; the jobs routing cancelled (a move, the slower
//! twin), which hold their place until the scheduler says they ended; and what twins and moves
//! cost. The loop (`submit/routing.rs`) does the scheduler's and run.db's part around these
//! calls, and the simulator (`benches/route_sim.rs`) calls the same functions with its
//! made-up queues: what it measures is this code.

use std::collections::{BTreeMap, BTreeSet};

use embedfleet_core::rundb::JobRow;
use embedfleet_core::state::JobStatus;
use embedfleet_core::status_snapshot::RoutingState;

use super::{
    JobEnd, Move, MoveKind, OpenJob, Pending, QueueOutlook, QueueView, Round, Route, RoutePlan,
    Router,
};

/// What the loop saw of a job, for its own bookkeeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    Nothing,
    Started,
    /// Back in its queue after running: the scheduler requeued it (a preemption).
    Requeued,
    Ended(JobEnd),
}

/// A job routing cancelled, until the scheduler says it ended.
#[derive(Debug, Clone)]
struct Cancelling {
    why: String,
    /// A move (its batches' try is given back), not the slower twin.
    moved: bool,
}

/// The router and what routing did in one loop.
#[derive(Debug, Clone)]
pub struct Routing {
    pub router: Router,
    /// Whether the tail gets speculative twins (`--speculate`).
    pub speculate: bool,
    /// The most jobs the run may hold over all queues (`--max-jobs`, or the scheduler's).
    pub max_jobs: Option<u32>,
    pub twins: u64,
    pub moves: u64,
    /// Jobs the scheduler put back in their queue after they ran.
    pub requeued: u64,
    /// Node-hours run by jobs cancelled because their batch's twin finished first, and by
    /// moved jobs that started before their cancel took effect.
    pub twin_node_hours: f64,
    pub move_node_hours: f64,
    pub next: Option<String>,
    pub outlook: Vec<QueueOutlook>,
    cancelling: BTreeMap<String, Cancelling>,
    /// Jobs the scheduler requeued: when their present wait began, and, once they run again,
    /// when that run began.
    waiting_since: BTreeMap<String, f64>,
    restarted: BTreeMap<String, f64>,
    /// Queues whose last submission failed in a way worth waiting out (a drained partition, a
    /// slow controller): until when their batches go to the other queues, and how many failed
    /// in a row.
    cooling: BTreeMap<String, (f64, u32)>,
}

/// The longest a queue whose submissions fail is left out of the rounds before it is tried
/// again, seconds.
pub const QUEUE_COOLING_MAX_S: f64 = 300.0;

impl Routing {
    pub fn new(route: Route, speculate: bool, max_jobs: Option<u32>) -> Self {
        Self {
            router: Router::new(route),
            speculate,
            max_jobs,
            twins: 0,
            moves: 0,
            requeued: 0,
            twin_node_hours: 0.0,
            move_node_hours: 0.0,
            next: None,
            outlook: Vec::new(),
            cancelling: BTreeMap::new(),
            waiting_since: BTreeMap::new(),
            restarted: BTreeMap::new(),
            cooling: BTreeMap::new(),
        }
    }

    /// Job `name` was sent to `queue` (a speculative twin, or not).
    pub fn sent(&mut self, name: &str, queue: &str, twin: bool) {
        self.router.submitted(name, queue);
        self.twins += u64::from(twin);
        self.cooling.remove(queue);
    }

    /// A submission to `queue` failed in a way worth waiting out: the queue gets no job for
    /// one poll, then two, four, ... (doubling with each failure in a row) up to
    /// [`QUEUE_COOLING_MAX_S`]. Returns how long, seconds.
    pub fn submission_failed(&mut self, queue: &str, now_s: f64, poll_s: f64) -> f64 {
        let failures = self.cooling.get(queue).map_or(0, |(_, n)| *n) + 1;
        let wait = (poll_s * f64::from(1u32 << (failures - 1).min(16))).min(QUEUE_COOLING_MAX_S);
        self.cooling
            .insert(queue.to_string(), (now_s + wait, failures));
        wait
    }

    /// The queues cooling off after a failed submission at `now_s`.
    pub fn cooling(&self, now_s: f64) -> impl Iterator<Item = &String> {
        self.cooling
            .iter()
            .filter(move |(_, (until, _))| *until > now_s)
            .map(|(q, _)| q)
    }

    /// When job `row`'s present run began, if it runs (run.db keeps a requeued job's first).
    fn running_since(&self, row: &JobRow) -> Option<f64> {
        if row.state != JobStatus::Running {
            return None;
        }
        self.restarted.get(&row.name).copied().or(row.started_s)
    }

    /// When job `row`'s present wait began: its submission, or its requeue.
    fn wait_began(&self, row: &JobRow, now_s: f64) -> f64 {
        self.waiting_since
            .get(&row.name)
            .copied()
            .or(row.submitted_s)
            .unwrap_or(now_s)
    }

    /// The loop saw job `row` (the first row of its job) go from its recorded state to
    /// `status` at `now_s`.
    pub fn saw(&mut self, row: &JobRow, status: JobStatus, now_s: f64) -> Seen {
        let started = |r: &Self| r.running_since(row);
        match (row.state, status) {
            (JobStatus::Running, JobStatus::Running) => Seen::Nothing,
            (_, JobStatus::Running) => {
                let began = self.wait_began(row, now_s);
                self.router.job_started(&row.name, &row.queue, began, now_s);
                if self.waiting_since.remove(&row.name).is_some() {
                    self.restarted.insert(row.name.clone(), now_s);
                }
                Seen::Started
            }
            (JobStatus::Running, JobStatus::Pending) => {
                let ran_from = started(self);
                self.router
                    .ended(&row.queue, JobEnd::Preempted, ran_from, now_s);
                self.restarted.remove(&row.name);
                self.waiting_since.insert(row.name.clone(), now_s);
                self.requeued += 1;
                Seen::Requeued
            }
            (_, end) if !end.is_open() => {
                let ran_from = started(self);
                self.end(row, end, ran_from, now_s)
            }
            _ => Seen::Nothing,
        }
    }

    /// Job `row` ended as `status` at `now_s` and the loop never saw it run (it ran between
    /// two polls, or while no loop ran); its embed run says it began at `began_s`. Its start
    /// and run time are learned as a sighting's would be, as a restarted loop learns them from
    /// run.db; without the run's record (or for a requeued job, whose record holds its first
    /// run's start too) it is [`Routing::saw`]'s end with no start.
    pub fn saw_end_unseen(
        &mut self,
        row: &JobRow,
        status: JobStatus,
        began_s: Option<f64>,
        now_s: f64,
    ) -> Seen {
        // A requeued job's record holds its first run's start too: not this run's.
        let requeued = self.waiting_since.contains_key(&row.name);
        let (Some(began), false, true, false) = (
            began_s,
            status.is_open(),
            row.state != JobStatus::Running,
            requeued,
        ) else {
            return self.saw(row, status, now_s);
        };
        let waited_from = self.wait_began(row, now_s);
        // A compute node's clock may run ahead of the loop's, or behind its submission.
        let began = began.clamp(waited_from.min(now_s), now_s);
        self.router
            .job_started(&row.name, &row.queue, waited_from, began);
        self.end(row, status, Some(began), now_s)
    }

    /// Job `row` ended as `end` at `now_s`, having run from `ran_from` if it ran.
    fn end(&mut self, row: &JobRow, end: JobStatus, ran_from: Option<f64>, now_s: f64) -> Seen {
        self.router.forget(&row.name);
        self.waiting_since.remove(&row.name);
        self.restarted.remove(&row.name);
        let end = JobEnd::of(end);
        self.router.ended(&row.queue, end, ran_from, now_s);
        Seen::Ended(end)
    }

    /// This round's plan from the run's open job rows (one per batch of a job), its queues'
    /// caps, the batches per job of each queue, the batches without a job (all of them, or
    /// the first of them) and the queues that take none now. Asked again in the same round
    /// with more batches (a plan `cut_short`), it decides from the same knowledge.
    pub fn round(
        &mut self,
        caps: &BTreeMap<String, u32>,
        nodes: impl Fn(&str) -> usize,
        open: &[JobRow],
        pending: Pending<'_>,
        disabled: &BTreeSet<String>,
        now_s: f64,
    ) -> RoutePlan {
        let queues = self.views(caps, nodes, open, disabled, now_s);
        self.router.saw_running(&queues);
        let plan = self.router.plan(&Round {
            now_s,
            queues: &queues,
            pending,
            speculate: self.speculate,
            max_jobs: self.max_jobs,
        });
        for q in plan.outlook.iter().filter(|q| q.state == "stopped") {
            self.router.saw_stopped(&q.queue, now_s, q.longest_wait_s);
        }
        self.next = plan.next.clone();
        self.outlook = plan.outlook.clone();
        plan
    }

    fn views(
        &self,
        caps: &BTreeMap<String, u32>,
        nodes: impl Fn(&str) -> usize,
        open: &[JobRow],
        disabled: &BTreeSet<String>,
        now_s: f64,
    ) -> Vec<QueueView> {
        let mut jobs: BTreeMap<&str, BTreeMap<&str, OpenJob>> = BTreeMap::new();
        for row in open {
            let job = jobs
                .entry(row.queue.as_str())
                .or_default()
                .entry(row.name.as_str())
                .or_insert_with(|| OpenJob {
                    name: row.name.clone(),
                    batches: Vec::new(),
                    submitted_s: self.wait_began(row, now_s),
                    started_s: self.running_since(row),
                    cancelling: self.cancelling.contains_key(&row.name),
                });
            job.batches.push(row.batch_id);
        }
        caps.iter()
            .map(|(name, cap)| QueueView {
                name: name.clone(),
                cap: *cap,
                usable: !disabled.contains(name),
                nodes: nodes(name),
                jobs: jobs
                    .remove(name.as_str())
                    .map(|j| j.into_values().collect())
                    .unwrap_or_default(),
            })
            .collect()
    }

    /// Whether this loop cancelled job `name` and waits for it to end.
    pub fn cancelling(&self, name: &str) -> bool {
        self.cancelling.contains_key(name)
    }

    /// The loop cancelled queued job `row` as `mv` said: it holds its place until it ended,
    /// then its batches are routed again. Returns the reason, for the job's row and the user.
    pub fn moved(&mut self, mv: &Move, row: &JobRow, now_s: f64) -> String {
        // A stopped queue's moved jobs teach it nothing: it counts as stopped until it starts
        // a job again (it keeps its newest one for that), and its waits then were not its
        // usual ones. (Learning them as starts kept a queue that had come back from a
        // maintenance window looking slow for hours: BENCHMARKS.md, "Routing between queues".)
        if mv.kind == MoveKind::Straggler {
            let waited = now_s - self.wait_began(row, now_s);
            self.router.gave_up_straggling(&mv.queue, waited);
        }
        self.moves += 1;
        let why = format!("moved: {}", mv.why);
        self.cancelling.insert(
            mv.job.clone(),
            Cancelling {
                why: why.clone(),
                moved: true,
            },
        );
        why
    }

    /// Job `finished` ended having done `done` of its batches: the other open jobs of those
    /// batches (speculative twins), each once with its rows, to cancel.
    pub fn twins_to_cancel<'r>(
        &self,
        finished: &str,
        done: &[i64],
        open: &'r [JobRow],
    ) -> Vec<Vec<&'r JobRow>> {
        let mut twins: BTreeMap<&str, Vec<&JobRow>> = BTreeMap::new();
        let names: BTreeSet<&str> = open
            .iter()
            .filter(|r| r.name != finished && done.contains(&r.batch_id))
            .filter(|r| !self.cancelling.contains_key(&r.name))
            .map(|r| r.name.as_str())
            .collect();
        for r in open.iter().filter(|r| names.contains(r.name.as_str())) {
            twins.entry(r.name.as_str()).or_default().push(r);
        }
        twins.into_values().collect()
    }

    /// The loop cancelled twin `rows` (one per batch and node) because `finished` did its
    /// batch first: what it ran counts as the twins' cost. Returns the reason.
    pub fn twin_cancelled(&mut self, rows: &[&JobRow], finished: &str, now_s: f64) -> String {
        self.twin_node_hours += self.node_hours(rows, now_s);
        let why = format!("its batch was finished first by its twin {finished}");
        self.cancelling.insert(
            rows[0].name.clone(),
            Cancelling {
                why: why.clone(),
                moved: false,
            },
        );
        why
    }

    /// Job `rows` ended at `now_s`: if routing cancelled it, why and whether it was a move
    /// (whose batches get back the try it cost). A moved job that started before its cancel
    /// took effect counts what it ran as the moves' cost.
    pub fn ended_by_routing(&mut self, rows: &[&JobRow], now_s: f64) -> Option<(String, bool)> {
        let cancelled = self.cancelling.remove(&rows.first()?.name)?;
        if cancelled.moved {
            self.move_node_hours += self.node_hours(rows, now_s);
        }
        Some((cancelled.why, cancelled.moved))
    }

    /// Node-hours a job of `rows` (one per node) has run by `now_s`, if it runs.
    fn node_hours(&self, rows: &[&JobRow], now_s: f64) -> f64 {
        let Some(since) = rows.first().and_then(|r| self.running_since(r)) else {
            return 0.0;
        };
        (now_s - since).max(0.0) / 3600.0 * rows.len() as f64
    }

    /// The routing part of the snapshot.
    pub fn state(&self) -> RoutingState {
        RoutingState {
            route: self.router.route.name().into(),
            speculate: self.speculate,
            next: self.next.clone(),
            queues: self.outlook.clone(),
            twins: self.twins,
            moves: self.moves,
            twin_node_hours: self.twin_node_hours,
            move_node_hours: self.move_node_hours,
            max_jobs: self.max_jobs,
            scheduler_limit: None,
        }
    }
}
