//! A run directory with synthetic shards (random normalised vectors, no model), for upload
//! benchmarks at real model sizes:
//!
//! `cargo run -p embedfleet-vectordb --example synthetic_run -- DIR POINTS DIM [SHARD_ROWS] [BATCH_POINTS] [CLUSTERS]`
//!
//! then `embedfleet upload --run-dir DIR --collection bench`. With CLUSTERS (> 0) each paper
//! is near one of that many topic centres, and its year and source follow its topic: years
//! 1975-2024 with more papers each year (a corpus's growth: the earliest years well under 1 %,
//! the latest ~6 %), sources `s2orc` (60 %), `pubmed` (30 %), `arxiv` (10 %) by topic. A filter
//! on them then selects papers that sit together in vector space, as it does in a real corpus.

use embedfleet_core::synthetic::{cluster_of, SyntheticRun};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

static CLUSTERS: AtomicUsize = AtomicUsize::new(0);

fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: Option<T>) -> T {
    args.get(i)
        .and_then(|a| a.parse().ok())
        .or(default)
        .unwrap_or_else(|| {
            eprintln!("usage: synthetic_run DIR POINTS DIM [SHARD_ROWS] [BATCH_POINTS] [CLUSTERS]");
            std::process::exit(2)
        })
}

/// The year and source of paper `i` by its topic (see the module docs).
fn topic_payload(i: usize) -> (i64, &'static str) {
    let clusters = CLUSTERS.load(Ordering::Relaxed).max(1);
    let c = cluster_of(i, clusters);
    // The topic's quantile, mapped through the inverse of a CDF growing as e^(t/12) over
    // 1975..=2024.
    let u = (c as f64 + 0.5) / clusters as f64;
    let (span, scale) = (50.0f64, 12.0f64);
    let t = scale * (1.0 + u * ((span / scale).exp() - 1.0)).ln();
    let year = 1975 + (t.floor() as i64).clamp(0, 49);
    let source = match c % 10 {
        0 => "arxiv",
        1..=3 => "pubmed",
        _ => "s2orc",
    };
    (year, source)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir: PathBuf = arg(&args, 0, None);
    let points: usize = arg(&args, 1, None);
    let dim: usize = arg(&args, 2, None);
    let shard_rows: usize = arg(&args, 3, Some(500));
    let batch_points: usize = arg(&args, 4, Some(usize::MAX));
    let clusters: usize = arg(&args, 5, Some(0));
    let mut run = SyntheticRun {
        batch_points,
        ..SyntheticRun::new(points, dim, shard_rows)
    };
    if clusters > 0 {
        CLUSTERS.store(clusters, Ordering::Relaxed);
        run.clusters = clusters;
        run.payload = topic_payload;
    }
    run.write(&dir)?;
    eprintln!(
        "wrote {points} points of {dim}-d into {}{}",
        dir.display(),
        if clusters > 0 {
            format!(" ({clusters} topics; year and source by topic)")
        } else {
            String::new()
        }
    );
    Ok(())
}
