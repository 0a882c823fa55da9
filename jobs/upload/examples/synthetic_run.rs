//! A run directory with synthetic shards (random normalised vectors, no model), for upload
//! benchmarks at real model sizes:
//!
//! `cargo run -p embedfleet-upload --example synthetic_run -- DIR POINTS DIM [SHARD_ROWS] [BATCH_POINTS]`
//!
//! then `embedfleet upload --run-dir DIR --collection bench`.

use embedfleet_core::synthetic::SyntheticRun;
use std::path::PathBuf;

fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: Option<T>) -> T {
    args.get(i)
        .and_then(|a| a.parse().ok())
        .or(default)
        .unwrap_or_else(|| {
            eprintln!("usage: synthetic_run DIR POINTS DIM [SHARD_ROWS] [BATCH_POINTS]");
            std::process::exit(2)
        })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir: PathBuf = arg(&args, 0, None);
    let points: usize = arg(&args, 1, None);
    let dim: usize = arg(&args, 2, None);
    let shard_rows: usize = arg(&args, 3, Some(500));
    let batch_points: usize = arg(&args, 4, Some(usize::MAX));
    SyntheticRun {
        batch_points,
        ..SyntheticRun::new(points, dim, shard_rows)
    }
    .write(&dir)?;
    eprintln!("wrote {points} points of {dim}-d into {}", dir.display());
    Ok(())
}
