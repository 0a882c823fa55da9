//! The submit loop against a scheduler whose answers each test chooses.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use embedfleet_core::rundb::JobRow;
use embedfleet_core::state::JobStatus;
use embedfleet_core::state::PlanState;
use embedfleet_core::RunLayout;
use std::path::Path;

use super::follow::log_tail;
use super::submit_loop::SubmitLoop;
use super::*;
use crate::scheduler::{
    marker_state, Backend, JobHandle, JobState, JobSubmission, QueuedJob, Scheduler,
    SchedulerError, SchedulerJobId, SchedulerResult,
};

/// A scheduler that answers submissions from a list, lists no job, and reports a job by its
/// completion marker (running until the marker appears), as the real backends do for a job
/// that writes one. What the loop asked of it, in order, is in `calls`.
#[derive(Debug, Clone, Default)]
struct Scripted {
    answers: Arc<Mutex<VecDeque<SchedulerResult<SchedulerJobId>>>>,
    calls: Arc<Mutex<Vec<String>>>,
}

impl Scripted {
    fn answering(answers: Vec<SchedulerResult<SchedulerJobId>>) -> Self {
        Self {
            answers: Arc::new(Mutex::new(answers.into())),
            calls: Arc::default(),
        }
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    fn record(&self, call: String) {
        self.calls.lock().unwrap().push(call);
    }
}

impl Scheduler for Scripted {
    fn backend(&self) -> Backend {
        Backend::Local
    }

    fn submit(&self, job: &JobSubmission) -> SchedulerResult<SchedulerJobId> {
        self.record(format!("submit {}", job.name));
        self.answers
            .lock()
            .unwrap()
            .pop_front()
            .expect("the test gave the scheduler no answer for this submission")
    }

    fn poll(&self, jobs: &[JobHandle]) -> SchedulerResult<HashMap<SchedulerJobId, JobState>> {
        Ok(jobs
            .iter()
            .map(|job| {
                let state = job.marker.as_deref().and_then(marker_state);
                (job.id.clone(), state.unwrap_or(JobState::Running))
            })
            .collect())
    }

    fn cancel(&self, job: &JobHandle) -> SchedulerResult<()> {
        self.record(format!("cancel {}", job.id));
        Ok(())
    }

    fn list_jobs(&self) -> SchedulerResult<Vec<QueuedJob>> {
        Ok(Vec::new())
    }

    fn cancel_named(&self, name: &str) -> SchedulerResult<()> {
        self.record(format!("cancel_named {name}"));
        Ok(())
    }
}

/// Every queue refused: the run's last line gives each queue's own reason and remedy, not one
/// remedy for all (a host key is not fixed by renaming its queue).
#[test]
fn every_queue_refused_ends_with_each_queues_own_reason_and_remedy() {
    let (_dir, mut options) = planned_run(2);
    options.queues = Some(BTreeMap::from([
        ("h2".to_string(), 1),
        ("q".to_string(), 1),
    ]));
    let host_key = "ssh refused the host key of 127.0.0.3: check its fingerprint, then add it \
                    (`ssh-keyscan -p 2222 127.0.0.3 >> ~/.ssh/known_hosts`)";
    let scheduler = Scripted::answering(vec![Err(SchedulerError::InvalidJob {
        name: "j".into(),
        reason: "invalid partition specified: q".into(),
    })]);
    let mut lp = submit_loop(&options, &scheduler);
    lp.refused.insert("h2".into(), host_key.into());
    let err = lp.run_keeping_db().err().expect("the loop fails");
    assert!(matches!(err, SubmitError::AllQueuesRefused(_)), "{err}");
    let text = err.to_string();
    assert!(text.contains(&format!("h2: {host_key}")), "{text}");
    assert!(
        text.contains(
            "q: invalid partition specified: q; fix the queue with `embedfleet queues set`"
        ),
        "{text}"
    );
    assert_eq!(text.matches("queues set").count(), 1, "{text}");
}

fn timed_out(name: &str) -> SchedulerError {
    SchedulerError::SubmitUncertain {
        name: name.to_string(),
        source: Box::new(SchedulerError::CommandTimedOut {
            command: "sbatch".into(),
            timeout: Duration::from_secs(30),
            attempts: 1,
            stderr_tail: String::new(),
        }),
    }
}

fn sbatch_failed() -> SchedulerError {
    SchedulerError::CommandFailed {
        command: "sbatch".into(),
        status: "exit status 1".into(),
        attempts: 3,
        stderr_tail: "Socket timed out on send/recv operation".into(),
    }
}

/// A planned run of `batches` batches, and the options of a loop over it (one queue of cap 1).
fn planned_run(batches: i64) -> (tempfile::TempDir, SubmitOptions) {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let mut db = RunDb::create(&run_dir).unwrap();
    let tx = db.conn_mut().transaction().unwrap();
    tx.execute(
        "INSERT INTO corpus_files (id, path, size, mtime_ns, edges, state)
         VALUES (1, 'c', 0, 0, '', 'planned')",
        [],
    )
    .unwrap();
    for id in 1..=batches {
        tx.execute(
            "INSERT INTO batches (id, file_id, seq, path, n_rows, n_chars)
             VALUES (?1, 1, ?1, 'b', 1, 1)",
            [id],
        )
        .unwrap();
    }
    tx.commit().unwrap();
    db.set_plan_state(PlanState::Complete).unwrap();
    // The loop writes plan.json for runs planned without one; these jobs never read it.
    std::fs::write(RunLayout::new(&run_dir).plan_file(), "{}").unwrap();
    let options = SubmitOptions {
        run_dir,
        config: Default::default(),
        queues: Some(BTreeMap::from([("q".to_string(), 1)])),
        policy: LoopPolicy {
            max_attempts: 3,
            poll_interval: Duration::from_millis(10),
            lost_after: Duration::from_secs(3600),
            breaker_after: 3,
            route: Default::default(),
            speculate: true,
            max_jobs: None,
        },
        embed_args: Vec::new(),
        exe: PathBuf::from("/bin/false"),
        progress: false,
        session: Default::default(),
        bytes_per_paper: 0,
        keep_on_first_job: Vec::new(),
    };
    (dir, options)
}

fn submit_loop<'a>(options: &'a SubmitOptions, scheduler: &Scripted) -> SubmitLoop<'a> {
    let mut lp = SubmitLoop::new(options).unwrap();
    lp.scheduler = Box::new(scheduler.clone());
    lp
}

/// (attempt, name, state, marker) of every job row, in the order they were recorded.
fn job_rows(options: &SubmitOptions) -> Vec<(u32, String, String, String)> {
    let db = RunDb::open(&options.run_dir).unwrap();
    let mut stmt = db
        .conn()
        .prepare("SELECT attempt, name, state, marker FROM jobs ORDER BY id")
        .unwrap();
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap();
    rows.map(|row| row.unwrap()).collect()
}

#[test]
fn an_uncertain_submission_is_cancelled_by_name_and_its_batch_resubmitted_under_a_new_name() {
    let (_dir, options) = planned_run(1);
    let tag = run_tag(&options.run_dir);
    let first = job_name(&tag, Backend::Local, 1, 1);
    let second = job_name(&tag, Backend::Local, 1, 2);
    let scheduler =
        Scripted::answering(vec![Err(timed_out(&first)), Ok(SchedulerJobId::new("101"))]);
    let mut lp = submit_loop(&options, &scheduler);
    lp.submit_round().unwrap();
    lp.settle_submitting().unwrap();
    std::thread::sleep(options.policy.poll_interval); // the queue is tried again a poll later
    lp.submit_round().unwrap();
    assert_ne!(first, second);
    assert_eq!(
        scheduler.calls(),
        [
            format!("submit {first}"),
            format!("cancel_named {first}"),
            format!("submit {second}"),
        ]
    );
    let rows = job_rows(&options);
    let summary: Vec<(u32, &str, &str)> = rows
        .iter()
        .map(|(attempt, name, state, _)| (*attempt, name.as_str(), state.as_str()))
        .collect();
    assert_eq!(
        summary,
        [(1, first.as_str(), "lost"), (2, second.as_str(), "pending")]
    );
}

#[test]
fn a_failed_submission_keeps_its_attempt_number_and_the_next_try_takes_a_new_one() {
    let (_dir, options) = planned_run(1);
    let scheduler = Scripted::answering(vec![Err(sbatch_failed()), Ok(SchedulerJobId::new("7"))]);
    let mut lp = submit_loop(&options, &scheduler);
    lp.submit_round().unwrap();
    std::thread::sleep(options.policy.poll_interval); // the queue is tried again a poll later
    lp.submit_round().unwrap();
    let rows = job_rows(&options);
    assert_eq!(rows.len(), 2, "{rows:?}");
    let (failed, next) = (&rows[0], &rows[1]);
    assert_eq!((failed.0, failed.2.as_str()), (1, "failed"), "{rows:?}");
    assert_eq!((next.0, next.2.as_str()), (2, "pending"), "{rows:?}");
    assert_ne!(failed.1, next.1, "the next try reused the job name");
    assert_ne!(failed.3, next.3, "the next try reused the exit marker");
}

#[test]
fn an_attempt_whose_script_is_already_in_the_job_directory_is_not_reused() {
    // A run submitted by an embedfleet that deleted the rows of failed submissions: run.db
    // knows no job of batch 1, but attempt 1's script (and maybe a twin) is there.
    let (_dir, options) = planned_run(1);
    let tag = run_tag(&options.run_dir);
    let layout = RunLayout::new(&options.run_dir);
    std::fs::create_dir_all(layout.job_dir()).unwrap();
    std::fs::write(layout.job_script(&job_name(&tag, Backend::Local, 1, 1)), "").unwrap();
    let scheduler = Scripted::answering(vec![Ok(SchedulerJobId::new("5"))]);
    submit_loop(&options, &scheduler).submit_round().unwrap();
    assert_eq!(
        scheduler.calls(),
        [format!("submit {}", job_name(&tag, Backend::Local, 1, 2))]
    );
}

#[test]
fn an_exit_marker_of_an_earlier_attempt_is_not_read_as_the_new_jobs_end() {
    let (_dir, options) = planned_run(1);
    let tag = run_tag(&options.run_dir);
    let first = job_name(&tag, Backend::Local, 1, 1);
    let scheduler =
        Scripted::answering(vec![Err(timed_out(&first)), Ok(SchedulerJobId::new("101"))]);
    let mut lp = submit_loop(&options, &scheduler);
    lp.submit_round().unwrap();
    lp.settle_submitting().unwrap();
    std::thread::sleep(options.policy.poll_interval); // the queue is tried again a poll later
    lp.submit_round().unwrap();
    // The uncertain submission had queued a twin after all; it ends, writing its marker.
    let twin_marker = RunLayout::new(&options.run_dir).job_marker(&first);
    std::fs::write(&twin_marker, "0\n").unwrap();
    lp.poll().unwrap();
    let rows = job_rows(&options);
    let tracked = rows.last().unwrap();
    assert_ne!(tracked.3, twin_marker.display().to_string());
    assert!(
        JobStatus::parse(&tracked.2).is_some_and(JobStatus::is_open),
        "the twin's exit marker ended the tracked job: {rows:?}"
    );
}

#[test]
fn run_tags_of_two_run_directories_differ_and_are_64_bits_long() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (
        run_tag(&dir.path().join("a")),
        run_tag(&dir.path().join("b")),
    );
    assert_ne!(a, b);
    for tag in [&a, &b] {
        assert_eq!(tag.len(), 16, "{tag}");
        assert!(tag.chars().all(|c| c.is_ascii_hexdigit()), "{tag}");
    }
    assert_eq!(run_tag(&dir.path().join("a")), a, "a run's tag is stable");
}

#[test]
fn job_names_are_unique_per_attempt_and_fit_pbs_name_limit() {
    let tag = run_tag(Path::new("/scratch/run"));
    let slurm = job_name(&tag, Backend::Slurm, 42, 2);
    assert_eq!(slurm, format!("ef{tag}-b000042-a2"));
    let mut pbs_names = BTreeSet::new();
    for batch in 1..=50 {
        for attempt in 1..=20 {
            let name = job_name(&tag, Backend::Pbs, batch, attempt);
            let pbs_name_max = Backend::Pbs.kind().max_job_name().unwrap();
            assert!(name.len() <= pbs_name_max, "{name}");
            assert!(name.chars().all(|c| c.is_ascii_alphanumeric()), "{name}");
            pbs_names.insert(name);
        }
    }
    assert_eq!(pbs_names.len(), 50 * 20, "two PBS jobs share a name");
    let other_run = run_tag(Path::new("/scratch/run2"));
    assert!(!pbs_names.contains(&job_name(&other_run, Backend::Pbs, 1, 1)));
}

#[test]
fn jobs_in_flight_when_the_breaker_trips_do_not_pause_the_run_twice() {
    let (_dir, mut options) = planned_run(4);
    options.queues = Some(BTreeMap::from([("q".to_string(), 3)]));
    options.policy.breaker_after = 2;
    let scheduler = Scripted::answering(
        ["11", "12", "13"]
            .map(|id| Ok(SchedulerJobId::new(id)))
            .into(),
    );
    let mut lp = submit_loop(&options, &scheduler);
    lp.submit_round().unwrap();
    let layout = RunLayout::new(&options.run_dir);
    let tag = run_tag(&options.run_dir);
    for batch in 1..=3 {
        let name = job_name(&tag, Backend::Local, batch, 1);
        let log = format!("loading\nerror: libcudnn.so.9 missing on nid00{batch}\n");
        std::fs::write(layout.job_log(&name), log).unwrap();
        std::fs::write(layout.job_marker(&name), "1\n").unwrap();
    }
    // All three end in one poll: the first two trip the breaker, the third is the same
    // failure of a job sent before the pause and adds nothing.
    lp.poll().unwrap();
    let db = RunDb::open(&options.run_dir).unwrap();
    assert!(db.paused().unwrap());
    let reason = db.pause_reason().unwrap().unwrap();
    assert_eq!(
        reason.jobs,
        [1, 2].map(|b| job_name(&tag, Backend::Local, b, 1))
    );
    assert_eq!(
        reason.signature,
        "exit code 1; first error line: error: libcudnn.so.# missing on nid#"
    );
    assert!(lp.trips.tripped);
    // Resumed: a fresh count, and the batches get their attempts again.
    db.set_paused(false).unwrap();
    lp.resumed_after_trip().unwrap();
    assert!(!lp.trips.tripped);
    assert!(
        lp.following.attempts.is_empty(),
        "{:?}",
        lp.following.attempts
    );
    assert_eq!(db.pause_reason().unwrap(), None);
}

#[test]
fn a_log_tail_reads_the_end_of_a_large_log_only() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("job.log");
    let mut text = "x".repeat(100).repeat(50_000); // 5 MB with no newline: never read whole
    text.push_str("\nloading model\n\nshard 3 of 8\nerror: CUDA out of memory\n");
    std::fs::write(&log, text).unwrap();
    assert_eq!(
        log_tail(log.to_str().unwrap()),
        "loading model | shard 3 of 8 | error: CUDA out of memory"
    );
    assert_eq!(log_tail("/no/such/log"), "");
}

#[test]
fn a_queue_that_is_not_taking_jobs_does_not_hold_up_the_others() {
    // The rehearsal's drained partition: its sbatch fails every time, and the round used to
    // stop there, so the other partition got no job either.
    let (_dir, mut options) = planned_run(3);
    options.queues = Some(BTreeMap::from([
        ("drained".to_string(), 2),
        ("up".to_string(), 2),
    ]));
    options.policy.poll_interval = Duration::from_millis(200);
    let scheduler = Scripted::answering(vec![
        Err(sbatch_failed()),
        Ok(SchedulerJobId::new("1")),
        Ok(SchedulerJobId::new("2")),
        Ok(SchedulerJobId::new("3")),
    ]);
    let mut lp = submit_loop(&options, &scheduler);
    lp.submit_round().unwrap();
    let queue_of = |options: &SubmitOptions| -> Vec<(String, String)> {
        let db = RunDb::open(&options.run_dir).unwrap();
        let mut stmt = db
            .conn()
            .prepare("SELECT queue, state FROM jobs ORDER BY id")
            .unwrap();
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
        rows.map(|r| r.unwrap()).collect()
    };
    let rows = queue_of(&options);
    assert!(
        rows.contains(&("drained".into(), "failed".into()))
            && rows.iter().any(|(q, s)| q == "up" && s == "pending"),
        "the round went on to the other queue after the failure: {rows:?}"
    );
    // The next round, within the wait: the failed batch goes to the queue that takes jobs.
    lp.submit_round().unwrap();
    let rows = queue_of(&options);
    let up = rows
        .iter()
        .filter(|(q, s)| q == "up" && s == "pending")
        .count();
    assert_eq!(up, 2, "{rows:?}");
    assert_eq!(
        rows.iter().filter(|(q, _)| q == "drained").count(),
        1,
        "the drained queue is left alone while it cools: {rows:?}"
    );
}

#[test]
fn the_first_twin_to_finish_its_batch_has_the_other_cancelled_and_the_batch_counted_once() {
    let (_dir, mut options) = planned_run(1);
    options.queues = Some(BTreeMap::from([("a".to_string(), 1), ("b".to_string(), 1)]));
    let scheduler = Scripted::answering(["11", "12"].map(|id| Ok(SchedulerJobId::new(id))).into());
    let mut lp = submit_loop(&options, &scheduler);
    // The batch's job on a, and its speculative twin on b (the next attempt number).
    for queue in ["a", "b"] {
        let job = PlannedJob {
            queue: queue.into(),
            batches: vec![1],
        };
        assert!(matches!(lp.submit_job(&job).unwrap(), launch::Sent::Yes(_)));
    }
    let tag = run_tag(&options.run_dir);
    let (first, twin) = (
        job_name(&tag, Backend::Local, 1, 1),
        job_name(&tag, Backend::Local, 1, 2),
    );
    // The twin finishes first: its attempt is the batch's (the owner accepts one attempt per
    // batch), and it exits 0.
    let db = RunDb::open(&options.run_dir).unwrap();
    db.set_batch_state(
        embedfleet_core::BatchId(1),
        embedfleet_core::state::BatchState::Done,
    )
    .unwrap();
    let layout = RunLayout::new(&options.run_dir);
    std::fs::write(layout.job_marker(&twin), "0\n").unwrap();
    lp.poll().unwrap();
    assert!(
        scheduler.calls().contains(&"cancel 11".to_string()),
        "{:?}",
        scheduler.calls()
    );
    // It holds its place in queue a until the scheduler says it ended.
    let open = db.open_jobs().unwrap();
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].name, first);
    lp.observe(&first, &[&open[0]], JobState::Cancelled)
        .unwrap();
    let rows = job_rows(&options);
    assert_eq!(rows[0].1, first);
    assert_eq!(rows[0].2, "cancelled");
    assert_eq!(rows[1].2, "completed");
    let reason: String = db
        .conn()
        .query_row(
            "SELECT exit_reason FROM jobs WHERE name = ?1",
            [&first],
            |r| r.get(0),
        )
        .unwrap();
    assert!(
        reason.contains(&format!("finished first by its twin {twin}")),
        "{reason}"
    );
    // Counted once, retried never, and a cancel is nothing against queue a.
    assert_eq!(lp.report.batches_done, 1);
    assert_eq!(lp.report.retried, 0);
    assert!(db.open_jobs().unwrap().is_empty());
    assert_eq!(lp.routing.router.model("b").unwrap().finished, 1);
    assert_eq!(
        lp.routing
            .router
            .model("a")
            .map_or(0, |m| m.failed + m.preempted),
        0
    );
}

#[test]
fn a_running_job_seen_queued_again_counts_as_preempted_on_its_queue() {
    let (_dir, options) = planned_run(1);
    let scheduler = Scripted::answering(vec![Ok(SchedulerJobId::new("11"))]);
    let mut lp = submit_loop(&options, &scheduler);
    lp.submit_round().unwrap();
    let open = lp.db.open_jobs().unwrap();
    let name = open[0].name.clone();
    lp.observe(&name, &[&open[0]], JobState::Running).unwrap();
    let open = lp.db.open_jobs().unwrap();
    assert_eq!(open[0].state, JobStatus::Running);
    assert!(open[0].started_s.is_some());
    assert_eq!(lp.routing.router.model("q").unwrap().start_delay.samples, 1);
    // The scheduler requeued it (PreemptMode=REQUEUE): back to pending, the same job.
    lp.observe(&name, &[&open[0]], JobState::Pending).unwrap();
    assert_eq!(lp.report.requeued, 1);
    assert_eq!(lp.routing.router.model("q").unwrap().preempted, 1);
    assert_eq!(lp.db.open_jobs().unwrap()[0].state, JobStatus::Pending);
}

#[test]
fn a_queue_whose_jobs_fail_alike_while_the_others_run_is_set_aside_until_a_resume() {
    let (_dir, mut options) = planned_run(6);
    options.queues = Some(BTreeMap::from([
        ("bad".to_string(), 2),
        ("good".to_string(), 2),
    ]));
    options.policy.breaker_after = 2;
    options.policy.route = crate::route::Route::Static;
    let scheduler = Scripted::answering(
        (1..=8)
            .map(|id| Ok(SchedulerJobId::new(id.to_string())))
            .collect(),
    );
    let mut lp = submit_loop(&options, &scheduler);
    lp.submit_round().unwrap();
    let layout = RunLayout::new(&options.run_dir);
    let db = RunDb::open(&options.run_dir).unwrap();
    let on_bad: Vec<JobRow> = db
        .open_jobs()
        .unwrap()
        .into_iter()
        .filter(|j| j.queue == "bad")
        .collect();
    assert_eq!(on_bad.len(), 2);
    // The host behind "bad" lacks cuDNN; "good"'s jobs run on.
    for job in &on_bad {
        let log = "loading\nerror: libcudnn.so.9: cannot open shared object file\n";
        std::fs::write(layout.job_log(&job.name), log).unwrap();
        std::fs::write(layout.job_marker(&job.name), "1\n").unwrap();
    }
    lp.poll().unwrap();
    assert!(!db.paused().unwrap(), "one queue's fault pauses nothing");
    assert!(!lp.trips.tripped);
    let why = lp.set_aside().get("bad").expect("bad set aside").clone();
    assert!(
        why.contains("2 jobs in a row there failed the same way")
            && why.contains("cannot open shared object file"),
        "{why}"
    );
    assert_eq!(lp.report.set_aside, ["bad"]);
    // No job goes there: the retried batches wait for "good".
    let before = scheduler.calls().len();
    lp.submit_round().unwrap();
    assert_eq!(
        scheduler.calls().len(),
        before,
        "good is full, bad set aside"
    );
    // `embedfleet resume`, though the run is not paused, brings it back.
    db.set_paused(false).unwrap();
    lp.bring_back_set_aside().unwrap();
    assert!(lp.set_aside().is_empty());
    lp.submit_round().unwrap();
    let open_bad = db
        .open_jobs()
        .unwrap()
        .into_iter()
        .filter(|j| j.queue == "bad")
        .count();
    assert_eq!(open_bad, 2, "jobs go to bad again");
}

/// An embed job refused by its node's device (exit 5: `--precision fp8` on an A100) sets its
/// queue aside at the first and its batch is tried on the other queue, the run going on; on
/// the run's last queue the same refusal pauses the run at the first, saying what to do.
#[test]
fn a_device_refusal_sets_its_queue_aside_at_the_first_and_pauses_only_on_the_last() {
    let refuse = |options: &SubmitOptions, job: &JobRow| {
        let layout = RunLayout::new(&options.run_dir);
        let log = "error: --precision fp8 needs FP8 tensor cores (compute capability 8.9 or \
                   newer); this GPU is 8.0 (an A100)\n";
        std::fs::write(layout.job_log(&job.name), log).unwrap();
        std::fs::write(layout.job_marker(&job.name), "5\n").unwrap();
    };
    let (_dir, mut options) = planned_run(2);
    options.queues = Some(BTreeMap::from([
        ("a100".to_string(), 1),
        ("h100".to_string(), 1),
    ]));
    options.policy.route = crate::route::Route::Static;
    let ids = (1..=4).map(|id| Ok(SchedulerJobId::new(id.to_string())));
    let scheduler = Scripted::answering(ids.collect());
    let mut lp = submit_loop(&options, &scheduler);
    lp.submit_round().unwrap();
    let db = RunDb::open(&options.run_dir).unwrap();
    let on_a100 = db.open_jobs().unwrap();
    let on_a100 = on_a100.iter().find(|j| j.queue == "a100").unwrap();
    refuse(&options, on_a100);
    lp.poll().unwrap();
    assert!(!db.paused().unwrap(), "the h100 queue takes the run");
    let why = lp.set_aside().get("a100").expect("a100 set aside").clone();
    assert!(
        why.contains("was refused by its node's device") && why.contains("exit code 5"),
        "{why}"
    );
    // Retried, not failed; it waits for h100, and nothing of a100's speed was learned.
    assert_eq!(lp.report.retried, 1);
    assert!(lp.report.failed.is_empty(), "{:?}", lp.report.failed);
    let batch = embedfleet_core::BatchId(on_a100.batch_id);
    let failed = Some(embedfleet_core::state::BatchState::Failed);
    assert_ne!(db.batch_state(batch).unwrap(), failed);
    assert_eq!(lp.routing.router.model("a100").map_or(0, |m| m.failed), 0);
    let before = scheduler.calls().len();
    lp.submit_round().unwrap();
    assert_eq!(
        scheduler.calls().len(),
        before,
        "h100 is full, a100 set aside"
    );

    // One queue: the same refusal pauses the run at the first.
    let (_dir, options) = planned_run(2);
    let scheduler = Scripted::answering(vec![Ok(SchedulerJobId::new("21"))]);
    let mut lp = submit_loop(&options, &scheduler);
    lp.submit_round().unwrap();
    let db = RunDb::open(&options.run_dir).unwrap();
    refuse(&options, &db.open_jobs().unwrap()[0]);
    lp.poll().unwrap();
    assert!(db.paused().unwrap());
    let reason = db.pause_reason().unwrap().unwrap();
    assert!(
        reason.message.contains("refused by its node's device")
            && reason.signature.starts_with("exit code 5;"),
        "{reason:?}"
    );
    assert!(
        reason
            .check
            .iter()
            .any(|c| c.contains("leave --precision out")),
        "{:?}",
        reason.check
    );
}
