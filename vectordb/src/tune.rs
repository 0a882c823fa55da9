//! `embedfleet tune`: the study's figures 2 and 4, made automatic.
//!
//! A sample of the run's points (held in memory) is uploaded into a scratch collection, created
//! afresh for every trial as a bulk-load collection like the real upload's: first with batch sizes
//! 1, 2, 4, …, 512 at one request in flight, then with the chosen batch size at 1, 2, 4, 8, 16 in
//! flight. Each sweep picks the smallest setting within [`TuneOptions::within`] (5 %) of its
//! fastest: smaller batches and fewer requests cost the server less memory for the same speed. A
//! trial is timed from the first upsert to the end of the checkpoint (durable), so the edge
//! engine's flush is counted. The scratch collection is dropped at the end.

mod plot;
mod sweep;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use arrow_array::RecordBatch;
use embedfleet_core::rundb::{RunDb, RunDbError};
use serde::{Deserialize, Serialize};

use crate::error::UploadError;
use crate::points::PointsBatch;
use crate::request::UpsertRequest;
use crate::shards::{self, ShardReadError};
use crate::sink::Sink;
use crate::spec::CollectionSpec;

pub use plot::{write_png, PlotError};
pub use sweep::{pick, two_stage_sweep, SweepPlan, Swept, Trial};

/// The run.db setting that holds the tuned values ([`TunedUpload`]).
pub const TUNED_SETTING: &str = "upload.tuned";

/// What `tune` saved: `upload` uses it unless told otherwise.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TunedUpload {
    /// `edge` or `server`: the values are only used for the same kind of sink.
    pub sink: String,
    /// Points per upsert.
    pub batch_size: usize,
    /// Upserts in flight.
    pub in_flight: usize,
    /// Points/s of the chosen trial.
    pub points_per_s: f64,
    /// Points in the sample.
    pub sample_points: usize,
}

/// How to tune.
#[derive(Debug, Clone)]
pub struct TuneOptions {
    /// Points in the sample (capped at what the shards have).
    pub sample: usize,
    /// Batch sizes of the first sweep, at one request in flight.
    pub batch_sizes: Vec<usize>,
    /// Requests in flight of the second sweep, at the chosen batch size.
    pub in_flights: Vec<usize>,
    /// The scratch collection (dropped before and after).
    pub scratch: String,
    /// Pick the smallest setting within this fraction of the fastest.
    pub within: f64,
}

impl TuneOptions {
    /// 20,000 points, batches 1…512, 1…16 in flight, within 5 %.
    pub fn new(scratch: impl Into<String>) -> Self {
        Self {
            sample: 20_000,
            batch_sizes: (0..10).map(|p| 1usize << p).collect(),
            in_flights: vec![1, 2, 4, 8, 16],
            scratch: scratch.into(),
            within: 0.05,
        }
    }
}

/// Both sweeps and what was chosen.
#[derive(Debug, Clone, PartialEq)]
pub struct TuneReport {
    /// Every trial, in the order run.
    pub trials: Vec<Trial>,
    /// The chosen batch size.
    pub batch_size: usize,
    /// The chosen requests in flight.
    pub in_flight: usize,
    /// Points/s at the chosen setting.
    pub points_per_s: f64,
    /// Vector size of the sample.
    pub dim: usize,
}

/// Why tuning failed.
#[derive(Debug, thiserror::Error)]
pub enum TuneError {
    /// run.db could not be read.
    #[error(transparent)]
    RunDb(#[from] RunDbError),
    /// A shard could not be read.
    #[error(transparent)]
    Shard(#[from] ShardReadError),
    /// The sink failed.
    #[error(transparent)]
    Sink(#[from] UploadError),
    /// Nothing to tune with.
    #[error("the run has no shards yet: embed first (`embedfleet run`), then tune")]
    NoShards,
    /// The table could not be written.
    #[error("failed to write {}: {cause}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        cause: std::io::Error,
    },
}

/// Runs both sweeps against `sink` with a sample of the run's shards; drops the scratch collection.
pub fn tune(sink: &dyn Sink, db: &RunDb, options: &TuneOptions) -> Result<TuneReport, TuneError> {
    let sample = load_sample(db, options.sample)?;
    let dim = sample
        .first()
        .map(PointsBatch::from_record_batch)
        .transpose()?;
    let dim = dim.map(|p| p.dim()).ok_or(TuneError::NoShards)?;
    let result = sweeps(sink, &sample, dim, options);
    // Dropped whatever happened; a failure to drop is reported only if the sweeps succeeded.
    let dropped = sink.delete_collection(&options.scratch);
    let report = result?;
    dropped?;
    Ok(report)
}

fn sweeps(
    sink: &dyn Sink,
    sample: &[RecordBatch],
    dim: usize,
    options: &TuneOptions,
) -> Result<TuneReport, TuneError> {
    let spec = CollectionSpec {
        bulk_load: true,
        ..CollectionSpec::new(&options.scratch, dim)
    };
    let plan = SweepPlan {
        batch_sizes: &options.batch_sizes,
        in_flights: &options.in_flights,
        within: options.within,
        fallback_batch_size: 256,
        // The first sweep ran it already.
        reuse_one_in_flight: true,
    };
    let swept = two_stage_sweep(&plan, |sweep, batch_size, in_flight| {
        trial(sink, &spec, sample, sweep, batch_size, in_flight)
    })?;
    Ok(TuneReport {
        trials: swept.trials,
        batch_size: swept.batch_size,
        in_flight: swept.in_flight,
        points_per_s: swept.per_s,
        dim,
    })
}

/// The first `points` rows of the run's shards, in memory, as batches of at most 4,096 rows.
fn load_sample(db: &RunDb, points: usize) -> Result<Vec<RecordBatch>, TuneError> {
    let mut out = Vec::new();
    let mut left = points;
    for shard in db.all_shards()? {
        if left == 0 {
            break;
        }
        let batches = shards::read_all(&db.dir().join(&shard.path), 4096, left)?;
        for batch in batches {
            left = left.saturating_sub(batch.num_rows());
            out.push(batch);
        }
    }
    if out.is_empty() {
        return Err(TuneError::NoShards);
    }
    Ok(out)
}

/// Uploads the sample in `batch_size` slices with `in_flight` threads into a fresh collection.
fn trial(
    sink: &dyn Sink,
    spec: &CollectionSpec,
    sample: &[RecordBatch],
    sweep: &'static str,
    batch_size: usize,
    in_flight: usize,
) -> Result<Trial, TuneError> {
    sink.delete_collection(&spec.name)?;
    sink.ensure_collection(spec)?;
    let slices: Vec<RecordBatch> = sample
        .iter()
        .flat_map(|b| {
            (0..b.num_rows())
                .step_by(batch_size.max(1))
                .map(move |o| b.slice(o, batch_size.min(b.num_rows() - o)))
        })
        .collect();
    let next = AtomicUsize::new(0);
    let started = Instant::now();
    let results: Vec<Result<(), UploadError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..in_flight.max(1))
            .map(|_| {
                scope.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(slice) = slices.get(i) else {
                        return Ok(());
                    };
                    let points = PointsBatch::from_record_batch(slice)?;
                    sink.upsert(UpsertRequest::new(&spec.name, &points))?;
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a tune sender panicked. This is a bug."))
            .collect()
    });
    results.into_iter().collect::<Result<(), _>>()?;
    sink.checkpoint(&spec.name)?;
    let secs = started.elapsed().as_secs_f64();
    let points = sample.iter().map(RecordBatch::num_rows).sum();
    tracing::info!(sweep, batch_size, in_flight, secs, "tune trial");
    Ok(Trial {
        sweep,
        batch_size,
        in_flight,
        points,
        secs,
    })
}

/// The trials as CSV.
pub fn csv(report: &TuneReport) -> String {
    let mut out = String::from("sweep,batch_size,in_flight,points,secs,points_per_s,chosen\n");
    for t in &report.trials {
        out.push_str(&format!(
            "{},{},{},{},{:.4},{:.1},{}\n",
            t.sweep,
            t.batch_size,
            t.in_flight,
            t.points,
            t.secs,
            t.points_per_s(),
            chosen(report, t)
        ));
    }
    out
}

/// The trials as a markdown table.
pub fn markdown(report: &TuneReport) -> String {
    let mut out = String::from(
        "| sweep | batch size | in flight | points | s | points/s | chosen |\n|---|---:|---:|---:|---:|---:|---|\n",
    );
    for t in &report.trials {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {:.3} | {:.0} | {} |\n",
            t.sweep,
            t.batch_size,
            t.in_flight,
            t.points,
            t.secs,
            t.points_per_s(),
            if chosen(report, t) { "◀" } else { "" }
        ));
    }
    out
}

fn chosen(report: &TuneReport, t: &Trial) -> bool {
    match t.sweep {
        "batch" => t.batch_size == report.batch_size,
        _ => t.in_flight == report.in_flight,
    }
}

/// Writes `tune.csv`, `tune.md` and `tune.png` into `dir`; returns their paths.
pub fn write_outputs(report: &TuneReport, dir: &Path) -> Result<Vec<PathBuf>, TuneError> {
    let write_err = |path: &Path| {
        let path = path.to_owned();
        move |source| TuneError::Write {
            path,
            cause: source,
        }
    };
    std::fs::create_dir_all(dir).map_err(write_err(dir))?;
    let csv_path = dir.join("tune.csv");
    std::fs::write(&csv_path, csv(report)).map_err(write_err(&csv_path))?;
    let md_path = dir.join("tune.md");
    std::fs::write(&md_path, markdown(report)).map_err(write_err(&md_path))?;
    let png_path = dir.join("tune.png");
    write_png(&report.trials, report.dim, report.batch_size, &png_path).map_err(|e| {
        TuneError::Write {
            path: png_path.clone(),
            cause: std::io::Error::other(e.to_string()),
        }
    })?;
    Ok(vec![csv_path, md_path, png_path])
}
