//! The breaker and the notify hook end to end: jobs that all fail the same way pause the run
//! after K of them (at the first for a refusal, exit 4), with no further submission, the reason
//! in `status`; `resume` after the fix finishes the run; the notify command hears every event
//! the loop sends; a hanging one does not hold the loop up. Against the local backend always
//! and the one-node Slurm of `.ci/slurm/start-local-slurm.sh` when it runs (required in CI by
//! EMBEDFLEET_REQUIRE_SLURM=1).

use crate::util::{slurm_up, wait_until, TestDir};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Jobs the scheduler took, from run.db.
fn jobs_submitted(t: &TestDir) -> u64 {
    let c = rusqlite::Connection::open(t.join("run/run.db")).unwrap();
    c.busy_timeout(Duration::from_secs(30)).unwrap();
    c.query_row(
        "SELECT count(DISTINCT name) FROM jobs WHERE scheduler_id IS NOT NULL",
        [],
        |r| r.get(0),
    )
    .unwrap()
}

/// An `embedfleet` for the jobs that fails as a node without cuDNN would (its first error line
/// naming this job's process id, as real errors name batch ids and nodes) until `fixed`
/// exists; with `refuse`, it passes embed-job a `--dim` the run was not made with, which
/// embed-job refuses (exit 4) as it would any settings that differ from the run's.
fn job_binary(t: &TestDir, fixed: &Path, refuse: bool) -> String {
    let real = env!("CARGO_BIN_EXE_embedfleet");
    let broken = if refuse {
        format!("exec {real} \"$@\" --dim 8")
    } else {
        "echo \"starting on $(hostname), pid $$\"; \
         echo \"error: libcudnn.so.9: cannot open shared object file: No such file or directory (pid $$)\" >&2; \
         exit 1"
            .to_string()
    };
    let path = t.join("embedfleet-on-the-nodes");
    std::fs::write(
        &path,
        format!(
            "#!/bin/bash\nif [ \"$1\" = embed-job ] && [ ! -f {} ]; then {broken}; fi\nexec {real} \"$@\"\n",
            fixed.display()
        ),
    )
    .unwrap();
    Command::new("chmod").arg("+x").arg(&path).status().unwrap();
    path.display().to_string()
}

/// A run config with the job binary above and a notify command appending each event's
/// variables, one line per event, to `events`.
fn write_config(t: &TestDir, binary: &str, events: &Path) {
    let notify = format!(
        "echo \"event=$EMBEDFLEET_EVENT batch=${{EMBEDFLEET_BATCH:-}} done=${{EMBEDFLEET_BATCHES_DONE:-}} \
         run=$EMBEDFLEET_RUN_DIR reason=${{EMBEDFLEET_REASON:-}} msg=$EMBEDFLEET_MESSAGE\" >> {}",
        events.display()
    );
    let config = format!(
        "[scheduler.script]\nembedfleet = '{binary}'\n\n[notify]\ncommand = '{notify}'\ntimeout_secs = 30\n"
    );
    std::fs::write(t.join("run.toml"), config).unwrap();
}

fn spawn_submit(t: &TestDir, backend: &str, queue: &str, extra: &[&str]) -> Child {
    let queue = format!("{queue}=1");
    let mut args = vec![
        "submit",
        "--run-dir",
        "run",
        "--backend",
        backend,
        "--model-dir",
        "model",
        "--devices",
        "cpu",
        "--shard-papers",
        "4",
        "--poll-interval",
        "0.3",
        "--lost-after",
        "60",
        "--queue",
        &queue,
        "--config",
        "run.toml",
    ];
    args.extend(extra);
    t.cmd(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("submit starts")
}

/// Waits for the loop to exit (at most `timeout_s`), returning its exit code and stderr.
fn finish(mut child: Child, timeout_s: u64) -> (Option<i32>, String) {
    let end = Instant::now() + Duration::from_secs(timeout_s);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            let mut err = String::new();
            let _ = std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err);
            panic!("the submit loop did not end in {timeout_s} s:\n{err}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    (status.code(), err)
}

fn events(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn count(events: &[String], name: &str) -> usize {
    let prefix = format!("event={name} ");
    events.iter().filter(|e| e.starts_with(&prefix)).count()
}

/// Five batches, one job at a time, one attempt each: three jobs fail alike, the run pauses
/// with the reason and no fourth job is sent; the fix and `resume` finish it, the three failed
/// batches included; the hook hears each batch failure, the pause and the end.
fn three_alike_pause_and_resume_finishes(backend: &str, queue: &str) {
    let t = TestDir::new();
    t.plan_with_model(40, 8);
    let fixed = t.join("fixed");
    let events_file = t.join("events.txt");
    let binary = job_binary(&t, &fixed, false);
    write_config(&t, &binary, &events_file);
    let child = spawn_submit(
        &t,
        backend,
        queue,
        &["--max-attempts", "1", "--breaker-after", "3"],
    );
    let mut child = Some(child);
    wait_until("the breaker pauses the run", 300, || {
        if let Some(c) = child.as_mut() {
            if let Some(status) = c.try_wait().unwrap() {
                let mut err = String::new();
                let _ = std::io::Read::read_to_string(c.stderr.as_mut().unwrap(), &mut err);
                panic!("the loop ended ({status}) instead of pausing:\n{err}");
            }
        }
        t.status("run")["paused"] == true
    });
    // A few polls later: still three jobs, the loop still waiting.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        jobs_submitted(&t),
        3,
        "no fourth job after the breaker tripped"
    );
    let mut child = child.take().unwrap();
    assert!(
        child.try_wait().unwrap().is_none(),
        "the loop waits for resume"
    );
    let status = t.status("run");
    let reason = &status["pause_reason"];
    assert_eq!(reason["by"], "breaker", "{status}");
    assert_eq!(reason["jobs"].as_array().unwrap().len(), 3, "{status}");
    assert_eq!(reason["logs"].as_array().unwrap().len(), 3, "{status}");
    let signature = reason["signature"].as_str().unwrap();
    assert_eq!(
        signature,
        "exit code 1; first error line: error: libcudnn.so.#: cannot open shared object file: \
         No such file or directory (pid #)",
        "{status}"
    );
    assert_eq!(status["batches_by_state"]["failed"], 3, "{status}");
    let text = t.run(&["status", "--run-dir", "run"], 0);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("by the breaker: 3 jobs in a row failed the same way")
            && text.contains("libcudnn.so.#")
            && text.contains("embedfleet doctor"),
        "{text}"
    );
    let seen = events(&events_file);
    assert_eq!(count(&seen, "batch_failed"), 3, "{seen:#?}");
    assert_eq!(count(&seen, "paused"), 1, "{seen:#?}");
    assert_eq!(count(&seen, "finished"), 0, "{seen:#?}");
    let run_dir = std::path::absolute(t.join("run")).unwrap();
    assert!(
        seen.iter()
            .all(|e| e.contains(&format!("run={} ", run_dir.display()))),
        "{seen:#?}"
    );
    assert!(
        seen.iter().any(|e| e.starts_with("event=paused ")
            && e.contains("reason=exit code 1; first error line")),
        "{seen:#?}"
    );
    // The fix, then resume: the running loop goes on, the failed batches too.
    std::fs::write(&fixed, "").unwrap();
    let out = t.run(&["resume", "--run-dir", "run"], 0);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("resumed after the breaker's pause"), "{err}");
    let (code, err) = finish(child, 600);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("paused by the breaker"), "{err}");
    assert!(err.contains("tried again"), "{err}");
    let status = t.status("run");
    assert_eq!(status["batches_by_state"]["done"], 5, "{status}");
    assert_eq!(status["paused"], false, "{status}");
    assert!(status["pause_reason"].is_null(), "{status}");
    assert_eq!(jobs_submitted(&t), 8, "3 failed jobs, then one per batch");
    let seen = events(&events_file);
    assert_eq!(count(&seen, "finished"), 1, "{seen:#?}");
    assert!(
        seen.iter()
            .any(|e| e.starts_with("event=finished ") && e.contains(" done=5 ")),
        "{seen:#?}"
    );
    assert_eq!(count(&seen, "paused"), 1, "{seen:#?}");
    // Started again on a settled run: nothing to do, no second `finished`.
    let again = spawn_submit(&t, backend, queue, &[]);
    let (code, err) = finish(again, 120);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(count(&events(&events_file), "finished"), 1);
}

/// embed-job refuses the first job (exit 4): paused at once, one job sent.
fn a_refusal_pauses_at_the_first(backend: &str, queue: &str) {
    let t = TestDir::new();
    t.plan_with_model(24, 8);
    let fixed = t.join("fixed");
    let events_file = t.join("events.txt");
    let binary = job_binary(&t, &fixed, true);
    write_config(&t, &binary, &events_file);
    let child = spawn_submit(&t, backend, queue, &[]);
    wait_until("the breaker pauses the run", 300, || {
        t.status("run")["paused"] == true
    });
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(jobs_submitted(&t), 1, "paused at the first refusal");
    let status = t.status("run");
    let reason = &status["pause_reason"];
    let signature = reason["signature"].as_str().unwrap();
    assert!(
        signature.starts_with("exit code 4; first error line: error:"),
        "{status}"
    );
    assert!(
        reason["message"].as_str().unwrap().contains("refused"),
        "{status}"
    );
    let log = reason["logs"][0].as_str().unwrap();
    assert!(Path::new(log).is_file(), "{log}");
    std::fs::write(&fixed, "").unwrap();
    t.run(&["resume", "--run-dir", "run"], 0);
    let (code, err) = finish(child, 600);
    assert_eq!(code, Some(0), "{err}");
    let status = t.status("run");
    assert_eq!(status["batches_by_state"]["done"], 3, "{status}");
    let seen = events(&events_file);
    assert_eq!(count(&seen, "paused"), 1, "{seen:#?}");
    assert_eq!(count(&seen, "batch_failed"), 1, "{seen:#?}");
    assert_eq!(count(&seen, "finished"), 1, "{seen:#?}");
}

#[test]
fn breaker_local_three_alike_pause_then_resume_finishes() {
    three_alike_pause_and_resume_finishes("local", "local");
}

#[test]
fn breaker_slurm_three_alike_pause_then_resume_finishes() {
    if slurm_up("breaker_slurm_three_alike_pause_then_resume_finishes") {
        three_alike_pause_and_resume_finishes("slurm", "debug");
    }
}

#[test]
fn breaker_local_a_refusal_pauses_at_the_first() {
    a_refusal_pauses_at_the_first("local", "local");
}

#[test]
fn breaker_slurm_a_refusal_pauses_at_the_first() {
    if slurm_up("breaker_slurm_a_refusal_pauses_at_the_first") {
        a_refusal_pauses_at_the_first("slurm", "debug");
    }
}

#[test]
fn notify_a_hanging_command_does_not_hold_the_loop_up() {
    let t = TestDir::new();
    t.plan_with_model(16, 8);
    std::fs::write(
        t.join("run.toml"),
        "[notify]\ncommand = 'echo started >> hook.txt; sleep 600'\ntimeout_secs = 2\n",
    )
    .unwrap();
    let started = Instant::now();
    let child = t
        .cmd(&[
            "submit",
            "--run-dir",
            "run",
            "--model-dir",
            "model",
            "--devices",
            "cpu",
            "--queue",
            "local=2",
            "--poll-interval",
            "0.3",
            "--config",
            "run.toml",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (code, err) = finish(child, 120);
    assert_eq!(code, Some(0), "{err}");
    // The hook ran (in the run directory), hung, and was killed at its 2 s timeout: the loop
    // waited for it no longer than that and its grace.
    assert!(std::fs::read_to_string(t.join("run/hook.txt"))
        .unwrap()
        .contains("started"));
    assert!(err.contains("ran past its 2s timeout"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(t.status("run")["batches_by_state"]["done"], 2);
}
