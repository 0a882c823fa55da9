//! Nothing wrong is ever accepted: a result is tied to its plan and to its papers, names only
//! its own files, and a read error on a shared filesystem is not taken for a verdict.
//!
//! Results are tampered with as a user's tools would (pyarrow rewriting a shard, an editor on a
//! manifest) and faults are made as a cluster's filesystem makes them (a file that cannot be
//! read for one poll), then the owner (`status`) ingests.

use crate::util::{embed_job_args, planned_ids, python, shard_rows, TestDir};
use embedfleet_core::rundb::{RunDb, TEST_KILL_ENV};
use embedfleet_core::state::AttemptState;
use serde_json::Value;
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The one result manifest of `batch`.
fn manifest_of(run: &Path, batch: u32) -> PathBuf {
    let dir = run.join(format!("results/b{batch:06}"));
    let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    found.pop().unwrap()
}

/// A tiny model and a sample corpus of `papers` planned into `run`, `per_job` a batch, and
/// every batch embedded by one `embed-job` with `--shard-papers shard_papers`; returns `run`.
fn embedded(t: &TestDir, papers: u64, per_job: u64, shard_papers: &str) -> PathBuf {
    t.plan_with_model(papers, per_job);
    for batch in 1..=papers.div_ceil(per_job) {
        let batch = batch.to_string();
        let mut job = embed_job_args(&["--shard-papers", shard_papers]);
        job[4] = &batch;
        t.run(&job, 0);
    }
    t.join("run")
}

/// The shard file the manifest of `batch` names for `part`.
fn shard_of(run: &Path, batch: u32, part: usize) -> PathBuf {
    let m: Value =
        serde_json::from_slice(&std::fs::read(manifest_of(run, batch)).unwrap()).unwrap();
    run.join(m["shards"][part]["file"].as_str().unwrap())
}

/// The accepted shards hold every planned paper, once.
fn assert_every_planned_paper_once(run: &Path) {
    assert_eq!(
        shard_rows(run).into_keys().collect::<Vec<_>>(),
        planned_ids(run)
    );
}

fn edit_json(path: &Path, edit: impl FnOnce(&mut Value)) {
    let mut value: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    edit(&mut value);
    std::fs::write(path, serde_json::to_vec_pretty(&value).unwrap()).unwrap();
}

/// (state, reason) of every attempt run.db recorded.
fn attempts(run: &Path) -> Vec<(AttemptState, String)> {
    let db = RunDb::open(run).unwrap();
    db.attempts()
        .unwrap()
        .into_iter()
        .map(|(_, _, state, why)| (state, why))
        .collect()
}

fn done_batches(t: &TestDir) -> u64 {
    t.status("run")["batches_by_state"]["done"]
        .as_u64()
        .unwrap_or(0)
}

/// Rewrites a shard with pyarrow (its defaults: snappy), ids changed by `edit_ids` (Python
/// code over the list `ids`), and returns the new file's sha256; `None` without pyarrow.
fn rewrite_shard_ids(shard: &Path, edit_ids: &str) -> Option<String> {
    let code = format!(
        r#"
import hashlib, pyarrow as pa, pyarrow.parquet as pq
p = {path:?}
t = pq.read_table(p)
ids = t.column("id").to_pylist()
{edit_ids}
t = t.set_column(t.schema.get_field_index("id"), "id", pa.array(ids, pa.string()))
pq.write_table(t, p)
print(hashlib.sha256(open(p, "rb").read()).hexdigest())
"#,
        path = shard.display().to_string()
    );
    python(&code, "pyarrow", "EMBEDFLEET_REQUIRE_PYARROW")
}

/// Runs `status` on `run`, failing the test when it has not returned in 60 s (it would be
/// blocked reading a FIFO the test planted).
fn status_within_a_minute(t: &TestDir) {
    let mut child = t
        .cmd(&["status", "--run-dir", "run", "--json"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "status failed");
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    panic!("status did not return: it read a file the manifest named outside its own");
}

fn corpus(t: &TestDir, name: &str, papers: u64, seed: &str) {
    let papers = papers.to_string();
    let args = [
        "sample-corpus",
        "--papers",
        &papers,
        "--mean-chars",
        "600",
        "--seed",
        seed,
        "--out",
        name,
    ];
    t.run(&args, 0);
}

fn run_args(corpus: &str) -> Vec<&str> {
    vec![
        "run",
        "--corpus",
        corpus,
        "--run-dir",
        "run",
        "--papers-per-job",
        "100",
        "--shard-papers",
        "50",
        "--local-jobs",
        "2",
    ]
}

#[test]
fn a_run_directory_whose_run_db_was_lost_is_not_planned_again_over_its_results() {
    let t = TestDir::new();
    corpus(&t, "a.jsonl.gz", 300, "42");
    corpus(&t, "b.jsonl.gz", 300, "43");
    t.run(&run_args("a.jsonl.gz"), 0);
    for name in ["run.db", "run.db-wal", "run.db-shm"] {
        let _ = std::fs::remove_file(t.join("run").join(name));
    }
    for command in [
        vec![
            "plan",
            "--corpus",
            "b.jsonl.gz",
            "--run-dir",
            "run",
            "--papers-per-job",
            "100",
        ],
        run_args("b.jsonl.gz"),
    ] {
        let out = t.run(&command, 4);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("no run.db") && stderr.contains("new run directory"),
            "{stderr}"
        );
        assert!(
            !t.join("run/run.db").exists(),
            "a refused plan makes no run.db"
        );
    }
    // Done as the message says: the old results moved away, the new corpus is the run's.
    for dir in ["results", "shards"] {
        std::fs::rename(t.join("run").join(dir), t.join(&format!("old-{dir}"))).unwrap();
    }
    std::fs::remove_dir_all(t.join("run/qdrant")).unwrap();
    t.run(&run_args("b.jsonl.gz"), 0);
    let b_ids: Vec<String> = {
        let rows = shard_rows(&t.join("run"));
        rows.into_keys().collect()
    };
    assert_eq!(b_ids, planned_ids(&t.join("run")));
    // Read by sqlite3 and pyarrow, not by us: the accepted shards hold B's 300 papers once.
    let code = format!(
        r#"
import gzip, json, sqlite3, pyarrow.parquet as pq
run = {run:?}
want = sorted(json.loads(l)["id"] for l in gzip.open({b:?}, "rt"))
db = sqlite3.connect(run + "/run.db")
got = []
for (path,) in db.execute("SELECT path FROM shards"):
    got += pq.read_table(run + "/" + path, columns=["id"]).column("id").to_pylist()
assert len(got) == len(set(got)), "duplicates"
assert sorted(got) == want, (len(got), len(want))
print(len(got))
"#,
        run = t.join("run").display().to_string(),
        b = t.join("b.jsonl.gz").display().to_string()
    );
    if let Some(out) = python(&code, "pyarrow", "EMBEDFLEET_REQUIRE_PYARROW") {
        assert_eq!(out, "300");
    }
}

#[test]
fn a_result_made_for_another_plan_of_the_directory_is_rejected() {
    let t = TestDir::new();
    let run = embedded(&t, 40, 40, "15");
    // The directory planned again, the same corpus even, while the old job's results were
    // away; then they come back (a job of the old plan finishing late on another node).
    for dir in ["results", "shards"] {
        std::fs::rename(run.join(dir), t.join(dir)).unwrap();
    }
    for name in ["run.db", "run.db-wal", "run.db-shm"] {
        let _ = std::fs::remove_file(run.join(name));
    }
    t.run(
        &[
            "plan",
            "--corpus",
            "c.jsonl.gz",
            "--run-dir",
            "run",
            "--papers-per-job",
            "40",
        ],
        0,
    );
    for dir in ["results", "shards"] {
        std::fs::remove_dir_all(run.join(dir)).ok();
        std::fs::rename(t.join(dir), run.join(dir)).unwrap();
    }
    assert_eq!(done_batches(&t), 0);
    let recorded = attempts(&run);
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert_eq!(recorded[0].0, AttemptState::Rejected);
    assert!(recorded[0].1.contains("another plan"), "{recorded:?}");
    // A job of this plan does the batch, and takes nothing over from the other plan's.
    t.run(&embed_job_args(&["--shard-papers", "15"]), 0);
    assert_eq!(done_batches(&t), 1);
    assert_every_planned_paper_once(&run);
}

#[test]
fn a_shard_with_one_paper_doubled_and_another_dropped_is_rejected_at_ingest() {
    let t = TestDir::new();
    let run = embedded(&t, 30, 30, "15");
    let manifest = manifest_of(&run, 1);
    let shard = shard_of(&run, 1, 0);
    // The rows and the count stay right: only the papers are wrong.
    let Some(sha) = rewrite_shard_ids(&shard, "ids[1] = ids[0]") else {
        return;
    };
    edit_json(&manifest, |m| m["shards"][0]["sha256"] = Value::from(sha));
    assert_eq!(done_batches(&t), 0);
    let recorded = attempts(&run);
    assert_eq!(recorded[0].0, AttemptState::Rejected, "{recorded:?}");
    assert!(
        recorded[0].1.contains("does not hold the part's papers"),
        "{recorded:?}"
    );
}

#[test]
fn a_killed_attempts_shard_with_other_papers_is_not_taken_over() {
    let t = TestDir::new();
    let run = embedded(&t, 30, 30, "15");
    // As a killed attempt leaves it: not complete, a shard whose papers are not the part's.
    let manifest = manifest_of(&run, 1);
    let shard = shard_of(&run, 1, 0);
    let Some(sha) = rewrite_shard_ids(&shard, "ids[1] = ids[0]") else {
        return;
    };
    edit_json(&manifest, |m| {
        m["shards"][0]["sha256"] = Value::from(sha);
        m["complete"] = Value::from(false);
        m["shards"].as_array_mut().unwrap().truncate(1);
    });
    let out = t.run(&embed_job_args(&["--shard-papers", "15"]), 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("in 2 new shards (0 taken over"), "{stderr}");
    assert_eq!(done_batches(&t), 1);
    // Every planned paper once: the doubled one was embedded again, the dropped one too.
    assert_every_planned_paper_once(&run);
}

#[test]
fn a_manifest_naming_a_file_outside_its_own_is_refused_and_nothing_outside_is_read() {
    let t = TestDir::new();
    let run = embedded(&t, 40, 20, "20");
    // Batch 1 names `../outside.parquet`: a faithful copy of its shard, so only the name is
    // wrong. Batch 2 names an absolute path to a FIFO: reading it would block for ever.
    let first = manifest_of(&run, 1);
    let own = shard_of(&run, 1, 0);
    std::fs::rename(&own, t.join("outside.parquet")).unwrap();
    edit_json(&first, |m| {
        m["shards"][0]["file"] = Value::from("../outside.parquet")
    });
    let fifo = t.join("fifo.parquet");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) }, 0);
    edit_json(&manifest_of(&run, 2), |m| {
        m["shards"][0]["file"] = Value::from(fifo.to_str().unwrap())
    });

    status_within_a_minute(&t);
    assert_eq!(done_batches(&t), 0);
    let recorded = attempts(&run);
    assert_eq!(recorded.len(), 2, "{recorded:?}");
    for (state, why) in &recorded {
        assert_eq!(*state, AttemptState::Rejected, "{recorded:?}");
        assert!(why.contains("not its own"), "{why}");
    }
    // The owner's word is beside each manifest, for the jobs.
    assert_eq!(
        std::fs::read_dir(run.join("results/b000001"))
            .unwrap()
            .filter(|e| e
                .as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".rejected"))
            .count(),
        1
    );
}

#[test]
fn a_read_error_at_ingest_is_tried_again_at_the_next_poll() {
    let t = TestDir::new();
    let run = embedded(&t, 40, 20, "10");
    // Batch 1: a shard that cannot be read (a directory in its place gives EISDIR, as a stale
    // handle gives ESTALE). Batch 2: its manifest cannot be read.
    let shard = shard_of(&run, 1, 1);
    let aside = |p: &Path| PathBuf::from(format!("{}.aside", p.display()));
    std::fs::rename(&shard, aside(&shard)).unwrap();
    std::fs::create_dir(&shard).unwrap();
    let second = manifest_of(&run, 2);
    std::fs::rename(&second, aside(&second)).unwrap();
    std::fs::create_dir(&second).unwrap();

    assert_eq!(done_batches(&t), 0);
    assert_eq!(attempts(&run), vec![], "a read error records nothing");

    std::fs::remove_dir(&shard).unwrap();
    std::fs::rename(aside(&shard), &shard).unwrap();
    std::fs::remove_dir(&second).unwrap();
    std::fs::rename(aside(&second), &second).unwrap();
    assert_eq!(done_batches(&t), 2, "accepted at the next poll");
    assert_every_planned_paper_once(&run);
}

#[test]
fn a_rejected_attempt_is_verified_again_when_its_manifest_changes() {
    let t = TestDir::new();
    let run = embedded(&t, 20, 20, "10");
    let manifest = manifest_of(&run, 1);
    let whole = std::fs::read(&manifest).unwrap();
    edit_json(&manifest, |m| {
        m["shards"][0]["sha256"] = Value::from("0".repeat(64))
    });
    assert_eq!(done_batches(&t), 0);
    assert_eq!(attempts(&run)[0].0, AttemptState::Rejected);
    // The job (or a user) writes the manifest again, whole this time.
    std::fs::write(&manifest, whole).unwrap();
    assert_eq!(done_batches(&t), 1);
    assert_eq!(attempts(&run)[0].0, AttemptState::Accepted);
    assert!(
        !manifest.with_extension("rejected").exists(),
        "the rejection is gone with it"
    );
}

#[test]
fn a_job_never_stands_down_for_an_attempt_the_owner_rejected() {
    let t = TestDir::new();
    let run = embedded(&t, 20, 20, "10");
    let shard = shard_of(&run, 1, 1);
    // The owner reads the shard while it is damaged (a bad write seen through one host's
    // cache) and rejects the attempt; afterwards the job's view of it is whole again.
    let bytes = std::fs::read(&shard).unwrap();
    let mut damaged = bytes.clone();
    damaged[100] ^= 0xff;
    std::fs::write(&shard, &damaged).unwrap();
    assert_eq!(done_batches(&t), 0);
    assert_eq!(attempts(&run)[0].0, AttemptState::Rejected);
    std::fs::write(&shard, &bytes).unwrap();

    let out = t.run(&embed_job_args(&["--shard-papers", "10"]), 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("did it first"), "{stderr}");
    assert_eq!(done_batches(&t), 1, "the new attempt did the batch");
    assert_every_planned_paper_once(&run);
}

#[test]
fn unreadable_output_settings_hold_the_ingest_instead_of_skipping_its_settings_check() {
    let t = TestDir::new();
    let run = embedded(&t, 20, 20, "10");
    // A result that claims other settings than the run's.
    edit_json(&manifest_of(&run, 1), |m| {
        m["settings"]["dim"] = Value::from(16)
    });
    let settings = run.join("output-settings.json");
    std::fs::rename(&settings, t.join("settings.aside")).unwrap();
    std::fs::create_dir(&settings).unwrap();
    assert_eq!(done_batches(&t), 0);
    assert_eq!(attempts(&run), vec![], "nothing ingested unchecked");
    std::fs::remove_dir(&settings).unwrap();
    std::fs::rename(t.join("settings.aside"), &settings).unwrap();
    assert_eq!(done_batches(&t), 0);
    let recorded = attempts(&run);
    assert_eq!(recorded[0].0, AttemptState::Rejected);
    assert!(recorded[0].1.contains("--dim"), "{recorded:?}");
}

#[test]
fn quarantine_jsonl_is_written_again_after_a_kill_between_the_accept_and_its_rewrite() {
    let t = TestDir::new();
    let run = embedded(&t, 20, 20, "10");
    // Paper 0 of part 0 as one the job could not embed: out of the shard (pyarrow), in the
    // manifest's failed list.
    let manifest = manifest_of(&run, 1);
    let shard = shard_of(&run, 1, 0);
    let code = format!(
        r#"
import hashlib, pyarrow.parquet as pq
p = {p:?}
t = pq.read_table(p)
first = t.column("id")[0].as_py()
pq.write_table(t.slice(1), p)
print(first, hashlib.sha256(open(p, "rb").read()).hexdigest())
"#,
        p = shard.display().to_string()
    );
    let Some(out) = python(&code, "pyarrow", "EMBEDFLEET_REQUIRE_PYARROW") else {
        return;
    };
    let (failed, sha) = out.split_once(' ').unwrap();
    edit_json(&manifest, |m| {
        let s = &mut m["shards"][0];
        s["sha256"] = Value::from(sha);
        s["rows"] = Value::from(s["rows"].as_u64().unwrap() - 1);
        s["failed"] = serde_json::json!([[failed, "out of memory at one paper"]]);
    });
    let killed = t
        .cmd(&["status", "--run-dir", "run", "--json"])
        .env(TEST_KILL_ENV, "accepted")
        .output()
        .unwrap();
    assert_eq!(killed.status.signal(), Some(libc::SIGKILL));
    assert_eq!(done_batches(&t), 1);
    let quarantine = std::fs::read_to_string(run.join("quarantine.jsonl")).unwrap();
    assert!(
        quarantine.contains(failed) && quarantine.contains("embed_failed"),
        "{quarantine}"
    );
}

#[test]
fn a_fifo_a_link_to_dev_zero_and_a_huge_parts_in_results_are_rejected_with_reasons_and_status_answers(
) {
    let t = TestDir::new();
    let run = embedded(&t, 40, 20, "10");
    let dir = run.join("results/b000001");
    // Planted beside the job's own manifest by someone who can write the run directory.
    let fifo = dir.join("fifo.json");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) }, 0);
    std::os::unix::fs::symlink("/dev/zero", dir.join("zero.json")).unwrap();
    // A second manifest of a batch already taken in is discarded unread, so the absurd part
    // count goes into the other batch's only manifest, which the owner must verify.
    edit_json(&manifest_of_own(&run.join("results/b000002")), |m| {
        m["parts"] = Value::from(4_294_967_295u64);
    });
    // None of them blocks, feeds without end or builds four billion paths: status answers (a
    // hang would show as this wait running out; the time is printed for the record).
    let started = Instant::now();
    status_within_a_minute(&t);
    eprintln!(
        "status answered in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(
        done_batches(&t),
        1,
        "batch 1's own result is taken in, batch 2's is not"
    );
    let mut recorded = attempts(&run);
    recorded.retain(|(state, _)| *state == AttemptState::Rejected);
    let reasons: Vec<&str> = recorded.iter().map(|(_, why)| why.as_str()).collect();
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    assert!(reasons.iter().any(|r| r.contains("a FIFO")), "{reasons:?}");
    assert!(
        reasons.iter().any(|r| r.contains("symbolic link")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.contains("4294967295")),
        "{reasons:?}"
    );
    // Verdicts, not retries: the next look records nothing more.
    done_batches(&t);
    assert_eq!(
        attempts(&run)
            .iter()
            .filter(|(s, _)| *s == AttemptState::Rejected)
            .count(),
        3
    );
}

/// The one manifest in `dir` a job wrote (before anything was planted there).
fn manifest_of_own(dir: &Path) -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "json")
                && std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file())
                && !p.ends_with("huge.json")
        })
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    found.pop().unwrap()
}

/// The token of each attempt at batch 1 with a manifest, and its shard files on disk.
fn shard_files_by_attempt(run: &Path) -> BTreeMap<String, usize> {
    let tokens: Vec<String> = std::fs::read_dir(run.join("results/b000001"))
        .map(|entries| {
            entries
                .filter_map(|e| {
                    let name = e.ok()?.file_name().to_string_lossy().into_owned();
                    name.strip_suffix(".json").map(str::to_string)
                })
                .collect()
        })
        .unwrap_or_default();
    let files: Vec<String> = std::fs::read_dir(run.join("shards"))
        .map(|entries| {
            entries
                .filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
                .collect()
        })
        .unwrap_or_default();
    tokens
        .into_iter()
        .map(|t| {
            let n = files
                .iter()
                .filter(|f| f.ends_with(&format!(".{t}.parquet")))
                .count();
            (t, n)
        })
        .collect()
}

#[test]
fn an_attempt_that_wakes_after_its_batch_was_done_elsewhere_writes_no_more_shards() {
    let t = TestDir::new();
    t.plan_with_model(24, 24);
    let run = t.join("run");
    // Attempt A, a shard per paper, stopped (SIGSTOP, as a hung node) once it wrote a shard.
    let mut a = t
        .cmd(&embed_job_args(&["--shard-papers", "1"]))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while shard_files_by_attempt(&run).values().all(|&n| n == 0) {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "A wrote no shard"
        );
        assert!(
            a.try_wait().unwrap().is_none(),
            "A ended before it was caught"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = a.id() as i32;
    // SAFETY: stops the test's own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    std::thread::sleep(Duration::from_millis(200));
    let at_stop = shard_files_by_attempt(&run);
    assert_eq!(at_stop.len(), 1, "{at_stop:?}");
    let (token_a, written_a) = at_stop.into_iter().next().unwrap();
    assert!(written_a < 24, "A was caught mid-batch");

    // Attempt B does the batch (taking over A's finished shards) while A sleeps.
    t.run(&embed_job_args(&["--shard-papers", "1"]), 0);
    // A wakes: the part it was embedding is thrown away, not written beside B's.
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    let out = a.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("did it first"), "{stderr}");
    assert_eq!(
        shard_files_by_attempt(&run)[&token_a],
        written_a,
        "A wrote after waking: {stderr}"
    );
    assert_eq!(done_batches(&t), 1);
    assert_every_planned_paper_once(&run);
}
