//! `upload` into the embedded engine, and the upload and query that end `run`.
//!
//! The `server_*` tests run `upload --qdrant` with worker processes when `QDRANT_URL` is set;
//! the sink-level server suite is `jobs/tests/it/upload_driver.rs` and `upload_server.rs`.

use crate::util::TestDir;
use embedfleet_core::rundb::RunDb;
use embedfleet_vectordb::{
    parse_year, CountRequest, PayloadFilter, QdrantEdge, QdrantExtras, QdrantServer, ServerConfig,
    Sink,
};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// `run` of a small sample corpus into `run_dir`, 40 papers a batch; returns its stdout and
/// stderr.
fn small_run(t: &TestDir, run_dir: &str, papers: u64, extra: &[&str]) -> (String, String) {
    t.small_run(run_dir, papers, 40, extra)
}

/// The year of every row of every shard recorded in run.db.
fn shard_years(run_dir: &Path) -> Vec<Option<i64>> {
    use arrow_array::{Array, StringArray};
    let db = RunDb::open(run_dir).unwrap();
    let mut years = Vec::new();
    for shard in db.all_shards().unwrap() {
        let file = std::fs::File::open(run_dir.join(&shard.path)).unwrap();
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
            .unwrap()
            .build()
            .unwrap();
        for batch in reader {
            let batch = batch.unwrap();
            let created = batch.column_by_name("created").unwrap();
            let created = created.as_any().downcast_ref::<StringArray>().unwrap();
            for i in 0..created.len() {
                years.push(
                    created
                        .is_valid(i)
                        .then(|| created.value(i))
                        .and_then(parse_year),
                );
            }
        }
    }
    years
}

fn edge_count(run_dir: &Path, collection: &str, filter: Option<&PayloadFilter>) -> u64 {
    let sink = QdrantEdge::open(run_dir.join("qdrant")).unwrap();
    sink.count(CountRequest::new(collection).filter(filter))
        .unwrap()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Starts `upload args` with every upsert delayed by `delay_ms` (so that it can be killed
/// mid-way) and returns once run.db has acknowledged rows under progress `key`.
fn start_slowed_upload(
    t: &TestDir,
    args: &[&str],
    delay_ms: u64,
    key: &str,
) -> (std::process::Child, RunDb) {
    let mut child = t
        .cmd(args)
        .env(embedfleet_vectordb::TEST_DELAY_ENV, delay_ms.to_string())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let db = RunDb::open(&t.join("run")).unwrap();
    let started = Instant::now();
    while db.upload_totals(key).unwrap().0 == 0 {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the upload ended before anything was acknowledged"
        );
        assert!(started.elapsed() < Duration::from_secs(120), "no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, db)
}

/// run.db's progress key of `collection` in the embedded engine of the run in `run_dir`.
fn edge_key(run_dir: &Path, collection: &str) -> String {
    let dir = std::fs::canonicalize(run_dir.join("qdrant")).unwrap();
    format!("{collection}@edge:{}", dir.display())
}

/// Runs `upload args` again after a kill: it starts from the `at_kill` rows acknowledged and
/// ends with all 60, none failed.
fn rerun_resumes_from(t: &TestDir, args: &[&str], db: &RunDb, key: &str, at_kill: u64) {
    let err = stderr(&t.run(args, 0));
    assert!(
        err.contains(&format!("{at_kill} already acknowledged")),
        "{err}"
    );
    assert_eq!(db.upload_totals(key).unwrap(), (60, 0));
}

#[test]
fn run_ends_with_the_upload_and_a_query_and_upload_again_sends_nothing() {
    let t = TestDir::new();
    let (stdout, _) = small_run(&t, "run", 60, &["--query", "protein folding"]);
    assert!(
        stdout.contains("top 5 papers for \"protein folding\":"),
        "{stdout}"
    );
    let ranked = stdout.lines().filter(|l| l.starts_with(" 1. ")).count();
    assert_eq!(ranked, 1, "{stdout}");
    let run = t.join("run");
    let years = shard_years(&run);
    assert_eq!(years.len(), 60);
    let status = t.status("run");
    let key = edge_key(&run, "papers");
    assert_eq!(status["uploads_by_collection"][&key]["acked"], 60);
    assert_eq!(status["uploads_by_collection"][&key]["missing"], 0);
    assert_eq!(edge_count(&run, "papers", None), 60);
    let year = years
        .iter()
        .flatten()
        .copied()
        .min()
        .expect("papers have years");
    let expected = years.iter().filter(|y| **y == Some(year)).count() as u64;
    assert!(expected > 0 && expected < 60);
    let filter = PayloadFilter::year(year);
    assert_eq!(edge_count(&run, "papers", Some(&filter)), expected);

    let out = t.run(&["upload", "--run-dir", "run", "--collection", "papers"], 0);
    let err = stderr(&out);
    assert!(err.contains(" 0 points sent"), "{err}");
    assert!(err.contains("60 already acknowledged"), "{err}");
    assert_eq!(edge_count(&run, "papers", None), 60);
}

#[test]
fn upload_killed_mid_way_resumes_to_the_exact_count() {
    let t = TestDir::new();
    small_run(&t, "run", 60, &[]);
    let run = t.join("run");
    let args = [
        "upload",
        "--run-dir",
        "run",
        "--collection",
        "killed",
        "--batch-size",
        "4",
        "--in-flight",
        "1",
        "--checkpoint-every",
        "1",
    ];
    let key = edge_key(&t.join("run"), "killed");
    let (mut child, db) = start_slowed_upload(&t, &args, 40, &key);
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let (at_kill, _) = db.upload_totals(&key).unwrap();
    assert!(
        at_kill > 0 && at_kill < 60,
        "killed mid-way: {at_kill} of 60"
    );

    rerun_resumes_from(&t, &args, &db, &key, at_kill);
    assert_eq!(edge_count(&run, "killed", None), 60);
}

#[test]
fn a_run_of_another_vector_size_is_refused_by_the_collection() {
    let t = TestDir::new();
    small_run(&t, "run", 20, &[]);
    small_run(&t, "small", 20, &["--dim", "32"]);
    let out = t.run(
        &[
            "upload",
            "--run-dir",
            "small",
            "--edge",
            "run/qdrant",
            "--collection",
            "papers",
        ],
        4,
    );
    let err = stderr(&out);
    assert!(
        err.contains("already exists with 128-d Cosine vectors, but this run needs 32-d"),
        "{err}"
    );
    assert_eq!(edge_count(&t.join("run"), "papers", None), 20);
}

/// The server and a fresh collection name; `None` without `QDRANT_URL`, the test said to be
/// skipped.
fn server(test: &str) -> Option<(String, QdrantServer, String)> {
    let url = crate::util::qdrant_env(&format!("the upload server test `{test}`"), "QDRANT_URL")?;
    let sink = QdrantServer::connect(ServerConfig::new(url.clone())).unwrap();
    let name = format!("embedfleet-e2e-{test}-{}", std::process::id());
    let _ = sink.delete_collection(&name);
    Some((url, sink, name))
}

fn refs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

#[test]
fn server_upload_with_worker_processes_sends_every_row_once() {
    let Some((url, sink, name)) = server("workers") else {
        return;
    };
    let t = TestDir::new();
    small_run(&t, "run", 60, &[]);
    let args = |collection: &str, extra: &[&str]| {
        let mut a: Vec<String> = [
            "upload",
            "--run-dir",
            "run",
            "--qdrant",
            &url,
            "--collection",
            collection,
            "--batch-size",
            "4",
        ]
        .map(String::from)
        .to_vec();
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let out = t.run(&refs(&args(&name, &["--workers", "3"])), 0);
    let err = stderr(&out);
    assert!(
        err.contains("60 points sent") && err.contains("by 3 worker processes"),
        "{err}"
    );
    assert_eq!(sink.count(CountRequest::new(&name)).unwrap(), 60);
    let years = shard_years(&t.join("run"));
    let year = years
        .iter()
        .flatten()
        .next()
        .copied()
        .expect("a dated paper");
    let of_year = years.iter().filter(|y| **y == Some(year)).count() as u64;
    assert_eq!(
        sink.count(CountRequest::new(&name).filter(Some(&PayloadFilter::year(year))))
            .unwrap(),
        of_year
    );
    let info = sink.collection_info(&name).unwrap().expect("collection");
    assert!(
        info.green && info.qdrant.is_some_and(|q| q.hnsw.m == 16),
        "index restored and built: {info:?}"
    );
    // A second run has nothing left to send.
    let out = t.run(&refs(&args(&name, &[])), 0);
    let err = stderr(&out);
    assert!(err.contains("60 already acknowledged"), "{err}");
    assert_eq!(sink.count(CountRequest::new(&name)).unwrap(), 60);

    // Without --workers: one per peer holding the collection (a cluster), else one per core.
    let other = format!("{name}-default");
    let _ = sink.delete_collection(&other);
    let out = t.run(&refs(&args(&other, &[])), 0);
    let err = stderr(&out);
    let peers = sink
        .peers(&other)
        .unwrap()
        .expect("a server knows its peers");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let expected = if peers > 1 { peers } else { cores };
    if expected > 1 {
        assert!(
            err.contains(&format!("by {expected} worker processes")),
            "{peers} peers, {cores} cores: {err}"
        );
    }
    assert_eq!(sink.count(CountRequest::new(&other)).unwrap(), 60);
    sink.delete_collection(&other).unwrap();
    sink.delete_collection(&name).unwrap();
}

#[test]
fn server_upload_killed_mid_way_stops_its_workers_and_resumes_to_the_exact_count() {
    let Some((url, sink, name)) = server("killed") else {
        return;
    };
    let t = TestDir::new();
    small_run(&t, "run", 60, &[]);
    let args = [
        "upload",
        "--run-dir",
        "run",
        "--qdrant",
        &url,
        "--collection",
        &name,
        "--batch-size",
        "2",
        "--in-flight",
        "1",
        "--checkpoint-every",
        "1",
        "--workers",
        "2",
    ];
    let key = format!("{name}@server:{}", url.trim_end_matches('/'));
    let (mut child, db) = start_slowed_upload(&t, &args, 100, &key);
    child.kill().unwrap(); // SIGKILL of the parent only
    child.wait().unwrap();
    // Its workers notice and stop: the acknowledged count stops moving short of 60.
    std::thread::sleep(Duration::from_millis(1500));
    let (at_kill, _) = db.upload_totals(&key).unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(
        db.upload_totals(&key).unwrap().0,
        at_kill,
        "workers kept sending"
    );
    assert!(
        at_kill > 0 && at_kill < 60,
        "killed mid-way: {at_kill} of 60"
    );

    rerun_resumes_from(&t, &args, &db, &key, at_kill);
    assert_eq!(sink.count(CountRequest::new(&name)).unwrap(), 60);
    sink.delete_collection(&name).unwrap();
}

#[test]
fn progress_belongs_to_its_target_a_second_target_and_a_deleted_one_get_every_point() {
    let t = TestDir::new();
    small_run(&t, "run", 60, &[]);
    let run = t.join("run");
    assert_eq!(edge_count(&run, "papers", None), 60);
    // Another Qdrant (a second embedded directory): everything is sent there too.
    let second = ["upload", "--run-dir", "run", "--edge", "second"];
    let err = stderr(&t.run(&second, 0));
    assert!(err.contains("60 points sent"), "{err}");
    let sink = QdrantEdge::open(t.join("second")).unwrap();
    assert_eq!(sink.count(CountRequest::new("papers")).unwrap(), 60);
    drop(sink);
    assert_eq!(
        edge_count(&run, "papers", None),
        60,
        "the first target untouched"
    );
    // The first target's directory deleted: the next upload sees the empty collection, says
    // so, and sends everything again.
    std::fs::remove_dir_all(run.join("qdrant")).unwrap();
    let again = ["upload", "--run-dir", "run"];
    let err = stderr(&t.run(&again, 0));
    assert!(err.contains("60 points sent"), "{err}");
    assert_eq!(edge_count(&run, "papers", None), 60);
    // A collection dropped and recreated empty under the same name: the same.
    let sink = QdrantEdge::open(run.join("qdrant")).unwrap();
    assert!(sink.delete_collection("papers").unwrap());
    drop(sink);
    let err = stderr(&t.run(&again, 0));
    assert!(
        err.contains("dropped or replaced") && err.contains("60 points sent"),
        "{err}"
    );
    assert_eq!(edge_count(&run, "papers", None), 60);
    // tune never drops a collection the run uploaded into.
    let tune = [
        "tune",
        "--run-dir",
        "run",
        "--scratch",
        "papers",
        "--sample",
        "10",
    ];
    let err = stderr(&t.run(&tune, 1));
    assert!(err.contains("holds this run's upload"), "{err}");
    assert_eq!(edge_count(&run, "papers", None), 60);
}

/// A server that is not running: `upload` says so at once, since nothing has answered this
/// command, and gives up after about 10 s (not the minute a server that was up and went
/// away is given, nor every batch's retries: 8 minutes before), naming what to check.
#[test]
fn an_upload_to_a_server_that_refuses_connections_says_so_and_gives_up() {
    let t = TestDir::new();
    small_run(&t, "run", 20, &[]);
    // A port bound and closed again: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let started = std::time::Instant::now();
    let out = t
        .cmd(&[
            "upload",
            "--run-dir",
            "run",
            "--qdrant",
            &url,
            "--batch-size",
            "1",
        ])
        .output()
        .unwrap();
    let took = started.elapsed();
    let said = stderr(&out);
    assert!(!out.status.success(), "{said}");
    let first_warning = said
        .lines()
        .find(|l| l.starts_with("warning:"))
        .unwrap_or("");
    assert!(
        first_warning.contains(&format!(
            "the Qdrant server at {url} has not answered for 0 s"
        )) && first_warning.contains("nothing listens there"),
        "said at once: {said}"
    );
    assert!(
        said.contains(&format!("nothing listens at {url}"))
            && said.contains("Start the Qdrant server, or fix the URL"),
        "{said}"
    );
    assert!(
        took < std::time::Duration::from_secs(40),
        "gave up after {took:?}"
    );
}
