//! Each command opens run.db once (issue 61): an open checks the owner host, starts the
//! heartbeat and takes in the result manifests written since, so a command that opened it
//! twice did all of that twice. `EMBEDFLEET_LOG=embedfleet_core::rundb=debug` logs every open.

use crate::util::{planned_ids, TestDir};

/// Runs `embedfleet ARGS` in `t` with every run.db open logged; asserts it succeeds and
/// returns how many times it opened run.db.
fn opens(t: &TestDir, args: &[&str]) -> usize {
    let out = t
        .cmd(args)
        .env("EMBEDFLEET_LOG", "embedfleet_core::rundb=debug")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
    stderr.matches("opening run.db").count()
}

#[test]
fn plan_submit_upload_query_eval_publish_status_report_and_delete_open_run_db_once() {
    let t = TestDir::new();
    t.sample("c.jsonl.gz", 40, 1);
    t.run(&["make-tiny-model", "--out", "model"], 0);
    let plan = [
        "plan",
        "--corpus",
        "c.jsonl.gz",
        "--run-dir",
        "run",
        "--papers-per-job",
        "20",
    ];
    let submit = [
        "submit",
        "--run-dir",
        "run",
        "--backend",
        "local",
        "--queue",
        "local=2",
        "--model-dir",
        "model",
        "--devices",
        "cpu",
        "--poll-interval",
        "0.2",
    ];
    assert_eq!(opens(&t, &plan), 1, "plan opened run.db more than once");
    let paper = planned_ids(&t.join("run")).remove(0);
    let commands: [&[&str]; 9] = [
        // Planned again: nothing to do, still one open.
        &plan,
        &submit,
        &["upload", "--run-dir", "run"],
        &[
            "query",
            "--run-dir",
            "run",
            "--model-dir",
            "model",
            "protein folding",
        ],
        &["eval", "--run-dir", "run", "--sample", "5"],
        &["publish", "--run-dir", "run", "--out", "dataset"],
        &["status", "--run-dir", "run"],
        &["report", "--run-dir", "run"],
        &["delete", "--run-dir", "run", &paper],
    ];
    for args in commands {
        assert_eq!(opens(&t, args), 1, "{args:?} opened run.db more than once");
    }
}
