//! Routing under a limit of the user's jobs over two partitions (a QOS's
//! `MaxSubmitJobsPerUser`, read by the loop with `sacctmgr`), and a job held long while its
//! partition starts others, through the real one-node Slurm. Partitions and the QOS are the
//! test's own, removed after.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::routing::{db, in_queue, jobs, set_state, submit_to_end as submit, Partitions};
use crate::util::{slurm_up, wait_until, TestDir};

const PAPERS: u64 = 24;
const PER_BATCH: u64 = 4;
const BATCHES: u64 = PAPERS / PER_BATCH;

/// A QOS of the test's own; removed when dropped.
struct Qos(String);

impl Qos {
    fn create(name: &str, limits: &[&str]) -> Option<Self> {
        let mut args = vec!["-i", "add", "qos", name];
        args.extend(limits);
        let out = Command::new("sacctmgr").args(&args).output().ok()?;
        out.status.success().then(|| Self(name.to_string()))
    }
}

impl Drop for Qos {
    fn drop(&mut self) {
        let _ = Command::new("sacctmgr")
            .args(["-i", "delete", "qos", &self.0])
            .output();
    }
}

/// The most jobs the run held at once (submitted, not yet seen ended), from run.db.
fn most_held_at_once(t: &TestDir) -> u64 {
    let c = db(t);
    c.query_row(
        "SELECT max((SELECT count(*) FROM (SELECT DISTINCT name FROM jobs o
                      WHERE o.submitted_at <= j.submitted_at
                        AND (o.finished_at IS NULL OR o.finished_at > j.submitted_at))))
         FROM jobs j WHERE j.submitted_at IS NOT NULL",
        [],
        |r| r.get(0),
    )
    .unwrap()
}

fn accepted(t: &TestDir) -> u64 {
    db(t)
        .query_row(
            "SELECT count(*) FROM attempts WHERE state = 'accepted'",
            [],
            |r| r.get(0),
        )
        .unwrap()
}

#[test]
fn under_a_qos_job_limit_over_two_partitions_adaptive_gives_the_places_to_the_free_one() {
    let test =
        "under_a_qos_job_limit_over_two_partitions_adaptive_gives_the_places_to_the_free_one";
    if !slurm_up(test) {
        return;
    }
    let tag = std::process::id() % 100_000;
    // The held partition first by name: alike while nothing is known, it gets places first.
    let (held, free, qos) = (
        format!("rtla{tag}"),
        format!("rtlb{tag}"),
        format!("rtq{tag}"),
    );
    let Some(_qos) = Qos::create(&qos, &["MaxSubmitJobsPerUser=3"]) else {
        eprintln!("skipping {test}: sacctmgr cannot add a QOS (no Slurm accounting here)");
        return;
    };
    let qos_setting = format!("QOS={qos}");
    let _partitions = Partitions::create_with(&[&held, &free], &[&qos_setting]);
    let queues = [format!("{held}=3"), format!("{free}=3")];
    let queue_args = ["--queue", &queues[0], "--queue", &queues[1]];

    // Adaptive, the held partition never released: the loop reads the QOS's limit of three
    // jobs over both partitions, gives the held one two of its three first places (nothing is
    // known yet: they take turns), then every place that frees to the free one, and the held
    // one's two batches to the free one too (twins at the tail, or moves once it counts as
    // stopped).
    let a = TestDir::new();
    a.plan_with_model(PAPERS, PER_BATCH);
    set_state(&held, "DOWN");
    let route = [&queue_args[..], &["--route", "adaptive"]].concat();
    let started = Instant::now();
    let (adaptive_polls, stderr) = submit(&a, &route, None, |_| {});
    let adaptive_wall = started.elapsed();
    assert!(
        stderr.contains(&format!(
            "limits your jobs over these queues to 3 (Slurm: QOS {qos} MaxSubmitJobsPerUser=3)"
        )),
        "{stderr}"
    );
    let st = a.status("run");
    assert_eq!(st["batches_by_state"]["done"], BATCHES, "{st}");
    assert_eq!(st["rows_in_shards"], PAPERS, "{st}");
    assert_eq!(st["routing"]["max_jobs"], 3, "{st}");
    let said = st["routing"]["scheduler_limit"]
        .as_str()
        .unwrap_or_default();
    assert!(said.contains("MaxSubmitJobsPerUser=3"), "{st}");
    assert!(most_held_at_once(&a) <= 3, "the loop held more than 3 jobs");
    let (rows, per_batch) = jobs(&a);
    let on_held = in_queue(&rows, &held);
    assert_eq!(on_held.len(), 2, "two of the three first places: {rows:?}");
    // Each cancelled once the free partition had done its batch (a twin at the tail) or
    // once the held one counted as stopped (moved), whichever came first.
    for job in &on_held {
        assert_eq!(job.1, "cancelled", "{rows:?}");
        assert!(
            job.2.contains("finished first by its twin") || job.2.starts_with("moved: "),
            "{rows:?}"
        );
    }
    let on_free = in_queue(&rows, &free);
    assert_eq!(on_free.len() as u64, BATCHES, "{rows:?}");
    let mut sorted = per_batch.clone();
    sorted.sort_unstable();
    let mut expected = vec![1; BATCHES as usize];
    expected[BATCHES as usize - 2..].fill(2);
    assert_eq!(sorted, expected, "{per_batch:?}");
    assert_eq!(accepted(&a), BATCHES);

    // Static, the held partition released a while after the adaptive run's whole time: it
    // takes turns within the limit, so places wait on the held partition until then.
    let s = TestDir::new();
    s.plan_with_model(PAPERS, PER_BATCH);
    set_state(&held, "DOWN");
    let route = [&queue_args[..], &["--route", "static"]].concat();
    let release = adaptive_wall + Duration::from_secs(10);
    let (static_polls, _) = submit(&s, &route, Some((&held, release)), |_| {});
    let st = s.status("run");
    assert_eq!(st["batches_by_state"]["done"], BATCHES, "{st}");
    assert_eq!(st["rows_in_shards"], PAPERS, "{st}");
    assert!(most_held_at_once(&s) <= 3, "the loop held more than 3 jobs");
    let (rows, per_batch) = jobs(&s);
    assert!(
        in_queue(&rows, &held).iter().all(|r| r.1 == "completed"),
        "{rows:?}"
    );
    assert_eq!(per_batch, vec![1; BATCHES as usize], "{rows:?}");
    assert_eq!(accepted(&s), BATCHES);
    assert!(
        adaptive_polls < static_polls,
        "adaptive took {adaptive_polls} rounds, static {static_polls}"
    );
}

/// The run's queued jobs on `partition`, as squeue lists them.
fn queued_on(partition: &str, run: &std::path::Path) -> Vec<String> {
    let out = Command::new("squeue")
        .args(["-h", "-t", "PD", "-p", partition, "-o", "%i %o"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&run.display().to_string()))
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect()
}

#[test]
fn a_job_held_long_while_its_partition_starts_others_is_sent_again_elsewhere_exactly_once() {
    let test =
        "a_job_held_long_while_its_partition_starts_others_is_sent_again_elsewhere_exactly_once";
    if !slurm_up(test) {
        return;
    }
    let tag = std::process::id() % 100_000;
    // The free partition first by name: where a batch sent again goes when both do as well.
    let (free, holding) = (format!("rtha{tag}"), format!("rthb{tag}"));
    let _partitions = Partitions::create(&[&free, &holding]);
    let t = TestDir::new();
    let papers = 32;
    t.plan_with_model(papers, PER_BATCH);
    let batches = papers / PER_BATCH;
    // `holding` is down until its first jobs are queued; one of them is then held (as a
    // scheduler holds a job for its own reasons) and the partition goes up: it starts the
    // others, and the held one waits on.
    set_state(&holding, "DOWN");
    let queues = [format!("{free}=2"), format!("{holding}=2")];
    let run = t.join("run");
    let held = std::cell::RefCell::new(None::<String>);
    let (_, stderr) = submit(
        &t,
        &["--queue", &queues[0], "--queue", &queues[1]],
        None,
        |_| {
            if held.borrow().is_some() {
                return;
            }
            if let Some(id) = queued_on(&holding, &run).first() {
                let out = Command::new("scontrol")
                    .args(["hold", id])
                    .output()
                    .unwrap();
                assert!(out.status.success(), "{out:?}");
                *held.borrow_mut() = Some(id.clone());
                set_state(&holding, "UP");
            }
        },
    );
    let held = held
        .into_inner()
        .expect("a job was queued on the held partition");
    let st = t.status("run");
    assert_eq!(st["batches_by_state"]["done"], batches, "{st}");
    assert_eq!(st["rows_in_shards"], papers, "{st}");
    assert_eq!(accepted(&t), batches, "each batch accepted once");
    // The held job: cancelled by the loop (moved, or its twin finished its batch first), its
    // batch done by one other job, elsewhere.
    let c = db(&t);
    let (batch, state, why): (i64, String, String) = c
        .query_row(
            "SELECT batch_id, state, coalesce(exit_reason, '') FROM jobs WHERE scheduler_id = ?1",
            [&held],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!(state, "cancelled", "{why}\n{stderr}");
    assert!(
        why.starts_with("moved: ") || why.contains("finished first by its twin"),
        "{why}"
    );
    let others: Vec<(String, String)> = {
        let mut stmt = c
            .prepare("SELECT queue, state FROM jobs WHERE batch_id = ?1 AND scheduler_id != ?2")
            .unwrap();
        stmt.query_map(rusqlite::params![batch, held], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect()
    };
    assert_eq!(
        others,
        [(free.clone(), "completed".to_string())],
        "{stderr}"
    );
    // Nothing of it is left in Slurm.
    wait_until("the held job is gone from squeue", 30, || {
        !queued_on(&holding, &run).contains(&held)
    });
}
