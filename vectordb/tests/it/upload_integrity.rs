//! Whether an upload trusts run.db's progress only as far as the collection bears it out: the
//! run's tombstones (papers `delete`d) never come back, a batch that lost points is sent again
//! alone, and a collection made again by someone else is told from the one the run uploaded
//! into. All over the embedded engine.

use crate::upload_common;

use std::path::{Path, PathBuf};

use embedfleet_core::rundb::{RunDb, ShardRow, Tombstone};
use embedfleet_vectordb::{
    point_id, progress_key, upload, CountRequest, DeleteRequest, QdrantEdge, Sink, UploadOptions,
};
use upload_common::paper_id;

/// A run directory with one batch per entry of `batches` (rows `first..first + n`, 16-d), each
/// a single parquet shard recorded in run.db.
fn run_of_batches(dir: &Path, name: &str, batches: &[(usize, usize)]) -> PathBuf {
    let run = dir.join(name);
    let db = RunDb::create(&run).unwrap();
    db.conn()
        .execute(
            "INSERT INTO corpus_files (id, path, size, mtime_ns, edges) VALUES (1, 'c', 1, 1, 'e')",
            [],
        )
        .unwrap();
    std::fs::create_dir_all(run.join("shards")).unwrap();
    for (i, &(first, n)) in batches.iter().enumerate() {
        let batch = i as i64 + 1;
        db.conn()
            .execute(
                "INSERT INTO batches (id, file_id, seq, path, n_rows, n_chars) VALUES (?1, 1, ?1, 'b', ?2, 1)",
                [batch, n as i64],
            )
            .unwrap();
        let rel = format!("shards/b{batch}.parquet");
        let info = upload_common::write_shard(&run.join(&rel), first..first + n, 16);
        db.record_shard(&ShardRow {
            batch_id: embedfleet_core::BatchId(batch),
            part: 0,
            path: rel,
            rows: info.rows,
            sha256: info.sha256,
        })
        .unwrap();
    }
    run
}

fn options(run: &Path) -> UploadOptions {
    let mut o = UploadOptions::new(run, "papers");
    o.batch_size = 16;
    o.in_flight = 2;
    o
}

fn edge(dir: &Path) -> QdrantEdge {
    QdrantEdge::open(dir.join("edge")).unwrap()
}

fn tombstone(batch_id: i64, i: usize) -> Tombstone {
    Tombstone {
        batch_id,
        paper_id: paper_id(i),
    }
}

fn holds(sink: &dyn Sink, papers: &[usize]) -> u64 {
    let ids: Vec<_> = papers.iter().map(|&i| point_id(&paper_id(i))).collect();
    sink.count(CountRequest::new("papers").ids(&ids)).unwrap()
}

#[test]
fn deleted_papers_stay_deleted_through_an_upload_again_and_a_resend_of_their_batch() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_of_batches(dir.path(), "run", &[(0, 40), (40, 30)]);
    let sink = edge(dir.path());
    upload(&sink, &options(&run)).unwrap();
    // `embedfleet delete` of papers 3, 45 and 50: tombstones, then the points.
    let db = RunDb::open(&run).unwrap();
    let dead = [tombstone(1, 3), tombstone(2, 45), tombstone(2, 50)];
    db.record_tombstones(&dead).unwrap();
    let ids: Vec<_> = dead.iter().map(|t| point_id(&t.paper_id)).collect();
    sink.delete(DeleteRequest::new("papers", &ids)).unwrap();
    assert_eq!(sink.count(CountRequest::new("papers")).unwrap(), 67);

    let again = upload(&sink, &options(&run)).unwrap();
    assert_eq!(again.send.points, 0, "nothing is missing: nothing is sent");
    assert_eq!(sink.count(CountRequest::new("papers")).unwrap(), 67);
    assert_eq!(holds(&sink, &[3, 45, 50]), 0);

    // Batch 2's progress lost (a shard accepted again, say): it is sent again, less its dead.
    let key = progress_key(&sink, "papers");
    db.forget_batch_uploads(&key, 2).unwrap();
    let resend = upload(&sink, &options(&run)).unwrap();
    assert_eq!(
        resend.send.points, 28,
        "batch 2's 30 rows less its 2 tombstoned"
    );
    assert_eq!(sink.count(CountRequest::new("papers")).unwrap(), 67);
    assert_eq!(holds(&sink, &[3, 45, 50]), 0);
    assert_eq!(db.upload_totals(&key).unwrap(), (70, 0), "every row done");
}

#[test]
fn a_batch_that_lost_points_is_sent_again_alone() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_of_batches(dir.path(), "run", &[(0, 40), (40, 30), (70, 20)]);
    let sink = edge(dir.path());
    upload(&sink, &options(&run)).unwrap();
    // Points lost behind the run's back (not deleted by it): two of batch 2.
    let lost = [point_id(&paper_id(41)), point_id(&paper_id(69))];
    sink.delete(DeleteRequest::new("papers", &lost)).unwrap();
    assert_eq!(sink.count(CountRequest::new("papers")).unwrap(), 88);
    let repair = upload(&sink, &options(&run)).unwrap();
    assert_eq!(repair.send.points, 30, "batch 2 alone, not the run's 90");
    assert_eq!(repair.already_acked, 60);
    assert_eq!(sink.count(CountRequest::new("papers")).unwrap(), 90);
}

#[test]
fn a_tombstoned_paper_still_in_the_collection_is_deleted_by_the_next_upload() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_of_batches(dir.path(), "run", &[(0, 40)]);
    let sink = edge(dir.path());
    upload(&sink, &options(&run)).unwrap();
    // A `delete` killed after run.db and before Qdrant: the tombstone alone.
    RunDb::open(&run)
        .unwrap()
        .record_tombstones(&[tombstone(1, 7)])
        .unwrap();
    assert_eq!(holds(&sink, &[7]), 1);
    let report = upload(&sink, &options(&run)).unwrap();
    assert_eq!(report.send.points, 0);
    assert_eq!(holds(&sink, &[7]), 0);
    assert_eq!(sink.count(CountRequest::new("papers")).unwrap(), 39);
}

#[test]
fn a_collection_made_again_by_another_run_is_not_trusted_though_it_holds_every_point() {
    let dir = tempfile::tempdir().unwrap();
    let mine = run_of_batches(dir.path(), "mine", &[(0, 40), (40, 30)]);
    let theirs = run_of_batches(dir.path(), "theirs", &[(0, 40), (40, 30)]);
    let sink = edge(dir.path());
    upload(&sink, &options(&mine)).unwrap();
    let key = progress_key(&sink, "papers");
    let recorded = RunDb::open(&mine).unwrap().upload_marker(&key).unwrap();
    assert!(recorded.is_some(), "the run recorded its collection");
    assert_eq!(sink.collection_marker("papers").unwrap(), recorded);
    // Dropped, and made again by another run with the same paper ids: every count agrees.
    assert!(sink.delete_collection("papers").unwrap());
    upload(&sink, &options(&theirs)).unwrap();
    assert_ne!(sink.collection_marker("papers").unwrap(), recorded);
    let report = upload(&sink, &options(&mine)).unwrap();
    assert_eq!(
        (report.already_acked, report.send.points),
        (0, 70),
        "every point sent again"
    );
    // The run now records the collection it found; another upload trusts it.
    let again = upload(&sink, &options(&mine)).unwrap();
    assert_eq!((again.already_acked, again.send.points), (70, 0));
}

/// Pins `precision` (and the rest of a fixed set of output settings) in `run`, as its first
/// job would.
fn pin(run: &Path, precision: embedfleet_core::Precision) {
    let settings = embedfleet_core::handoff::OutputSettings {
        model: "0123456789abcdef".into(),
        model_dir: "/models/q".into(),
        dim: None,
        vector_dtype: embedfleet_core::shardfile::VectorDtype::F32,
        precision,
        max_tokens: None,
        shard_papers: 500,
        pooling: "last_token".into(),
        normalized: true,
        instruction: None,
        text_rule: None,
    };
    settings.pin(&embedfleet_core::RunLayout::new(run)).unwrap();
}

#[test]
fn a_second_run_whose_vectors_were_made_differently_is_refused_by_the_collection() {
    let dir = tempfile::tempdir().unwrap();
    check_a_run_of_other_vectors_is_refused(&edge(dir.path()), "papers");
}

/// What every sink must do with the vectors' identity in its collection's marker (the edge's
/// file, the server's metadata, pgvector's table comment): a first run's marker names its
/// precision and pooling; a second run directory whose vectors were made at another precision
/// is refused before it writes a point; one whose vectors were made alike is taken.
pub fn check_a_run_of_other_vectors_is_refused(sink: &dyn Sink, collection: &str) {
    use embedfleet_core::Precision;
    let dir = tempfile::tempdir().unwrap();
    let into = |run: &Path| {
        let mut o = UploadOptions::new(run, collection);
        o.batch_size = 16;
        o
    };
    let holds = |papers: std::ops::Range<usize>| -> u64 {
        let ids: Vec<_> = papers.map(|i| point_id(&paper_id(i))).collect();
        sink.count(CountRequest::new(collection).ids(&ids)).unwrap()
    };
    let native = run_of_batches(dir.path(), "native", &[(0, 20)]);
    pin(&native, Precision::Native);
    upload(sink, &into(&native)).unwrap();
    let marker = sink.collection_marker(collection).unwrap().unwrap();
    assert!(
        marker.ends_with("precision:native,pooling:last_token"),
        "{marker}"
    );

    // Another run directory into the same collection: FP8 vectors are refused before any
    // point is written; the same model's native vectors (an update's run) are taken.
    let fp8 = run_of_batches(dir.path(), "fp8", &[(20, 10)]);
    pin(&fp8, Precision::Fp8);
    let err = upload(sink, &into(&fp8)).unwrap_err();
    assert!(err.is_refusal(), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("precision native") && message.contains("precision fp8"),
        "{message}"
    );
    assert_eq!(holds(20..30), 0);
    assert_eq!(
        sink.collection_marker(collection).unwrap().as_deref(),
        Some(marker.as_str()),
        "the refused run left the marker as it was"
    );
    let same = run_of_batches(dir.path(), "same", &[(20, 10)]);
    pin(&same, Precision::Native);
    upload(sink, &into(&same)).unwrap();
    assert_eq!(holds(20..30), 10);
}
