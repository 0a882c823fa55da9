//! A discrete-event simulator of a run's queues, driving the submit loop's own routing
//! ([`Routing`]): the same calls the loop makes when it sees a job start, end, go back to its
//! queue, or get a start estimate, when it cancels one (it holds its place until it ended),
//! when a submission fails, and the same round decisions (jobs, moves, twins), from job rows as
//! run.db holds them. Only the world is made up: queues that start a job after a drawn wait,
//! within a limit of running jobs, run it for a drawn time, preempt a share of them (ended, or
//! put back in the queue), close or refuse submissions for a while. Measures the wall time to
//! the last batch, adaptive against static, at the study's shape (2,075 batches of ~40 min),
//! in scenarios whose queues are written down below, with a bound no routing can beat.
//!
//! Run: `cargo bench -p embedfleet-orchestrator --bench route_sim [-- SEEDS [WIDTH [LETTER]]]`
//! (default 5 seeds; WIDTH multiplies every cap, running limit and job limit; a scenario's
//! LETTER runs that one alone and prints each seed's walls; seconds). BENCHMARKS.md records the
//! tables.

#[path = "route_sim/bound.rs"]
mod bound;
#[path = "route_sim/world.rs"]
mod world;

use bound::{bound_h, whole_jobs_h};
use world::{mean, runs, simulate, Outcome, QueueSpec, Scenario};

use embedfleet_orchestrator::route::Route;

/// The study's batch: inference 2,382 s + model load 28 s + I/O 7.5 s.
pub const RUN_S: f64 = 2_417.5;
pub const BATCHES: i64 = 2_075;
/// The loop polls every minute (the default poll of a cluster run is 30 s; a minute keeps the
/// simulation to seconds and moves every wait by at most one poll).
pub const POLL_S: f64 = 60.0;
const HOUR: f64 = 3600.0;

fn q(name: &str, cap: u32, running: u32, wait_median_s: f64, width: u32) -> QueueSpec {
    QueueSpec {
        name: name.to_string(),
        cap: cap * width,
        running: running * width,
        wait_median_s,
        wait_sigma: 0.5,
        preempt: 0.0,
        requeue: false,
        closed_for_s: None,
        refuses_for_s: None,
        nodes: 1,
    }
}

fn scenario(label: &str, queues: Vec<QueueSpec>) -> Scenario {
    Scenario {
        label: label.to_string(),
        queues,
        max_jobs: None,
        estimates: false,
    }
}

/// The scenarios at caps times `w`: the table's rows.
fn scenarios(w: u32) -> Vec<Scenario> {
    vec![
        scenario(
            "(a) two equal queues",
            vec![q("prod", 20, 10, 300.0, w), q("other", 20, 10, 300.0, w)],
        ),
        scenario(
            "(b) one starts in 5 min, one in 3 h",
            vec![
                q("fast", 20, 10, 300.0, w),
                q("slow", 20, 10, 3.0 * HOUR, w),
            ],
        ),
        scenario(
            "(c) a preemptable queue losing 20 %",
            vec![
                q("prod", 20, 10, 300.0, w),
                QueueSpec {
                    preempt: 0.2,
                    ..q("preemptable", 20, 10, 300.0, w)
                },
            ],
        ),
        scenario(
            "(d) a queue closed for 6 h mid-run",
            vec![
                q("prod", 20, 10, 300.0, w),
                QueueSpec {
                    closed_for_s: Some(6.0 * HOUR),
                    ..q("other", 20, 10, 300.0, w)
                },
            ],
        ),
        // A queue the user may submit to that runs nothing of theirs (no allocation left, a
        // reservation not yet begun): what a queue with no history costs when the guess that
        // it starts jobs at once is wrong.
        scenario(
            "(f) a queue that starts nothing for 200 h",
            vec![
                q("prod", 20, 10, 300.0, w),
                QueueSpec {
                    wait_sigma: 0.01,
                    ..q("dead", 20, 10, 200.0 * HOUR, w)
                },
            ],
        ),
        // A site's limit of jobs per user over all queues, binding: each queue could hold 20
        // and run all of them, the user 24 in all.
        Scenario {
            max_jobs: Some(24 * w),
            ..scenario(
                "(g) 24 jobs over a 5-min and a 3-h queue",
                vec![
                    q("fast", 20, 20, 300.0, w),
                    q("slow", 20, 20, 3.0 * HOUR, w),
                ],
            )
        },
        polaris(w),
    ]
}

/// The study's queues on Polaris (README): `debug` (1 job), `preemptable` (4, some preempted
/// and put back in the queue by PBS) and `prod`, which takes only jobs of ten nodes or more
/// (ten batches a job, one per node), under a limit of jobs per user over all three. The
/// waits are assumptions (a quick debug queue, a preemptable one of an hour, prod of three
/// hours), so are prod's cap (10 jobs) and the per-user limit (6 jobs); PBS's start estimates
/// are given to the router, rough and blind to each job's draw; `debug` refuses submissions for
/// two hours from a quarter of the run (a reservation). Two PBS queues rarely start a job in a
/// minute; what matters is the shape: a job limit that makes the places scarce, and a queue
/// that finishes ten batches per place.
fn polaris(w: u32) -> Scenario {
    Scenario {
        label: "(h) Polaris: debug=1, preemptable=4, prod of 10 nodes; 6 jobs".into(),
        max_jobs: Some(6 * w),
        estimates: true,
        queues: vec![
            QueueSpec {
                wait_sigma: 1.0,
                refuses_for_s: Some(2.0 * HOUR),
                ..q("debug", 1, 1, 600.0, w)
            },
            QueueSpec {
                wait_sigma: 1.0,
                preempt: 0.15,
                requeue: true,
                ..q("preemptable", 4, 4, HOUR, w)
            },
            QueueSpec {
                wait_sigma: 1.0,
                nodes: 10,
                ..q("prod", 10, 10, 3.0 * HOUR, w)
            },
        ],
    }
}

/// (e) the tail: heavy-tailed waits (sigma 1.5: one job in ten waits over 7x the median).
fn tail(w: u32) -> Scenario {
    scenario(
        "(e) heavy-tailed waits",
        vec![
            QueueSpec {
                wait_sigma: 1.5,
                ..q("a", 20, 10, 600.0, w)
            },
            QueueSpec {
                wait_sigma: 1.5,
                ..q("b", 20, 10, 600.0, w)
            },
        ],
    )
}

fn main() {
    let all: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<u64> = all.iter().filter_map(|a| a.parse().ok()).collect();
    // A scenario's letter (`d`) runs that one alone, with each seed's walls.
    let only: Option<String> = all
        .iter()
        .find(|a| a.len() == 1 && a.chars().all(|c| c.is_ascii_lowercase()))
        .map(|a| format!("({a})"));
    let seeds = args.first().copied().unwrap_or(5);
    let width = args.get(1).copied().unwrap_or(1) as u32;
    println!(
        "route_sim: {BATCHES} batches of {:.0} min, poll {POLL_S} s, {seeds} seeds (mean), caps x{width}",
        RUN_S / 60.0
    );
    println!(
        "| scenario | static, name order | static, reversed order | adaptive | adaptive / better static | moves | twins | cancelled | node-hours on twins and moves | no routing below | static / bound | adaptive / bound |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut whole_rows = Vec::new();
    let mut reads = Vec::new();
    for s in scenarios(width) {
        if only
            .as_ref()
            .is_some_and(|o| !s.label.starts_with(o.as_str()))
        {
            continue;
        }
        let fixed = runs(seeds, |seed| simulate(&s, Route::Static, false, seed));
        let flipped = s.queue_order_reversed();
        let other = runs(seeds, |seed| simulate(&flipped, Route::Static, false, seed));
        let adaptive = runs(seeds, |seed| simulate(&s, Route::Adaptive, true, seed));
        if only.is_some() {
            for (seed, ((st, rv), ad)) in (1..).zip(fixed.iter().zip(&other).zip(&adaptive)) {
                println!(
                    "seed {seed}: static {:.2} h, reversed {:.2} h, adaptive {:.2} h ({:.0} moves)",
                    st.wall_h, rv.wall_h, ad.wall_h, ad.moves
                );
            }
        }
        let (fixed, other, a) = (mean(&fixed), mean(&other), mean(&adaptive));
        let better = fixed.wall_h.min(other.wall_h);
        let bound = bound_h(&s);
        println!(
            "| {} | {:.1} h | {:.1} h | {:.1} h | **{:.3}** | {:.1} | {:.1} | {:.1} | {:.1} ({:.2} %) | {bound:.1} h | {:.3} | **{:.3}** |",
            s.label,
            fixed.wall_h,
            other.wall_h,
            a.wall_h,
            a.wall_h / better,
            a.moves,
            a.twins,
            a.cancelled,
            a.twin_node_h + a.move_node_h,
            100.0 * (a.twin_node_h + a.move_node_h) / a.node_h,
            better / bound,
            a.wall_h / bound
        );
        reads.push((s.label.clone(), a.rounds, a.cut_short));
        let whole: Option<Vec<f64>> = (1..=seeds).map(|seed| whole_jobs_h(&s, seed)).collect();
        if let Some(whole) = whole {
            let whole = whole.iter().sum::<f64>() / seeds as f64;
            whole_rows.push((s.label.clone(), whole, better, a.wall_h, bound));
        }
    }
    // How often the adaptive round walked past the batches it read first (the caps' worth
    // and one) and was planned again from more.
    println!();
    println!("| scenario | adaptive rounds | planned again from more batches |");
    println!("|---|---|---|");
    for (label, rounds, again) in reads {
        println!(
            "| {label} | {rounds:.0} | {again:.1} ({:.2} %) |",
            100.0 * again / rounds
        );
    }
    println!();
    println!("| scenario | no routing below | in whole jobs | better static / whole jobs | adaptive / whole jobs |");
    println!("|---|---|---|---|---|");
    for (label, whole, better, adaptive, bound) in whole_rows {
        println!(
            "| {label} | {bound:.2} h | {whole:.2} h | {:.3} | **{:.3}** |",
            better / whole,
            adaptive / whole
        );
    }
    if only.as_deref().is_none_or(|o| o == "(e)") {
        tail_table(seeds, &tail(width));
    }
}

/// (e): static, adaptive without and with speculation, the bound, and what the twins and
/// moves cost.
fn tail_table(seeds: u64, s: &Scenario) {
    let fixed = mean(&runs(seeds, |seed| simulate(s, Route::Static, false, seed)));
    let off = mean(&runs(seeds, |seed| {
        simulate(s, Route::Adaptive, false, seed)
    }));
    let on = mean(&runs(seeds, |seed| {
        simulate(s, Route::Adaptive, true, seed)
    }));
    let bound = bound_h(s);
    println!();
    println!(
        "| {} | wall | / bound | node-hours | moves | twins | cancelled | node-hours on twins and moves | share |",
        s.label
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let row = |label: &str, o: &Outcome| {
        let wasted = o.twin_node_h + o.move_node_h;
        println!(
            "| {label} | {:.2} h | {:.3} | {:.0} | {:.1} | {:.1} | {:.1} | {wasted:.1} | {:.2} % |",
            o.wall_h,
            o.wall_h / bound,
            o.node_h,
            o.moves,
            o.twins,
            o.cancelled,
            100.0 * wasted / o.node_h
        );
    };
    row("static", &fixed);
    row("adaptive, without speculation", &off);
    row("adaptive, with speculation", &on);
    println!("no routing below: {bound:.2} h");
}
