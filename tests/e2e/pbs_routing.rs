//! Routing on the real one-node OpenPBS: `submit --route adaptive` learns PBS queues as it
//! learns Slurm's partitions (a stopped queue's jobs are moved or twinned, the run ends
//! exact), and PBS's own estimate of a queued job's start (`estimated.start_time`, set by a
//! scheduler with strict ordering, as Polaris's) is what the backend hands the router.

use crate::pbs_util::{
    assert_exact, finish, jobs, pbs_ok, pbs_up, qmgr, qstat_job, route_of, run_config,
    spawn_submit, submit_args, StoppedQueue,
};
use crate::util::TestDir;
use std::time::{Duration, Instant};

/// `debug=2` and a held queue of cap 2, adaptive: the held queue gets its cap (nothing is
/// known of it yet), the other batches go to `debug`, and each held job's batch is twinned or
/// moved there; the held jobs end cancelled, the run exact.
#[test]
fn pbs_adaptive_routes_around_a_queue_that_never_starts_its_jobs() {
    if !pbs_up("pbs_adaptive_routes_around_a_queue_that_never_starts_its_jobs") {
        return;
    }
    let (batches, per) = (6, 4);
    let t = TestDir::new();
    t.plan_with_model(batches * per, per);
    let held = StoppedQueue::create("efheld");
    std::fs::write(t.join("run.toml"), run_config("walltime = \"00:10:00\"")).unwrap();
    let held_cap = format!("{}=2", held.0);
    let child = spawn_submit(
        &t,
        &[
            "--queue", "debug=2", "--queue", &held_cap, "--route", "adaptive",
        ],
    );
    let (code, err) = finish(child, 400, || {});
    assert_eq!(code, 0, "{err}");
    assert_exact(&t, batches, batches * per);
    let all = jobs(&t);
    let on_held: Vec<_> = all.iter().filter(|j| j.2 == held.0).collect();
    assert_eq!(
        on_held.len(),
        2,
        "the held queue filled to its cap: {all:?}"
    );
    for job in &on_held {
        assert_eq!(job.3, "cancelled", "{all:?}");
        assert!(
            job.4.contains("finished first by its twin") || job.4.starts_with("moved: "),
            "{all:?}"
        );
        // Deleted in PBS, never run.
        let pbs_job = qstat_job(&job.1);
        assert_eq!(pbs_job["job_state"], "F", "{pbs_job}");
        assert!(pbs_job.get("Exit_status").is_none(), "{pbs_job}");
    }
    let on_debug = all.iter().filter(|j| j.2 == "debug").count() as u64;
    assert_eq!(on_debug, batches, "every batch done on debug: {all:?}");
    assert!(all
        .iter()
        .filter(|j| j.2 == "debug")
        .all(|j| j.3 == "completed"));
    // The router learned both queues as it learns Slurm's.
    let debug = route_of(&t, "debug");
    assert_eq!(debug["finished"], batches, "{debug}");
    let stuck = route_of(&t, &held.0);
    assert_eq!(stuck["jobs_started"], 0, "{stuck}");
}

/// Strict ordering on in the scheduler's config while it lives (the scheduler reads it again
/// on SIGHUP); the config as it was when dropped.
struct StrictOrdering(String);

const SCHED_CONFIG: &str = "/var/spool/pbs/sched_priv/sched_config";

impl StrictOrdering {
    fn on() -> Self {
        let before = std::fs::read_to_string(SCHED_CONFIG).unwrap();
        let on = before.replace("strict_ordering: false", "strict_ordering: true");
        assert_ne!(
            on, before,
            "{SCHED_CONFIG} has no `strict_ordering: false` line"
        );
        std::fs::write(SCHED_CONFIG, on).unwrap();
        hup_scheduler();
        Self(before)
    }
}

impl Drop for StrictOrdering {
    fn drop(&mut self) {
        std::fs::write(SCHED_CONFIG, &self.0).unwrap();
        hup_scheduler();
    }
}

fn hup_scheduler() {
    let pid = std::fs::read_to_string("/var/spool/pbs/sched_priv/sched.lock").unwrap();
    let pid: i32 = pid.trim().parse().unwrap();
    // SAFETY: signals PBS's scheduler, whose pid its own lock file holds.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
    std::thread::sleep(Duration::from_millis(500));
}

/// With strict ordering, PBS plans when its top queued job starts: a job waiting for the ngpus
/// a one-minute job holds gets `estimated.start_time` = that job's start + its walltime, and
/// the PBS backend hands exactly that to the router (`start_estimates`). Runs alone
/// (.config/nextest.toml): strict ordering would hold other tests' jobs behind this one.
#[test]
fn pbs_estimated_start_time_is_what_the_backend_hands_the_router() {
    use embedfleet_orchestrator::scheduler::{
        CommandConfig, JobHandle, JobScript, JobSubmission, PbsConfig, PbsJob, PbsScheduler,
        Scheduler,
    };
    if !pbs_up("pbs_estimated_start_time_is_what_the_backend_hands_the_router") {
        return;
    }
    let t = TestDir::new();
    let _strict = StrictOrdering::on();
    let blocker = pbs_ok(
        "qsub",
        &[
            "-q",
            "debug",
            "-l",
            "select=1:ncpus=1:ngpus=4",
            "-l",
            "walltime=00:01:00",
            "-j",
            "oe",
            "-o",
            "/dev/null",
            "--",
            "/bin/sleep",
            "60",
        ],
    );
    let blocker = blocker.trim().to_string();
    let end = Instant::now() + Duration::from_secs(60);
    while qstat_job(&blocker)["job_state"] != "R" {
        assert!(Instant::now() < end, "the blocker never ran");
        std::thread::sleep(Duration::from_millis(200));
    }
    let table: toml::Table = toml::from_str(&crate::pbs_util::commands_table(&[])).unwrap();
    let config: PbsConfig = table["scheduler"]["pbs"].clone().try_into().unwrap();
    let pbs_backend = PbsScheduler::new(config, CommandConfig::default());
    let script = t.join("wait.sh");
    std::fs::write(
        &script,
        "#!/bin/bash\n#PBS -l select=1:ncpus=1:ngpus=4\n#PBS -l walltime=00:01:00\ntrue\n",
    )
    .unwrap();
    let job = JobSubmission::new("efestimate", "debug", JobScript::Path(script)).workdir(t.path());
    let id = pbs_backend.submit(&job).unwrap();
    let handle = JobHandle::new(id.clone());
    let mut estimate = None;
    let end = Instant::now() + Duration::from_secs(30);
    while estimate.is_none() && Instant::now() < end {
        estimate = pbs_backend
            .start_estimates(std::slice::from_ref(&handle))
            .unwrap()
            .get(&id)
            .copied();
        std::thread::sleep(Duration::from_millis(500));
    }
    let stime = qstat_job(&blocker)["stime"].as_str().unwrap().to_string();
    pbs_ok("qdel", &[id.as_str(), &blocker]);
    let estimate = estimate.expect("PBS gave the waiting job an estimated start");
    // The blocker's start, read as the backend reads every ctime PBS prints.
    let mut at = PbsJob::default();
    at.attrs.insert("estimated.start_time".into(), stime);
    let blocker_start = at.estimated_start_s().unwrap();
    assert!(
        (estimate - (blocker_start + 60.0)).abs() <= 5.0,
        "estimate {estimate}, blocker started {blocker_start} with a walltime of 60 s"
    );
}

/// A server attribute set by qmgr while it lives, unset when dropped.
struct ServerSetting(&'static str);

impl ServerSetting {
    fn set(attr: &'static str, value: &str) -> Self {
        qmgr(&format!("set server {attr} = \"{value}\""));
        Self(attr)
    }
}

impl Drop for ServerSetting {
    fn drop(&mut self) {
        let _ = crate::pbs_util::pbs("qmgr")
            .args(["-c", &format!("unset server {}", self.0)])
            .output();
    }
}

/// The most jobs the run held at once in `queue` ("" for all queues): submitted, not yet seen
/// ended, from run.db.
fn most_held_at_once(t: &TestDir, queue: &str) -> u64 {
    crate::pbs_util::db(t)
        .query_row(
            "SELECT coalesce(max((SELECT count(*) FROM (SELECT DISTINCT name FROM jobs o
                      WHERE o.submitted_at <= j.submitted_at
                        AND (o.finished_at IS NULL OR o.finished_at > j.submitted_at)
                        AND (?1 = '' OR o.queue = ?1)))), 0)
             FROM jobs j WHERE j.submitted_at IS NOT NULL AND (?1 = '' OR j.queue = ?1)",
            [queue],
            |r| r.get(0),
        )
        .unwrap()
}

/// PBS Pro states limits of a user's jobs with qmgr: `max_queued` on the server (over every
/// queue) and on a queue (that queue's own). The loop reads both (`qstat -B -f`, `qstat -Q -f`),
/// says them, `status` names them, and it holds no more than either lets it: 3 over both
/// queues, 1 in the limited queue, though `--queue` gives each 3. Had it sent more, PBS would
/// have refused the job. Runs alone (.config/nextest.toml): the server's limit is every test's.
#[test]
fn pbs_max_queued_of_the_server_and_of_a_queue_hold_the_loop_under_them() {
    if !pbs_up("pbs_max_queued_of_the_server_and_of_a_queue_hold_the_loop_under_them") {
        return;
    }
    let (batches, per) = (6, 4);
    let t = TestDir::new();
    t.plan_with_model(batches * per, per);
    let limited = StoppedQueue::create("eflim");
    limited.start();
    qmgr(&format!(
        "set queue {} max_queued = \"[u:PBS_GENERIC=1]\"",
        limited.0
    ));
    let _server = ServerSetting::set("max_queued", "[u:PBS_GENERIC=3]");
    std::fs::write(t.join("run.toml"), run_config("walltime = \"00:10:00\"")).unwrap();
    let limited_cap = format!("{}=3", limited.0);
    let child = spawn_submit(
        &t,
        &[
            "--queue",
            "debug=3",
            "--queue",
            &limited_cap,
            "--route",
            "adaptive",
        ],
    );
    let (code, err) = finish(child, 400, || {});
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains(
            "limits your jobs over these queues to 3 (PBS: server max_queued [u:PBS_GENERIC=3]"
        ),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "queues kept under their own: {} at most 1",
            limited.0
        )),
        "{err}"
    );
    assert_exact(&t, batches, batches * per);
    let st = t.status("run");
    assert_eq!(st["routing"]["max_jobs"], 3, "{st}");
    let said = st["routing"]["scheduler_limit"]
        .as_str()
        .unwrap_or_default();
    assert!(said.starts_with("3 jobs, 1 in "), "{st}");
    assert!(
        said.contains(&format!("queue {} max_queued [u:PBS_GENERIC=1]", limited.0)),
        "{st}"
    );
    // The limits held, and the run used them: three at once, one of them in the limited queue
    // (alike while nothing is known, the queues take turns).
    assert_eq!(most_held_at_once(&t, ""), 3, "{:?}", jobs(&t));
    assert_eq!(
        most_held_at_once(&t, &limited.0),
        1,
        "{:?}\n{err}",
        jobs(&t)
    );
    // PBS refused nothing (`qsub: would exceed queue generic's per-user limit`, exit 38).
    assert!(!err.contains("would exceed"), "{err}");
}

/// PBS's form of `routing::a_job_that_ends_between_two_polls_still_teaches_its_queue`: a job
/// queued at one poll and ended at the next (a 30 s poll) is found by its name as PBS's
/// environment gives it (`NAME (ID)`), so `debug` learns its start and run time.
#[test]
fn pbs_a_job_that_ends_between_two_polls_still_teaches_its_queue() {
    if !pbs_up("pbs_a_job_that_ends_between_two_polls_still_teaches_its_queue") {
        return;
    }
    let t = TestDir::new();
    t.plan_with_model(4, 4);
    std::fs::write(t.join("run.toml"), run_config("")).unwrap();
    t.run(
        &[&submit_args("30")[..], &["--queue", "debug=1"]].concat(),
        0,
    );
    let st = t.status("run");
    let queue = &st["routing"]["queues"][0];
    assert_eq!(
        (queue["queue"].as_str(), queue["finished"].as_u64()),
        (Some("debug"), Some(1)),
        "{st}"
    );
    assert_eq!(queue["jobs_started"], 1, "its start is learned: {queue}");
    let run_s = queue["run_time_s"]
        .as_f64()
        .unwrap_or_else(|| panic!("{queue}"));
    assert!(run_s > 0.0 && run_s < 300.0, "{queue}");
}
