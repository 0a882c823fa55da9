//! The adaptive route where waits are long-tailed and where a limit of jobs holds over all
//! queues, and the loop's side of routing ([`Routing`]): requeues, cancelled jobs holding
//! their place.

use std::collections::BTreeSet;

use embedfleet_core::rundb::JobRow;
use embedfleet_core::state::JobStatus;

use super::tests::{queued, running, NOW};
use super::*;

fn queue(name: &str, cap: u32, nodes: usize, jobs: Vec<OpenJob>) -> QueueView {
    QueueView {
        name: name.into(),
        cap,
        usable: true,
        nodes,
        jobs,
    }
}

/// A router that has seen 200 jobs of `queue` wait log-normally (this median and spread) and
/// run 2,400 s, and one more sent `last_sent_ago` before NOW that started two minutes ago.
fn learn(router: &mut Router, queue: &str, median_s: f64, sigma: f64, last_sent_ago: f64) {
    learn_until(router, queue, median_s, sigma, last_sent_ago, 120.0);
}

fn learn_until(
    router: &mut Router,
    queue: &str,
    median_s: f64,
    sigma: f64,
    last_sent_ago: f64,
    last_started_ago: f64,
) {
    let mut rng = crate::sample::Rng(11);
    for _ in 0..200 {
        let wait = median_s * (sigma * rng.normal()).exp();
        router.started(queue, 0.0, wait);
        router.ended(queue, JobEnd::Finished, Some(wait), wait + 2400.0);
    }
    router.started(queue, NOW - last_sent_ago, NOW - last_started_ago);
}

fn round<'a>(queues: &'a [QueueView], pending: &'a [i64], max_jobs: Option<u32>) -> Round<'a> {
    Round {
        now_s: NOW,
        queues,
        pending: Pending::all(pending),
        speculate: true,
        max_jobs,
    }
}

fn sent_to(plan: &RoutePlan, queue: &str) -> usize {
    plan.jobs.iter().filter(|j| j.queue == queue).count()
}

/// Queue `a`: three of the run's jobs running (it ran four at once before), one queued for
/// `waited_s` though a job sent an hour ago has started; `b` alike with room.
fn with_a_straggler(router: &mut Router, waited_s: f64) -> Vec<QueueView> {
    let four = (0..4)
        .map(|i| running(&format!("r{i}"), 90 + i, 60.0))
        .collect();
    router.saw_running(&[queue("a", 8, 1, four)]);
    let a = queue(
        "a",
        8,
        1,
        vec![
            running("a1", 1, 600.0),
            running("a2", 2, 900.0),
            running("a3", 3, 1200.0),
            queued("a-old", 4, waited_s),
        ],
    );
    let b = queue("b", 8, 1, vec![running("b1", 5, 600.0)]);
    let queues = vec![a, b];
    router.saw_running(&queues);
    queues
}

#[test]
fn a_straggler_does_not_stop_its_queue_and_is_sent_again_where_waits_are_long_tailed() {
    let mut heavy = Router::new(Route::Adaptive);
    learn(&mut heavy, "a", 600.0, 1.5, 3600.0);
    learn(&mut heavy, "b", 600.0, 1.5, 3600.0);
    let queues = with_a_straggler(&mut heavy, 3.0 * 3600.0);
    let plan = heavy.plan(&round(&queues, &[], None));
    assert_eq!(plan.outlook[0].state, "ok", "{:?}", plan.outlook[0]);
    let moved: Vec<(&str, MoveKind)> = plan
        .moves
        .iter()
        .map(|m| (m.job.as_str(), m.kind))
        .collect();
    assert_eq!(moved, [("a-old", MoveKind::Straggler)], "{plan:?}");
    assert!(
        plan.moves[0].why.contains("started jobs sent after it"),
        "{}",
        plan.moves[0].why
    );

    // Narrow waits (sigma 0.3): one that has waited long (a few in a hundred wait as long) is
    // about to start; it stays.
    let mut narrow = Router::new(Route::Adaptive);
    learn(&mut narrow, "a", 600.0, 0.3, 3600.0);
    learn(&mut narrow, "b", 600.0, 0.3, 3600.0);
    let queues = with_a_straggler(&mut narrow, 1000.0);
    let plan = narrow.plan(&round(&queues, &[], None));
    assert_eq!(plan.outlook[0].state, "ok");
    assert!(plan.moves.is_empty(), "{plan:?}");
    // A wait the narrow shape all but rules out (three hours: a held job) goes on as long
    // again: sent again, to `b`'s slot free now (elsewhere, when it does as well).
    let queues = with_a_straggler(&mut narrow, 3.0 * 3600.0);
    let plan = narrow.plan(&round(&queues, &[], None));
    assert_eq!(plan.moves.len(), 1, "{plan:?}");
    assert!(
        plan.moves[0].why.contains("a new job on b"),
        "{}",
        plan.moves[0].why
    );

    // A long wait the queue did not pass over (no job sent after it has started: it may
    // wait for a place of the run's own) is no straggler; nor is one while the queue runs
    // as many of the run's jobs as it ever did (its queued jobs wait for those).
    let mut unpassed = Router::new(Route::Adaptive);
    learn(&mut unpassed, "a", 600.0, 1.5, 4.0 * 3600.0);
    learn(&mut unpassed, "b", 600.0, 1.5, 4.0 * 3600.0);
    let queues = with_a_straggler(&mut unpassed, 3.0 * 3600.0);
    assert!(unpassed.plan(&round(&queues, &[], None)).moves.is_empty());
    let mut at_limit = with_a_straggler(&mut heavy, 3.0 * 3600.0);
    at_limit[0].jobs.push(running("a4", 6, 60.0));
    assert!(heavy.plan(&round(&at_limit, &[], None)).moves.is_empty());
}

#[test]
fn a_queue_that_starts_nothing_while_running_fewer_than_it_did_counts_as_stopped() {
    let mut router = Router::new(Route::Adaptive);
    learn_until(
        &mut router,
        "a",
        300.0,
        0.5,
        2.0 * 3600.0 + 300.0,
        2.0 * 3600.0,
    );
    learn(&mut router, "b", 300.0, 0.5, 600.0);
    // a ran three at once; it last started a job two hours ago.
    router.saw_running(&[queue(
        "a",
        8,
        1,
        vec![
            running("x", 9, 60.0),
            running("y", 9, 60.0),
            running("z", 9, 60.0),
        ],
    )]);
    let queued_a = vec![queued("a1", 1, 3600.0), queued("a2", 2, 3000.0)];
    let mut jobs = queued_a.clone();
    jobs.push(running("a3", 3, 2300.0));
    let queues = [queue("a", 8, 1, jobs), queue("b", 8, 1, vec![])];
    let plan = router.plan(&round(&queues, &[], None));
    assert_eq!(plan.outlook[0].state, "stopped");
    assert_eq!(plan.moves.len(), 1, "the newest stays: {plan:?}");
    assert_eq!(plan.moves[0].kind, MoveKind::Stopped);
    // Running as many as it ever did, its queued jobs wait for the run's own: not stopped.
    let mut jobs = queued_a;
    jobs.extend(["a3", "a4", "a5"].map(|n| running(n, 3, 2300.0)));
    let queues = [queue("a", 8, 1, jobs), queue("b", 8, 1, vec![])];
    let plan = router.plan(&round(&queues, &[], None));
    assert_eq!(plan.outlook[0].state, "ok");
    assert!(plan.moves.is_empty(), "{plan:?}");
}

/// Polaris-like: debug (1 job, starts in 10 min), preemptable (4, in an hour), prod (jobs of
/// ten nodes, ten batches each, in three hours).
fn polaris(router: &mut Router) -> Vec<QueueView> {
    learn(router, "debug", 600.0, 0.5, 600.0);
    learn(router, "preemptable", 3600.0, 0.5, 600.0);
    learn(router, "prod", 3.0 * 3600.0, 0.5, 600.0);
    vec![
        queue("debug", 1, 1, vec![]),
        queue("preemptable", 4, 1, vec![]),
        queue("prod", 10, 10, vec![]),
    ]
}

#[test]
fn under_a_job_limit_each_place_goes_to_the_queue_that_finishes_most_with_it() {
    let mut router = Router::new(Route::Adaptive);
    let queues = polaris(&mut router);
    let pending: Vec<i64> = (1..=500).collect();
    // Six places: a place on prod finishes ten batches in ~3.7 h, on debug one in ~50 min.
    let plan = router.plan(&round(&queues, &pending, Some(6)));
    assert_eq!(sent_to(&plan, "prod"), 6, "{plan:?}");
    assert!(plan.jobs.iter().all(|j| j.batches.len() == 10));
    // Without the limit every queue is filled.
    let plan = router.plan(&round(&queues, &pending, None));
    assert_eq!(
        (
            sent_to(&plan, "debug"),
            sent_to(&plan, "preemptable"),
            sent_to(&plan, "prod")
        ),
        (1, 4, 10)
    );
    // The static route takes turns within the limit.
    let mut fixed = router.clone();
    fixed.route = Route::Static;
    let plan = fixed.plan(&round(&queues, &pending, Some(6)));
    assert_eq!(
        (
            sent_to(&plan, "debug"),
            sent_to(&plan, "preemptable"),
            sent_to(&plan, "prod")
        ),
        (1, 3, 2)
    );
    // The tail (fewer batches than one job per place takes): each goes where it is done
    // soonest, debug first.
    let plan = router.plan(&round(&queues, &pending[..20], Some(6)));
    assert_eq!(sent_to(&plan, "debug"), 1, "{plan:?}");
    assert!(plan.next.as_deref().unwrap().contains("goes to debug"));
    // A place is taken by every open job, one being cancelled too.
    let mut full = queues.clone();
    let mut cancelling = queued("c", 900, 60.0);
    cancelling.cancelling = true;
    full[0].jobs = vec![cancelling];
    full[2].jobs = (0..5)
        .map(|i| queued(&format!("p{i}"), 1000 + i, 60.0))
        .collect();
    let plan = router.plan(&round(&full, &pending, Some(6)));
    assert!(plan.jobs.is_empty(), "{plan:?}");
    assert!(plan.next.as_deref().unwrap().contains("waits for a place"));
}

#[test]
fn a_shared_limit_over_a_fast_and_a_slow_queue_fills_the_fast_one_and_gives_the_slow_the_rest() {
    let mut router = Router::new(Route::Adaptive);
    learn(&mut router, "fast", 300.0, 0.5, 600.0);
    learn(&mut router, "slow", 3.0 * 3600.0, 0.5, 600.0);
    let queues = [queue("fast", 20, 1, vec![]), queue("slow", 20, 1, vec![])];
    let pending: Vec<i64> = (1..=2000).collect();
    let plan = router.plan(&round(&queues, &pending, Some(24)));
    assert_eq!((sent_to(&plan, "fast"), sent_to(&plan, "slow")), (20, 4));
    let mut fixed = router.clone();
    fixed.route = Route::Static;
    let plan = fixed.plan(&round(&queues, &pending, Some(24)));
    assert_eq!((sent_to(&plan, "fast"), sent_to(&plan, "slow")), (12, 12));
}

fn row(name: &str, batch: i64, state: JobStatus, started_s: Option<f64>) -> JobRow {
    JobRow {
        batch_id: batch,
        attempt: 1,
        backend: "slurm".into(),
        queue: "a".into(),
        name: name.into(),
        scheduler_id: Some("1".into()),
        state,
        exit_reason: None,
        log: None,
        marker: None,
        submitted_s: Some(1000.0),
        started_s,
    }
}

#[test]
fn a_requeued_job_waits_again_from_its_requeue_and_a_cancelled_one_holds_its_place() {
    let mut routing = Routing::new(Route::Adaptive, true, Some(2));
    let caps = BTreeMap::from([("a".to_string(), 4), ("b".to_string(), 4)]);
    let none = BTreeSet::new();
    let j1 = row("j1", 1, JobStatus::Pending, None);
    assert_eq!(routing.saw(&j1, JobStatus::Running, 1600.0), Seen::Started);
    let j1 = row("j1", 1, JobStatus::Running, Some(1600.0));
    assert_eq!(routing.saw(&j1, JobStatus::Pending, 5000.0), Seen::Requeued);
    assert_eq!(routing.requeued, 1);
    assert_eq!(routing.router.model("a").unwrap().preempted, 1);
    // Back in its queue: it has waited since the requeue, not since it was sent.
    let j1 = row("j1", 1, JobStatus::Pending, Some(1600.0));
    let plan = routing.round(
        &caps,
        |_| 1,
        std::slice::from_ref(&j1),
        Pending::all(&[]),
        &none,
        5600.0,
    );
    assert_eq!(plan.outlook[0].longest_wait_s, 600.0);
    // Its second start is learned from the requeue (a 700-s wait), and its run from then.
    assert_eq!(routing.saw(&j1, JobStatus::Running, 5700.0), Seen::Started);
    assert_eq!(
        routing.router.model("a").unwrap().start_delay.mean,
        (600.0 + 700.0) / 2.0
    );
    let j1 = row("j1", 1, JobStatus::Running, Some(1600.0));
    routing.saw(&j1, JobStatus::Completed, 8100.0);
    assert_eq!(
        routing.router.model("a").unwrap().run_time.get(),
        Some(2400.0)
    );

    // A moved job holds its place (the limit is 2) until it ended.
    let j2 = row("j2", 2, JobStatus::Pending, None);
    let j3 = row("j3", 3, JobStatus::Pending, None);
    let mv = Move {
        job: "j2".into(),
        queue: "a".into(),
        kind: MoveKind::Straggler,
        why: "test".into(),
    };
    let why = routing.moved(&mv, &j2, 9000.0);
    assert!(routing.cancelling("j2"));
    let open = [j2.clone(), j3];
    let plan = routing.round(&caps, |_| 1, &open, Pending::all(&[4, 5]), &none, 9060.0);
    assert!(plan.jobs.is_empty(), "{plan:?}");
    assert_eq!(routing.ended_by_routing(&[&j2], 9120.0), Some((why, true)));
    assert!(!routing.cancelling("j2"));
    assert_eq!(routing.moves, 1);
}

/// A job that ended between two polls (or while no loop ran) is learned from its embed run's
/// start: its wait and its run, as a sighting's; without the record it ends with neither, and
/// a requeued job's record (its first run's start too) is not taken for its second run.
#[test]
fn a_job_never_seen_running_is_learned_from_its_runs_start() {
    let mut routing = Routing::new(Route::Adaptive, true, None);
    let j1 = row("j1", 1, JobStatus::Pending, None);
    let seen = routing.saw_end_unseen(&j1, JobStatus::Completed, Some(1300.0), 1900.0);
    assert_eq!(seen, Seen::Ended(JobEnd::Finished));
    let a = routing.router.model("a").unwrap();
    assert!(a.known(), "its start is known: the queue is no longer new");
    assert_eq!(a.start_delay.mean, 300.0);
    assert_eq!(a.run_time.get(), Some(600.0));
    assert_eq!(a.finished, 1);

    // A node clock ahead of the loop's: the start is no later than the end was seen.
    let j2 = row("j2", 2, JobStatus::Pending, None);
    routing.saw_end_unseen(&j2, JobStatus::Completed, Some(2500.0), 2000.0);
    let a = routing.router.model("a").unwrap();
    assert_eq!(a.start_delay.samples, 2);
    assert_eq!(a.run_time.get(), Some(300.0), "(600 + 0) / 2");

    // No record: the end alone, as before.
    let j3 = row("j3", 3, JobStatus::Pending, None);
    routing.saw_end_unseen(&j3, JobStatus::Completed, None, 3000.0);
    let a = routing.router.model("a").unwrap();
    assert_eq!((a.start_delay.samples, a.finished), (2, 3));
    assert_eq!(a.run_time.get(), Some(300.0));

    // Requeued, then run and ended unseen: the record's start is its first run's.
    let j4 = row("j4", 4, JobStatus::Running, Some(1100.0));
    assert_eq!(routing.saw(&j4, JobStatus::Pending, 4000.0), Seen::Requeued);
    let j4 = row("j4", 4, JobStatus::Pending, Some(1100.0));
    routing.saw_end_unseen(&j4, JobStatus::Completed, Some(1050.0), 6000.0);
    let a = routing.router.model("a").unwrap();
    assert_eq!(
        a.start_delay.samples, 2,
        "nothing learned from the first run's start"
    );
}
