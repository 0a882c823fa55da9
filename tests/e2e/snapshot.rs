//! `build-shard`, `embed-job --build-shard`, `upload --mode snapshot` and `delete`.
//!
//! The embedded-path tests always run. The `server_*` tests need a Qdrant server in cluster
//! mode (`QDRANT_CLUSTER=1 .ci/qdrant/qdrant-server.sh start`) and run with `--run-ignored`,
//! `QDRANT_URL` (gRPC) and `QDRANT_REST_URL` (default: the gRPC URL with its port minus one).

use crate::util::{embed_job_args, TestDir};
use embedfleet_core::rundb::{RunDb, SnapshotStep};
use embedfleet_core::RunLayout;
use embedfleet_snapshot::{BuiltShardManifest, ShardKeys, SNAPSHOT_TEST_DELAY_ENV};
use embedfleet_upload::{
    point_id, CountRequest, PayloadFilter, PointsBatch, QdrantExtras, QdrantServer, QueryRequest,
    SearchOptions, ServerConfig, Sink, UpsertRequest,
};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// `run` of `papers` sample papers, `per_job` a batch, into `run_dir`.
fn small_run(t: &TestDir, run_dir: &str, papers: u64, per_job: u64) {
    t.small_run(run_dir, papers, per_job, &[]);
}

/// `build-shard --run-dir run` with `args`, exiting `code`; returns its stderr.
fn build(t: &TestDir, args: &[&str], code: i32) -> String {
    let line = [&["build-shard", "--run-dir", "run"][..], args].concat();
    stderr(&t.run(&line, code))
}

/// Every built-shard manifest of a run.
fn manifests(run: &Path) -> Vec<BuiltShardManifest> {
    let mut out: Vec<BuiltShardManifest> = std::fs::read_dir(run.join("snapshots"))
        .into_iter()
        .flatten()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "json")
                && p.file_name()
                    .is_some_and(|n| n != "settings.json" && n != "keys.json")
        })
        .map(|p| serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap())
        .collect();
    out.sort_by_key(|m| m.batch);
    out
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn build_shard_builds_each_batch_once_from_its_accepted_shards() {
    let t = TestDir::new();
    small_run(&t, "run", 60, 40);
    let db = RunDb::open(&t.join("run")).unwrap();
    let shards = db.all_shards().unwrap();
    drop(db);
    let err = build(&t, &["--batch", "1", "--batch", "2"], 0);
    assert!(err.contains("points into snapshots/"), "{err}");
    let built = manifests(&t.join("run"));
    assert_eq!(built.len(), 2);
    for m in &built {
        let mine: Vec<_> = shards.iter().filter(|s| s.batch_id.0 == m.batch).collect();
        assert_eq!(m.points, mine.iter().map(|s| s.rows).sum::<u64>());
        let files: Vec<&str> = m.sources.iter().map(|s| s.file.as_str()).collect();
        let recorded: Vec<&str> = mine.iter().map(|s| s.path.as_str()).collect();
        assert_eq!(files, recorded, "built from the batch's accepted shards");
        assert!(t.join("run").join(&m.snapshot).is_file());
    }
    // Again: nothing to build; from run.db's accepted shards (the owner) it is the same shard.
    let err = build(&t, &["--batch", "2"], 0);
    assert!(err.contains("built already"), "{err}");
    let err = build(&t, &["--batch", "2", "--accepted"], 0);
    assert!(err.contains("built already"), "{err}");
    // The run's build settings are pinned: other ones are refused (exit 4), naming them.
    let err = build(&t, &["--batch", "1", "--hnsw-m", "32"], 4);
    assert!(err.contains("hnsw m: the run's 16, here 32"), "{err}");
    // A batch nothing embedded yet is refused with what to do.
    let err = build(&t, &["--batch", "9"], 1);
    assert!(err.contains("embed it first"), "{err}");
}

#[test]
fn build_shard_reads_shards_that_pyarrow_wrote_with_its_defaults() {
    let t = TestDir::new();
    small_run(&t, "run", 20, 20);
    let run = t.join("run");
    // Every shard of the run rewritten by pyarrow (snappy, its own schema metadata), and
    // recorded in run.db as the accepted shards with their new sha256.
    let code = format!(
        "import hashlib, sqlite3, pyarrow.parquet as pq
db = sqlite3.connect('{run}/run.db')
for sid, path in db.execute('SELECT id, path FROM shards').fetchall():
    t = pq.read_table('{run}/' + path).replace_schema_metadata(None)
    new = path.replace('.parquet', '.pyarrow.parquet')
    pq.write_table(t, '{run}/' + new)
    sha = hashlib.sha256(open('{run}/' + new, 'rb').read()).hexdigest()
    db.execute('UPDATE shards SET path = ?, sha256 = ? WHERE id = ?', (new, sha, sid))
db.commit()
print(pq.ParquetFile('{run}/' + new).metadata.row_group(0).column(0).compression)",
        run = run.display()
    );
    let Some(codec) = crate::util::python(&code, "pyarrow", "EMBEDFLEET_REQUIRE_PYARROW") else {
        return;
    };
    assert_eq!(codec, "SNAPPY");
    let err = build(&t, &["--batch", "1", "--accepted"], 0);
    assert!(err.contains("20 points into snapshots/"), "{err}");
    let built = manifests(&run);
    assert_eq!(built.len(), 1);
    assert!(built[0]
        .sources
        .iter()
        .all(|s| s.file.ends_with(".pyarrow.parquet")));
    assert_eq!(built[0].points, 20);
}

#[test]
fn embed_job_with_build_shard_leaves_the_batchs_shard_built() {
    let t = TestDir::new();
    t.plan_with_model(30, 30);
    t.run(&embed_job_args(&["--build-shard"]), 0);
    // The owner takes the attempt in (status opens run.db, which ingests results).
    t.status("run");
    let built = manifests(&t.join("run"));
    assert_eq!(built.len(), 1);
    let db = RunDb::open(&t.join("run")).unwrap();
    let accepted: Vec<String> = db
        .shards_of(embedfleet_core::BatchId(1))
        .unwrap()
        .into_iter()
        .map(|s| s.sha256)
        .collect();
    let sources: Vec<String> = built[0].sources.iter().map(|s| s.sha256.clone()).collect();
    assert_eq!(sources, accepted);
    assert_eq!(built[0].points, 30);
}

/// The job scripts under `run/jobs` whose name contains `part`.
fn job_scripts(run: &Path, part: &str) -> Vec<std::path::PathBuf> {
    let mut out: Vec<_> = std::fs::read_dir(run.join("jobs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "sh")
                && p.file_name().unwrap().to_string_lossy().contains(part)
        })
        .collect();
    out.sort();
    out
}

#[test]
fn submit_builds_each_group_in_a_job_of_its_own_once_its_batches_are_done() {
    let t = TestDir::new();
    t.plan_with_model(50, 10);
    let run = t.join("run");
    // Batches 1-3 (group 1 of two groups of three) are embedded before the loop starts.
    for batch in ["1", "2", "3"] {
        let args = [
            "embed-job",
            "--run-dir",
            "run",
            "--batch",
            batch,
            "--model-dir",
            "model",
        ];
        t.run(&args, 0);
    }
    // Keep batch 5's shards aside: without them group 2's build fails, twice, and is given up.
    let submit = |extra: &[&str]| {
        let base = [
            "submit",
            "--run-dir",
            "run",
            "--model-dir",
            "model",
            "--poll-interval",
            "0.2",
            "--queue",
            "local=1",
        ];
        stderr(&t.run(&[&base[..], extra].concat(), 0))
    };
    let err = submit(&[
        "--group-builds",
        "local",
        "--group-count",
        "2",
        "--max-attempts",
        "2",
    ]);
    assert!(
        err.contains("group 1 (batches 1-3): 30 points ready"),
        "{err}"
    );
    assert!(
        err.contains("group 2 (batches 4-6): 20 points ready"),
        "{err}"
    );
    // Group 1's build went in the first round, before batch 5's embed job (one slot): the
    // builds pipeline with the embedding.
    let g1 = job_scripts(&run, "-g1-a");
    let embed5: Vec<_> = {
        let db = RunDb::open(&run).unwrap();
        let names: Vec<String> = db
            .conn()
            .prepare("SELECT name FROM jobs WHERE batch_id = 5")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        names
            .iter()
            .map(|n| RunLayout::new(&run).job_script(n))
            .collect()
    };
    assert_eq!((g1.len(), embed5.len()), (1, 1), "{g1:?} {embed5:?}");
    let mtime = |p: &Path| std::fs::metadata(p).unwrap().modified().unwrap();
    assert!(mtime(&g1[0]) < mtime(&embed5[0]));
    // Each group's shard is what the load builds: its batches' accepted shards, in order.
    let built = manifests(&run);
    assert_eq!(
        built.iter().map(|m| m.batches()).collect::<Vec<_>>(),
        vec![(1, 3), (4, 6)]
    );
    let db = RunDb::open(&run).unwrap();
    let accepted: Vec<String> = db
        .all_shards()
        .unwrap()
        .into_iter()
        .map(|s| s.sha256)
        .collect();
    let sources: Vec<String> = built
        .iter()
        .flat_map(|m| m.sources.iter().map(|s| s.sha256.clone()))
        .collect();
    assert_eq!(sources, accepted);
    assert_eq!(built.iter().map(|m| m.points).sum::<u64>(), 50);
    drop(db);
    let err = build(&t, &["--accepted", "--group", "1", "--group", "2"], 0);
    assert_eq!(err.matches("built already").count(), 2, "{err}");

    // A build that fails is tried again up to --max-attempts, then left to the load.
    for m in &built {
        std::fs::remove_file(run.join(&m.snapshot)).unwrap();
    }
    let shard5 = db_shards(&run, 5);
    std::fs::rename(run.join(&shard5), run.join("aside.parquet")).unwrap();
    let err = submit(&["--max-attempts", "2"]);
    assert!(err.contains("group 1: built by"), "{err}");
    assert_eq!(err.matches("group 2: build job").count(), 2, "{err}");
    assert!(err.contains("given up after 2 jobs"), "{err}");
    assert_eq!(job_scripts(&run, "-g2-a").len(), 3);
    // Restarted without the option (it is kept), the group is built once its shards are back.
    std::fs::rename(run.join("aside.parquet"), run.join(&shard5)).unwrap();
    let err = submit(&[]);
    assert!(err.contains("group 2: built by"), "{err}");
    assert!(!err.contains("group 1"), "built already: {err}");
    let err = submit(&["--group-builds", "off"]);
    assert!(
        !err.contains("group builds") && !err.contains("build job"),
        "{err}"
    );
}

/// Every batch embedded first, then `submit` on `backend` with only group builds to do: each
/// group's job goes through the scheduler, asks for its cores and memory, and builds it.
fn group_builds_through(backend: &str, directives: &[&str], config: Option<&str>) {
    let t = TestDir::new();
    t.plan_with_model(40, 10);
    for batch in ["1", "2", "3", "4"] {
        let args = [
            "embed-job",
            "--run-dir",
            "run",
            "--batch",
            batch,
            "--model-dir",
            "model",
        ];
        t.run(&args, 0);
    }
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
        "--queue",
        "gpu=1",
        "--poll-interval",
        "0.5",
        "--group-builds",
        "debug",
        "--group-count",
        "2",
        "--build-cpus",
        "1",
    ];
    if let Some(config) = config {
        std::fs::write(t.join("run.toml"), config).unwrap();
        args.extend(["--config", "run.toml"]);
    }
    let err = stderr(&t.run(&args, 0));
    assert!(
        err.contains("group 1: built by") && err.contains("group 2: built by"),
        "{err}"
    );
    let run = t.join("run");
    assert_eq!(
        manifests(&run)
            .iter()
            .map(|m| m.batches())
            .collect::<Vec<_>>(),
        vec![(1, 2), (3, 4)]
    );
    // The owner's record of group 1's job names its script (PBS names are cut to 15 chars).
    let record: serde_json::Value = serde_json::from_slice(
        &std::fs::read(run.join("snapshots/requests/group-000001.job.json")).unwrap(),
    )
    .unwrap();
    let script = std::fs::read_to_string(record["script"].as_str().unwrap()).unwrap();
    for d in directives {
        assert!(script.contains(d), "{d} in {script}");
    }
    assert!(!script.contains("gpus"), "{script}");
}

#[test]
fn submit_group_builds_through_slurm() {
    if !crate::util::slurm_up("submit_group_builds_through_slurm") {
        return;
    }
    group_builds_through(
        "slurm",
        &[
            "#SBATCH --partition=debug",
            "#SBATCH --cpus-per-task=1",
            "#SBATCH --mem=10",
        ],
        None,
    );
}

#[test]
fn submit_group_builds_through_pbs() {
    if !crate::util::slurm_up("submit_group_builds_through_pbs") {
        return;
    }
    group_builds_through(
        "pbs",
        &["#PBS -q debug", "#PBS -l select=1:ncpus=1:mem=10"],
        Some("[scheduler.pbs]\nflavor = \"torque\"\n"),
    );
}

/// The first parquet shard run.db accepted for `batch`.
fn db_shards(run: &Path, batch: i64) -> String {
    let db = RunDb::open(run).unwrap();
    db.shards_of(embedfleet_core::BatchId(batch)).unwrap()[0]
        .path
        .clone()
}

#[test]
fn snapshot_mode_needs_a_server_and_says_so() {
    let t = TestDir::new();
    small_run(&t, "run", 20, 20);
    let out = t.run(&["upload", "--run-dir", "run", "--mode", "snapshot"], 4);
    let err = stderr(&out);
    assert!(
        err.contains("--qdrant URL") && err.contains("cluster mode"),
        "{err}"
    );
    // A server that is not there: the REST address to check is named.
    let out = t.run(
        &[
            "upload",
            "--run-dir",
            "run",
            "--mode",
            "snapshot",
            "--qdrant",
            "http://127.0.0.1:9",
            "--qdrant-rest",
            "http://127.0.0.1:9",
        ],
        1,
    );
    assert!(stderr(&out).contains("--qdrant-rest"), "{}", stderr(&out));
}

#[test]
fn delete_removes_papers_by_id_from_the_embedded_engine() {
    let t = TestDir::new();
    small_run(&t, "run", 30, 30);
    let db = RunDb::open(&t.join("run")).unwrap();
    let ids = crate::util::planned_ids(&t.join("run"));
    drop(db);
    let out = t.run(&["delete", "--run-dir", "run", &ids[0], &ids[1]], 0);
    assert!(
        stderr(&out).contains("deleted 2 points"),
        "{}",
        stderr(&out)
    );
    let out = t.run(&["delete", "--run-dir", "run", "no-such-paper"], 0);
    assert!(
        stderr(&out).contains("deleted 0 points"),
        "{}",
        stderr(&out)
    );
}

// ---- The server suite: a Qdrant server in cluster mode ----

/// The server suite's Qdrant (cluster mode): gRPC and REST URLs, a client, and a collection
/// name of this test's own (the update tests use it too).
pub(crate) fn server(test: &str) -> (String, String, QdrantServer, String) {
    let url = std::env::var("QDRANT_URL").expect(
        "the server tests need QDRANT_URL: a cluster-mode Qdrant's gRPC URL, e.g. http://127.0.0.1:6334",
    );
    let rest = std::env::var("QDRANT_REST_URL")
        .unwrap_or_else(|_| embedfleet_snapshot::RestClient::url_from_grpc(&url));
    let sink = QdrantServer::connect(ServerConfig::new(url.clone())).unwrap();
    let name = format!("embedfleet-snap-{test}-{}", std::process::id());
    let _ = sink.delete_collection(&name);
    (url, rest, sink, name)
}

fn upload(
    t: &TestDir,
    url: &str,
    rest: &str,
    collection: &str,
    extra: &[&str],
    code: i32,
) -> String {
    upload_from(t, "run", url, rest, collection, extra, code)
}

/// `upload` of the run in `run_dir`.
fn upload_from(
    t: &TestDir,
    run_dir: &str,
    url: &str,
    rest: &str,
    collection: &str,
    extra: &[&str],
    code: i32,
) -> String {
    stderr(&t.run(&upload_args(run_dir, url, rest, collection, extra), code))
}

/// The command line of `upload` of the run in `run_dir` into `collection`, then `extra`.
fn upload_args<'a>(
    run_dir: &'a str,
    url: &'a str,
    rest: &'a str,
    collection: &'a str,
    extra: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec![
        "upload",
        "--run-dir",
        run_dir,
        "--qdrant",
        url,
        "--qdrant-rest",
        rest,
        "--collection",
        collection,
    ];
    args.extend_from_slice(extra);
    args
}

/// Vectors of the run's first rows (the queries of the comparisons).
fn query_vectors(run: &Path, n: usize) -> Vec<Vec<f32>> {
    let db = RunDb::open(run).unwrap();
    let mut out = Vec::new();
    for s in db.all_shards().unwrap() {
        let reader = embedfleet_upload::shards::read_from(&run.join(&s.path), 0, 64).unwrap();
        for b in reader {
            let b = b.unwrap();
            let points = PointsBatch::from_record_batch(&b).unwrap();
            out.extend(points.iter().map(|p| p.vector.to_vec()));
            if out.len() >= n {
                out.truncate(n);
                return out;
            }
        }
    }
    out
}

#[test]
#[ignore = "needs a Qdrant server in cluster mode: set QDRANT_URL and run the server suite (docs/testing.md, \"Server tests\")"]
fn server_snapshot_load_equals_upsert_load_and_later_writes_keep_counts_exact() {
    let (url, rest, sink, name) = server("equal");
    let upserted = format!("{name}-upsert");
    let _ = sink.delete_collection(&upserted);
    let t = TestDir::new();
    small_run(&t, "run", 90, 30);
    let run = t.join("run");
    upload(&t, &url, &rest, &upserted, &[], 0);
    let err = upload(
        &t,
        &url,
        &rest,
        &name,
        &["--mode", "snapshot", "--group-count", "2"],
        0,
    );
    assert!(
        err.contains("3 batches in 2 groups of 2") && err.contains("2 recovered now"),
        "{err}"
    );
    assert!(err.contains("built here"), "no job built them: {err}");

    // Same points, same payload, same answers.
    let rows: u64 = RunDb::open(&run)
        .unwrap()
        .all_shards()
        .unwrap()
        .iter()
        .map(|s| s.rows)
        .sum();
    assert_eq!(sink.count(CountRequest::new(&name)).unwrap(), rows);
    assert_eq!(sink.count(CountRequest::new(&upserted)).unwrap(), rows);
    for filter in [
        PayloadFilter::years(2000, 2015),
        PayloadFilter::source("s2orc/train"),
        PayloadFilter::year(2010),
    ] {
        assert_eq!(
            sink.count(CountRequest::new(&name).filter(Some(&filter)))
                .unwrap(),
            sink.count(CountRequest::new(&upserted).filter(Some(&filter)))
                .unwrap(),
            "{filter:?}"
        );
    }
    let exact = SearchOptions {
        exact: true,
        ..SearchOptions::new(10)
    };
    for v in query_vectors(&run, 50) {
        let a: Vec<_> = sink
            .query(QueryRequest::one(&name, &v, exact.clone()))
            .unwrap()
            .remove(0)
            .iter()
            .map(|h| h.id)
            .collect();
        let b: Vec<_> = sink
            .query(QueryRequest::one(&upserted, &v, exact.clone()))
            .unwrap()
            .remove(0)
            .iter()
            .map(|h| h.id)
            .collect();
        assert_eq!(a, b);
    }
    // Green, nothing left to optimise: the shards arrived built.
    let info = sink.collection_info(&name).unwrap().unwrap();
    assert!(info.green, "{info:?}");
    assert!(sink.keyed(&name).unwrap(), "custom sharding");

    // A re-upsert of every point (into its group's key) and deletes by id leave exact counts.
    let keys = ShardKeys::pinned(&embedfleet_core::RunLayout::new(&run))
        .unwrap()
        .expect("the load pinned the run's keys");
    assert_eq!(keys.batches_per_group, 2);
    let db = RunDb::open(&run).unwrap();
    for s in db.all_shards().unwrap() {
        let key = keys.key_of(s.batch_id.0);
        for b in embedfleet_upload::shards::read_from(&run.join(&s.path), 0, 64).unwrap() {
            let b = b.unwrap();
            let points = PointsBatch::from_record_batch(&b).unwrap();
            sink.upsert(UpsertRequest::new(&name, &points).shard_key(Some(&key)))
                .unwrap();
        }
    }
    assert_eq!(
        sink.count(CountRequest::new(&name)).unwrap(),
        rows,
        "a re-upsert duplicates nothing"
    );
    let ids = crate::util::planned_ids(&run);
    let out = t.run(
        &[
            "delete",
            "--run-dir",
            "run",
            "--qdrant",
            &url,
            "--collection",
            &name,
            &ids[0],
            &ids[40],
            &ids[80],
        ],
        0,
    );
    assert!(
        stderr(&out).contains("deleted 3 points"),
        "{}",
        stderr(&out)
    );
    assert_eq!(sink.count(CountRequest::new(&name)).unwrap(), rows - 3);
    let hits = sink
        .query(QueryRequest::one(
            &name,
            &query_vectors(&run, 1)[0],
            exact.clone(),
        ))
        .unwrap()
        .remove(0);
    assert!(hits.iter().all(|h| h.id != point_id(&ids[0])));

    // Upsert mode into the snapshot-loaded collection: nothing is left to send.
    let err = upload(&t, &url, &rest, &name, &[], 0);
    assert!(err.contains("0 points sent"), "{err}");
    sink.delete_collection(&name).unwrap();
    sink.delete_collection(&upserted).unwrap();
}

#[test]
#[ignore = "needs a Qdrant server in cluster mode: set QDRANT_URL and run the server suite (docs/testing.md, \"Server tests\")"]
fn server_killed_snapshot_load_resumes_without_recovering_finished_shards() {
    let (url, rest, sink, name) = server("resume");
    let t = TestDir::new();
    small_run(&t, "run", 120, 20);
    let run = t.join("run");
    let batches: Vec<&str> = ["1", "2", "3", "4", "5", "6"]
        .iter()
        .flat_map(|b| ["--batch", b])
        .collect();
    build(&t, &batches, 0);
    let key = format!("{name}@server:{url}");
    let mut child = t
        .cmd(&upload_args(
            "run",
            &url,
            &rest,
            &name,
            // A group per batch: the shards built above, six recoveries to kill in between.
            &[
                "--mode",
                "snapshot",
                "--recoveries",
                "1",
                "--group-count",
                "6",
            ],
        ))
        .env(SNAPSHOT_TEST_DELAY_ENV, "700")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    loop {
        let recovered = RunDb::open(&run)
            .ok()
            .and_then(|db| db.snapshot_loads(&key).ok())
            .map_or(0, |rows| {
                rows.iter()
                    .filter(|r| r.step >= SnapshotStep::Recovered)
                    .count()
            });
        if recovered >= 2 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no recovery recorded"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let err = upload(&t, &url, &rest, &name, &["--mode", "snapshot"], 0);
    let rows: u64 = RunDb::open(&run)
        .unwrap()
        .all_shards()
        .unwrap()
        .iter()
        .map(|s| s.rows)
        .sum();
    assert!(!err.contains(" 0 loaded before"), "{err}");
    assert!(err.contains(&format!("{rows} points")), "{err}");
    assert_eq!(sink.count(CountRequest::new(&name)).unwrap(), rows);
    let db = RunDb::open(&run).unwrap();
    assert!(db
        .snapshot_loads(&key)
        .unwrap()
        .iter()
        .all(|r| r.step == SnapshotStep::Verified));
    sink.delete_collection(&name).unwrap();
}

#[test]
#[ignore = "needs a Qdrant server in cluster mode: set QDRANT_URL and run the server suite (docs/testing.md, \"Server tests\")"]
fn server_mismatched_snapshot_or_collection_is_refused() {
    let (url, rest, sink, name) = server("mismatch");
    let t = TestDir::new();
    small_run(&t, "run", 30, 30);
    upload(&t, &url, &rest, &name, &["--mode", "snapshot"], 0);
    // The collection has m = 16: a load asking for 32 is refused before anything changes.
    let err = upload(
        &t,
        &url,
        &rest,
        &name,
        &["--mode", "snapshot", "--hnsw-m", "32"],
        4,
    );
    assert!(
        err.contains("hnsw m: the run's 16, here 32") && err.contains("--mode upsert"),
        "{err}"
    );
    // A hash-sharded collection cannot take built shards.
    let hashed = format!("{name}-hash");
    let _ = sink.delete_collection(&hashed);
    upload(&t, &url, &rest, &hashed, &[], 0);
    let err = upload(&t, &url, &rest, &hashed, &["--mode", "snapshot"], 4);
    assert!(err.contains("hash sharding"), "{err}");
    // A built shard made with other settings than the new collection's: refused too.
    let layout = RunLayout::new(t.join("run"));
    let other = format!("{name}-other");
    let _ = sink.delete_collection(&other);
    let err = upload(
        &t,
        &url,
        &rest,
        &other,
        &["--mode", "snapshot", "--int8"],
        4,
    );
    assert!(
        err.contains("int8 quantization: the run's false, here true"),
        "{err}"
    );
    assert!(
        sink.collection_info(&other).unwrap().is_none(),
        "nothing was created"
    );
    assert!(layout.snapshot_dir().is_dir());
    sink.delete_collection(&name).unwrap();
    sink.delete_collection(&hashed).unwrap();
}

/// A run of `papers` sample papers made with corpus seed `seed` (another seed, other paper ids),
/// `per_job` a batch, into `run_dir`.
fn seeded_run(t: &TestDir, run_dir: &str, papers: u64, per_job: u64, seed: u64) {
    let corpus = format!("{run_dir}-corpus.jsonl.gz");
    t.sample_seeded(&corpus, papers, 1, seed);
    t.run_corpus(run_dir, &corpus, per_job, &[]);
}

fn rows_of(run: &Path) -> u64 {
    RunDb::open(run)
        .unwrap()
        .all_shards()
        .unwrap()
        .iter()
        .map(|s| s.rows)
        .sum()
}

/// The ids of the exact top-`k` of each query in `collection`.
fn top_ids(
    sink: &QdrantServer,
    collection: &str,
    queries: &[Vec<f32>],
    k: usize,
) -> Vec<Vec<String>> {
    let exact = SearchOptions {
        exact: true,
        ..SearchOptions::new(k)
    };
    queries
        .iter()
        .map(|v| {
            sink.query(QueryRequest::one(collection, v, exact.clone()))
                .unwrap()
                .remove(0)
                .iter()
                .map(|h| h.id.to_string())
                .collect()
        })
        .collect()
}

#[test]
#[ignore = "needs a Qdrant server in cluster mode: set QDRANT_URL and run the server suite (docs/testing.md, \"Server tests\")"]
fn server_two_runs_load_side_by_side_and_a_copy_of_one_is_refused() {
    let (url, rest, sink, name) = server("tworuns");
    let t = TestDir::new();
    small_run(&t, "run", 60, 20);
    seeded_run(&t, "run2", 40, 20, 43);
    let (rows1, rows2) = (rows_of(&t.join("run")), rows_of(&t.join("run2")));
    let err = upload(
        &t,
        &url,
        &rest,
        &name,
        &["--mode", "snapshot", "--group-count", "2"],
        0,
    );
    assert!(err.contains("3 batches in 2 groups of 2"), "{err}");
    let err = upload_from(
        &t,
        "run2",
        &url,
        &rest,
        &name,
        &["--mode", "snapshot", "--group-count", "2"],
        0,
    );
    assert!(
        err.contains("2 batches in 2 groups of 1")
            && err.contains(&format!("{rows2} points of this run"))
            && err.contains(&format!("{rows1} more in other runs' keys")),
        "{err}"
    );
    // Both runs' points, exactly: the second run's keys are its own.
    assert_eq!(sink.count(CountRequest::new(&name)).unwrap(), rows1 + rows2);
    let keys1 = ShardKeys::pinned(&RunLayout::new(t.join("run")))
        .unwrap()
        .unwrap();
    let keys2 = ShardKeys::pinned(&RunLayout::new(t.join("run2")))
        .unwrap()
        .unwrap();
    assert_ne!(keys1.run_id, keys2.run_id);
    let mut keys: Vec<String> = sink
        .keyed_shards(&name)
        .unwrap()
        .into_iter()
        .map(|s| s.key)
        .collect();
    keys.sort();
    let mut want = vec![
        keys1.key_of_group(1),
        keys1.key_of_group(2),
        keys2.key_of_group(1),
        keys2.key_of_group(2),
    ];
    want.sort();
    assert_eq!(keys, want);
    let owners = sink.key_owners(&name).unwrap();
    assert_eq!(owners[&keys2.key_of_group(2)].run, keys2.run_id);
    assert_eq!(owners[&keys1.key_of_group(1)].batches, (1, 2));
    // Each run's load again: nothing recovered, both still exact.
    let err = upload(&t, &url, &rest, &name, &["--mode", "snapshot"], 0);
    assert!(
        err.contains("0 recovered now") && err.contains("2 loaded before"),
        "{err}"
    );
    assert_eq!(sink.count(CountRequest::new(&name)).unwrap(), rows1 + rows2);

    // A copy of the first run directory names the same keys: its load would replace the first
    // run's points, so it is refused, nothing changed; --replace-keys takes them over.
    let copy = std::process::Command::new("cp")
        .args(["-a", "run", "run-copy"])
        .current_dir(t.path())
        .status()
        .unwrap();
    assert!(copy.success());
    let err = upload_from(
        &t,
        "run-copy",
        &url,
        &rest,
        &name,
        &["--mode", "snapshot"],
        4,
    );
    assert!(
        err.contains("belongs to another run") && err.contains("--replace-keys"),
        "{err}"
    );
    assert_eq!(sink.count(CountRequest::new(&name)).unwrap(), rows1 + rows2);
    let err = upload_from(
        &t,
        "run-copy",
        &url,
        &rest,
        &name,
        &["--mode", "snapshot", "--replace-keys"],
        0,
    );
    assert!(
        err.contains(&format!("{rows1} points of this run")),
        "{err}"
    );
    assert_eq!(sink.count(CountRequest::new(&name)).unwrap(), rows1 + rows2);
    sink.delete_collection(&name).unwrap();
}

#[test]
#[ignore = "needs a Qdrant server in cluster mode: set QDRANT_URL and run the server suite (docs/testing.md, \"Server tests\")"]
fn server_a_grouped_load_killed_at_any_step_ends_exact_and_searches_as_the_upserted() {
    let (url, rest, sink, name) = server("killgroups");
    let upserted = format!("{name}-upsert");
    let _ = sink.delete_collection(&upserted);
    let t = TestDir::new();
    small_run(&t, "run", 160, 20);
    let run = t.join("run");
    let rows = rows_of(&run);
    upload(&t, &url, &rest, &upserted, &[], 0);
    // Kills at seeded moments: while building (the first kills land before any shard is
    // built), between making the collection and its payload indexes, while keys are made,
    // between recoveries, while waiting for green. Each recovery waits 800 ms first, so the
    // 4 recoveries outlast the kill moments (at most 1.35 s in): a load run again resumes,
    // and a kill lands until its last recovery.
    let mut rng = 0x5eed_u64;
    let mut kills = 0;
    for _ in 0..6 {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let after = Duration::from_millis(150 + (rng >> 33) % 1200);
        let mut child = t
            .cmd(&upload_args(
                "run",
                &url,
                &rest,
                &name,
                &[
                    "--mode",
                    "snapshot",
                    "--group-count",
                    "4",
                    "--recoveries",
                    "1",
                ],
            ))
            .env(SNAPSHOT_TEST_DELAY_ENV, "800")
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(after);
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap();
            kills += 1;
        }
        child.wait().unwrap();
    }
    assert!(kills >= 3, "only {kills} loads were killed mid-way");
    let err = upload(
        &t,
        &url,
        &rest,
        &name,
        &["--mode", "snapshot", "--group-count", "4"],
        0,
    );
    assert!(err.contains(&format!("{rows} points of this run")), "{err}");
    assert_eq!(sink.count(CountRequest::new(&name)).unwrap(), rows);
    assert_eq!(sink.keyed_shards(&name).unwrap().len(), 4);
    let queries = query_vectors(&run, 40);
    assert_eq!(
        top_ids(&sink, &name, &queries, 10),
        top_ids(&sink, &upserted, &queries, 10)
    );
    // The approximate search too: the built graphs answer like the server's own.
    let approx = |c: &str| -> Vec<String> {
        queries
            .iter()
            .map(|v| {
                sink.query(QueryRequest::one(c, v, SearchOptions::new(1)))
                    .unwrap()
                    .remove(0)[0]
                    .id
                    .to_string()
            })
            .collect()
    };
    assert_eq!(approx(&name), approx(&upserted));
    sink.delete_collection(&name).unwrap();
    sink.delete_collection(&upserted).unwrap();
}

#[test]
#[ignore = "needs a Qdrant server in cluster mode: set QDRANT_URL and run the server suite (docs/testing.md, \"Server tests\")"]
fn server_a_collection_left_without_its_payload_indexes_gets_them_from_the_next_load() {
    let (url, rest, sink, name) = server("noindexes");
    let t = TestDir::new();
    small_run(&t, "run", 60, 20);
    let run = t.join("run");
    let rows = rows_of(&run);
    let first = RunDb::open(&run).unwrap().all_shards().unwrap()[0]
        .path
        .clone();
    let dim = embedfleet_upload::shards::shard_dim(&run.join(&first)).unwrap();
    // What a load killed between creating the collection and its payload indexes leaves:
    // the collection, custom-sharded, with none of them.
    let mut made = embedfleet_upload::CollectionSpec::new(&name, dim);
    made.qdrant.custom_sharding = true;
    made.payload_indexes.clear();
    sink.ensure_collection(&made).unwrap();
    let before = sink.server_collection(&name).unwrap().unwrap();
    assert!(before.settings.payload_indexes.is_empty());
    // The next load goes on (it once refused, naming the missing indexes as a difference),
    // makes them, and ends exact.
    let err = upload(&t, &url, &rest, &name, &["--mode", "snapshot"], 0);
    assert!(err.contains(&format!("{rows} points of this run")), "{err}");
    let after = sink.server_collection(&name).unwrap().unwrap();
    let wanted = embedfleet_upload::CollectionSpec::new(&name, dim);
    assert_eq!(
        after.settings.payload_indexes.len(),
        wanted.payload_indexes.len(),
        "{after:?}"
    );
    assert_eq!(sink.count(CountRequest::new(&name)).unwrap(), rows);
    sink.delete_collection(&name).unwrap();
}

// ---- The cluster suite: a real three-peer cluster on loopback (.ci/qdrant/qdrant-cluster.sh) ----

/// The peers of the three-peer cluster the cluster tests run against, from the environment
/// `qdrant-cluster.sh start` prints.
fn cluster_peers() -> (Vec<String>, Vec<String>) {
    let list = |var: &str| -> Vec<String> {
        std::env::var(var)
            .unwrap_or_else(|_| panic!("the cluster tests need {var}: eval \"$(.ci/qdrant/qdrant-cluster.sh start)\" (docs/testing.md, \"Server tests\")"))
            .split(',')
            .map(str::to_owned)
            .collect()
    };
    (list("QDRANT_PEER_GRPC_URLS"), list("QDRANT_PEER_REST_URLS"))
}

/// Runs `QDRANT_PEER_KILL_CMD` or `QDRANT_PEER_START_CMD` (the cluster script's `kill-peer`,
/// `start-peer`) for peer `peer` (1-based).
fn peer_cmd(var: &str, peer: usize) {
    let cmd = std::env::var(var)
        .unwrap_or_else(|_| panic!("the cluster tests need {var} (docs/testing.md)"));
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{cmd} {peer}"))
        .status()
        .unwrap();
    assert!(status.success(), "{cmd} {peer}");
}

#[test]
#[ignore = "needs a three-peer Qdrant cluster: .ci/qdrant/qdrant-cluster.sh (docs/testing.md, \"Server tests\")"]
fn cluster_groups_go_round_three_peers_and_survive_one_killed_under_replication_two() {
    let (grpc, rest) = cluster_peers();
    assert!(grpc.len() >= 3, "{grpc:?}");
    let sink = QdrantServer::connect(ServerConfig::new(grpc[0].clone())).unwrap();
    let name = format!("embedfleet-cluster-{}", std::process::id());
    let _ = sink.delete_collection(&name);
    let t = TestDir::new();
    small_run(&t, "run", 120, 20);
    let run = t.join("run");
    let rows = rows_of(&run);
    let err = upload(
        &t,
        &grpc[0],
        &rest[0],
        &name,
        &[
            "--mode",
            "snapshot",
            "--group-count",
            "6",
            "--replication-factor",
            "2",
        ],
        0,
    );
    assert!(err.contains("6 batches in 6 groups of 1"), "{err}");
    // Each group's key: two replicas on two peers, the first replicas going round the peers.
    let placed = sink.keyed_shards(&name).unwrap();
    assert_eq!(placed.len(), 6);
    let mut per_peer = std::collections::BTreeMap::<u64, usize>::new();
    for s in &placed {
        let mut peers = s.peers.clone();
        peers.sort();
        peers.dedup();
        assert_eq!(peers.len(), 2, "{s:?}");
        for p in peers {
            *per_peer.entry(p).or_default() += 1;
        }
    }
    assert_eq!(per_peer.len(), 3, "every peer holds replicas: {per_peer:?}");
    assert!(per_peer.values().all(|&n| n == 4), "{per_peer:?}");
    // Every peer answers the exact count from its replicas (or forwards).
    for url in &grpc {
        let peer = QdrantServer::connect(ServerConfig::new(url.clone())).unwrap();
        assert_eq!(peer.count(CountRequest::new(&name)).unwrap(), rows, "{url}");
    }
    let queries = query_vectors(&run, 20);
    let before = top_ids(&sink, &name, &queries, 10);

    // Peer 3 dies: counts stay exact and searches answer through peer 1.
    peer_cmd("QDRANT_PEER_KILL_CMD", 3);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assert_eq!(sink.count(CountRequest::new(&name)).unwrap(), rows);
        for s in &placed {
            let n = sink
                .count(CountRequest::new(&name).shard_key(Some(&s.key)))
                .unwrap();
            assert!(n > 0, "{}", s.key);
        }
        assert_eq!(top_ids(&sink, &name, &queries, 10), before);
        for v in &queries {
            assert!(!sink
                .query(QueryRequest::one(&name, v, SearchOptions::new(5)))
                .unwrap()
                .remove(0)
                .is_empty());
        }
    }));
    peer_cmd("QDRANT_PEER_START_CMD", 3);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
    sink.delete_collection(&name).unwrap();
}
