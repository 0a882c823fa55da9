//! A reader that goes away (`status | head -1`, a closed terminal, a log pipe whose reader
//! exits) ends a command quietly, as coreutils do: no panic, and nothing half-written.

use crate::util::TestDir;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};

/// Ended by the closed pipe (SIGPIPE, as `cat` would be) or finished: never a panic (101).
fn ended_quietly(status: ExitStatus) -> bool {
    status.signal() == Some(libc::SIGPIPE) || status.code() == Some(0)
}

#[test]
fn status_and_report_into_a_closed_stdout_end_quietly() {
    let t = TestDir::new();
    t.run_sample(40, 10);
    for args in [
        &["status", "--run-dir", "run"][..],
        &["report", "--run-dir", "run"],
        &["status", "--run-dir", "run", "--json"],
    ] {
        let mut child = t
            .cmd(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The reader is gone before the first line is written.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            ended_quietly(out.status),
            "{args:?}: {:?}\n{err}",
            out.status
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn a_plan_whose_stderr_reader_exits_ends_quietly_and_plans_whole_when_run_again() {
    let t = TestDir::new();
    t.sample("c.jsonl.gz", 3000, 3);
    let plan = ["plan", "--corpus", "c.jsonl.gz", "--run-dir", "run"];
    let mut child = t.cmd(&plan).stderr(Stdio::piped()).spawn().unwrap();
    drop(child.stderr.take());
    let status = child.wait().unwrap();
    assert!(ended_quietly(status), "{status:?}");
    // Whatever moment it ended at, the plan is whole after one more run.
    t.run(&plan, 0);
    assert_eq!(t.status("run")["papers_planned"], 3000);
}
