//! The query workload as a scheduler job: `query --submit` on the run's owner sends
//! `query-job` through the run's stored Slurm config, collects its vector files and searches;
//! the results are the local `query`'s. A job killed midway keeps its parts, and the same
//! command again finishes with a new job that does only the rest.

use crate::query::{read_results, run_with_terms, ResultRow};
use crate::util::{slurm_up, TestDir};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Paper ids per query id, by rank.
fn top_ids(rows: &[ResultRow]) -> BTreeMap<i64, Vec<String>> {
    let mut out: BTreeMap<i64, Vec<(i32, String)>> = BTreeMap::new();
    for r in rows {
        out.entry(r.1).or_default().push((r.2, r.3.clone()));
    }
    out.into_iter()
        .map(|(q, mut v)| {
            v.sort();
            (q, v.into_iter().map(|(_, id)| id).collect())
        })
        .collect()
}

/// The one work folder under run/queries.
fn work_dir(run: &Path) -> Option<PathBuf> {
    let dir = run.join("queries");
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .map(|e| e.unwrap().path())
        .collect();
    assert!(found.len() <= 1, "{found:?}");
    found.pop()
}

#[test]
fn query_as_a_slurm_job_is_collected_by_the_owner_and_equals_a_local_query() {
    let test = "query_as_a_slurm_job_is_collected_by_the_owner_and_equals_a_local_query";
    if !slurm_up(test) {
        return;
    }
    let t = TestDir::new();
    run_with_terms(&t, 24);
    // The run's scheduler config is Slurm (its first submit stores it; every batch is done,
    // so that submit sends nothing).
    std::fs::write(t.join("slurm.toml"), "[scheduler]\nbackend = \"slurm\"\n").unwrap();
    t.run(
        &[
            "submit",
            "--run-dir",
            "run",
            "--config",
            "slurm.toml",
            "--model-dir",
            "run/tiny-model",
            "--devices",
            "cpu",
            "--queue",
            "debug=1",
        ],
        0,
    );
    let local = [
        "query",
        "--run-dir",
        "run",
        "--terms",
        "terms.txt",
        "--top-k",
        "5",
        "--output",
        "local.parquet",
    ];
    t.run(&local, 0);
    let cluster = [
        "query",
        "--run-dir",
        "run",
        "--terms",
        "terms.txt",
        "--top-k",
        "5",
        "--output",
        "cluster.parquet",
        "--submit",
        "--queue",
        "debug",
        "--devices",
        "cpu",
        "--part-terms",
        "4",
        "--poll-interval",
        "0.3",
    ];
    // The job is slowed after each part, and cancelled once two are written.
    let child = t
        .cmd(&cluster)
        .env(embedfleet_query::workload::TEST_DELAY_ENV, "1500")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(180);
    let work = loop {
        assert!(
            Instant::now() < deadline,
            "the query job wrote no two parts"
        );
        if let Some(w) = work_dir(&t.join("run")) {
            if w.join("vectors/part-000001.parquet").exists() {
                break w;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(work.join("job.json")).unwrap()).unwrap();
    assert_eq!(record["backend"], "slurm", "{record}");
    let id = record["scheduler_id"].as_str().unwrap().to_string();
    assert!(Command::new("scancel").arg(&id).status().unwrap().success());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("Run the same command again"), "{err}");
    assert!(!t.join("cluster.parquet").exists());
    let first_part = work.join("vectors/part-000000.parquet");
    let kept = std::fs::metadata(&first_part).unwrap().modified().unwrap();
    // The same command again: a new job does only the missing parts; the owner collects.
    let out = t.run(&cluster, 0);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("submitted query job") && err.contains("-a2"),
        "{err}"
    );
    assert!(
        err.contains("collecting the query vectors (6 parts)"),
        "{err}"
    );
    assert_eq!(
        std::fs::metadata(&first_part).unwrap().modified().unwrap(),
        kept,
        "a finished part is not made again"
    );
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(work.join("job.json")).unwrap()).unwrap();
    let name = record["name"].as_str().unwrap();
    let script = std::fs::read_to_string(t.join(&format!("run/jobs/{name}.sh"))).unwrap();
    assert!(
        script.contains("#SBATCH --partition=debug") && script.contains(" query-job --work "),
        "{script}"
    );
    let log = std::fs::read_to_string(t.join(&format!("run/logs/{name}.log"))).unwrap_or_default();
    assert!(log.contains("were done before"), "{log}");
    // The same top-k papers as the local query, term by term.
    let (a, b) = (
        read_results(&t.join("local.parquet")),
        read_results(&t.join("cluster.parquet")),
    );
    assert_eq!(a.len(), 24 * 5);
    assert_eq!(top_ids(&a), top_ids(&b));
    // Done: the same command again has nothing to do and submits nothing.
    let out = t.run(&cluster, 0);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("nothing to do") && !err.contains("submitted"),
        "{err}"
    );
}

#[test]
fn query_submit_without_a_cluster_runs_its_job_locally_with_the_same_results() {
    let t = TestDir::new();
    run_with_terms(&t, 6);
    let common = [
        "query",
        "--run-dir",
        "run",
        "--terms",
        "terms.txt",
        "--top-k",
        "4",
    ];
    t.run(&[&common[..], &["--output", "local.parquet"]].concat(), 0);
    // `run` stores no run config: the job goes to the local backend, and says so.
    let out = t.run(
        &[
            &common[..],
            &[
                "--output",
                "job.parquet",
                "--submit",
                "--queue",
                "local",
                "--part-terms",
                "4",
                "--poll-interval",
                "0.2",
            ],
        ]
        .concat(),
        0,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no stored run config") && err.contains("submitted query job"),
        "{err}"
    );
    let work = work_dir(&t.join("run")).expect("a work folder");
    let parts: Vec<_> = std::fs::read_dir(work.join("vectors")).unwrap().collect();
    assert_eq!(parts.len(), 2, "6 terms in parts of 4");
    assert_eq!(
        top_ids(&read_results(&t.join("local.parquet"))),
        top_ids(&read_results(&t.join("job.parquet")))
    );
    // --queue goes with --submit only.
    t.run(
        &[&common[..], &["--output", "x.parquet", "--queue", "gpu"]].concat(),
        2,
    );
}
