//! Routing between queues through the real one-node Slurm: two partitions of the test's own
//! (made with `scontrol create` and removed after), one of them held down so its jobs wait.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::{slurm_up, TestDir, SUBMIT_ON_SLURM_CPU};

const PAPERS: u64 = 24;
const PER_BATCH: u64 = 4;
const BATCHES: u64 = PAPERS / PER_BATCH;

/// Partitions this test made, on the one node; cancelled and removed when dropped.
pub(crate) struct Partitions(Vec<String>);

impl Partitions {
    pub(crate) fn create(names: &[&str]) -> Self {
        Self::create_with(names, &[])
    }

    /// Partitions with more settings each, e.g. `QOS=NAME`.
    pub(crate) fn create_with(names: &[&str], extra: &[&str]) -> Self {
        let node = String::from_utf8(
            Command::new("sinfo")
                .args(["-h", "-o", "%N"])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        let node = node.lines().next().unwrap().trim().to_string();
        for name in names {
            let partition = format!("PartitionName={name}");
            let nodes = format!("Nodes={node}");
            let mut args = vec![
                "create",
                &partition,
                &nodes,
                "MaxTime=INFINITE",
                "State=UP",
                // Never preempted by the preemption test's higher tier running beside it.
                "PreemptMode=OFF",
            ];
            args.extend(extra);
            scontrol(&args);
        }
        Self(names.iter().map(|n| n.to_string()).collect())
    }
}

impl Drop for Partitions {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = Command::new("scancel").args(["-p", p]).status();
            let _ = Command::new("scontrol")
                .args(["delete", &format!("PartitionName={p}")])
                .status();
        }
    }
}

pub(crate) fn scontrol(args: &[&str]) {
    let out = Command::new("scontrol").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "scontrol {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub(crate) fn set_state(partition: &str, state: &str) {
    scontrol(&[
        "update",
        &format!("PartitionName={partition}"),
        &format!("State={state}"),
    ]);
}

pub(crate) fn db(t: &TestDir) -> rusqlite::Connection {
    let c = rusqlite::Connection::open(t.join("run").join("run.db")).unwrap();
    c.busy_timeout(Duration::from_secs(30)).unwrap();
    c
}

/// Runs `submit` to its end over `fast=2` and `held=2`, `held` down until `release_after`
/// into the run (never, if None). Returns the loop's polls, its stderr and its wall time.
fn submit(
    t: &TestDir,
    route: &str,
    fast: &str,
    held: &str,
    release_after: Option<Duration>,
) -> (u64, String, Duration) {
    set_state(held, "DOWN");
    let started = Instant::now();
    let (fast, held_cap) = (format!("{fast}=2"), format!("{held}=2"));
    let (polls, stderr) = submit_to_end(
        t,
        &["--queue", &fast, "--queue", &held_cap, "--route", route],
        release_after.map(|after| (held, after)),
        |_| {},
    );
    (polls, stderr, started.elapsed())
}

/// Runs `submit` on the run in `t` (Slurm, the model in `model`, CPU, a poll every half
/// second) with `args` added, to its end; `release` = (partition, after): the partition goes
/// up that long into the run (never, if None); `during` sees the time elapsed at each look.
/// Returns the loop's polls and its stderr.
pub(crate) fn submit_to_end(
    t: &TestDir,
    args: &[&str],
    release: Option<(&str, Duration)>,
    during: impl Fn(Duration),
) -> (u64, String) {
    let started = Instant::now();
    let base = [&SUBMIT_ON_SLURM_CPU[..], &["--poll-interval", "0.5"]].concat();
    let mut child = t
        .cmd(&[&base[..], args].concat())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut released = false;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        during(started.elapsed());
        if let Some((partition, after)) = release {
            if !released && started.elapsed() >= after {
                set_state(partition, "UP");
                released = true;
            }
        }
        if started.elapsed() >= Duration::from_secs(400) {
            let _ = child.kill();
            let _ = child.wait();
            let mut stderr = String::new();
            let _ = std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr);
            panic!("the submit {args:?} did not finish:\n{stderr}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "submit {args:?} failed: {stderr}");
    let polls = stderr
        .lines()
        .find_map(|l| l.strip_prefix("owner: ")?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no `owner: N polls` line: {stderr}"));
    (polls, stderr)
}

/// (queue, state, exit reason) of every job, and the job count per batch.
pub(crate) fn jobs(t: &TestDir) -> (Vec<(String, String, String)>, Vec<u64>) {
    let c = db(t);
    let mut stmt = c
        .prepare("SELECT queue, state, coalesce(exit_reason, '') FROM jobs ORDER BY id")
        .unwrap();
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let mut stmt = c
        .prepare("SELECT count(*) FROM jobs GROUP BY batch_id ORDER BY batch_id")
        .unwrap();
    let per_batch = stmt
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    (rows, per_batch)
}

pub(crate) fn in_queue<'a>(
    rows: &'a [(String, String, String)],
    queue: &str,
) -> Vec<&'a (String, String, String)> {
    rows.iter().filter(|r| r.0 == queue).collect()
}

#[test]
fn adaptive_routes_around_a_held_partition_and_finishes_in_fewer_rounds_than_static() {
    if !slurm_up("adaptive_routes_around_a_held_partition_and_finishes_in_fewer_rounds_than_static")
    {
        return;
    }
    let tag = std::process::id() % 100_000;
    let (fast, held) = (format!("rtfast{tag}"), format!("rtheld{tag}"));
    let _partitions = Partitions::create(&[&fast, &held]);

    // Adaptive, with the held partition never released: a queue with no history is expected
    // to start jobs at once, so it gets its cap of two as static gives it, and the other
    // batches go to the partition that starts jobs. At the tail each held job's batch gets a
    // twin there (or, if the run is slow enough for the held queue to count as stopped
    // first, is moved there), and the held jobs are cancelled.
    let a = TestDir::new();
    a.plan_with_model(PAPERS, PER_BATCH);
    let (adaptive_polls, stderr, adaptive_wall) = submit(&a, "adaptive", &fast, &held, None);
    let st = a.status("run");
    assert_eq!(st["batches_by_state"]["done"], BATCHES, "{st}");
    assert_eq!(st["rows_in_shards"], PAPERS, "{st}");
    let (rows, per_batch) = jobs(&a);
    let on_held = in_queue(&rows, &held);
    assert_eq!(
        on_held.len(),
        2,
        "the held partition filled to its cap: {rows:?}"
    );
    for job in &on_held {
        assert_eq!(job.1, "cancelled", "{rows:?}");
        assert!(
            job.2.contains("finished first by its twin") || job.2.starts_with("moved: "),
            "{rows:?}"
        );
    }
    let twins = on_held
        .iter()
        .filter(|j| j.2.contains("finished first by its twin"))
        .count();
    assert!(
        twins >= 1,
        "the newest held job is kept for a twin: {rows:?}"
    );
    assert!(
        stderr.contains(&format!("{twins} speculative twins")),
        "{stderr}"
    );
    assert_eq!(in_queue(&rows, &fast).len() as u64, BATCHES, "{rows:?}");
    // The held jobs' two batches have two jobs each (held, then fast), every other one.
    let mut sorted = per_batch.clone();
    sorted.sort_unstable();
    let mut expected = vec![1; BATCHES as usize];
    expected[BATCHES as usize - 2..].fill(2);
    assert_eq!(sorted, expected, "{per_batch:?}");
    // Each batch accepted once: the shards hold every paper once (counted above) and one
    // accepted attempt per batch.
    let accepted: u64 = db(&a)
        .query_row(
            "SELECT count(*) FROM attempts WHERE state = 'accepted'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(accepted, BATCHES);

    // Static, with the held partition released a while after the adaptive run's whole time:
    // its two jobs there wait for it, and the run with them.
    let s = TestDir::new();
    s.plan_with_model(PAPERS, PER_BATCH);
    let release = adaptive_wall + Duration::from_secs(10);
    let (static_polls, stderr, _) = submit(&s, "static", &fast, &held, Some(release));
    let st = s.status("run");
    assert_eq!(st["batches_by_state"]["done"], BATCHES, "{st}");
    assert_eq!(st["rows_in_shards"], PAPERS, "{st}");
    let (rows, per_batch) = jobs(&s);
    let on_held = in_queue(&rows, &held);
    assert_eq!(
        on_held.len(),
        2,
        "static fills the held partition to its cap: {rows:?}"
    );
    assert!(on_held.iter().all(|r| r.1 == "completed"), "{rows:?}");
    assert_eq!(per_batch, vec![1; BATCHES as usize], "{stderr}");
    assert!(
        adaptive_polls < static_polls,
        "adaptive took {adaptive_polls} rounds, static {static_polls}"
    );
}

/// Whether the cluster preempts by partition priority (`.ci/slurm/start-local-slurm.sh`
/// configures it; a cluster started by an older copy of that script does not).
fn preemption_configured() -> bool {
    let out = Command::new("scontrol")
        .args(["show", "config"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.starts_with("PreemptType") && l.contains("partition_prio"))
}

#[test]
fn a_batch_preempted_by_a_higher_priority_partition_is_retried_and_counted_as_preempted() {
    if !slurm_up(
        "a_batch_preempted_by_a_higher_priority_partition_is_retried_and_counted_as_preempted",
    ) {
        return;
    }
    assert!(
        preemption_configured(),
        "Slurm runs without PreemptType=preempt/partition_prio: start it again with \
         .ci/slurm/stop-local-slurm.sh && .ci/slurm/start-local-slurm.sh"
    );
    let tag = std::process::id() % 100_000;
    let (low, high) = (format!("rtlow{tag}"), format!("rthigh{tag}"));
    let parts = Partitions::create(&[&low, &high]);
    // The low partition's jobs may be preempted (requeued when a job allows it, else
    // cancelled: ours ask not to be requeued, the loop retries them itself); the high one
    // outranks it.
    scontrol(&[
        "update",
        &format!("PartitionName={low}"),
        "PriorityTier=1",
        "PreemptMode=REQUEUE",
    ]);
    scontrol(&[
        "update",
        &format!("PartitionName={high}"),
        "PriorityTier=100",
        "PreemptMode=OFF",
    ]);
    let t = TestDir::new();
    t.plan_with_model(8, 4);
    // Each job takes the whole node, so that the high partition's one-CPU job can only start
    // by preempting it; the first attempt lingers until it is.
    let first = t.join("first-attempt");
    let config = format!(
        "[scheduler.script]\nextra_directives = [\"#SBATCH --exclusive\"]\n\
         setup = [\"if mkdir {} 2>/dev/null; then sleep 300; fi\"]\n",
        first.display()
    );
    std::fs::write(t.join("run.toml"), config).unwrap();
    let mut child = t
        .cmd(&[
            "submit",
            "--run-dir",
            "run",
            "--backend",
            "slurm",
            "--config",
            "run.toml",
            "--model-dir",
            "model",
            "--devices",
            "cpu",
            "--queue",
            &format!("{low}=1"),
            "--poll-interval",
            "0.5",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for the first attempt to run, then outrank it.
    let start = Instant::now();
    while !first.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(240),
            "the first job never started"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = Command::new("sbatch")
        .args([
            "-p",
            &high,
            "-n",
            "1",
            "-t",
            "5",
            "--wrap",
            "sleep 2",
            "--job-name",
            "rt-filler",
            // Its (empty) output nowhere near the checkout.
            "--output",
            "/dev/null",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(400),
            "the submit loop did not finish"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "submit failed: {stderr}");
    let st = t.status("run");
    assert_eq!(st["batches_by_state"]["done"], 2, "{st}");
    assert_eq!(st["rows_in_shards"], 8, "{st}");
    // Three jobs: batch 1's preempted one and its retry, batch 2's.
    let (rows, per_batch) = jobs(&t);
    assert_eq!(per_batch, vec![2, 1], "{rows:?}");
    let states: Vec<&str> = rows.iter().map(|r| r.1.as_str()).collect();
    assert_eq!(states, ["preempted", "completed", "completed"], "{stderr}");
    // The queue's model counts it; status shows it.
    let queue = st["routing"]["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == low.as_str())
        .unwrap_or_else(|| panic!("{st}"))
        .clone();
    assert_eq!(queue["preempted"], 1, "{queue}");
    assert_eq!(queue["finished"], 2, "{queue}");
    assert!(
        stderr.contains("preempted; submitting it again"),
        "{stderr}"
    );
    drop(parts);
}

/// A job shorter than the loop's poll interval is never seen running: it is pending at one
/// poll and ended at the next. Its queue learns its start and run time all the same, from its
/// embed run's own record (found by the job's name as Slurm's environment gave it), as a
/// restarted loop would from run.db: the queue is no longer `new` with no run time, which a
/// complete run's status once said of a queue that had finished every job.
#[test]
fn a_job_that_ends_between_two_polls_still_teaches_its_queue() {
    if !slurm_up("a_job_that_ends_between_two_polls_still_teaches_its_queue") {
        return;
    }
    let tag = std::process::id() % 100_000;
    let quick = format!("rtquick{tag}");
    let _partitions = Partitions::create(&[&quick]);
    let t = TestDir::new();
    t.plan_with_model(4, 4);
    let cap = format!("{quick}=1");
    let args = ["--queue", &cap, "--poll-interval", "30"];
    t.run(&[&SUBMIT_ON_SLURM_CPU[..], &args].concat(), 0);
    let seen_running: Option<String> = db(&t)
        .query_row("SELECT started_at FROM jobs", [], |r| r.get(0))
        .unwrap();
    let st = t.status("run");
    let queue = &st["routing"]["queues"][0];
    assert_eq!(queue["finished"], 1, "{st}");
    assert_eq!(queue["jobs_started"], 1, "its start is learned: {queue}");
    assert_ne!(queue["state"], "new", "{queue}");
    let run_s = queue["run_time_s"]
        .as_f64()
        .unwrap_or_else(|| panic!("{queue}"));
    assert!(run_s > 0.0 && run_s < 300.0, "{queue}");
    if seen_running.is_some() {
        // A busy machine can start the job late enough for a poll to catch it.
        eprintln!("the job was seen running this time (at {seen_running:?})");
    }
}
