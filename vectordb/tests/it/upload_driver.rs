//! The uploader over a run directory (run.db + parquet shards, no model): counts, resume,
//! failures recorded and sent again, refusals, and `tune`. The embedded sink always runs; the
//! server variants run when `QDRANT_URL` is set (the restart one needs `QDRANT_RESTART_CMD` too,
//! which `.ci/run` sets: it SIGKILLs the server and starts it again).

use crate::upload_common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use embedfleet_core::rundb::{RunDb, ShardRow};
use embedfleet_vectordb::tune::{self, TuneOptions};
use embedfleet_vectordb::{
    progress_key, upload, CollectionInfo, CollectionSpec, CountRequest, DeleteRequest, Ensured,
    FinishReport, Hit, PayloadFilter, PointsBatch, QdrantEdge, QdrantExtras, QdrantServer,
    QueryRequest, Sink, UploadError, UploadOptions, UploadResult, UploadRunError, UpsertRequest,
};
use upload_common::{paper_id, year_of};

/// Writes a run directory whose shards hold rows `first..first + n` with `dim`-d vectors each,
/// recorded in run.db as parts of one batch.
fn make_run(dir: &Path, shards: &[(usize, usize, usize)]) -> PathBuf {
    let run = dir.join("run");
    let db = RunDb::create(&run).expect("run.db");
    db.conn()
        .execute_batch(
            "INSERT INTO corpus_files (id, path, size, mtime_ns, edges) VALUES (1, 'c', 1, 1, 'e');
             INSERT INTO batches (id, file_id, seq, path, n_rows, n_chars) VALUES (1, 1, 0, 'b', 1, 1);",
        )
        .expect("batch rows");
    std::fs::create_dir_all(run.join("shards")).expect("shards dir");
    for (part, &(first, n, dim)) in shards.iter().enumerate() {
        let rel = format!("shards/part-{part}.parquet");
        let info = upload_common::write_shard(&run.join(&rel), first..first + n, dim);
        let shard = ShardRow {
            batch_id: embedfleet_core::BatchId(1),
            part: part as u32,
            path: rel,
            rows: info.rows,
            sha256: info.sha256,
        };
        db.record_shard(&shard).expect("record shard");
    }
    run
}

fn options(run: &Path, collection: &str) -> UploadOptions {
    let mut o = UploadOptions::new(run, collection);
    o.batch_size = 16;
    o.in_flight = 3;
    o.checkpoint_every = 2;
    o
}

fn edge(dir: &Path) -> QdrantEdge {
    QdrantEdge::open(dir.join("edge")).expect("open edge")
}

/// Rows `0..n` with a year equal to `year`.
fn rows_of_year(n: usize, year: i64) -> u64 {
    (0..n).filter(|&i| year_of(i) == Some(year)).count() as u64
}

fn check_upload_resume(sink: &dyn Sink, run: &Path, collection: &str) {
    let report = upload(sink, &options(run, collection)).expect("upload");
    assert_eq!(report.ensured, Some(Ensured::Created));
    assert_eq!((report.send.points, report.send.failed_points), (250, 0));
    assert_eq!(
        sink.count(CountRequest::new(collection)).expect("count"),
        250
    );
    let status = RunDb::open(run).unwrap().status().unwrap();
    let u = &status.uploads_by_collection[&progress_key(sink, collection)];
    assert_eq!((u.acked, u.failed, u.missing), (250, 0, 0));
    // Filters on the payload index.
    for year in [2018, 2020] {
        let n = sink
            .count(CountRequest::new(collection).filter(Some(&PayloadFilter::year(year))))
            .expect("filtered count");
        assert_eq!(n, rows_of_year(250, year), "year {year}");
    }
    // Again: nothing to send, nothing duplicated.
    let again = upload(sink, &options(run, collection)).expect("upload again");
    assert_eq!(again.ensured, Some(Ensured::Existing));
    assert_eq!((again.already_acked, again.send.points), (250, 0));
    assert_eq!(
        sink.count(CountRequest::new(collection)).expect("count"),
        250
    );
}

#[test]
fn every_row_once_then_nothing_to_send() {
    let dir = tempfile::tempdir().unwrap();
    let run = make_run(dir.path(), &[(0, 100, 24), (100, 150, 24)]);
    check_upload_resume(&edge(dir.path()), &run, "papers");
}

#[test]
fn a_partly_acknowledged_run_sends_only_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let run = make_run(dir.path(), &[(0, 100, 24), (100, 150, 24)]);
    let sink = Counting::new(edge(dir.path()), usize::MAX);
    // As a killed upload leaves it: the first shard durable and recorded up to row 64.
    let db = RunDb::open(&run).unwrap();
    let key = progress_key(&sink, "papers");
    let shards = db.upload_shards(&key).unwrap();
    let spec = CollectionSpec::new("papers", 24);
    sink.ensure_collection(&spec).unwrap();
    let first =
        embedfleet_vectordb::shards::read_all(&run.join(&shards[0].path), 64, 64).expect("read");
    for batch in &first {
        sink.upsert(UpsertRequest::new(
            "papers",
            &PointsBatch::from_record_batch(batch).unwrap(),
        ))
        .unwrap();
    }
    sink.checkpoint("papers").unwrap();
    db.record_upload(shards[0].shard_id, &key, 64, 0).unwrap();
    let before = sink.points.load(Ordering::SeqCst);
    let report = upload(&sink, &options(&run, "papers")).expect("upload");
    assert_eq!((report.already_acked, report.send.points), (64, 186));
    assert_eq!(
        sink.points.load(Ordering::SeqCst) - before,
        186,
        "sent once"
    );
    assert_eq!(sink.count(CountRequest::new("papers")).unwrap(), 250);
}

#[test]
fn failed_batches_are_recorded_shown_missing_and_sent_again() {
    let dir = tempfile::tempdir().unwrap();
    let run = make_run(dir.path(), &[(0, 100, 24), (100, 150, 24)]);
    {
        // The first two upserts fail (after the sink's own retries, as it would report them).
        let sink = Counting::new(edge(dir.path()), 2);
        let report = upload(&sink, &options(&run, "papers")).expect("upload goes on");
        assert_eq!(report.send.failed_points, 32);
        assert_eq!(report.send.points, 250 - 32);
        assert_eq!(report.send.errors.len(), 1, "{:?}", report.send.errors);
        let status = RunDb::open(&run).unwrap().status().unwrap();
        let u = &status.uploads_by_collection[&progress_key(&sink, "papers")];
        assert_eq!(u.failed, 32);
        assert!(u.missing >= 32, "missing {}", u.missing);
        assert_eq!(u.acked + u.missing, 250);
    }
    let sink = edge(dir.path());
    let report = upload(&sink, &options(&run, "papers")).expect("second upload");
    assert_eq!(report.send.failed_points, 0);
    assert_eq!(sink.count(CountRequest::new("papers")).unwrap(), 250);
    let status = RunDb::open(&run).unwrap().status().unwrap();
    let u = &status.uploads_by_collection[&progress_key(&sink, "papers")];
    assert_eq!((u.acked, u.failed, u.missing), (250, 0, 0));
}

#[test]
fn a_sink_that_keeps_failing_stops_the_upload_with_progress_kept() {
    let dir = tempfile::tempdir().unwrap();
    let run = make_run(dir.path(), &[(0, 100, 24)]);
    let sink = Counting::new(edge(dir.path()), usize::MAX);
    sink.fail_from.store(3, Ordering::SeqCst);
    let mut o = options(&run, "papers");
    o.in_flight = 1;
    o.max_consecutive_failures = 2;
    match upload(&sink, &o) {
        Err(e @ UploadRunError::TooManyFailures { .. }) => assert!(!e.is_refusal()),
        other => panic!("expected TooManyFailures, got {other:?}"),
    }
    let db = RunDb::open(&run).unwrap();
    let key = progress_key(&sink, "papers");
    assert_eq!(db.upload_totals(&key).unwrap().0, 48, "3 batches acked");
}

#[test]
fn shards_of_mixed_sizes_and_a_collection_of_another_size_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let run = make_run(dir.path(), &[(0, 20, 24), (20, 20, 12)]);
    let sink = edge(dir.path());
    let err = upload(&sink, &options(&run, "papers")).expect_err("mixed sizes");
    assert!(
        matches!(
            err,
            UploadRunError::MixedDims {
                found: 12,
                expected: 24,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.is_refusal());

    let other = tempfile::tempdir().unwrap();
    let run = make_run(other.path(), &[(0, 20, 12)]);
    sink.ensure_collection(&CollectionSpec::new("papers24", 24))
        .unwrap();
    let err = upload(&sink, &options(&run, "papers24")).expect_err("other size");
    assert!(err.is_refusal(), "{err}");
    assert!(err.to_string().contains("24-d"), "{err}");
    assert_eq!(sink.count(CountRequest::new("papers24")).unwrap(), 0);
}

#[test]
fn tune_sweeps_picks_saves_outputs_and_drops_the_scratch_collection() {
    let dir = tempfile::tempdir().unwrap();
    let run = make_run(dir.path(), &[(0, 150, 16), (150, 150, 16)]);
    let sink = edge(dir.path());
    let db = RunDb::open(&run).unwrap();
    let mut o = TuneOptions::new("scratch");
    o.sample = 200;
    o.batch_sizes = vec![1, 4, 16, 64];
    o.in_flights = vec![1, 2, 4];
    let report = tune::tune(&sink, &db, &o).expect("tune");
    assert_eq!(report.trials.len(), 7);
    assert!(report.trials.iter().all(|t| t.points == 200));
    let best = |sweep| {
        report
            .trials
            .iter()
            .filter(|t| t.sweep == sweep)
            .map(|t| t.points_per_s())
            .fold(0.0, f64::max)
    };
    let chosen_b = report
        .trials
        .iter()
        .find(|t| t.sweep == "batch" && t.batch_size == report.batch_size)
        .expect("chosen batch was tried");
    assert!(chosen_b.points_per_s() >= best("batch") * 0.95);
    assert!(report.points_per_s >= best("in_flight") * 0.95);
    assert!(sink.collection_info("scratch").unwrap().is_none());
    let files = tune::write_outputs(&report, &dir.path().join("out")).expect("outputs");
    let csv = std::fs::read_to_string(&files[0]).unwrap();
    assert_eq!(csv.lines().count(), 8);
    let png = std::fs::read(&files[2]).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
}

/// The server variants' server, or `None` with `test` said to be skipped (no `QDRANT_URL`).
fn server(test: &str) -> Option<QdrantServer> {
    // Long enough to ride out a restart.
    upload_common::server_from_env(test, Some(12))
}

#[test]
fn server_every_row_once_then_nothing_to_send() {
    let Some(sink) = server("server_every_row_once_then_nothing_to_send") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let run = make_run(dir.path(), &[(0, 100, 24), (100, 150, 24)]);
    let name = format!("embedfleet-test-driver-{}", std::process::id());
    let _ = sink.delete_collection(&name);
    check_upload_resume(&sink, &run, &name);
    let info = sink.collection_info(&name).unwrap().expect("exists");
    let info = info.qdrant.expect("a Qdrant collection");
    assert_eq!(info.hnsw.m, 16, "bulk load restored m");
    assert!(
        info.indexing_threshold_kb > 0,
        "bulk load restored indexing"
    );
    sink.delete_collection(&name).unwrap();
}

#[test]
fn server_restarted_mid_upload_ends_with_the_exact_count() {
    let Some(sink) = server("server_restarted_mid_upload_ends_with_the_exact_count") else {
        return;
    };
    let restart = std::env::var("QDRANT_RESTART_CMD").expect(
        "this test needs QDRANT_RESTART_CMD beside QDRANT_URL: a shell command that kills the \
         server and starts it again (.ci/qdrant/qdrant-server.sh kill-restart)",
    );
    let dir = tempfile::tempdir().unwrap();
    let run = make_run(dir.path(), &[(0, 2000, 24), (2000, 2000, 24)]);
    let name = format!("embedfleet-test-restart-{}", std::process::id());
    let _ = sink.delete_collection(&name);
    let mut o = options(&run, &name);
    o.batch_size = 8;
    o.in_flight = 1;
    o.max_consecutive_failures = 1000;
    let report = std::thread::scope(|s| {
        let up = s.spawn(|| upload(&sink, &o));
        std::thread::sleep(Duration::from_millis(500));
        let status = std::process::Command::new("sh")
            .args(["-c", &restart])
            .status()
            .expect("restart command runs");
        assert!(status.success(), "QDRANT_RESTART_CMD failed: {status}");
        up.join().unwrap()
    });
    // One upload, no manual step: the retries ride out the restart.
    let report = report.expect("upload");
    assert_eq!(report.send.failed_points, 0, "{report:?}");
    assert_eq!(sink.count(CountRequest::new(&name)).unwrap(), 4000);
    sink.delete_collection(&name).unwrap();
}

/// A sink around the edge engine that counts points and fails chosen upserts: the first
/// `fail_first` ones, and every one from number `fail_from` on.
struct Counting {
    inner: QdrantEdge,
    calls: AtomicUsize,
    points: AtomicUsize,
    fail_first: usize,
    fail_from: AtomicUsize,
}

impl Counting {
    fn new(inner: QdrantEdge, fail_first: usize) -> Self {
        Self {
            inner,
            calls: AtomicUsize::new(0),
            points: AtomicUsize::new(0),
            fail_first: if fail_first == usize::MAX {
                0
            } else {
                fail_first
            },
            fail_from: AtomicUsize::new(usize::MAX),
        }
    }
}

/// The calls a test sink passes to its edge engine as they are.
macro_rules! pass_to_inner {
    () => {
        fn target(&self) -> String {
            self.inner.target()
        }
        fn kind(&self) -> &'static str {
            self.inner.kind()
        }
        fn database_name(&self) -> &'static str {
            self.inner.database_name()
        }
        fn ensure_collection(&self, spec: &CollectionSpec) -> UploadResult<Ensured> {
            self.inner.ensure_collection(spec)
        }
        fn checkpoint(&self, collection: &str) -> UploadResult<()> {
            self.inner.checkpoint(collection)
        }
        fn finish(&self, spec: &CollectionSpec) -> UploadResult<FinishReport> {
            self.inner.finish(spec)
        }
        fn query(&self, request: QueryRequest<'_>) -> UploadResult<Vec<Vec<Hit>>> {
            self.inner.query(request)
        }
        fn collection_info(&self, collection: &str) -> UploadResult<Option<CollectionInfo>> {
            self.inner.collection_info(collection)
        }
        fn delete_collection(&self, collection: &str) -> UploadResult<bool> {
            self.inner.delete_collection(collection)
        }
        fn set_payload(
            &self,
            request: embedfleet_vectordb::PayloadRequest<'_>,
        ) -> UploadResult<()> {
            self.inner.set_payload(request.shard_key(None))
        }
        fn qdrant(&self) -> Option<&dyn QdrantExtras> {
            Some(self)
        }
    };
}

/// The collection marker of a test sink: its edge engine's.
macro_rules! marker_of_inner {
    () => {
        fn collection_marker(&self, collection: &str) -> UploadResult<Option<String>> {
            self.inner.collection_marker(collection)
        }
        fn set_collection_marker(&self, collection: &str, marker: &str) -> UploadResult<()> {
            self.inner.set_collection_marker(collection, marker)
        }
    };
}

impl Sink for Counting {
    pass_to_inner!();
    marker_of_inner!();
    fn upsert(&self, request: UpsertRequest<'_>) -> UploadResult<()> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        if n < self.fail_first || n >= self.fail_from.load(Ordering::SeqCst) {
            return Err(UploadError::RetriesExhausted {
                action: "upsert points",
                attempts: 8,
                code: tonic::Code::Unavailable,
                message: "test".into(),
            });
        }
        self.points
            .fetch_add(request.points.len(), Ordering::SeqCst);
        self.inner.upsert(request)
    }
    fn count(&self, request: CountRequest<'_>) -> UploadResult<u64> {
        self.inner.count(request.shard_key(None))
    }
    fn delete(&self, request: DeleteRequest<'_>) -> UploadResult<()> {
        self.inner.delete(request)
    }
}

impl QdrantExtras for Counting {}

/// A sink whose collection is custom-sharded: it records the shard key of every upsert (by the
/// paper ids it carried) and every key it was asked to make.
struct Keyed {
    inner: QdrantEdge,
    keys_made: std::sync::Mutex<Vec<String>>,
    key_of_paper: std::sync::Mutex<std::collections::HashMap<String, String>>,
}

impl Sink for Keyed {
    pass_to_inner!();
    marker_of_inner!();
    fn upsert(&self, request: UpsertRequest<'_>) -> UploadResult<()> {
        let Some(key) = request.shard_key else {
            panic!("a keyed collection got an upsert without a shard key");
        };
        assert!(
            self.keys_made.lock().unwrap().iter().any(|k| k == key),
            "key {key} used before it was made"
        );
        let mut map = self.key_of_paper.lock().unwrap();
        for p in request.points.iter() {
            map.insert(p.paper_id.to_owned(), key.to_owned());
        }
        self.inner.upsert(request.shard_key(None))
    }
    fn count(&self, request: CountRequest<'_>) -> UploadResult<u64> {
        self.inner.count(request.shard_key(None))
    }
    fn delete(&self, request: DeleteRequest<'_>) -> UploadResult<()> {
        self.inner.delete(request.shard_key(None))
    }
}

impl QdrantExtras for Keyed {
    fn keyed(&self, _collection: &str) -> UploadResult<bool> {
        Ok(true)
    }
    fn ensure_shard_key(
        &self,
        _collection: &str,
        key: &str,
        owner: &embedfleet_vectordb::shard_keys::KeyOwner,
    ) -> UploadResult<()> {
        // The key is made owned by the run it is named after.
        assert!(
            key.starts_with(&format!("{}-", owner.run)) || owner.run.is_empty(),
            "{key} {owner:?}"
        );
        self.keys_made.lock().unwrap().push(key.to_owned());
        Ok(())
    }
}

#[test]
fn into_a_keyed_collection_every_upsert_names_its_batchs_shard_key() {
    // A run loaded before groups (no keys pinned): a `b<batch>` key per batch.
    keyed_upload(None, ["b1", "b2", "b3"]);
}

#[test]
fn into_a_grouped_collection_every_upsert_names_its_groups_key_owned_by_the_run() {
    // Two batches per group: batches 1-2 into g1, batch 3 into g2, keys named after the run.
    keyed_upload(Some(2), ["g1", "g1", "g2"]);
}

fn keyed_upload(batches_per_group: Option<i64>, want_keys: [&str; 3]) {
    let dir = tempfile::tempdir().unwrap();
    let run = make_run(dir.path(), &[(0, 30, 8), (30, 25, 8), (55, 20, 8)]);
    // Three batches, a shard each: parts 0, 1, 2 become batches 1, 2, 3.
    let db = RunDb::open(&run).unwrap();
    db.conn()
        .execute_batch(
            "INSERT INTO batches (id, file_id, seq, path, n_rows, n_chars) VALUES (2, 1, 1, 'b2', 1, 1);
             INSERT INTO batches (id, file_id, seq, path, n_rows, n_chars) VALUES (3, 1, 2, 'b3', 1, 1);
             UPDATE shards SET batch_id = part + 1, part = 0;",
        )
        .unwrap();
    drop(db);
    let prefix = match batches_per_group {
        Some(n) => {
            let keys = embedfleet_vectordb::shard_keys::ShardKeys::pin(
                &embedfleet_core::RunLayout::new(&run),
                n,
            )
            .unwrap();
            format!("{}-", keys.run_id)
        }
        None => String::new(),
    };
    let want_keys = want_keys.map(|k| format!("{prefix}{k}"));
    let sink = Keyed {
        inner: edge(dir.path()),
        keys_made: Default::default(),
        key_of_paper: Default::default(),
    };
    let report = upload(&sink, &options(&run, "keyed")).unwrap();
    assert_eq!(report.send.points, 75);
    let mut made = sink.keys_made.lock().unwrap().clone();
    made.sort();
    let mut want_made = want_keys.to_vec();
    want_made.dedup();
    assert_eq!(made, want_made);
    let map = sink.key_of_paper.lock().unwrap();
    assert_eq!(map.len(), 75);
    for i in 0..75 {
        let want = if i < 30 {
            &want_keys[0]
        } else if i < 55 {
            &want_keys[1]
        } else {
            &want_keys[2]
        };
        assert_eq!(&map[&paper_id(i)], want, "paper {i}");
    }
}
