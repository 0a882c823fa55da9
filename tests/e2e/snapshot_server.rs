//! The snapshot server suite: `upload --mode snapshot` into a Qdrant server in cluster mode
//! (the three-peer cluster tests are in `snapshot_cluster.rs`).
//!
//! These need a Qdrant server in cluster mode (`QDRANT_CLUSTER=1 .ci/qdrant/qdrant-server.sh
//! start`, which `.ci/run` starts), named by `QDRANT_URL` (gRPC) and `QDRANT_REST_URL` (default:
//! the gRPC URL with its port minus one); without one they say they are skipped.

use crate::snapshot::{build, small_run, stderr};
use crate::util::TestDir;
use embedfleet_core::rundb::{RunDb, SnapshotStep};
use embedfleet_core::RunLayout;
use embedfleet_snapshot::{ShardKeys, SNAPSHOT_TEST_DELAY_ENV};
use embedfleet_vectordb::{
    point_id, CountRequest, PayloadFilter, PointsBatch, QdrantExtras, QdrantServer, QueryRequest,
    SearchOptions, ServerConfig, Sink, UpsertRequest,
};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

// ---- The server suite: a Qdrant server in cluster mode ----

/// The server suite's Qdrant (cluster mode): gRPC and REST URLs, a client, and a collection
/// name of this test's own (the update tests use it too); `None` without `QDRANT_URL`, the
/// test said to be skipped.
pub(crate) fn server(test: &str) -> Option<(String, String, QdrantServer, String)> {
    let url = crate::util::qdrant_env(&format!("the snapshot server test `{test}`"), "QDRANT_URL")?;
    let rest = std::env::var("QDRANT_REST_URL")
        .unwrap_or_else(|_| embedfleet_snapshot::RestClient::url_from_grpc(&url));
    let sink = QdrantServer::connect(ServerConfig::new(url.clone())).unwrap();
    let name = format!("embedfleet-snap-{test}-{}", std::process::id());
    let _ = sink.delete_collection(&name);
    Some((url, rest, sink, name))
}

pub(crate) fn upload(
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
pub(crate) fn query_vectors(run: &Path, n: usize) -> Vec<Vec<f32>> {
    let db = RunDb::open(run).unwrap();
    let mut out = Vec::new();
    for s in db.all_shards().unwrap() {
        let reader = embedfleet_vectordb::shards::read_from(&run.join(&s.path), 0, 64).unwrap();
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
fn server_snapshot_load_equals_upsert_load_and_later_writes_keep_counts_exact() {
    let Some((url, rest, sink, name)) = server("equal") else {
        return;
    };
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
        for b in embedfleet_vectordb::shards::read_from(&run.join(&s.path), 0, 64).unwrap() {
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
fn server_killed_snapshot_load_resumes_without_recovering_finished_shards() {
    let Some((url, rest, sink, name)) = server("resume") else {
        return;
    };
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
fn server_mismatched_snapshot_or_collection_is_refused() {
    let Some((url, rest, sink, name)) = server("mismatch") else {
        return;
    };
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
pub(crate) fn seeded_run(t: &TestDir, run_dir: &str, papers: u64, per_job: u64, seed: u64) {
    let corpus = format!("{run_dir}-corpus.jsonl.gz");
    t.sample_seeded(&corpus, papers, 1, seed);
    t.run_corpus(run_dir, &corpus, per_job, &[]);
}

pub(crate) fn rows_of(run: &Path) -> u64 {
    RunDb::open(run)
        .unwrap()
        .all_shards()
        .unwrap()
        .iter()
        .map(|s| s.rows)
        .sum()
}

/// The ids of the exact top-`k` of each query in `collection`.
pub(crate) fn top_ids(
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
fn server_two_runs_load_side_by_side_and_a_copy_of_one_is_refused() {
    let Some((url, rest, sink, name)) = server("tworuns") else {
        return;
    };
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
fn server_a_grouped_load_killed_at_any_step_ends_exact_and_searches_as_the_upserted() {
    let Some((url, rest, sink, name)) = server("killgroups") else {
        return;
    };
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
fn server_a_collection_left_without_its_payload_indexes_gets_them_from_the_next_load() {
    let Some((url, rest, sink, name)) = server("noindexes") else {
        return;
    };
    let t = TestDir::new();
    small_run(&t, "run", 60, 20);
    let run = t.join("run");
    let rows = rows_of(&run);
    let first = RunDb::open(&run).unwrap().all_shards().unwrap()[0]
        .path
        .clone();
    let dim = embedfleet_vectordb::shards::shard_dim(&run.join(&first)).unwrap();
    // What a load killed between creating the collection and its payload indexes leaves:
    // the collection, custom-sharded, with none of them.
    let mut made = embedfleet_vectordb::CollectionSpec::new(&name, dim);
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
    let wanted = embedfleet_vectordb::CollectionSpec::new(&name, dim);
    assert_eq!(
        after.settings.payload_indexes.len(),
        wanted.payload_indexes.len(),
        "{after:?}"
    );
    assert_eq!(sink.count(CountRequest::new(&name)).unwrap(), rows);
    sink.delete_collection(&name).unwrap();
}

/// A second run whose vectors were made at another precision (its pinned settings say fp8, as
/// an FP8 run's on an H100 would) is refused by the collection the first run's snapshots
/// filled, in either mode, before a point of it is loaded; the collection keeps its count.
#[test]
fn server_a_run_of_other_vectors_is_refused_by_a_snapshot_loaded_collection() {
    let Some((url, rest, sink, name)) = server("precision") else {
        return;
    };
    let t = TestDir::new();
    small_run(&t, "run", 40, 20);
    seeded_run(&t, "fp8run", 40, 20, 47);
    let pinned = t.join("fp8run/output-settings.json");
    let text = std::fs::read_to_string(&pinned).unwrap();
    assert!(text.contains("\"precision\": \"native\""), "{text}");
    std::fs::write(
        &pinned,
        text.replace("\"precision\": \"native\"", "\"precision\": \"fp8\""),
    )
    .unwrap();
    upload(&t, &url, &rest, &name, &["--mode", "snapshot"], 0);
    let rows = rows_of(&t.join("run"));
    assert_eq!(sink.count(CountRequest::new(&name)).unwrap(), rows);
    for mode in ["snapshot", "upsert"] {
        let err = upload_from(&t, "fp8run", &url, &rest, &name, &["--mode", mode], 4);
        assert!(
            err.contains("precision native") && err.contains("precision fp8"),
            "{mode}: {err}"
        );
        assert_eq!(
            sink.count(CountRequest::new(&name)).unwrap(),
            rows,
            "{mode}: nothing of the FP8 run loaded"
        );
    }
    let _ = sink.delete_collection(&name);
}
