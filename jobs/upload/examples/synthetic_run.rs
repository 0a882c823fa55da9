//! A run directory with synthetic shards (random normalised vectors, no model), for upload
//! benchmarks at real model sizes:
//!
//! `cargo run -p embedfleet-upload --example synthetic_run -- DIR POINTS DIM [SHARD_ROWS]`
//!
//! then `embedfleet upload --run-dir DIR --collection bench`.

use embedfleet_core::paper::Paper;
use embedfleet_core::rundb::{RunDb, ShardRow};
use embedfleet_core::shardfile::{ShardMeta, ShardRow as Row, ShardWriter, VectorDtype};
use std::path::PathBuf;

fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: Option<T>) -> T {
    args.get(i)
        .and_then(|a| a.parse().ok())
        .or(default)
        .unwrap_or_else(|| {
            eprintln!("usage: synthetic_run DIR POINTS DIM [SHARD_ROWS]");
            std::process::exit(2)
        })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir: PathBuf = arg(&args, 0, None);
    let points: usize = arg(&args, 1, None);
    let dim: usize = arg(&args, 2, None);
    let shard_rows: usize = arg(&args, 3, Some(500));
    let db = RunDb::create(&dir)?;
    db.conn().execute_batch(
        "INSERT INTO corpus_files (id, path, size, mtime_ns, edges) VALUES (1, 'synthetic', 1, 1, 'e');
         INSERT INTO batches (id, file_id, seq, path, n_rows, n_chars) VALUES (1, 1, 0, 'synthetic', 1, 1);",
    )?;
    std::fs::create_dir_all(dir.join("shards"))?;
    let meta = ShardMeta {
        model: "synthetic".into(),
        model_revision: "0".into(),
        compute_dtype: "f32".into(),
        pooling: "last_token".into(),
        normalized: true,
        dim,
        embedfleet_version: env!("CARGO_PKG_VERSION").into(),
        timings: None,
    };
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut vector = vec![0f32; dim];
    for (part, first) in (0..points).step_by(shard_rows.max(1)).enumerate() {
        let rel = format!("shards/synthetic-{part:05}.parquet");
        let mut w = ShardWriter::create(&dir.join(&rel), VectorDtype::F32, &meta)?;
        for i in first..(first + shard_rows).min(points) {
            for v in vector.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *v = (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            }
            let norm = vector.iter().map(|a| a * a).sum::<f32>().sqrt();
            vector.iter_mut().for_each(|a| *a /= norm);
            let paper = Paper {
                id: format!("W{i:010}"),
                source: Some(if i % 3 == 0 { "arxiv" } else { "s2orc" }.into()),
                created: Some(format!("{}-05-02T00:00:00.000Z", 2000 + i % 25)),
                ..Paper::default()
            };
            w.push(&Row {
                paper: &paper,
                vector: &vector,
                n_chars: 20_000,
                n_tokens: 5_000,
                n_chunks: 1,
            })?;
        }
        let info = w.finish()?;
        db.record_shard(&ShardRow {
            batch_id: embedfleet_core::BatchId(1),
            part: part as u32,
            path: rel,
            rows: info.rows,
            sha256: info.sha256,
        })?;
    }
    eprintln!("wrote {points} points of {dim}-d into {}", dir.display());
    Ok(())
}
