//! Shard-like record batches for the upload tests (no files, no model).

use std::sync::Arc;

use arrow_array::{
    ArrayRef, FixedSizeListArray, Float16Array, Float32Array, Int16Array, Int32Array, RecordBatch,
    StringArray,
};
use arrow_schema::{DataType, Field, Schema};

/// Years of row `i`: 2018..=2022 in turn; every 7th row has no `created`.
pub fn year_of(i: usize) -> Option<i64> {
    (i % 7 != 3).then_some(2018 + (i % 5) as i64)
}

/// Source of row `i`.
pub fn source_of(i: usize) -> &'static str {
    if i.is_multiple_of(3) {
        "arxiv"
    } else {
        "s2orc"
    }
}

/// A deterministic, normalised pseudo-random vector for row `i`.
pub fn vector_of(i: usize, dim: usize, seed: u64) -> Vec<f32> {
    let mut x = seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    let mut v: Vec<f32> = (0..dim)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect();
    let norm = v.iter().map(|a| a * a).sum::<f32>().sqrt().max(1e-12);
    v.iter_mut().for_each(|a| *a /= norm);
    v
}

/// The file metadata of a test shard of `dim`-d f32 vectors.
pub fn shard_meta(dim: usize) -> embedfleet_core::shardfile::ShardMeta {
    embedfleet_core::shardfile::ShardMeta {
        model: "test".into(),
        model_revision: "0".into(),
        compute_dtype: "f32".into(),
        pooling: "last_token".into(),
        document_prompt: String::new(),
        text_rule: None,
        normalized: true,
        dim,
        embedfleet_version: "0".into(),
        timings: None,
    }
}

/// Writes rows `rows` (paper ids, payload and vectors of the functions here) into a parquet
/// shard at `path`, as the embed job writes one.
pub fn write_shard(
    path: &std::path::Path,
    rows: std::ops::Range<usize>,
    dim: usize,
) -> embedfleet_core::shardfile::ShardInfo {
    use embedfleet_core::shardfile::{ShardRow, ShardWriter, VectorDtype};
    let mut w = ShardWriter::create(path, VectorDtype::F32, &shard_meta(dim)).expect("writer");
    for i in rows {
        let paper = embedfleet_core::paper::Paper {
            id: paper_id(i),
            source: Some(source_of(i).into()),
            created: year_of(i).map(|y| format!("{y}-05-01")),
            ..Default::default()
        };
        let vector = vector_of(i, dim, 7);
        let row = ShardRow {
            paper: &paper,
            vector: &vector,
            n_chars: 100,
            n_tokens: 20,
            n_chunks: 1,
        };
        w.push(&row).expect("push");
    }
    w.finish().expect("finish")
}

/// Paper id of row `i`.
pub fn paper_id(i: usize) -> String {
    format!("W{:09}", 1_000_000 + i)
}

/// Rows `first..first + n` of a shard with `dim`-d f32 vectors.
pub fn shard_batch(first: usize, n: usize, dim: usize) -> RecordBatch {
    let values: Vec<f32> = (first..first + n)
        .flat_map(|i| vector_of(i, dim, 7))
        .collect();
    build(
        first,
        n,
        dim,
        Arc::new(Float32Array::from(values)),
        DataType::Float32,
    )
}

/// The same rows with f16 vectors.
pub fn shard_batch_f16(first: usize, n: usize, dim: usize) -> RecordBatch {
    let values: Vec<half::f16> = (first..first + n)
        .flat_map(|i| vector_of(i, dim, 7))
        .map(half::f16::from_f32)
        .collect();
    build(
        first,
        n,
        dim,
        Arc::new(Float16Array::from(values)),
        DataType::Float16,
    )
}

fn build(first: usize, n: usize, dim: usize, values: ArrayRef, dtype: DataType) -> RecordBatch {
    let rows = first..first + n;
    let item = Arc::new(Field::new("item", dtype, false));
    let embedding = FixedSizeListArray::try_new(item.clone(), dim as i32, values, None)
        .expect("valid fixed size list");
    let ids = StringArray::from(rows.clone().map(paper_id).collect::<Vec<_>>());
    let created = StringArray::from(
        rows.clone()
            .map(|i| {
                year_of(i).map(|y| {
                    if i.is_multiple_of(2) {
                        format!("{y}-05-02T00:00:00.000Z")
                    } else {
                        format!("{y}-11-30")
                    }
                })
            })
            .collect::<Vec<_>>(),
    );
    let source = StringArray::from(rows.clone().map(|i| Some(source_of(i))).collect::<Vec<_>>());
    let n_chars = Int32Array::from(rows.clone().map(|i| 1000 + i as i32).collect::<Vec<_>>());
    let n_tokens = Int32Array::from(rows.clone().map(|i| 250 + i as i32).collect::<Vec<_>>());
    let n_chunks = Int16Array::from(vec![1i16; n]);
    let schema = Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new(
            "embedding",
            DataType::FixedSizeList(item, dim as i32),
            false,
        ),
        Field::new("n_chars", DataType::Int32, false),
        Field::new("n_tokens", DataType::Int32, false),
        Field::new("n_chunks", DataType::Int16, false),
        Field::new("source", DataType::Utf8, true),
        Field::new("created", DataType::Utf8, true),
    ]);
    RecordBatch::try_new(
        Arc::new(schema),
        vec![
            Arc::new(ids),
            Arc::new(embedding),
            Arc::new(n_chars),
            Arc::new(n_tokens),
            Arc::new(n_chunks),
            Arc::new(source),
            Arc::new(created),
        ],
    )
    .expect("valid batch")
}

/// Rows among `first..first + n` whose year is in `min..=max`.
pub fn rows_in_years(first: usize, n: usize, min: i64, max: i64) -> u64 {
    (first..first + n)
        .filter(|&i| year_of(i).is_some_and(|y| (min..=max).contains(&y)))
        .count() as u64
}

// ---- Assertions shared by the edge and the server suites ----

use embedfleet_vectordb::{
    point_id, CollectionSpec, CountRequest, DeleteRequest, Ensured, PayloadFilter, PointsBatch,
    QueryRequest, SearchOptions, Sink, UploadError, UpsertRequest,
};

/// Upserts `batch` in slices of `size` rows, as the uploader does.
pub fn upsert_in_slices(sink: &dyn Sink, collection: &str, batch: &RecordBatch, size: usize) {
    let mut offset = 0;
    while offset < batch.num_rows() {
        let len = size.min(batch.num_rows() - offset);
        let slice = batch.slice(offset, len);
        let points = PointsBatch::from_record_batch(&slice).expect("valid shard batch");
        sink.upsert(UpsertRequest::new(collection, &points))
            .expect("upsert");
        offset += len;
    }
    sink.checkpoint(collection).expect("checkpoint");
}

/// Count equals rows; a second upload of the same rows leaves it unchanged.
pub fn check_count_and_idempotence(sink: &dyn Sink, name: &str) {
    let dim = 24;
    let spec = CollectionSpec::new(name, dim);
    assert_eq!(
        sink.ensure_collection(&spec).expect("create"),
        Ensured::Created
    );
    let batch = shard_batch(0, 150, dim);
    upsert_in_slices(sink, name, &batch, 32);
    assert_eq!(sink.count(CountRequest::new(name)).expect("count"), 150);
    upsert_in_slices(sink, name, &batch, 64);
    assert_eq!(
        sink.count(CountRequest::new(name)).expect("count"),
        150,
        "re-upload must not duplicate"
    );
    assert_eq!(
        sink.ensure_collection(&spec).expect("again"),
        Ensured::Existing
    );
    let more = shard_batch(150, 10, dim);
    upsert_in_slices(sink, name, &more, 32);
    assert_eq!(sink.count(CountRequest::new(name)).expect("count"), 160);
}

/// Year and source filters select exactly the matching rows.
pub fn check_filters(sink: &dyn Sink, name: &str) {
    let dim = 16;
    sink.ensure_collection(&CollectionSpec::new(name, dim))
        .expect("create");
    let n = 140;
    upsert_in_slices(sink, name, &shard_batch(0, n, dim), 50);
    for year in 2018..=2022 {
        let got = sink
            .count(CountRequest::new(name).filter(Some(&PayloadFilter::year(year))))
            .expect("count");
        assert_eq!(got, rows_in_years(0, n, year, year), "year {year}");
        assert!(got > 0);
    }
    let got = sink
        .count(CountRequest::new(name).filter(Some(&PayloadFilter::years(2019, 2020))))
        .expect("count");
    assert_eq!(got, rows_in_years(0, n, 2019, 2020));
    let arxiv = (0..n).filter(|&i| source_of(i) == "arxiv").count() as u64;
    assert_eq!(
        sink.count(CountRequest::new(name).filter(Some(&PayloadFilter::source("arxiv"))))
            .expect("count"),
        arxiv
    );
    // Any of several sources: what `--filter source=PREFIX` resolves to.
    let any_of = |sources: &[&str]| PayloadFilter {
        sources: sources.iter().map(|s| s.to_string()).collect(),
        ..PayloadFilter::default()
    };
    let count_any = |sources: &[&str]| {
        sink.count(CountRequest::new(name).filter(Some(&any_of(sources))))
            .expect("count")
    };
    assert_eq!(count_any(&["arxiv", "pubmed"]), arxiv);
    assert_eq!(count_any(&["arxiv", "s2orc"]), n as u64);
    let both = PayloadFilter {
        sources: vec!["arxiv".into()],
        ..PayloadFilter::year(2018)
    };
    let expected = (0..n)
        .filter(|&i| source_of(i) == "arxiv" && year_of(i) == Some(2018))
        .count() as u64;
    assert_eq!(
        sink.count(CountRequest::new(name).filter(Some(&both)))
            .expect("count"),
        expected
    );
}

/// Each point is its own top hit, with its payload; a filter that excludes it hides it.
pub fn check_search(sink: &dyn Sink, name: &str) {
    let dim = 32;
    sink.ensure_collection(&CollectionSpec::new(name, dim))
        .expect("create");
    let n = 120;
    upsert_in_slices(sink, name, &shard_batch(0, n, dim), 32);
    for i in [0, 1, 17, 64, 119] {
        let hits = sink
            .query(QueryRequest::one(
                name,
                &vector_of(i, dim, 7),
                SearchOptions::new(3),
            ))
            .expect("search")
            .remove(0);
        let top = &hits[0];
        assert_eq!(top.id, point_id(&paper_id(i)), "row {i}");
        assert_eq!(top.paper_id.as_deref(), Some(paper_id(i).as_str()));
        assert_eq!(top.year, year_of(i));
        assert_eq!(top.source.as_deref(), Some(source_of(i)));
        assert_eq!(top.n_chars, Some(1000 + i as i64));
        assert_eq!(top.n_tokens, Some(250 + i as i64));
        assert!(
            top.score > 0.99,
            "cosine of a point with itself: {}",
            top.score
        );
        assert!(hits.windows(2).all(|w| w[0].score >= w[1].score));
    }
    let i = 17;
    let other_year = year_of(i).map_or(2018, |y| if y == 2018 { 2019 } else { 2018 });
    let hits = sink
        .query(QueryRequest::one(
            name,
            &vector_of(i, dim, 7),
            SearchOptions {
                filter: Some(PayloadFilter::year(other_year)),
                ..SearchOptions::new(5)
            },
        ))
        .expect("search")
        .remove(0);
    assert!(!hits.is_empty());
    assert!(hits.iter().all(|h| h.year == Some(other_year)));
    assert!(hits.iter().all(|h| h.id != point_id(&paper_id(i))));
}

/// The request types' conditions: a count by ids and a filter together counts the points
/// matching both (an empty id list counts none); one query of several vectors answers each as
/// a query of that vector alone, in order; a delete by id removes exactly those points.
pub fn check_requests(sink: &dyn Sink, name: &str) {
    let dim = 16;
    sink.ensure_collection(&CollectionSpec::new(name, dim))
        .expect("create");
    let n = 60;
    upsert_in_slices(sink, name, &shard_batch(0, n, dim), 25);
    let ids: Vec<_> = (0..20).map(|i| point_id(&paper_id(i))).collect();
    let count = |request: CountRequest<'_>| sink.count(request).expect("count");
    assert_eq!(count(CountRequest::new(name).ids(&ids)), 20);
    assert_eq!(count(CountRequest::new(name).ids(&[])), 0);
    let year = year_of(4).expect("row 4 has a year");
    let filter = PayloadFilter::year(year);
    assert_eq!(
        count(CountRequest::new(name).ids(&ids).filter(Some(&filter))),
        rows_in_years(0, 20, year, year)
    );
    let vectors: Vec<Vec<f32>> = [0, 7, 33].iter().map(|&i| vector_of(i, dim, 7)).collect();
    let together = sink
        .query(QueryRequest::new(name, &vectors, SearchOptions::new(3)))
        .expect("query");
    assert_eq!(together.len(), vectors.len());
    for (v, hits) in vectors.iter().zip(&together) {
        let alone = sink
            .query(QueryRequest::one(name, v, SearchOptions::new(3)))
            .expect("query");
        let ids = |hits: &[embedfleet_vectordb::Hit]| hits.iter().map(|h| h.id).collect::<Vec<_>>();
        assert_eq!(ids(hits), ids(&alone[0]));
    }
    sink.delete(DeleteRequest::new(name, &ids[..5]))
        .expect("delete");
    assert_eq!(count(CountRequest::new(name).ids(&ids)), 15);
    assert_eq!(count(CountRequest::new(name)), n as u64 - 5);
}

/// A batch of another vector size is refused before anything is written; so is a collection
/// spec that does not match the existing collection.
pub fn check_refusals(sink: &dyn Sink, name: &str) {
    sink.ensure_collection(&CollectionSpec::new(name, 16))
        .expect("create");
    let wrong = shard_batch(0, 10, 8);
    let points = PointsBatch::from_record_batch(&wrong).expect("valid batch");
    match sink.upsert(UpsertRequest::new(name, &points)) {
        Err(UploadError::VectorSizeMismatch {
            expected: 16,
            found: 8,
            ..
        }) => {}
        other => panic!("expected VectorSizeMismatch, got {other:?}"),
    }
    assert_eq!(sink.count(CountRequest::new(name)).expect("count"), 0);
    match sink.ensure_collection(&CollectionSpec::new(name, 32)) {
        Err(UploadError::CollectionMismatch {
            existing_size: 16,
            wanted_size: 32,
            ..
        }) => {}
        other => panic!("expected CollectionMismatch, got {other:?}"),
    }
    let dot = CollectionSpec {
        distance: embedfleet_vectordb::Distance::Dot,
        ..CollectionSpec::new(name, 16)
    };
    assert!(matches!(
        sink.ensure_collection(&dot),
        Err(UploadError::CollectionMismatch { .. })
    ));
    match sink.count(CountRequest::new("no-such-collection")) {
        Err(UploadError::NoSuchCollection { .. }) | Err(UploadError::Server { .. }) => {}
        other => panic!("expected an error for a missing collection, got {other:?}"),
    }
}

/// Bulk load defers the index (Qdrant: m = 0; another database: none) and `finish` builds it
/// with the spec's HNSW settings; `indexed_vectors` says so, before and after.
pub fn check_bulk_load(sink: &dyn Sink, name: &str) {
    let dim = 64;
    let mut spec = CollectionSpec::new(name, dim);
    spec.bulk_load = true;
    spec.qdrant.hnsw.m = 12;
    spec.qdrant.hnsw.ef_construct = 64;
    // Tiny threshold so that this small collection gets a graph.
    spec.qdrant.indexing_threshold_kb = 10;
    sink.ensure_collection(&spec).expect("create");
    let during = sink.collection_info(name).expect("info").expect("exists");
    if let Some(q) = during.qdrant {
        assert_eq!(q.hnsw.m, 0, "HNSW deferred during the load");
    }
    assert_eq!(during.index, None, "no index during the load: {during:?}");
    let n = 600;
    upsert_in_slices(sink, name, &shard_batch(0, n, dim), 100);
    let loaded = sink.collection_info(name).expect("info").expect("exists");
    assert_eq!(loaded.index, None, "still none before finish: {loaded:?}");
    if loaded.qdrant.is_none() {
        // (Qdrant's optimizer may index segments with m = 0, counting them without a graph.)
        assert_eq!(
            loaded.indexed_vectors, 0,
            "exact search until finish: {loaded:?}"
        );
    }
    let report = sink.finish(&spec).expect("finish");
    assert_eq!(report.points, n as u64);
    let after = sink.collection_info(name).expect("info").expect("exists");
    if let Some(index) = after.qdrant {
        assert_eq!(index.hnsw.m, 12);
        assert_eq!(index.hnsw.ef_construct, 64);
        assert_eq!(index.indexing_threshold_kb, 10);
    }
    assert_eq!(
        after.index,
        Some(embedfleet_vectordb::VectorIndex::Hnsw(
            embedfleet_vectordb::HnswParams {
                m: 12,
                ef_construct: 64
            }
        ))
    );
    assert!(after.green);
    assert!(after.indexed_vectors > 0, "an index was built: {after:?}");
    let hits = sink
        .query(QueryRequest::one(
            name,
            &vector_of(5, dim, 7),
            SearchOptions::new(1),
        ))
        .expect("search")
        .remove(0);
    assert_eq!(hits[0].id, point_id(&paper_id(5)));
}

/// Deleting works once and reports a missing collection afterwards.
pub fn check_delete(sink: &dyn Sink, name: &str) {
    sink.ensure_collection(&CollectionSpec::new(name, 8))
        .expect("create");
    assert!(sink.delete_collection(name).expect("delete"));
    assert!(sink.collection_info(name).expect("info").is_none());
    assert!(!sink.delete_collection(name).expect("delete again"));
}

/// `QDRANT_URL`, the Qdrant server the server tests run against, or `None` when none is given:
/// `test` is then said to be skipped, and fails instead where
/// `EMBEDFLEET_REQUIRE_QDRANT_SERVER=1` (CI, whose `.ci/run` starts one).
pub fn qdrant_url(test: &str) -> Option<String> {
    match std::env::var("QDRANT_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("EMBEDFLEET_REQUIRE_QDRANT_SERVER").as_deref() == Ok("1") => panic!(
            "{test}: QDRANT_URL is not set but EMBEDFLEET_REQUIRE_QDRANT_SERVER=1; start one with \
             .ci/qdrant/qdrant-server.sh (docs/testing.md, \"Server tests\")"
        ),
        _ => {
            eprintln!(
                "skipping {test}: no Qdrant server (set QDRANT_URL; docs/testing.md, \"Server tests\")"
            );
            None
        }
    }
}

/// The server of `QDRANT_URL` (its API key from `QDRANT_API_KEY`), or `None` with `test` said
/// to be skipped ([`qdrant_url`]). `max_attempts` overrides the retries of transient errors.
pub fn server_from_env(
    test: &str,
    max_attempts: Option<u32>,
) -> Option<embedfleet_vectordb::QdrantServer> {
    use embedfleet_vectordb::{ApiKey, QdrantServer, ServerConfig};
    let url = qdrant_url(test)?;
    let mut config = ServerConfig::new(url);
    config.api_key = ApiKey::Env("QDRANT_API_KEY".into());
    config.green_timeout = std::time::Duration::from_secs(300);
    if let Some(n) = max_attempts {
        config.retry.max_attempts = n;
    }
    Some(QdrantServer::connect(config).expect("client"))
}
