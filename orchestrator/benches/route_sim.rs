//! A discrete-event simulator of a run's queues, driving the submit loop's own [`Router`]: the
//! same model updates (a job seen started, ended, given up on) and the same round decisions
//! (jobs, moves, twins) as `embedfleet submit`. Only the world is made up: queues that start a
//! job after a drawn wait, within a limit of running jobs, run it for a drawn time, and lose a
//! share of them. Measures the wall time to the last batch, adaptive against static, at the
//! study's shape (2,075 batches of ~40 min), in scenarios whose queues are written down below.
//!
//! Run: `cargo bench -p embedfleet-orchestrator --bench route_sim [-- SEEDS]` (default 5 seeds;
//! seconds). BENCHMARKS.md records the table.

use std::collections::{BTreeMap, BTreeSet};

use embedfleet_orchestrator::route::{JobEnd, OpenJob, QueueView, Round, Route, Router};
use embedfleet_orchestrator::sample::Rng;

/// The study's batch: inference 2,382 s + model load 28 s + I/O 7.5 s.
const RUN_S: f64 = 2_417.5;
const BATCHES: i64 = 2_075;
/// The loop polls every minute (the default poll of a cluster run is 30 s; a minute keeps the
/// simulation to seconds and moves every wait by at most one poll).
const POLL_S: f64 = 60.0;
static WIDTH: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

/// One queue of the made-up cluster.
#[derive(Clone, Debug)]
struct QueueSpec {
    name: &'static str,
    /// Jobs the run may hold there, queued or running (the user's cap, `--queue NAME=CAP`).
    cap: u32,
    /// Jobs of ours it runs at once (a per-user limit of running jobs): the rest wait behind.
    running: u32,
    /// The wait for a node apart from our own jobs ahead: log-normal, this median and sigma.
    wait_median_s: f64,
    wait_sigma: f64,
    /// Share of started jobs preempted, at a uniform point of their run.
    preempt: f64,
    /// Starts no job for this long from when half the batches are done (a maintenance window
    /// mid-run).
    closed_for_s: Option<f64>,
}

/// The world's draws: a log-normal wait around a median.
fn lognormal(rng: &mut Rng, median: f64, sigma: f64) -> f64 {
    median * (sigma * rng.normal()).exp()
}

struct Job {
    name: String,
    queue: usize,
    batch: i64,
    submitted: f64,
    /// When its wait for a node is over; it starts then if the queue has room for it.
    ready: f64,
    started: Option<f64>,
    /// The loop has seen it running.
    seen: bool,
    ends: Option<(f64, JobEnd)>,
}

#[derive(Default, Debug)]
struct Outcome {
    wall_h: f64,
    node_h: f64,
    /// Node-hours of jobs cancelled because their batch's twin finished first.
    twin_node_h: f64,
    twins: f64,
    moves: f64,
    lost: f64,
}

fn simulate(specs: &[QueueSpec], route: Route, speculate: bool, seed: u64) -> Outcome {
    let mut rng = Rng(seed);
    let mut router = Router::new(route);
    let mut pending: BTreeSet<i64> = (1..=BATCHES).collect();
    let mut done: BTreeSet<i64> = BTreeSet::new();
    let mut open: Vec<Job> = Vec::new();
    let mut out = Outcome::default();
    let mut next_id = 0u64;
    let mut t = 0.0;
    let mut half_done_at = None;
    while done.len() < BATCHES as usize {
        t += POLL_S;
        if half_done_at.is_none() && done.len() >= BATCHES as usize / 2 {
            half_done_at = Some(t);
        }
        world(specs, &mut open, &mut rng, t, half_done_at);
        // The loop's poll: starts and ends it sees.
        let mut ended = Vec::new();
        for (k, job) in open.iter_mut().enumerate() {
            let name = specs[job.queue].name;
            if let (Some(_), false) = (job.started, job.seen) {
                job.seen = true;
                router.started(name, job.submitted, t);
            }
            if let Some((at, end)) = job.ends {
                if at <= t {
                    ended.push((k, end));
                }
            }
        }
        let mut finished_batches = Vec::new();
        for (k, end) in ended.iter().rev() {
            let job = open.remove(*k);
            let name = specs[job.queue].name;
            let seen_start = job
                .seen
                .then_some(job.started.unwrap_or(t).max(job.submitted));
            router.ended(name, *end, seen_start.map(|_| job.started.unwrap()), t);
            out.node_h += (t - job.started.unwrap_or(t)) / 3600.0;
            if *end == JobEnd::Finished {
                finished_batches.push(job.batch);
            } else {
                out.lost += 1.0;
                if !open.iter().any(|j| j.batch == job.batch) && !done.contains(&job.batch) {
                    pending.insert(job.batch);
                }
            }
        }
        for batch in finished_batches {
            if !done.insert(batch) {
                continue;
            }
            // Its twin, if any, is cancelled: what it ran is the twins' cost.
            open.retain(|j| {
                if j.batch != batch {
                    return true;
                }
                let ran = (t - j.started.unwrap_or(t)) / 3600.0;
                out.twin_node_h += ran;
                out.node_h += ran;
                router.ended(specs[j.queue].name, JobEnd::Cancelled, j.started, t);
                false
            });
        }
        if done.len() == BATCHES as usize {
            break;
        }
        // The loop's round.
        let views: Vec<QueueView> = specs
            .iter()
            .enumerate()
            .map(|(i, s)| QueueView {
                name: s.name.into(),
                cap: s.cap,
                usable: true,
                jobs: open
                    .iter()
                    .filter(|j| j.queue == i)
                    .map(|j| OpenJob {
                        name: j.name.clone(),
                        batches: vec![j.batch],
                        submitted_s: j.submitted,
                        started_s: j.started.filter(|_| j.seen),
                        cancelling: false,
                    })
                    .collect(),
            })
            .collect();
        let pending_now: Vec<i64> = pending.iter().copied().collect();
        let plan = router.plan(&Round {
            now_s: t,
            queues: &views,
            pending: &pending_now,
            nodes: 1,
            speculate,
        });
        for mv in &plan.moves {
            if let Some(k) = open
                .iter()
                .position(|j| j.name == mv.job && j.started.is_none())
            {
                let job = open.remove(k);
                router.gave_up_waiting(&mv.queue, t - job.submitted);
                out.moves += 1.0;
                if !open.iter().any(|j| j.batch == job.batch) {
                    pending.insert(job.batch);
                }
            }
        }
        let queue_of: BTreeMap<&str, usize> =
            specs.iter().enumerate().map(|(i, s)| (s.name, i)).collect();
        for (planned, twin) in plan
            .jobs
            .iter()
            .map(|j| (j, false))
            .chain(plan.twins.iter().map(|j| (j, true)))
        {
            let q = queue_of[planned.queue.as_str()];
            let s = &specs[q];
            for &batch in &planned.batches {
                pending.remove(&batch);
                next_id += 1;
                out.twins += f64::from(u8::from(twin));
                open.push(Job {
                    name: format!("j{next_id}"),
                    queue: q,
                    batch,
                    submitted: t,
                    ready: t + lognormal(&mut rng, s.wait_median_s, s.wait_sigma),
                    started: None,
                    seen: false,
                    ends: None,
                });
            }
        }
        assert!(
            t < 3600.0 * 24.0 * 60.0,
            "the simulated run did not end in 60 days"
        );
    }
    out.wall_h = t / 3600.0;
    out
}

/// The made-up cluster: starts ready jobs (first ready, first started) within each queue's
/// running limit and outside its closed window, and decides how each started job ends.
fn world(specs: &[QueueSpec], open: &mut [Job], rng: &mut Rng, t: f64, half_done_at: Option<f64>) {
    for (q, s) in specs.iter().enumerate() {
        if let (Some(from), Some(closed)) = (half_done_at, s.closed_for_s) {
            if t >= from && t < from + closed {
                continue;
            }
        }
        let running = open
            .iter()
            .filter(|j| j.queue == q && j.started.is_some())
            .count();
        let mut ready: Vec<usize> = (0..open.len())
            .filter(|&k| open[k].queue == q && open[k].started.is_none() && open[k].ready <= t)
            .collect();
        ready.sort_by(|&a, &b| open[a].ready.total_cmp(&open[b].ready));
        for k in ready
            .into_iter()
            .take((s.running as usize).saturating_sub(running))
        {
            let start = open[k].ready.max(t - POLL_S);
            let run = RUN_S * (1.0 + 0.03 * rng.normal()).max(0.5);
            open[k].started = Some(start);
            open[k].ends = Some(if rng.unit() < s.preempt {
                (start + run * rng.unit(), JobEnd::Preempted)
            } else {
                (start + run, JobEnd::Finished)
            });
        }
    }
}

/// The shortest mean wait, in hours, that any rule of giving up on a job after it has waited
/// `tau` and sending it again can get from a queue's wait distribution: E[min(W, tau)] / P(W <=
/// tau) at the best `tau` (giving up never is `tau` = infinity: the mean). Computed from 200,000
/// draws. At sigma 0.5 the best is never giving up (waits get no longer the longer one waits);
/// at sigma 1.5 giving up on the longest is worth it (scenario (e)'s speculation).
fn best_mean_wait_h(median_s: f64, sigma: f64) -> f64 {
    let mut rng = Rng(0x5eed);
    let n = 200_000;
    let mut waits: Vec<f64> = (0..n)
        .map(|_| lognormal(&mut rng, median_s, sigma))
        .collect();
    waits.sort_by(f64::total_cmp);
    let mut below = 0.0;
    let mut best = f64::INFINITY;
    for (i, &tau) in waits.iter().enumerate() {
        below += tau;
        let capped_mean = (below + (n - i - 1) as f64 * tau) / n as f64;
        best = best.min(capped_mean / ((i + 1) as f64 / n as f64));
    }
    best / 3600.0
}

/// A wall time no routing can beat, in hours: the batches over what the queues can finish per
/// hour, each queue bounded by its running limit (a preempted job's partial run is lost: half a
/// run on average) and by its cap (Little's law: a job holds a place for its wait and run; the
/// wait at its best, [`best_mean_wait_h`]), less what a closed queue does not finish while
/// closed. The run's start (the first waits) and end (the last batches) only add to it.
fn bound_h(specs: &[QueueSpec]) -> f64 {
    let run_h = RUN_S / 3600.0;
    let mut rate = 0.0;
    let mut closed_work = 0.0;
    for s in specs {
        let p = s.preempt;
        let machine_per_batch = run_h * (1.0 + p / (2.0 * (1.0 - p)));
        let hold_per_batch =
            (best_mean_wait_h(s.wait_median_s, s.wait_sigma) + run_h * (1.0 - p / 2.0)) / (1.0 - p);
        let q_rate =
            (f64::from(s.running) / machine_per_batch).min(f64::from(s.cap) / hold_per_batch);
        rate += q_rate;
        closed_work += q_rate * s.closed_for_s.unwrap_or(0.0) / 3600.0;
    }
    (BATCHES as f64 + closed_work) / rate
}

fn q(name: &'static str, cap: u32, running: u32, wait_median_s: f64) -> QueueSpec {
    let w = WIDTH.load(std::sync::atomic::Ordering::Relaxed);
    QueueSpec {
        name,
        cap: cap * w,
        running: running * w,
        wait_median_s,
        wait_sigma: 0.5,
        preempt: 0.0,
        closed_for_s: None,
    }
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let seeds = args.first().copied().unwrap_or(5);
    let width = args.get(1).copied().unwrap_or(1) as u32;
    WIDTH.store(width, std::sync::atomic::Ordering::Relaxed);
    let hour = 3600.0;
    let scenarios: Vec<(&str, Vec<QueueSpec>)> = vec![
        (
            "(a) two equal queues",
            vec![q("prod", 20, 10, 300.0), q("other", 20, 10, 300.0)],
        ),
        (
            "(b) one starts in 5 min, one in 3 h",
            vec![q("fast", 20, 10, 300.0), q("slow", 20, 10, 3.0 * hour)],
        ),
        (
            "(c) a preemptable queue losing 20 %",
            vec![
                q("prod", 20, 10, 300.0),
                QueueSpec {
                    preempt: 0.2,
                    ..q("preemptable", 20, 10, 300.0)
                },
            ],
        ),
        (
            "(d) a queue closed for 6 h mid-run",
            vec![
                q("prod", 20, 10, 300.0),
                QueueSpec {
                    closed_for_s: Some(6.0 * hour),
                    ..q("other", 20, 10, 300.0)
                },
            ],
        ),
        (
            // A queue the user may submit to that runs nothing of theirs (no allocation
            // left, a reservation not yet begun): what a queue with no history costs when
            // the guess that it starts jobs at once is wrong.
            "(f) a queue that starts nothing for 200 h",
            vec![
                q("prod", 20, 10, 300.0),
                QueueSpec {
                    wait_sigma: 0.01,
                    ..q("dead", 20, 10, 200.0 * hour)
                },
            ],
        ),
    ];
    println!(
        "route_sim: {BATCHES} batches of {:.0} min, poll {POLL_S} s, {seeds} seeds (mean)",
        RUN_S / 60.0
    );
    println!(
        "| scenario | static wall | adaptive wall | adaptive / static | moves | twins | no routing below | its / static |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (label, specs) in &scenarios {
        let (s, a) = mean_pair(seeds, |seed| {
            (
                simulate(specs, Route::Static, false, seed),
                simulate(specs, Route::Adaptive, true, seed),
            )
        });
        let bound = bound_h(specs);
        println!(
            "| {label} | {:.1} h | {:.1} h | **{:.3}** | {:.1} | {:.1} | {bound:.1} h | {:.3} |",
            s.wall_h,
            a.wall_h,
            a.wall_h / s.wall_h,
            a.moves,
            a.twins,
            bound / s.wall_h
        );
    }
    // (e) the tail: heavy-tailed waits (sigma 1.5: one job in ten waits over 7x the median).
    let tail = vec![
        QueueSpec {
            wait_sigma: 1.5,
            ..q("a", 20, 10, 600.0)
        },
        QueueSpec {
            wait_sigma: 1.5,
            ..q("b", 20, 10, 600.0)
        },
    ];
    let (off, on) = mean_pair(seeds, |seed| {
        (
            simulate(&tail, Route::Adaptive, false, seed),
            simulate(&tail, Route::Adaptive, true, seed),
        )
    });
    println!();
    println!(
        "| (e) the tail, adaptive | wall | node-hours | twins | node-hours on twins | share |"
    );
    println!("|---|---|---|---|---|---|");
    for (label, o) in [("without speculation", &off), ("with speculation", &on)] {
        println!(
            "| {label} | {:.2} h | {:.0} | {:.1} | {:.1} | {:.2} % |",
            o.wall_h,
            o.node_h,
            o.twins,
            o.twin_node_h,
            100.0 * o.twin_node_h / o.node_h
        );
    }
    println!("with / without: {:.3}", on.wall_h / off.wall_h);
}

/// Means of both outcomes over `seeds` runs.
fn mean_pair(seeds: u64, run: impl Fn(u64) -> (Outcome, Outcome)) -> (Outcome, Outcome) {
    let mut sums = (Outcome::default(), Outcome::default());
    for seed in 1..=seeds {
        let (a, b) = run(seed);
        for (sum, o) in [(&mut sums.0, a), (&mut sums.1, b)] {
            sum.wall_h += o.wall_h / seeds as f64;
            sum.node_h += o.node_h / seeds as f64;
            sum.twin_node_h += o.twin_node_h / seeds as f64;
            sum.twins += o.twins / seeds as f64;
            sum.moves += o.moves / seeds as f64;
            sum.lost += o.lost / seeds as f64;
        }
    }
    sums
}
