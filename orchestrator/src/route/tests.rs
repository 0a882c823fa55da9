//! The adaptive route's decisions on queues whose behaviour each test sets.

use super::*;

pub(super) const NOW: f64 = 100_000.0;

fn queue(name: &str, cap: u32, jobs: Vec<OpenJob>) -> QueueView {
    QueueView {
        name: name.into(),
        cap,
        usable: true,
        nodes: 1,
        jobs,
    }
}

/// A job of `batch` waiting in its queue for `waited_s` (shared with `tests_limits`).
pub(super) fn queued(name: &str, batch: i64, waited_s: f64) -> OpenJob {
    OpenJob {
        name: name.into(),
        batches: vec![batch],
        submitted_s: NOW - waited_s,
        started_s: None,
        cancelling: false,
    }
}

/// A job of `batch` running for `for_s`, after a minute's wait.
pub(super) fn running(name: &str, batch: i64, for_s: f64) -> OpenJob {
    OpenJob {
        name: name.into(),
        batches: vec![batch],
        submitted_s: NOW - for_s - 60.0,
        started_s: Some(NOW - for_s),
        cancelling: false,
    }
}

/// A router that has seen `n` jobs of each queue start after its delay and run 2,400 s.
fn learned(queues: &[(&str, f64)], n: usize) -> Router {
    let mut r = Router::new(Route::Adaptive);
    for (q, delay) in queues {
        for _ in 0..n {
            r.started(q, 0.0, *delay);
            r.ended(q, JobEnd::Finished, Some(*delay), delay + 2400.0);
        }
    }
    r
}

fn round<'a>(queues: &'a [QueueView], pending: &'a [i64]) -> Round<'a> {
    Round {
        now_s: NOW,
        queues,
        pending: Pending::all(pending),
        speculate: true,
        max_jobs: None,
    }
}

fn sent_to(plan: &RoutePlan, queue: &str) -> Vec<i64> {
    plan.jobs
        .iter()
        .filter(|j| j.queue == queue)
        .flat_map(|j| j.batches.clone())
        .collect()
}

#[test]
fn a_slow_queue_gets_only_the_batches_a_fast_one_would_finish_later() {
    let router = learned(&[("fast", 300.0), ("slow", 10_800.0)], 5);
    let queues = [queue("fast", 4, vec![]), queue("slow", 4, vec![])];
    // Few batches: the fast queue does them all, some after its first four.
    let pending: Vec<i64> = (1..=8).collect();
    let plan = router.plan(&round(&queues, &pending));
    assert_eq!(sent_to(&plan, "fast"), vec![1, 2, 3, 4]);
    assert!(sent_to(&plan, "slow").is_empty(), "{plan:?}");
    assert!(plan
        .next
        .as_deref()
        .unwrap()
        .contains("batch 1 goes to fast"));
    // Many batches: the fast queue's later slots end after the slow queue's first (2,700 s a
    // round: batch 4×(13,200/2,700) ≈ 20 on would finish later there), so the slow one takes some.
    let pending: Vec<i64> = (1..=100).collect();
    let plan = router.plan(&round(&queues, &pending));
    assert_eq!(sent_to(&plan, "fast"), vec![1, 2, 3, 4]);
    let slow = sent_to(&plan, "slow");
    assert_eq!(slow.len(), 4, "{plan:?}");
    assert!(slow[0] > 16 && slow[0] < 24, "{slow:?}");
    // The static route fills both, taking turns.
    let mut fixed = router.clone();
    fixed.route = Route::Static;
    let plan = fixed.plan(&round(&queues, &pending));
    assert_eq!(sent_to(&plan, "slow"), vec![2, 4, 6, 8]);
}

#[test]
fn a_queue_with_no_history_is_expected_to_start_jobs_at_once_until_its_wait_says_otherwise() {
    let router = learned(&[("fast", 300.0)], 3);
    let pending: Vec<i64> = (1..=50).collect();
    // Nothing has waited there yet: a job there is expected to start at once, sooner than
    // fast's 5 min, so it is filled to its cap first, as the static route would fill it.
    let queues = [queue("fast", 2, vec![]), queue("new", 4, vec![])];
    let plan = router.plan(&round(&queues, &pending));
    assert_eq!(sent_to(&plan, "new"), vec![1, 2, 3, 4]);
    assert_eq!(sent_to(&plan, "fast"), vec![5, 6]);
    assert_eq!(plan.outlook[1].state, "new");
    assert_eq!(plan.outlook[1].expected_start_s, Some(0.0));
    // Its first job has waited 10 min: a new job there is expected to wait at least that
    // (3,000 s to a batch's end), so fast's free slots (2,700 s) go first, and it takes the
    // batches fast would finish later.
    let queues = [
        queue("fast", 4, vec![]),
        queue("new", 4, vec![queued("n1", 1, 600.0)]),
    ];
    let plan = router.plan(&round(&queues, &pending[1..]));
    assert_eq!(sent_to(&plan, "fast"), vec![2, 3, 4, 5]);
    assert_eq!(sent_to(&plan, "new"), vec![6, 7, 8]);
    assert_eq!(plan.outlook[1].state, "new");
    assert_eq!(plan.outlook[1].expected_start_s, Some(600.0));
    // Waiting over three times the fastest queue's start (plus a minute), it counts as
    // stopped, and its queued jobs move as a known queue's do, the newest kept.
    let queues = [
        queue("fast", 4, vec![]),
        queue(
            "new",
            4,
            vec![queued("n1", 1, 7200.0), queued("n2", 2, 7000.0)],
        ),
    ];
    let plan = router.plan(&round(&queues, &[]));
    assert_eq!(plan.outlook[1].state, "stopped");
    let moved: Vec<&str> = plan.moves.iter().map(|m| m.job.as_str()).collect();
    assert_eq!(moved, ["n1"]);
    assert!(
        plan.moves[0].why.contains("started none of the run's jobs"),
        "{}",
        plan.moves[0].why
    );
    // Two queues with no history: both filled, the first listed first.
    let fresh = Router::new(Route::Adaptive);
    let queues = [queue("a", 3, vec![]), queue("b", 3, vec![])];
    let plan = fresh.plan(&round(&queues, &pending));
    assert_eq!(
        (sent_to(&plan, "a"), sent_to(&plan, "b")),
        (vec![1, 2, 3], vec![4, 5, 6])
    );
}

#[test]
fn one_queue_is_filled_as_the_static_route_fills_it() {
    let fresh = Router::new(Route::Adaptive);
    let pending: Vec<i64> = (1..=10).collect();
    let queues = [queue("local", 4, vec![]), queue("off", 4, vec![])];
    let mut queues = queues.to_vec();
    queues[1].usable = false;
    let plan = fresh.plan(&round(&queues, &pending));
    assert_eq!(sent_to(&plan, "local"), vec![1, 2, 3, 4]);
}

#[test]
fn a_queue_that_loses_jobs_costs_its_rework() {
    let mut router = learned(&[("steady", 300.0), ("preemptable", 300.0)], 5);
    for i in 0..40 {
        let end = if i % 2 == 0 {
            JobEnd::Preempted
        } else {
            JobEnd::Finished
        };
        router.ended("preemptable", end, Some(0.0), 2400.0);
    }
    let queues = [queue("preemptable", 4, vec![]), queue("steady", 4, vec![])];
    let pending = [1, 2, 3, 4];
    let plan = router.plan(&round(&queues, &pending));
    assert_eq!(sent_to(&plan, "steady"), vec![1, 2, 3, 4]);
    let out = &plan.outlook[0];
    // Half its recent jobs lost, said as seen (the decay weighs the last, finished, most).
    assert!((0.4..0.5).contains(&out.loss_share), "{out:?}");
    assert_eq!(out.preempted, 20);
}

/// b's three queued jobs, of batches 1 to 3, waiting 2 h, 1 h 57 min and 1 h 55 min.
fn overdue_on_b() -> Vec<OpenJob> {
    vec![
        queued("b1", 1, 7200.0),
        queued("b2", 2, 7000.0),
        queued("b3", 3, 6900.0),
    ]
}

#[test]
fn a_queue_that_stopped_starting_jobs_gets_none_and_its_queued_jobs_move_when_worth_it() {
    let router = learned(&[("a", 300.0), ("b", 300.0)], 10);
    // b's three queued jobs have waited 2 h (its jobs usually start in 5 min); a has room.
    let b_jobs = overdue_on_b();
    let queues = [
        queue("a", 8, vec![running("a1", 4, 100.0)]),
        queue("b", 4, b_jobs),
    ];
    let pending = [5, 6];
    let plan = router.plan(&round(&queues, &pending));
    assert_eq!(plan.outlook[1].state, "stopped");
    assert_eq!(sent_to(&plan, "a"), vec![5, 6]);
    assert!(sent_to(&plan, "b").is_empty());
    // The two oldest move; the newest stays, to notice when b starts jobs again.
    let moved: Vec<&str> = plan.moves.iter().map(|m| m.job.as_str()).collect();
    assert_eq!(moved, ["b1", "b2"]);
    assert!(
        plan.moves[0].why.contains("done sooner on a"),
        "{}",
        plan.moves[0].why
    );
    // Not worth it when a has no slot for hours: the jobs stay.
    let a_full: Vec<OpenJob> = (0..8)
        .map(|i| queued(&format!("a{i}"), 10 + i, 0.0))
        .collect();
    let queues = [queue("a", 8, a_full), queue("b", 4, queues[1].jobs.clone())];
    let slow_a = learned(&[("a", 30_000.0), ("b", 300.0)], 5);
    assert!(slow_a.plan(&round(&queues, &[])).moves.is_empty());
}

#[test]
fn a_queued_job_whose_batch_has_a_twin_running_is_not_moved() {
    let router = learned(&[("a", 300.0), ("b", 300.0)], 10);
    // b stopped, its three queued jobs overdue; batch 1's already has a twin running on a.
    let b_jobs = overdue_on_b();
    let queues = [
        queue("a", 8, vec![running("a-twin-1", 1, 100.0)]),
        queue("b", 4, b_jobs),
    ];
    let plan = router.plan(&round(&queues, &[]));
    assert_eq!(plan.outlook[1].state, "stopped");
    // b1 keeps its place (its twin finishes the batch, or it does); b2 moves; b3, the newest,
    // stays to notice when b starts jobs again.
    let moved: Vec<&str> = plan.moves.iter().map(|m| m.job.as_str()).collect();
    assert_eq!(moved, ["b2"]);
    assert!(plan.twins.iter().all(|t| t.batches != vec![1]), "{plan:?}");
}

#[test]
fn the_tail_gets_a_twin_of_a_long_waiting_batch_on_a_queue_with_a_free_slot() {
    let router = learned(&[("a", 300.0), ("b", 300.0)], 5);
    // Nothing left to send; b's job has waited 40 min (not yet "stopped": 3×5 min + 1 min is
    // 16 min... so make b usually slow to start: learned 20 min).
    let router = {
        let mut r = router;
        for _ in 0..20 {
            r.started("b", 0.0, 1200.0);
        }
        r
    };
    let queues = [
        queue("a", 4, vec![running("a1", 1, 600.0)]),
        queue(
            "b",
            4,
            vec![queued("b1", 2, 2400.0), queued("b2", 3, 100.0)],
        ),
    ];
    let plan = router.plan(&round(&queues, &[]));
    // b1 waited 2,400 s > 2 × a's 300 s start, and a finishes it sooner: a twin on a. b2 has
    // not waited long enough.
    assert_eq!(
        plan.twins,
        vec![PlannedJob {
            queue: "a".into(),
            batches: vec![2]
        }]
    );
    // A batch that already has a twin gets no third job; no twins while batches wait.
    let with_twin = [
        queue("a", 4, vec![queued("a2", 2, 60.0)]),
        queue("b", 4, vec![queued("b1", 2, 2400.0)]),
    ];
    assert!(router.plan(&round(&with_twin, &[])).twins.is_empty());
    // The slower twin of a batch done already, still being cancelled, gets no new twin (its
    // batch has one job open again, but it is finished).
    let mut cancelling = queued("b1", 2, 2400.0);
    cancelling.cancelling = true;
    let done_batch = [
        queue("a", 4, vec![running("a1", 1, 600.0)]),
        queue("b", 4, vec![cancelling, queued("b2", 3, 100.0)]),
    ];
    assert!(router.plan(&round(&done_batch, &[])).twins.is_empty());
    assert!(router
        .plan(&round(&queues, &[9, 10, 11, 12, 13]))
        .twins
        .is_empty());
    // Off unless asked.
    let mut r = round(&queues, &[]);
    r.speculate = false;
    assert!(router.plan(&r).twins.is_empty());
}

#[test]
fn the_schedulers_start_estimate_weighs_by_how_close_its_earlier_ones_came() {
    let job = queued("j", 1, 60.0);
    let queues = [queue("fast", 2, vec![job.clone()])];
    let left = |router: &Router| {
        let r = round(&queues, &[]);
        let assessed = assess::assess(router, &r);
        assessed[0].start_left_s(&job, NOW)
    };
    let mut router = learned(&[("fast", 300.0)], 5);
    // The model alone: 300 s learned, 60 s waited.
    assert_eq!(left(&router), 240.0);
    // The scheduler says two hours, and no estimate of this queue was checked yet: half each.
    router.estimated("j", "fast", NOW + 7200.0);
    assert_eq!(left(&router), 0.5 * 7200.0 + 0.5 * 240.0);
    // Its earlier estimates came true to the second: the estimate is taken whole.
    let mut exact = router.clone();
    for i in 0..5 {
        let name = format!("e{i}");
        exact.estimated(&name, "fast", 1000.0);
        exact.job_started(&name, "fast", 700.0, 1000.0);
    }
    assert_eq!(exact.model("fast").unwrap().estimate_error.get(), Some(0.0));
    assert_eq!(left(&exact), 7200.0);
    // They were ten hours off: the model is nearly all that counts.
    let mut wrong = router.clone();
    for i in 0..5 {
        let name = format!("w{i}");
        wrong.estimated(&name, "fast", 1000.0 + 36_000.0);
        wrong.job_started(&name, "fast", 700.0, 1000.0);
    }
    let l = left(&wrong);
    assert!(l > 240.0 && l < 300.0, "{l}");
    // A started job's estimate is used up; an ended one's forgotten.
    router.job_started("j", "fast", NOW - 60.0, NOW);
    assert_eq!(router.estimate("j"), None);
}

#[test]
fn the_schedulers_estimate_for_a_job_not_yet_sent_moves_where_the_next_batch_goes() {
    // Two queues learned alike (5 min to start). The scheduler says a job sent to `b` now
    // would wait three hours (`sbatch --test-only`): the next batches go to `a`.
    let queues = [queue("a", 1, vec![]), queue("b", 1, vec![])];
    let mut router = learned(&[("a", 300.0), ("b", 300.0)], 5);
    let pending = [1, 2];
    let before = router.plan(&round(&queues, &pending));
    assert_eq!(before.jobs.len(), 2, "one to each while they look alike");
    router.new_job_estimated("b", NOW + 3.0 * 3600.0);
    let r = round(&queues, &pending);
    let assessed = assess::assess(&router, &r);
    // No estimate of `b` was checked yet: half the scheduler's, half the model's.
    assert_eq!(assessed[1].start_s, 0.5 * 3.0 * 3600.0 + 0.5 * 300.0);
    assert_eq!(assessed[0].start_s, 300.0);
    let after = router.plan(&r);
    assert_eq!(sent_to(&after, "a"), [1]);
    assert!(sent_to(&after, "b").is_empty(), "{after:?}");
    let outlook = &after.outlook[1];
    assert_eq!(outlook.scheduler_start_s, Some(3.0 * 3600.0));

    // A job sent to `b` takes that estimate as its own, checked when it starts.
    router.submitted("b-job", "b");
    assert_eq!(router.estimate("b-job"), Some(NOW + 3.0 * 3600.0));
    router.job_started("b-job", "b", NOW, NOW + 600.0);
    let error = router.model("b").unwrap().estimate_error.get().unwrap();
    assert_eq!(error, 3.0 * 3600.0 - 600.0);
}

/// Every plan made from the first `k` of the batches (the list cut) is the plan made from all
/// of them, or says it was cut short: the submit loop reads only the first few each round.
fn cut_lists_plan_as_the_whole_list(router: &Router, queues: &[QueueView], max_jobs: Option<u32>) {
    let pending: Vec<i64> = (1..=120).collect();
    let whole = router.plan(&Round {
        max_jobs,
        ..round(queues, &pending)
    });
    assert!(!whole.cut_short);
    for k in 0..pending.len() {
        let cut = router.plan(&Round {
            pending: Pending {
                batches: &pending[..k],
                cut: true,
            },
            max_jobs,
            ..round(queues, &pending)
        });
        if !cut.cut_short {
            assert_eq!(cut, whole, "a plan from the first {k} batches");
        }
    }
}

#[test]
fn a_plan_from_the_first_batches_is_the_plan_from_all_or_says_it_was_cut_short() {
    let router = learned(&[("fast", 300.0), ("slow", 10_800.0)], 5);
    let free = [queue("fast", 4, vec![]), queue("slow", 4, vec![])];
    // The slow queue's slots take batches only after the fast one's fourth round on paper
    // (about the 20th): a plan from the first 9 (what the loop reads first: the caps and one)
    // cannot know where they go, one from the first 40 can.
    let first = |k: usize| {
        let pending: Vec<i64> = (1..=k as i64).collect();
        router.plan(&Round {
            pending: Pending {
                batches: &pending,
                cut: true,
            },
            ..round(&free, &[])
        })
    };
    assert!(first(9).cut_short);
    assert!(!first(40).cut_short);
    assert_eq!(sent_to(&first(40), "slow").len(), 4);
    // Every queue full: nothing is sent, and one batch is enough to say so.
    let full = [
        queue(
            "fast",
            2,
            vec![queued("f1", 200, 100.0), running("f2", 201, 60.0)],
        ),
        queue("slow", 1, vec![queued("s1", 202, 600.0)]),
    ];
    let plan = router.plan(&Round {
        pending: Pending {
            batches: &[1],
            cut: true,
        },
        ..round(&full, &[])
    });
    assert!(!plan.cut_short && plan.jobs.is_empty(), "{plan:?}");
    let some_room = [
        queue("fast", 4, vec![running("f1", 200, 600.0)]),
        queue("slow", 4, vec![queued("s1", 201, 9000.0)]),
        queue("new", 2, vec![]),
    ];
    for queues in [&free[..], &full[..], &some_room[..]] {
        for max_jobs in [None, Some(3), Some(6)] {
            cut_lists_plan_as_the_whole_list(&router, queues, max_jobs);
            let mut fixed = router.clone();
            fixed.route = Route::Static;
            cut_lists_plan_as_the_whole_list(&fixed, queues, max_jobs);
        }
    }
}
