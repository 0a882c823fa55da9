//! A PBS site's and a PostgreSQL team's first day (issue 60): the mistakes and the faults a new
//! user meets, each answered right or refused in words. The PBS and PostgreSQL ones live with
//! their servers' tests (`pbs_first_day.rs`, `pgvector.rs`).

use crate::util::TestDir;

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A corpus file whose records all have the fields but empty text is quarantined and reported;
/// the plan goes on with the other files and exits 3 (some input could not be used whole).
/// Only a corpus no record of which is usable stops the plan.
#[test]
fn a_file_whose_records_are_all_quarantined_for_their_content_does_not_stop_the_plan() {
    let t = TestDir::new();
    std::fs::create_dir(t.join("corpus")).unwrap();
    t.sample("corpus/good.jsonl.gz", 150, 1);
    let empty = r#"{"id": "9000001", "text": "", "source": "s2orc/train", "created": "2020-01-01", "added": "2021-01-01", "version": "v2"}
{"id": "9000002", "text": "   ", "source": "s2orc/train", "created": "2020-01-01", "added": "2021-01-01", "version": "v2"}
"#;
    std::fs::write(t.join("corpus/empty.jsonl"), empty).unwrap();
    let out = t.run(&["plan", "--corpus", "corpus", "--run-dir", "run"], 3);
    let err = stderr(&out);
    assert!(err.contains("planned 150 papers"), "{err}");
    assert!(
        err.contains("empty.jsonl: no record could be used")
            && err.contains("empty_text")
            && err.contains("the plan went on without it"),
        "{err}"
    );
    let status = t.status("run");
    assert_eq!(status["papers_planned"], 150);
    assert_eq!(status["papers_quarantined"], 2);
    // Planned again: nothing to do, and still said.
    let out = t.run(&["plan", "--corpus", "corpus", "--run-dir", "run"], 3);
    assert!(stderr(&out).contains("already planned"), "{}", stderr(&out));

    // A corpus with nothing usable at all still stops, and plans nothing.
    let out = t.run(
        &[
            "plan",
            "--corpus",
            "corpus/empty.jsonl",
            "--run-dir",
            "none",
        ],
        3,
    );
    let err = stderr(&out);
    assert!(
        err.contains("empty.jsonl: no record could be used") && err.contains("nothing was planned"),
        "{err}"
    );
}

/// `plan --update` beside a loop of `query` on the same run (a notebook's): the writer waits its
/// turn and is never failed by the readers, and no raw SQLite error is printed.
#[test]
fn plan_update_while_queries_run_in_a_loop_is_not_refused() {
    let t = TestDir::new();
    t.small_run("run", 60, 30, &[]);
    t.sample_seeded("v2.jsonl.gz", 80, 1, 7);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let queries = {
        let stop = stop.clone();
        let dir = t.path().to_path_buf();
        std::thread::spawn(move || {
            let mut runs = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let out = std::process::Command::new(env!("CARGO_BIN_EXE_embedfleet"))
                    .current_dir(&dir)
                    .args(["query", "--run-dir", "run", "protein folding"])
                    .output()
                    .unwrap();
                let err = String::from_utf8_lossy(&out.stderr).into_owned();
                assert!(!err.contains("Error code"), "{err}");
                runs += 1;
            }
            runs
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(500));
    let out = t
        .cmd(&["plan", "--update", "v2.jsonl.gz", "--run-dir", "run"])
        .output()
        .unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let runs = queries.join().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("release 2"), "{err}");
    assert!(runs > 0, "the queries ran beside the plan");
}

/// `query --help`'s own example, `--filter source=s2orc`, selects the papers of `s2orc/train`
/// (as `plan --source s2orc` does); a source the run has not is refused with the ones it has.
#[test]
fn a_source_filter_selects_as_plan_source_does_and_one_selecting_nothing_is_said() {
    let t = TestDir::new();
    t.small_run("run", 60, 60, &[]);
    let out = t.run(
        &[
            "query",
            "--run-dir",
            "run",
            "--filter",
            "source=s2orc",
            "protein folding",
        ],
        0,
    );
    let hits = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(hits.contains("top 10 papers"), "{hits}");
    // Every hit is an s2orc paper: the same search under the exact source agrees.
    let exact = t.run(
        &[
            "query",
            "--run-dir",
            "run",
            "--filter",
            "source=s2orc/train",
            "protein folding",
        ],
        0,
    );
    assert_eq!(hits, String::from_utf8_lossy(&exact.stdout));
    // eval applies it to its exact search too.
    let out = t.run(
        &[
            "eval",
            "--run-dir",
            "run",
            "--sample",
            "10",
            "--filter",
            "source=s2orc",
            "--json",
        ],
        0,
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let selectivity = report["filter_selectivity"].as_f64().unwrap();
    assert!(selectivity > 0.5 && selectivity < 1.0, "{report}");
    let out = t.run(
        &[
            "query",
            "--run-dir",
            "run",
            "--filter",
            "source=arxiv",
            "protein folding",
        ],
        1,
    );
    let err = stderr(&out);
    assert!(
        err.contains("source=arxiv` selects no paper of this run")
            && err.contains("`s2orc/train` (")
            && err.contains("`s2ag/train` ("),
        "{err}"
    );
}

/// The release shape of the issue's walk-through: 300 papers, then 10 withdrawn, 5 changed and
/// 40 new.
const SMALL_UPDATE: crate::update::Shape = crate::update::Shape {
    release_1: 300,
    withdrawn: 10,
    changed: 5,
    new: 40,
};

/// After an update and a delete, `eval`'s exact truth is over what the collection holds now:
/// the exact row reads 1.0000, and the cached truth names no withdrawn, superseded or deleted
/// paper; `status` counts the collection as it is.
#[test]
fn eval_truth_follows_the_collection_after_an_update_and_a_delete() {
    let t = TestDir::new();
    let (withdrawn, _changed, _new) = crate::update::make_releases(&t, &SMALL_UPDATE);
    t.run_corpus("run", "r1.jsonl", 150, &[]);
    t.run(&["plan", "--update", "r2.jsonl", "--run-dir", "run"], 0);
    // The update's papers embedded, not yet uploaded: status says they wait for the upload,
    // not that they are still to embed.
    t.run(
        &[
            "submit",
            "--run-dir",
            "run",
            "--model-dir",
            "run/tiny-model",
            "--devices",
            "cpu",
            "--shard-papers",
            "15",
            "--backend",
            "local",
        ],
        0,
    );
    let human =
        String::from_utf8_lossy(&t.run(&["status", "--run-dir", "run"], 0).stdout).into_owned();
    assert!(
        human.contains("also sends the 45 new or changed papers embedded since")
            && !human.contains("to embed"),
        "{human}"
    );
    t.run_corpus("run", "r2.jsonl", 150, &[]);
    let deleted = "W00007";
    t.run(&["delete", "--run-dir", "run", deleted], 0);
    let out = t.run(
        &["eval", "--run-dir", "run", "--sample", "100", "--json"],
        0,
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let exact = &report["rows"][0];
    assert_eq!(exact["search"], "exact");
    assert_eq!(exact["recall"], 1.0, "{report}");
    let mut truth_ids = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(t.join("run/eval")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("exact-") {
            let hits: Vec<Vec<serde_json::Value>> =
                serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            truth_ids.extend(
                hits.iter()
                    .flatten()
                    .map(|h| h["paper_id"].as_str().unwrap().to_owned()),
            );
        }
    }
    assert!(!truth_ids.is_empty());
    assert!(
        !truth_ids.contains(deleted),
        "the deleted paper is no answer"
    );
    for id in &withdrawn {
        assert!(!truth_ids.contains(id), "withdrawn {id} is no answer");
    }
    // The run's live papers less the deleted one, as the collection holds them.
    let live = (300 - 10 + 40 - 1) as u64;
    let status = t.status("run");
    assert_eq!(status["papers_live"].as_u64(), Some(live), "{status}");
    let human =
        String::from_utf8_lossy(&t.run(&["status", "--run-dir", "run"], 0).stdout).into_owned();
    assert!(
        human.contains(&format!("the {live} live papers")),
        "status counts what the collection holds: {human}"
    );
    assert!(!human.contains("new or changed papers to embed"), "{human}");
}

/// A trial job that fails its setup (exit code 4, as an embed-job refusing a CPU build asked
/// for GPUs does) is no loss of its queue's; the next trial tries that batch again and says
/// so (it said it retried batch 1, and trialled batch 2).
#[test]
fn a_trial_failed_for_its_setup_is_no_loss_and_the_next_trial_tries_the_same_batch() {
    let t = TestDir::new();
    t.plan_with_model(8, 4);
    let fail = t.join("fail.sh");
    std::fs::write(
        &fail,
        "#!/bin/sh\necho 'error: this build has no CUDA support' >&2\nexit 4\n",
    )
    .unwrap();
    std::fs::set_permissions(&fail, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let config = |binary: &str| {
        format!("[scheduler]\nbackend = \"local\"\n[scheduler.script]\nembedfleet = \"{binary}\"\n")
    };
    std::fs::write(t.join("fail.toml"), config(&fail.display().to_string())).unwrap();
    std::fs::write(t.join("ok.toml"), config(env!("CARGO_BIN_EXE_embedfleet"))).unwrap();
    let trial = [
        "submit",
        "--run-dir",
        "run",
        "--model-dir",
        "model",
        "--devices",
        "cpu",
        "--trial",
        "local",
        "--poll-interval",
        "0.2",
    ];
    let out = t.run(&[&trial[..], &["--config", "fail.toml"]].concat(), 3);
    assert!(
        stderr(&out).contains("trial: batch 1 failed"),
        "{}",
        stderr(&out)
    );
    let status = t.status("run");
    let local = status["routing"]["queues"]
        .as_array()
        .and_then(|q| q.iter().find(|q| q["queue"] == "local"))
        .cloned()
        .unwrap_or_else(|| panic!("{status}"));
    assert_eq!(
        local["loss_share"], 0.0,
        "a setup error is no loss: {local}"
    );
    assert_eq!(local["failed"], 0, "{local}");
    let out = t.run(
        &[&trial[..], &["--config", "ok.toml", "--replace-config"]].concat(),
        0,
    );
    let (err, said) = (
        stderr(&out),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    );
    assert!(
        err.contains("1 batches that failed before are tried again"),
        "{err}"
    );
    assert!(
        said.contains("trial: batch 1 took"),
        "the same batch: {said}"
    );
}
