//! The embedded sink (qdrant-edge), always run.

use crate::upload_common;

use embedfleet_vectordb::{
    point_id, CollectionSpec, CountRequest, Ensured, PointsBatch, QdrantEdge, QueryRequest,
    SearchOptions, Sink, UploadError, UpsertRequest,
};
use upload_common::*;

fn edge() -> (tempfile::TempDir, QdrantEdge) {
    let dir = tempfile::tempdir().expect("temp dir");
    let sink = QdrantEdge::open(dir.path().join("edge")).expect("open edge dir");
    (dir, sink)
}

#[test]
fn count_equals_rows_and_reupload_is_idempotent() {
    let (_dir, sink) = edge();
    check_count_and_idempotence(&sink, "papers");
}

#[test]
fn payload_filters_select_matching_rows() {
    let (_dir, sink) = edge();
    check_filters(&sink, "papers");
}

#[test]
fn search_finds_each_point_first_with_payload() {
    let (_dir, sink) = edge();
    check_search(&sink, "papers");
}

#[test]
fn requests_count_by_ids_and_filter_query_several_vectors_delete_by_id() {
    let (_dir, sink) = edge();
    check_requests(&sink, "papers");
}

#[test]
fn wrong_vector_size_and_mismatched_collection_are_refused() {
    let (_dir, sink) = edge();
    check_refusals(&sink, "papers");
}

#[test]
fn bulk_load_defers_and_finish_restores_index_settings() {
    let (_dir, sink) = edge();
    check_bulk_load(&sink, "papers");
}

#[test]
fn delete_collection_removes_it() {
    let (_dir, sink) = edge();
    check_delete(&sink, "papers");
}

#[test]
fn data_persists_after_reopen() {
    let (dir, sink) = edge();
    let dim = 20;
    sink.ensure_collection(&CollectionSpec::new("papers", dim))
        .expect("create");
    let batch = shard_batch(0, 90, dim);
    upsert_in_slices(&sink, "papers", &batch, 32);
    drop(sink);

    let sink = QdrantEdge::open(dir.path().join("edge")).expect("reopen");
    assert_eq!(sink.count(CountRequest::new("papers")).expect("count"), 90);
    assert_eq!(
        sink.ensure_collection(&CollectionSpec::new("papers", dim))
            .expect("ensure"),
        Ensured::Existing
    );
    let hits = sink
        .query(QueryRequest::one(
            "papers",
            &vector_of(42, dim, 7),
            SearchOptions::new(1),
        ))
        .expect("search")
        .remove(0);
    assert_eq!(hits[0].id, point_id(&paper_id(42)));
    // Re-sending after a reopen overwrites (point versions continue), it does not duplicate.
    upsert_in_slices(&sink, "papers", &batch, 45);
    assert_eq!(sink.count(CountRequest::new("papers")).expect("count"), 90);
}

#[test]
fn a_second_open_of_the_same_directory_is_refused() {
    let (dir, _sink) = edge();
    match QdrantEdge::open(dir.path().join("edge")) {
        Err(UploadError::EdgeLocked { .. }) => {}
        other => panic!("expected EdgeLocked, got {other:?}"),
    }
}

#[test]
fn f16_shards_upload_like_f32() {
    let (_dir, sink) = edge();
    let dim = 32;
    sink.ensure_collection(&CollectionSpec::new("half", dim))
        .expect("create");
    let batch = shard_batch_f16(0, 40, dim);
    upsert_in_slices(&sink, "half", &batch, 16);
    assert_eq!(sink.count(CountRequest::new("half")).expect("count"), 40);
    let hits = sink
        .query(QueryRequest::one(
            "half",
            &vector_of(9, dim, 7),
            SearchOptions::new(1),
        ))
        .expect("search")
        .remove(0);
    assert_eq!(hits[0].id, point_id(&paper_id(9)));
}

#[test]
fn bad_collection_names_are_refused() {
    let (_dir, sink) = edge();
    for name in ["", "..", "a/b", "x\\y"] {
        let r = sink.ensure_collection(&CollectionSpec::new(name, 8));
        assert!(
            matches!(r, Err(UploadError::InvalidCollectionName { .. })),
            "{name:?}: {r:?}"
        );
    }
}

/// Child half of `checkpointed_points_survive_a_crash`: writes, checkpoints, writes more, aborts.
#[test]
#[ignore = "run by checkpointed_points_survive_a_crash as a child process"]
fn crash_child() {
    let Ok(dir) = std::env::var("EMBEDFLEET_CRASH_DIR") else {
        return;
    };
    let sink = QdrantEdge::open(dir).expect("open");
    sink.ensure_collection(&CollectionSpec::new("papers", 16))
        .expect("create");
    upsert_in_slices(&sink, "papers", &shard_batch(0, 100, 16), 25);
    let more = shard_batch(100, 50, 16);
    let points = PointsBatch::from_record_batch(&more).expect("batch");
    sink.upsert(UpsertRequest::new("papers", &points))
        .expect("upsert");
    // No destructor, no flush: like SIGKILL.
    std::process::abort();
}

#[test]
fn checkpointed_points_survive_a_crash() {
    let dir = tempfile::tempdir().expect("temp dir");
    let edge_dir = dir.path().join("edge");
    let status = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "upload_edge::crash_child",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env("EMBEDFLEET_CRASH_DIR", &edge_dir)
        .status()
        .expect("run child");
    assert!(!status.success(), "the child aborts");

    let sink = QdrantEdge::open(&edge_dir).expect("reopen after crash");
    let n = sink.count(CountRequest::new("papers")).expect("count");
    assert!((100..=150).contains(&n), "checkpointed points survive: {n}");
    // The uploader re-sends what was not recorded: the count is then exact.
    upsert_in_slices(&sink, "papers", &shard_batch(0, 150, 16), 50);
    assert_eq!(sink.count(CountRequest::new("papers")).expect("count"), 150);
}

#[test]
fn count_equals_parquet_rows() {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::arrow::ArrowWriter;

    let (dir, sink) = edge();
    let path = dir.path().join("shard-00000.parquet");
    let dim = 16;
    let file = std::fs::File::create(&path).expect("create shard");
    let first = shard_batch(0, 300, dim);
    let mut writer = ArrowWriter::try_new(file, first.schema(), None).expect("writer");
    writer.write(&first).expect("write");
    writer.write(&shard_batch(300, 77, dim)).expect("write");
    writer.close().expect("close");

    sink.ensure_collection(&CollectionSpec::new("papers", dim))
        .expect("create");
    let reader =
        ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&path).expect("open"))
            .expect("parquet")
            .with_batch_size(128)
            .build()
            .expect("reader");
    let mut rows = 0u64;
    for rb in reader {
        let rb = rb.expect("batch");
        rows += rb.num_rows() as u64;
        upsert_in_slices(&sink, "papers", &rb, 32);
    }
    assert_eq!(rows, 377);
    assert_eq!(
        sink.count(CountRequest::new("papers")).expect("count"),
        rows
    );
}
