//! Upload benchmarks (no server): client-side cost per batch, and points/s into qdrant-edge.
//!
//! `cargo bench -p embedfleet-vectordb --bench upload` (release profile). Environment knobs:
//! `UPLOAD_BENCH_POINTS` (default 20000), `UPLOAD_BENCH_DIM` (1024), `UPLOAD_BENCH_BATCH` (256).

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{
    new_null_array, FixedSizeListArray, Float32Array, Int16Array, Int32Array, RecordBatch,
    StringArray,
};
use arrow_schema::{DataType, Field};
use embedfleet_core::shardfile::{self, VectorDtype};
use embedfleet_vectordb::{
    build_point_structs, CollectionSpec, CountRequest, PointsBatch, QdrantEdge, Sink, UpsertRequest,
};
use prost::Message as _;
use qdrant_client::qdrant::UpsertPointsBuilder;

fn batch(first: usize, n: usize, dim: usize) -> RecordBatch {
    let mut x = 0x2545_F491_4F6C_DD1Du64 ^ first as u64;
    let values: Vec<f32> = (0..n * dim)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect();
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    let emb = FixedSizeListArray::try_new(
        item.clone(),
        dim as i32,
        Arc::new(Float32Array::from(values)),
        None,
    )
    .expect("list");
    let ids = StringArray::from(
        (first..first + n)
            .map(|i| format!("W{i:010}"))
            .collect::<Vec<_>>(),
    );
    let created = StringArray::from(
        (first..first + n)
            .map(|i| format!("{}-05-02T00:00:00.000Z", 2000 + i % 25))
            .collect::<Vec<_>>(),
    );
    let source = StringArray::from(
        (first..first + n)
            .map(|i| {
                if i.is_multiple_of(2) {
                    "s2orc"
                } else {
                    "arxiv"
                }
            })
            .collect::<Vec<_>>(),
    );
    let n_chars = Int32Array::from((0..n as i32).map(|i| 30_000 + i).collect::<Vec<_>>());
    let n_tokens = Int32Array::from((0..n as i32).map(|i| 8_000 + i).collect::<Vec<_>>());
    // The shard file's own schema (core::shardfile), so the bench converts what jobs write.
    let schema = shardfile::schema(dim, VectorDtype::F32);
    let nulls = || new_null_array(&DataType::Utf8, n);
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(ids),
            Arc::new(emb),
            Arc::new(n_chars),
            Arc::new(n_tokens),
            Arc::new(Int16Array::from(vec![1i16; n])),
            Arc::new(source),
            Arc::new(created),
            nulls(),
            nulls(),
            nulls(),
        ],
    )
    .expect("batch")
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn summary(mut samples: Vec<Duration>) -> String {
    samples.sort();
    let median = samples[samples.len() / 2];
    let p99 = samples[samples.len() * 99 / 100];
    let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
    format!(
        "median {:.1} µs, mean {:.1} µs, p99 {:.1} µs",
        us(median),
        us(mean),
        us(p99)
    )
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Arrow → gRPC request for 32-point batches of 2,560-d vectors (the study's 45.6 ms case).
fn conversion() {
    let (n, dim, iters) = (32, 2560, 2000);
    let rb = batch(0, n, dim);
    let (mut build, mut encode) = (Vec::new(), Vec::new());
    let mut bytes = 0;
    for _ in 0..iters {
        let t = Instant::now();
        let points = PointsBatch::from_record_batch(&rb).expect("valid");
        let request = UpsertPointsBuilder::new("papers", build_point_structs(&points))
            .wait(false)
            .build();
        build.push(t.elapsed());
        let t = Instant::now();
        // What tonic does with the request: protobuf-encode it (and qdrant-client clones it first).
        let wire = request.clone().encode_to_vec();
        encode.push(t.elapsed());
        bytes = wire.len();
        std::hint::black_box(wire);
    }
    println!("conversion {n} x {dim}-d f32, {iters} iterations");
    println!(
        "  arrow -> UpsertPoints (ids, payload, vectors): {}",
        summary(build)
    );
    println!(
        "  clone + protobuf encode ({:.2} MB):           {}",
        bytes as f64 / 1e6,
        summary(encode)
    );
}

/// Points/s upserted into the embedded engine, then the time to build the HNSW index.
fn edge_upsert() {
    let total = env("UPLOAD_BENCH_POINTS", 20_000);
    let dim = env("UPLOAD_BENCH_DIM", 1024);
    let size = env("UPLOAD_BENCH_BATCH", 256);
    let dir = tempfile::tempdir().expect("temp dir");
    let sink = QdrantEdge::open(dir.path()).expect("open");
    let mut spec = CollectionSpec::new("bench", dim);
    spec.bulk_load = true;
    sink.ensure_collection(&spec).expect("create");
    let batches: Vec<RecordBatch> = (0..total)
        .step_by(size)
        .map(|f| batch(f, size.min(total - f), dim))
        .collect();
    let start = Instant::now();
    for rb in &batches {
        let points = PointsBatch::from_record_batch(rb).expect("valid");
        sink.upsert(UpsertRequest::new("bench", &points))
            .expect("upsert");
    }
    let upserted = start.elapsed();
    sink.checkpoint("bench").expect("checkpoint");
    let durable = start.elapsed();
    assert_eq!(
        sink.count(CountRequest::new("bench")).expect("count"),
        total as u64
    );
    let report = sink.finish(&spec).expect("finish");
    println!("edge upsert {total} x {dim}-d f32, batches of {size}");
    println!(
        "  upsert: {:.2} s = {:.0} points/s ({:.0} MB/s of vectors)",
        upserted.as_secs_f64(),
        total as f64 / upserted.as_secs_f64(),
        (total * dim * 4) as f64 / 1e6 / upserted.as_secs_f64()
    );
    println!(
        "  + checkpoint (flush): {:.2} s = {:.0} points/s",
        durable.as_secs_f64(),
        total as f64 / durable.as_secs_f64()
    );
    println!(
        "  finish (HNSW m=16 ef=100): {:.2} s, {} of {} vectors indexed",
        report.indexing.as_secs_f64(),
        report.indexed_vectors,
        report.points
    );
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing useful: run both.
    let which = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    match which.as_deref() {
        Some("conversion") => conversion(),
        Some("edge") => edge_upsert(),
        _ => {
            conversion();
            edge_upsert();
        }
    }
}
