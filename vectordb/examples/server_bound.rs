//! The server-bound limit of an upload: the run's points sent to a Qdrant server as requests
//! built before the clock starts, K in flight, with nothing else to do. `embedfleet upload`
//! on the same run and server is compared against it (BENCHMARKS.md, "Server figures").
//!
//! `cargo run -p embedfleet-vectordb --example server_bound -- RUN_DIR URL BATCH IN_FLIGHT`
//!
//! Each run uses a fresh bulk-load collection `server_bound` (the uploader's settings: cosine,
//! `year`/`source` indexes, HNSW deferred) and drops it at the end.

use std::sync::Arc;
use std::time::Instant;

use embedfleet_core::rundb::RunDb;
use embedfleet_vectordb::{
    build_point_structs, shards, CollectionSpec, PointsBatch, QdrantServer, ServerConfig, Sink,
};
use qdrant_client::qdrant::{UpsertPoints, UpsertPointsBuilder};
use qdrant_client::Qdrant;

const COLLECTION: &str = "server_bound";

fn usage() -> ! {
    eprintln!("usage: server_bound RUN_DIR URL BATCH IN_FLIGHT");
    std::process::exit(2)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [run_dir, url, batch, in_flight] = args.as_slice() else {
        usage()
    };
    let batch: usize = batch.parse().unwrap_or_else(|_| usage());
    let in_flight: usize = in_flight.parse().unwrap_or_else(|_| usage());

    // Every point of the run, as upsert requests of `batch` points, built up front.
    let db = RunDb::open(std::path::Path::new(run_dir))?;
    let mut requests: Vec<UpsertPoints> = Vec::new();
    let mut points = 0usize;
    let mut dim = 0usize;
    for shard in db.upload_shards(COLLECTION)? {
        let path = db.dir().join(&shard.path);
        dim = shards::shard_dim(&path)?;
        for record_batch in shards::read_from(&path, 0, batch)? {
            let record_batch = record_batch?;
            let batch = PointsBatch::from_record_batch(&record_batch)?;
            points += batch.len();
            requests.push(
                UpsertPointsBuilder::new(COLLECTION, build_point_structs(&batch))
                    .wait(true)
                    .build(),
            );
        }
    }
    if points == 0 {
        return Err(format!("{run_dir} has no shards").into());
    }

    // The collection exactly as `embedfleet upload` makes it.
    let sink = QdrantServer::connect(ServerConfig::new(url.as_str()))?;
    sink.delete_collection(COLLECTION)?;
    let mut spec = CollectionSpec::new(COLLECTION, dim);
    spec.bulk_load = true;
    sink.ensure_collection(&spec)?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(in_flight.clamp(1, 4))
        .enable_all()
        .build()?;
    let client = {
        let _guard = runtime.enter();
        Arc::new(
            Qdrant::from_url(url)
                .timeout(std::time::Duration::from_secs(120))
                .skip_compatibility_check()
                .build()?,
        )
    };
    // K senders taking the next request from a shared queue: K requests in flight.
    let queue = Arc::new(std::sync::Mutex::new(requests.into_iter()));
    let start = Instant::now();
    runtime.block_on(async {
        let mut senders = Vec::new();
        for _ in 0..in_flight.max(1) {
            let (client, queue) = (client.clone(), queue.clone());
            senders.push(tokio::spawn(async move {
                loop {
                    let next = queue.lock().expect("queue").next();
                    let Some(request) = next else { break };
                    client.upsert_points(request).await?;
                }
                Ok::<_, qdrant_client::QdrantError>(())
            }));
        }
        for sender in senders {
            sender.await??;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;
    let elapsed = start.elapsed().as_secs_f64();
    let mb = (points * dim * 4) as f64 / 1e6;
    println!(
        "server-bound: {points} points of {dim}-d, batch {batch}, {in_flight} in flight: \
         {elapsed:.2} s, {:.0} points/s, {:.1} MB/s",
        points as f64 / elapsed,
        mb / elapsed
    );
    sink.delete_collection(COLLECTION)?;
    Ok(())
}
