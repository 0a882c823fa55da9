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

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use arrow_array::RecordBatch;
use embedfleet_core::rundb::{RunDb, RunDbError};
use serde::{Deserialize, Serialize};

use super::shards::{self, ShardReadError};
use super::{CollectionSpec, PointsBatch, Sink, UploadError};

pub use plot::{write_png, PlotError};

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

/// One timed upload of the sample.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Trial {
    /// `batch` (first sweep) or `in_flight` (second sweep).
    pub sweep: &'static str,
    /// Points per upsert.
    pub batch_size: usize,
    /// Upserts in flight.
    pub in_flight: usize,
    /// Points sent.
    pub points: usize,
    /// Seconds from the first upsert to the end of the checkpoint.
    pub secs: f64,
}

impl Trial {
    /// Points per second.
    pub fn points_per_s(&self) -> f64 {
        self.points as f64 / self.secs.max(1e-9)
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
    #[error("failed to write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
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
    let mut trials = Vec::new();
    for &b in &options.batch_sizes {
        trials.push(trial(sink, &spec, sample, "batch", b, 1)?);
    }
    let batch_size = pick(&trials, options.within, |t| t.batch_size).unwrap_or(256);
    let mut second = Vec::new();
    for &k in &options.in_flights {
        // The first sweep ran this one already.
        let done = (k == 1).then(|| trials.iter().find(|t| t.batch_size == batch_size));
        match done.flatten() {
            Some(t) => second.push(Trial {
                sweep: "in_flight",
                ..*t
            }),
            None => second.push(trial(sink, &spec, sample, "in_flight", batch_size, k)?),
        }
    }
    let in_flight = pick(&second, options.within, |t| t.in_flight).unwrap_or(1);
    let points_per_s = second
        .iter()
        .find(|t| t.in_flight == in_flight)
        .map_or(0.0, Trial::points_per_s);
    trials.extend(second);
    Ok(TuneReport {
        trials,
        batch_size,
        in_flight,
        points_per_s,
        dim,
    })
}

/// The smallest `key` among the trials within `within` of the fastest.
pub fn pick(trials: &[Trial], within: f64, key: impl Fn(&Trial) -> usize) -> Option<usize> {
    let best = trials.iter().map(Trial::points_per_s).fold(0.0, f64::max);
    trials
        .iter()
        .filter(|t| t.points_per_s() >= best * (1.0 - within))
        .map(key)
        .min()
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
                    sink.upsert(&spec.name, &points)?;
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
        move |source| TuneError::Write { path, source }
    };
    std::fs::create_dir_all(dir).map_err(write_err(dir))?;
    let csv_path = dir.join("tune.csv");
    std::fs::write(&csv_path, csv(report)).map_err(write_err(&csv_path))?;
    let md_path = dir.join("tune.md");
    std::fs::write(&md_path, markdown(report)).map_err(write_err(&md_path))?;
    let png_path = dir.join("tune.png");
    write_png(report, &png_path).map_err(|e| TuneError::Write {
        path: png_path.clone(),
        source: std::io::Error::other(e.to_string()),
    })?;
    Ok(vec![csv_path, md_path, png_path])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(batch_size: usize, secs: f64) -> Trial {
        Trial {
            sweep: "batch",
            batch_size,
            in_flight: 1,
            points: 1000,
            secs,
        }
    }

    #[test]
    fn pick_takes_the_smallest_within_the_margin_of_the_fastest() {
        // 1000 pts: 64 -> 10,000/s, 128 -> 10,400/s, 256 -> 10,600/s (fastest), 512 -> 9,000/s.
        let trials = [
            t(64, 0.1),
            t(128, 1.0 / 10.4),
            t(256, 1.0 / 10.6),
            t(512, 1.0 / 9.0),
        ];
        assert_eq!(pick(&trials, 0.05, |t| t.batch_size), Some(128));
        assert_eq!(pick(&trials, 0.0, |t| t.batch_size), Some(256));
        assert_eq!(pick(&[], 0.05, |t| t.batch_size), None);
    }
}
