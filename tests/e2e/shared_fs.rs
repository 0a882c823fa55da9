//! A run directory as a cluster's shared filesystem has it: jobs never open run.db, attempts at
//! one batch never touch each other's files, the first complete verified result wins, the
//! owner ingests each result once even when killed doing it, and settings that change the rows
//! are fixed by the first attempt.

use crate::util::{embed_job_args, planned_ids, shard_rows, TestDir};
use embedfleet_core::rundb::{RunDb, TEST_KILL_ENV};
use embedfleet_core::state::AttemptState;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// Waits until some attempt's result manifest of batch 1 lists a finished shard.
fn wait_for_a_finished_shard(run: &Path) {
    let dir = run.join("results/b000001");
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let listed = std::fs::read_dir(&dir).into_iter().flatten().any(|e| {
            let text = std::fs::read_to_string(e.unwrap().path()).unwrap_or_default();
            text.contains("\"sha256\"")
        });
        if listed {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("no attempt finished a shard in 120 s");
}

/// Every recorded shard's file has the sha256 run.db holds for it, and the shard directory has
/// no other file.
fn assert_shards_verified(run: &Path) {
    let db = RunDb::open(run).unwrap();
    let shards = db.all_shards().unwrap();
    for s in &shards {
        let sha = embedfleet_core::shardfile::sha256_of(&run.join(&s.path)).unwrap();
        assert_eq!(sha, s.sha256, "{}", s.path);
    }
    let mut on_disk: Vec<String> = std::fs::read_dir(run.join("shards"))
        .unwrap()
        .map(|e| format!("shards/{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    on_disk.sort();
    let mut recorded: Vec<String> = shards.into_iter().map(|s| s.path).collect();
    recorded.sort();
    assert_eq!(
        on_disk, recorded,
        "only the accepted attempt's shards are left"
    );
}

fn attempt_states(run: &Path) -> Vec<AttemptState> {
    let db = RunDb::open(run).unwrap();
    db.attempts().unwrap().into_iter().map(|a| a.2).collect()
}

#[test]
fn two_attempts_at_once_and_a_third_after_a_kill_give_the_batch_rows_once() {
    let t = TestDir::new();
    t.plan_with_model(120, 120);
    let run = t.join("run");
    let job = embed_job_args(&["--shard-papers", "20", "--devices", "cpu"]);
    let mut a = t.cmd(&job).spawn().unwrap();
    let mut b = t.cmd(&job).spawn().unwrap();
    wait_for_a_finished_shard(&run);
    a.kill().unwrap();
    assert_eq!(a.wait().unwrap().signal(), Some(libc::SIGKILL));
    let mut c = t.cmd(&job).spawn().unwrap();
    assert!(b.wait().unwrap().success());
    assert!(c.wait().unwrap().success());

    let status = t.status("run");
    assert_eq!(status["batches_by_state"]["done"], 1);
    assert_eq!(status["rows_in_shards"], 120);
    assert_eq!(status["shards"], 6);
    let rows = shard_rows(&run);
    assert_eq!(rows.keys().cloned().collect::<Vec<_>>(), planned_ids(&run));
    assert_shards_verified(&run);
    let states = attempt_states(&run);
    let accepted = states
        .iter()
        .filter(|s| **s == AttemptState::Accepted)
        .count();
    assert_eq!(accepted, 1, "{states:?}");
    assert!(
        states.contains(&AttemptState::Abandoned),
        "the killed attempt: {states:?}"
    );
    assert!(states.len() >= 2, "{states:?}");
}

#[test]
fn a_job_never_opens_run_db_and_the_owner_ingests_what_it_wrote() {
    let t = TestDir::new();
    t.plan_with_model(40, 40);
    let run = t.join("run");
    // As on a compute node that cannot open the owner's database: it is not there at all.
    let away = t.join("run.db.away");
    std::fs::rename(run.join("run.db"), &away).unwrap();
    t.run(&embed_job_args(&["--shard-papers", "15"]), 0);
    let left: Vec<String> = std::fs::read_dir(&run)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("run.db"))
        .collect();
    assert!(left.is_empty(), "the job made {left:?}");
    std::fs::rename(&away, run.join("run.db")).unwrap();

    let status = t.status("run");
    assert_eq!(status["batches_by_state"]["done"], 1);
    assert_eq!(status["rows_in_shards"], 40);
    assert_eq!(status["shards"], 3);
    assert_shards_verified(&run);
    let runs = RunDb::open(&run).unwrap().finished_runs().unwrap();
    assert_eq!(runs.len(), 1, "the attempt's timings, once");
    assert!(runs[0].1.inference_s > 0.0);
}

#[test]
fn the_owner_killed_while_ingesting_ingests_each_result_once_when_run_again() {
    let t = TestDir::new();
    t.plan_with_model(40, 20);
    for batch in ["1", "2"] {
        let mut job = embed_job_args(&["--shard-papers", "10"]);
        job[4] = batch;
        t.run(&job, 0);
    }
    for _ in 0..2 {
        let out = t
            .cmd(&["status", "--run-dir", "run", "--json"])
            .env(TEST_KILL_ENV, "ingest")
            .output()
            .unwrap();
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGKILL),
            "killed mid-ingest"
        );
    }
    let status = t.status("run");
    assert_eq!(status["batches_by_state"]["done"], 2);
    assert_eq!(status["rows_in_shards"], 40);
    assert_eq!(status["shards"], 4);
    let db = RunDb::open(&t.join("run")).unwrap();
    assert_eq!(db.finished_runs().unwrap().len(), 2, "one run per batch");
    assert_eq!(db.attempts().unwrap().len(), 2);
    assert_shards_verified(&t.join("run"));
    // And again: nothing new.
    assert_eq!(t.status("run")["shards"], 4);
    assert_eq!(
        RunDb::open(&t.join("run"))
            .unwrap()
            .finished_runs()
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn another_shard_size_model_or_dim_than_the_first_attempts_is_refused() {
    let t = TestDir::new();
    t.plan_with_model(60, 60);
    t.run(&["make-tiny-model", "--out", "model2", "--seed", "7"], 0);
    let first = embed_job_args(&["--shard-papers", "20"]);
    let mut killed = t.cmd(&first).spawn().unwrap();
    wait_for_a_finished_shard(&t.join("run"));
    killed.kill().unwrap();
    killed.wait().unwrap();
    for (extra, says) in [
        (
            &["--shard-papers", "30"][..],
            "--shard-papers: the run's 20, here 30",
        ),
        (&["--shard-papers", "20", "--dim", "32"][..], "--dim"),
    ] {
        let out = t.run(&embed_job_args(extra), 4);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{stderr}");
        assert!(!stderr.contains("--vector-dtype"), "{stderr}");
    }
    let mut other_model = embed_job_args(&["--shard-papers", "20"]);
    other_model[6] = "model2";
    let out = t.run(&other_model, 4);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("model: the run's"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The run's own settings finish the batch, taking over what the killed attempt made.
    t.run(&first, 0);
    let status = t.status("run");
    assert_eq!(status["rows_in_shards"], 60);
    assert_eq!(status["shards"], 3);
    assert_shards_verified(&t.join("run"));
}

#[test]
fn a_plan_killed_inside_duplicate_resolution_counts_what_an_unkilled_plan_counts() {
    let t = TestDir::new();
    std::fs::create_dir(t.join("corpus")).unwrap();
    t.sample("corpus/a.jsonl.gz", 60, 1);
    std::fs::copy(t.join("corpus/a.jsonl.gz"), t.join("corpus/b.jsonl.gz")).unwrap();
    let plan = |run: &'static str| {
        [
            "plan",
            "--corpus",
            "corpus",
            "--run-dir",
            run,
            "--papers-per-job",
            "25",
        ]
    };
    t.run(&plan("whole"), 0);
    let killed = t
        .cmd(&plan("killed"))
        .env(TEST_KILL_ENV, "resolve_duplicates")
        .output()
        .unwrap();
    assert_eq!(killed.status.signal(), Some(libc::SIGKILL));
    t.run(&plan("killed"), 0);
    let (whole, again) = (t.status("whole"), t.status("killed"));
    for key in [
        "papers_planned",
        "papers_quarantined",
        "quarantined_by_reason",
        "batches",
        "batches_by_state",
    ] {
        assert_eq!(whole[key], again[key], "{key}");
    }
    assert_eq!(whole["quarantined_by_reason"]["duplicate_id"], 60);
    let lines = |run: &str| {
        std::fs::read_to_string(t.join(run).join("quarantine.jsonl"))
            .unwrap()
            .lines()
            .count()
    };
    assert_eq!(lines("whole"), 60);
    assert_eq!(lines("killed"), 60);
}

#[test]
fn a_failed_attempt_is_recorded_once_even_when_the_owner_is_killed_recording_it() {
    let t = TestDir::new();
    t.plan_with_model(10, 10);
    // Weights that do not load: the attempt fails after writing its manifest.
    std::fs::write(t.join("model/model.safetensors"), b"not safetensors").unwrap();
    let out = t.cmd(&embed_job_args(&[])).output().unwrap();
    assert!(!out.status.success());
    let killed = t
        .cmd(&["status", "--run-dir", "run", "--json"])
        .env(TEST_KILL_ENV, "ingest")
        .output()
        .unwrap();
    assert_eq!(
        killed.status.signal(),
        Some(libc::SIGKILL),
        "killed recording it"
    );
    for _ in 0..2 {
        let status = t.status("run");
        assert_eq!(status["attempts_by_state"]["failed"], 1, "{status}");
    }
    let db = RunDb::open(&t.join("run")).unwrap();
    let (runs, errors): (i64, i64) = db
        .conn()
        .query_row("SELECT count(*), count(error) FROM batch_runs", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!(
        (runs, errors),
        (1, 1),
        "the failed run, once, with its error"
    );
}
