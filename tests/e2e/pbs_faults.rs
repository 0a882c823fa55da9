//! What goes wrong on a PBS Professional system, caused for real on the one-node OpenPBS of
//! `.ci/pbs/start-local-pbs.sh`, through `submit --backend pbs`: a job past its walltime, jobs
//! deleted while running and while queued, the server restarted under running jobs, a job that
//! can never run, and a preemption by requeue. Each run ends exact (or pauses, for the job that
//! can never run) and counts what happened as what it was.
//!
//! Without a reachable server these tests print why and pass, unless
//! `EMBEDFLEET_REQUIRE_PBS=1` (CI) makes them fail.

use crate::pbs_util::{
    assert_exact, finish, jobs, pbs_ok, pbs_up, qstat_job, route_of, run_config, spawn_submit,
    state_of, wait_for, StoppedQueue,
};
use crate::util::TestDir;
use std::time::{Duration, Instant};

/// The PBS id a job wrote to `<dir>/id` once it started (see `one_job_each`).
fn id_in(dir: &std::path::Path) -> Option<String> {
    let id = std::fs::read_to_string(dir.join("id")).ok()?;
    Some(id.trim().to_string()).filter(|i| !i.is_empty())
}

/// A script setup in which the first job to start does `first` and the second `second`, each
/// recording its PBS id in the folder it made under `dir`; the others (and every rerun) embed.
fn one_job_each(dir: &std::path::Path, first: (&str, &str), second: (&str, &str)) -> String {
    let d = dir.display();
    format!(
        "setup = [\"if mkdir {d}/{a} 2>/dev/null; then echo $PBS_JOBID > {d}/{a}/id; {fa}; \
         elif mkdir {d}/{b} 2>/dev/null; then echo $PBS_JOBID > {d}/{b}/id; {fb}; fi\"]",
        a = first.0,
        fa = first.1,
        b = second.0,
        fb = second.1
    )
}

/// A job past its walltime (PBS's Exit_status -29), one deleted while running (substate 91)
/// and one deleted while queued (no Exit_status at all): each counted as what it was, its
/// batch retried, the run exact.
#[test]
fn pbs_walltime_and_jobs_deleted_running_or_queued_are_retried_and_counted() {
    let test = "pbs_walltime_and_jobs_deleted_running_or_queued_are_retried_and_counted";
    if !pbs_up(test) {
        return;
    }
    let (batches, per) = (5, 4);
    let t = TestDir::new();
    t.plan_with_model(batches * per, per);
    let stopped = StoppedQueue::create("efstop");
    let setup = one_job_each(t.path(), ("hang", "sleep 300"), ("slow", "sleep 300"));
    std::fs::write(
        t.join("run.toml"),
        run_config(&format!("walltime = \"00:00:20\"\n{setup}")),
    )
    .unwrap();
    let held_cap = format!("{}=1", stopped.0);
    let mut child = spawn_submit(
        &t,
        &[
            "--queue", "debug=2", "--queue", &held_cap, "--route", "static",
        ],
    );
    // Deleted while running.
    let mut slow = None;
    wait_for(&mut child, "the second job runs", 120, || {
        slow = id_in(&t.join("slow"));
        slow.is_some()
    });
    let slow = slow.unwrap();
    pbs_ok("qdel", &[&slow]);
    // Deleted while queued: the stopped queue's job.
    let mut queued = None;
    wait_for(&mut child, "a job waits in the stopped queue", 120, || {
        queued = jobs(&t)
            .into_iter()
            .find(|j| j.2 == stopped.0 && j.3 == "pending")
            .map(|j| j.1);
        queued.is_some()
    });
    let queued = queued.unwrap();
    pbs_ok("qdel", &[&queued]);
    wait_for(&mut child, "both deletions are seen", 120, || {
        state_of(&t, &slow).as_deref() == Some("cancelled")
            && state_of(&t, &queued).as_deref() == Some("cancelled")
    });
    stopped.start();
    let (code, err) = finish(child, 300, || {});
    assert_eq!(code, 0, "{err}");
    assert_exact(&t, batches, batches * per);
    let hang = id_in(&t.join("hang")).expect("the first job started");
    // PBS's own record of each.
    assert_eq!(qstat_job(&hang)["Exit_status"], -29);
    assert_eq!(qstat_job(&slow)["substate"], 91);
    let never_ran = qstat_job(&queued);
    assert!(never_ran.get("Exit_status").is_none(), "{never_ran}");
    // run.db's: one timeout, two cancellations, one completed job per batch besides.
    let all = jobs(&t);
    let count = |state: &str| all.iter().filter(|j| j.3 == state).count() as u64;
    assert_eq!(state_of(&t, &hang).as_deref(), Some("timeout"), "{all:?}");
    assert_eq!(
        (count("timeout"), count("cancelled"), count("completed")),
        (1, 2, batches),
        "{all:?}"
    );
    assert_eq!(all.len() as u64, batches + 3, "{all:?}");
    let debug = route_of(&t, "debug");
    assert_eq!(debug["walltime"], 1, "{debug}");
    assert!(err.contains("timeout; submitting it again"), "{err}");
    assert!(err.contains("cancelled; submitting it again"), "{err}");
}

/// The server and its MOM restarted while jobs run (PBS's own init script): the rerunnable jobs
/// run again as the same jobs, the loop waits out the answerless server, never takes a rerun
/// job's old state for its end, and the run ends exact with one job per batch. Runs alone
/// (.config/nextest.toml): every PBS test's jobs would be rerun too.
#[test]
fn pbs_server_restarted_mid_run_ends_exact() {
    if !pbs_up("pbs_server_restarted_mid_run_ends_exact") {
        return;
    }
    let (batches, per) = (6, 4);
    let t = TestDir::new();
    t.plan_with_model(batches * per, per);
    // Every job's first run lingers, so that several run when the server goes down.
    let marks = t.join("first-runs");
    std::fs::create_dir(&marks).unwrap();
    let setup = format!(
        "setup = [\"if mkdir {}/$PBS_JOBID 2>/dev/null; then sleep 10; fi\"]",
        marks.display()
    );
    std::fs::write(
        t.join("run.toml"),
        run_config(&format!("walltime = \"00:10:00\"\n{setup}")),
    )
    .unwrap();
    let mut child = spawn_submit(&t, &["--queue", "debug=3", "--route", "static"]);
    wait_for(&mut child, "three jobs run", 120, || {
        jobs(&t).iter().filter(|j| j.3 == "running").count() == 3
    });
    let running: Vec<String> = jobs(&t)
        .into_iter()
        .filter(|j| j.3 == "running")
        .map(|j| j.1)
        .collect();
    let restart = Instant::now();
    let out = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            crate::pbs_util::NS,
            "/etc/init.d/pbs",
            "restart",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("PBS restarted in {:.1} s", restart.elapsed().as_secs_f64());
    let (code, err) = finish(child, 400, || {});
    assert_eq!(code, 0, "{err}");
    assert_exact(&t, batches, batches * per);
    let all = jobs(&t);
    assert_eq!(all.len() as u64, batches, "one job per batch: {all:?}");
    assert!(all.iter().all(|j| j.3 == "completed"), "{all:?}");
    // PBS ran the jobs that were running again, as themselves.
    for id in &running {
        let job = qstat_job(id);
        assert_eq!(job["run_count"], 2, "{id}: {job}");
        assert_eq!(job["Exit_status"], 0, "{id}: {job}");
    }
}

/// A job asking for more than the node has is accepted by `qsub` and kept queued forever by
/// PBS; the loop reads "Can Never Run" in its comment, deletes it and counts it failed with
/// PBS's words; three alike pause the run (the breaker), and `status` says why.
#[test]
fn pbs_a_job_that_can_never_run_is_noticed_and_counted_by_the_breaker() {
    let test = "pbs_a_job_that_can_never_run_is_noticed_and_counted_by_the_breaker";
    if !pbs_up(test) {
        return;
    }
    let t = TestDir::new();
    t.plan_with_model(20, 4);
    std::fs::write(
        t.join("run.toml"),
        run_config("select_extra = \"ncpus=64\""),
    )
    .unwrap();
    let mut child = spawn_submit(
        &t,
        &[
            "--queue",
            "debug=1",
            "--breaker-after",
            "3",
            "--max-attempts",
            "5",
        ],
    );
    wait_for(&mut child, "the breaker pauses the run", 180, || {
        t.status("run")["paused"] == true
    });
    std::thread::sleep(Duration::from_secs(2));
    let all = jobs(&t);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        all.len(),
        3,
        "no fourth job after the breaker tripped: {all:?}"
    );
    let why = "PBS can never run it: Insufficient amount of resource: ncpus (R: 64 A: 16 T: 16)";
    for (_, id, _, state, reason) in &all {
        assert_eq!(
            (state.as_str(), reason.as_str()),
            ("failed", format!("failed ({why})").as_str()),
            "{id}"
        );
        // Deleted, not left queued forever.
        let job = qstat_job(id);
        assert_eq!(
            (job["job_state"].as_str(), job["substate"].as_i64()),
            (Some("F"), Some(91))
        );
    }
    let st = t.status("run");
    let reason = &st["pause_reason"];
    assert_eq!(reason["by"], "breaker", "{st}");
    assert!(
        reason["signature"]
            .as_str()
            .unwrap()
            .starts_with("PBS can never run it: Insufficient amount of resource: ncpus"),
        "{st}"
    );
    let text = t.run(&["status", "--run-dir", "run"], 0);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("3 jobs in a row failed the same way")
            && text.contains("PBS can never run it"),
        "{text}"
    );
}

/// An `urgent` job (queue priority 200, over the scheduler's preempt_queue_prio 150) preempts
/// the run's `preemptable` job by requeueing it (preempt_order R): the loop sees it back in its
/// queue and counts one preemption; PBS reruns it, and the run ends exact with one job per
/// batch.
#[test]
fn pbs_preemption_by_requeue_is_counted_once_and_the_run_ends_exact() {
    if !pbs_up("pbs_preemption_by_requeue_is_counted_once_and_the_run_ends_exact") {
        return;
    }
    let t = TestDir::new();
    t.plan_with_model(8, 4);
    // Each job holds the node's four ngpus, which only this test asks for: the urgent job can
    // start only by preempting it, and no other test's job can be its victim. The first run
    // lingers until then.
    let first = t.join("first-run");
    let config = format!(
        "walltime = \"00:10:00\"\nselect_extra = \"ngpus=4\"\n\
         setup = [\"if mkdir {} 2>/dev/null; then echo $PBS_JOBID > {}/id; sleep 300; fi\"]",
        first.display(),
        first.display()
    );
    std::fs::write(t.join("run.toml"), run_config(&config)).unwrap();
    let mut child = spawn_submit(&t, &["--queue", "preemptable=1"]);
    // Preempted once the loop has seen it run (one preempted before that only waited longer).
    let mut victim = None;
    wait_for(&mut child, "the loop sees the first job run", 120, || {
        victim = id_in(&first);
        victim
            .as_deref()
            .is_some_and(|id| state_of(&t, id).as_deref() == Some("running"))
    });
    let victim = victim.unwrap();
    let urgent = pbs_ok(
        "qsub",
        &[
            "-q",
            "urgent",
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
            "3",
        ],
    );
    let (code, err) = finish(child, 300, || {});
    assert_eq!(code, 0, "{err}");
    assert_exact(&t, 2, 8);
    let all = jobs(&t);
    assert_eq!(all.len(), 2, "PBS reran the preempted job itself: {all:?}");
    assert!(all.iter().all(|j| j.3 == "completed"), "{all:?}");
    let job = qstat_job(&victim);
    assert_eq!(
        (job["run_count"].as_i64(), job["Exit_status"].as_i64()),
        (Some(2), Some(0))
    );
    assert_eq!(qstat_job(urgent.trim())["Exit_status"], 0);
    let queue = route_of(&t, "preemptable");
    assert_eq!(queue["preempted"], 1, "{queue}");
    assert!(err.contains("1 jobs requeued by the scheduler"), "{err}");
}
