//! `run` end to end, and the embed job killed, capped and chunked.

use crate::util::{embed_job_args, planned_ids, shard_rows, TestDir};
use embedfleet_core::rundb::RunDb;
use std::path::Path;
use std::time::Duration;

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>()
}

#[test]
fn run_embeds_every_planned_paper_once_and_pyarrow_reads_the_shards() {
    let t = TestDir::new();
    t.sample("corpus.jsonl.gz", 240, 1);
    let args = [
        "run",
        "--corpus",
        "corpus.jsonl.gz",
        "--run-dir",
        "run",
        "--papers-per-job",
        "80",
        "--local-jobs",
        "2",
        "--devices",
        "cpu:2",
        "--shard-papers",
        "30",
    ];
    t.run(&args, 0);
    let status = t.status("run");
    assert_eq!(status["papers_planned"], 240);
    assert_eq!(status["rows_in_shards"], 240);
    assert_eq!(status["batches_by_state"]["done"], 3);
    // The loop's own account: the results it took in, and the part of its CPU that took.
    let snapshot: serde_json::Value =
        serde_json::from_slice(&std::fs::read(t.join("run/status-snapshot.json")).unwrap())
            .unwrap();
    let owner = &snapshot["submit_loop"];
    assert_eq!(owner["taken_in"], 3, "{owner}");
    let (ingest, all) = (owner["ingest_cpu_s"].as_f64(), owner["cpu_s"].as_f64());
    assert!(
        matches!((ingest, all), (Some(i), Some(a)) if i <= a),
        "{owner}"
    );
    // Rounds in which nothing arrived (jobs still running) are counted apart, with their CPU;
    // the rounds that submitted the three jobs and took their results in are not among them.
    let (quiet, polls) = (owner["quiet_polls"].as_u64(), owner["polls"].as_u64());
    assert!(
        matches!((quiet, polls), (Some(q), Some(p)) if q >= 1 && q + 3 <= p),
        "{owner}"
    );
    let quiet_cpu = owner["quiet_cpu_s"].as_f64().unwrap();
    assert!(quiet_cpu > 0.0 && quiet_cpu <= all.unwrap(), "{owner}");
    let rows = shard_rows(&t.join("run"));
    let mut ids: Vec<String> = rows.keys().cloned().collect();
    ids.sort();
    assert_eq!(ids, planned_ids(&t.join("run")));
    for (id, (v, _)) in &rows {
        let norm = cosine(v, v).sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "{id}: norm {norm}");
    }
    // Running again does nothing new.
    t.run(&args, 0);
    assert_eq!(t.status("run")["shards"], status["shards"]);
    pyarrow_check(&t.join("run/shards"), 240);
    crate::report::assert_report(&t, "run", 3, 240);
}

/// `run` goes through its stages with one run.db handle (issue 51): the plan's, handed to the
/// submit loop, the upload, the query and the report page. Each open checks the owner and
/// ingests new results, so a second one is work done again. A run planned already and one
/// made now both open it once; the embed jobs are processes of their own and never do.
#[test]
fn run_opens_run_db_once_and_says_what_it_did() {
    let t = TestDir::new();
    t.sample("corpus.jsonl.gz", 40, 1);
    let args = [
        "run",
        "--corpus",
        "corpus.jsonl.gz",
        "--run-dir",
        "run",
        "--papers-per-job",
        "20",
    ];
    for round in ["first", "again"] {
        let out = t
            .cmd(&args)
            .env("EMBEDFLEET_LOG", "embedfleet_core::rundb=debug")
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(out.status.code(), Some(0), "{round}: {stderr}");
        let opens = stderr.matches("opening run.db").count();
        assert_eq!(opens, 1, "{round}: run.db opened {opens} times:\n{stderr}");
        for said in [
            "top 5 papers for \"protein folding\":",
            "results\n",
            "  report      ",
        ] {
            assert!(stdout.contains(said), "{round}: {said:?} not in\n{stdout}");
        }
        assert!(t.join("run/report.html").is_file());
    }
}

/// Reads the shards with pyarrow, as a user would. Required in CI (EMBEDFLEET_REQUIRE_PYARROW=1).
fn pyarrow_check(dir: &Path, rows: usize) {
    let script = r#"
import sys, glob, pyarrow.parquet as pq, pyarrow as pa, numpy as np
t = pa.concat_tables([pq.read_table(f) for f in sorted(glob.glob(sys.argv[1] + "/*.parquet"))])
assert t.num_rows == int(sys.argv[2]), t.num_rows
assert t.schema.field("id").type == pa.string()
assert pa.types.is_fixed_size_list(t.schema.field("embedding").type)
assert t.schema.field("n_chunks").type == pa.int16()
v = np.stack(t.column("embedding").to_numpy(zero_copy_only=False))
assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-4)
assert len(set(t.column("id").to_pylist())) == t.num_rows
print("pyarrow ok", t.num_rows)
"#;
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(dir)
        .arg(rows.to_string())
        .output();
    match out {
        Ok(out) if out.status.success() => {}
        Ok(out)
            if String::from_utf8_lossy(&out.stderr).contains("No module named")
                && std::env::var_os("EMBEDFLEET_REQUIRE_PYARROW").is_none() =>
        {
            eprintln!("skipping the pyarrow check: pyarrow is not installed (.ci/run installs it)");
        }
        Ok(out) => panic!(
            "pyarrow check failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) if std::env::var_os("EMBEDFLEET_REQUIRE_PYARROW").is_none() => {
            eprintln!("skipping the pyarrow check: {e}")
        }
        Err(e) => panic!("python3: {e}"),
    }
}

#[test]
fn embed_job_killed_at_any_moment_ends_with_exactly_the_planned_rows() {
    let t = TestDir::new();
    t.plan_with_model(200, 200);
    let job = embed_job_args(&["--shard-papers", "20", "--devices", "cpu:2"]);
    for delay_ms in [20u64, 150, 400, 800, 1500] {
        let mut child = t.cmd(&job).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        child.kill().unwrap();
        child.wait().unwrap();
    }
    t.run(&job, 0);
    let rows = shard_rows(&t.join("run"));
    let mut ids: Vec<String> = rows.keys().cloned().collect();
    ids.sort();
    assert_eq!(ids, planned_ids(&t.join("run")));
    let leftovers: Vec<_> = std::fs::read_dir(t.join("run/shards"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.ends_with(".parquet"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let status = t.status("run");
    assert_eq!(status["shards"], 10);
    assert_eq!(status["rows_in_shards"], 200);
    assert_eq!(status["batches_by_state"]["done"], 1);
}

#[test]
fn out_of_memory_fallback_gives_the_same_vectors() {
    let t = TestDir::new();
    t.plan_with_model(60, 60);
    let base = embed_job_args(&["--shard-papers", "60"]);
    t.run(&base, 0);
    let free = shard_rows(&t.join("run"));
    // The same papers planned again, embedded under a cap that the longest paper alone just
    // fits under: every mini-batch holding it with others must split, and no paper needs
    // chunking.
    t.run(
        &[
            "plan",
            "--corpus",
            "c.jsonl.gz",
            "--run-dir",
            "capped",
            "--papers-per-job",
            "60",
        ],
        0,
    );
    let cap = cap_for_longest_paper(&t).to_string();
    let mut capped_job = [&base[..], &["--memory-limit", &cap]].concat();
    capped_job[2] = "capped";
    t.run(&capped_job, 0);
    let capped = shard_rows(&t.join("capped"));
    assert_eq!(free.len(), capped.len());
    for (id, (v, _)) in &free {
        let c = cosine(v, &capped[id].0);
        assert!(c >= 0.99999, "{id}: cosine {c}");
    }
    let runs = |dir: &str| RunDb::open(&t.join(dir)).unwrap().finished_runs().unwrap();
    assert!(
        runs("capped")[0].1.fallback_split > 0,
        "{:?}",
        runs("capped")
    );
    assert_eq!(runs("run")[0].1.fallback_split, 0);
}

fn cap_for_longest_paper(t: &TestDir) -> u64 {
    use embedfleet_models::{load_embedder, load_tokenizer, LoadOptions};
    let model = load_embedder(&t.join("model"), &LoadOptions::default()).unwrap();
    let tokenizer = load_tokenizer(&t.join("model"), Some(Default::default())).unwrap();
    let db = RunDb::open(&t.join("run")).unwrap();
    let batch = db.batch(embedfleet_core::BatchId(1)).unwrap().unwrap();
    let mut longest = 0;
    embedfleet_core::batchfile::read(&t.join("run").join(batch.path), |row| {
        longest = longest.max(tokenizer.encode_document(&row.paper.text).unwrap().len());
    })
    .unwrap();
    model.estimate_memory(&[longest])
}

#[test]
fn papers_longer_than_max_tokens_are_chunked_not_cut() {
    let t = TestDir::new();
    t.plan_with_model(30, 30);
    t.run(&embed_job_args(&["--max-tokens", "64"]), 0);
    let rows = shard_rows(&t.join("run"));
    assert_eq!(rows.len(), 30);
    assert!(
        rows.values().all(|(_, n)| *n > 1),
        "every sample paper is longer than 64 tokens"
    );
    let runs = RunDb::open(&t.join("run"))
        .unwrap()
        .finished_runs()
        .unwrap();
    assert_eq!(runs[0].1.long_chunked, 30);
}

#[test]
fn embed_job_refusals_exit_4_so_the_submit_loop_does_not_retry_them() {
    let t = TestDir::new();
    t.plan_with_model(8, 8);
    for (extra, says) in [
        (&["--batch", "99"][..], "batch 99 is not in this run"),
        (
            &["--batch", "1", "--devices", "cuda:0"][..],
            "--features cuda",
        ),
    ] {
        let mut args = vec!["embed-job", "--run-dir", "run", "--model-dir", "model"];
        args.extend_from_slice(extra);
        let out = t.run(&args, 4);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{stderr}");
    }
    // A run that is not planned (a plan killed before it finished: no plan.json yet).
    std::fs::remove_file(t.join("run/plan.json")).unwrap();
    let args = [
        "embed-job",
        "--run-dir",
        "run",
        "--model-dir",
        "model",
        "--batch",
        "1",
    ];
    let out = t.run(&args, 4);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not completely planned"));
}
