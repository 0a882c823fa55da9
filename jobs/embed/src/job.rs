//! `embedfleet embed-job`: one batch (one per-node job) from its batch file to parquet shards.
//!
//! The batch's papers (less the rows run.db marks as later duplicates) are cut into parts of
//! `shard_papers`; each part becomes one shard file, written atomically and then recorded in
//! run.db. A job killed at any moment loses at most the part it was on: a re-run skips every
//! part whose shard is recorded and on disk, and writes the same rows for the rest.

use super::{write_rows, LoadedModels};
use embedfleet_core::batchfile;
use embedfleet_core::rundb::{BatchTimings, RunDb, RunDbError, ShardRow};
use embedfleet_core::shardfile::{ShardFileError, ShardWriter, VectorDtype};
use embedfleet_core::state::BatchState;
use embedfleet_core::{atomic, BatchId, Paper, RunLayout};
use embedfleet_models::{DeviceSpec, ModelError};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Papers per parquet shard: a killed job loses at most one shard's work.
pub const DEFAULT_SHARD_PAPERS: usize = 500;

#[derive(Debug, Clone)]
pub struct EmbedJobOptions {
    pub run_dir: PathBuf,
    pub batch: BatchId,
    pub model_dir: PathBuf,
    pub devices: Vec<DeviceSpec>,
    pub output_dim: Option<usize>,
    pub vector_dtype: VectorDtype,
    /// Longest sequence fed to the model, EOS included; longer papers are chunked. `None`: the
    /// model's context (`max_position_embeddings`).
    pub max_tokens: Option<usize>,
    /// Papers per shard file.
    pub shard_papers: usize,
    /// Test hook: a memory cap (bytes) on the model's own estimate, to exercise the
    /// out-of-memory fallback without a GPU.
    pub memory_limit: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum EmbedJobError {
    #[error(transparent)]
    RunDb(#[from] RunDbError),
    #[error("batch {0} is not in this run: `embedfleet status` lists the batches")]
    NoSuchBatch(BatchId),
    #[error("the run is not completely planned: run `embedfleet plan` again first")]
    NotPlanned,
    #[error(transparent)]
    Batch(#[from] batchfile::BatchFileError),
    #[error(transparent)]
    Shard(#[from] ShardFileError),
    #[error("failed to load the model: {0}")]
    Model(#[from] ModelError),
    #[error("failed to prepare {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl EmbedJobError {
    /// Errors that fail the same way on every attempt (exit code 4: the submit loop does not
    /// retry them): an unplanned run, a batch that is not there, a device this build cannot
    /// open, a model directory that is not a usable Qwen3. A read error is not among them.
    pub fn is_refusal(&self) -> bool {
        match self {
            EmbedJobError::NotPlanned | EmbedJobError::NoSuchBatch(_) => true,
            EmbedJobError::Model(e) => matches!(
                e,
                ModelError::InvalidDevice { .. }
                    | ModelError::MissingFile { .. }
                    | ModelError::ConfigParse { .. }
                    | ModelError::UnsupportedConfig { .. }
                    | ModelError::InvalidIndex { .. }
                    | ModelError::MissingTensor { .. }
                    | ModelError::TensorShape { .. }
                    | ModelError::MissingEos { .. }
                    | ModelError::InvalidDim { .. }
            ),
            _ => false,
        }
    }
}

/// What a job run came to.
#[derive(Debug, Clone, Default)]
pub struct JobReport {
    pub parts_written: u32,
    pub parts_skipped: u32,
    pub papers_embedded: u64,
    pub papers_failed: u64,
    pub timings: BatchTimings,
}

pub fn run(options: &EmbedJobOptions) -> Result<JobReport, EmbedJobError> {
    let started = Instant::now();
    let db = RunDb::open(&options.run_dir)?;
    let settings = db.plan_settings()?.ok_or(EmbedJobError::NotPlanned)?;
    if !db.is_planned()? {
        return Err(EmbedJobError::NotPlanned);
    }
    let batch = db
        .batch(options.batch)?
        .ok_or(EmbedJobError::NoSuchBatch(options.batch))?;
    let mut timings = BatchTimings::default();

    let io_started = Instant::now();
    let papers = read_papers(
        &options.run_dir.join(&batch.path),
        &db.excluded_rows(batch.id)?,
    )?;
    let parts: Vec<Vec<Paper>> = papers
        .chunks(options.shard_papers.max(1))
        .map(<[Paper]>::to_vec)
        .collect();
    drop(papers);
    let todo = parts_to_do(&db, options, parts.len() as u32)?;
    timings.io_s += io_started.elapsed().as_secs_f64();
    let mut report = JobReport {
        parts_skipped: parts.len() as u32 - todo.len() as u32,
        ..JobReport::default()
    };
    if todo.is_empty() {
        db.set_batch_state(batch.id, BatchState::Done)?;
        report.timings = timings;
        return Ok(report);
    }

    db.set_batch_state(batch.id, BatchState::Running)?;
    let devices = options
        .devices
        .iter()
        .map(|d| format!("{d:?}"))
        .collect::<Vec<_>>()
        .join(",");
    let run_id = db.start_batch_run(batch.id, &devices)?;
    let result = embed_parts(
        &db,
        options,
        &settings.minibatch,
        parts,
        &todo,
        &mut timings,
        &mut report,
    );
    timings.total_s = started.elapsed().as_secs_f64();
    timings.peak_memory_bytes = timings.peak_memory_bytes.or_else(process_peak_rss_bytes);
    let error = result.as_ref().err().map(ToString::to_string);
    db.finish_batch_run(run_id, &timings, error.as_deref())?;
    result?;
    db.set_batch_state(batch.id, BatchState::Done)?;
    report.timings = timings;
    Ok(report)
}

/// The process's peak resident memory (`VmHWM` of /proc/self/status), the CPU figure of the
/// peak memory; `None` where /proc is not there. A device's own peak, when a backend knows it,
/// is set before this and wins.
pub fn process_peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line
        .trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

fn read_papers(path: &Path, excluded: &[u64]) -> Result<Vec<Paper>, EmbedJobError> {
    let mut papers = Vec::new();
    let mut row = 0u64;
    let mut skip = excluded.iter().peekable();
    batchfile::read(path, |r| {
        if skip.peek() == Some(&&row) {
            skip.next();
        } else {
            papers.push(r.paper);
        }
        row += 1;
    })?;
    Ok(papers)
}

/// The parts whose shard is missing on disk or in run.db; removes this batch's leftovers.
fn parts_to_do(
    db: &RunDb,
    options: &EmbedJobOptions,
    parts: u32,
) -> Result<Vec<u32>, EmbedJobError> {
    let dir = RunLayout::new(&options.run_dir).shard_dir();
    std::fs::create_dir_all(&dir).map_err(|source| EmbedJobError::Io {
        path: dir.clone(),
        source,
    })?;
    let prefix = RunLayout::shard_file_prefix(options.batch.0);
    for entry in std::fs::read_dir(&dir).map_err(|source| EmbedJobError::Io {
        path: dir.clone(),
        source,
    })? {
        let entry = entry.map_err(|source| EmbedJobError::Io {
            path: dir.clone(),
            source,
        })?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(&prefix) && name.ends_with(atomic::TMP_SUFFIX) {
            std::fs::remove_file(entry.path()).map_err(|source| EmbedJobError::Io {
                path: entry.path(),
                source,
            })?;
        }
    }
    let recorded = db.shards_of(options.batch)?;
    Ok((0..parts)
        .filter(|&part| {
            !recorded
                .iter()
                .any(|s| s.part == part && options.run_dir.join(&s.path).is_file())
        })
        .collect())
}

fn embed_parts(
    db: &RunDb,
    options: &EmbedJobOptions,
    rule: &embedfleet_core::settings::MiniBatchRule,
    mut parts: Vec<Vec<Paper>>,
    todo: &[u32],
    timings: &mut BatchTimings,
    report: &mut JobReport,
) -> Result<(), EmbedJobError> {
    let loaded = LoadedModels::load(
        &options.model_dir,
        &options.devices,
        options.output_dim,
        options.memory_limit,
    )?;
    timings.model_load_s = loaded.load_time.as_secs_f64();
    let encoding = loaded.encoding(options.max_tokens, rule.clone(), None);
    let work: Vec<(u32, Vec<Paper>)> = todo
        .iter()
        .map(|&p| (p, std::mem::take(&mut parts[p as usize])))
        .collect();
    let order: Vec<u32> = work.iter().map(|(p, _)| *p).collect();
    let mut next = order.iter();
    let mut inference = Duration::ZERO;
    let mut tokenize = Duration::ZERO;
    loaded.embed_parts(
        work.into_iter().map(|(_, papers)| papers),
        &encoding,
        |papers, outcome| {
            let part = *next.next().expect("one outcome per part. This is a bug.");
            inference += outcome.inference;
            tokenize += outcome.tokenize;
            timings.tokens += outcome.tokens;
            timings.padding_tokens += outcome.padding_tokens;
            timings.fallback_split += outcome.fallbacks.split;
            timings.fallback_sequential += outcome.fallbacks.sequential;
            timings.fallback_chunked += outcome.fallbacks.chunked;
            timings.long_chunked += outcome.long_chunked;
            let write_started = Instant::now();
            let path = RunLayout::shard_file_name(options.batch.0, part);
            let mut writer = ShardWriter::create(
                &options.run_dir.join(&path),
                options.vector_dtype,
                &loaded.meta,
            )?;
            let failed = write_rows(&mut writer, &papers, &outcome.results)?;
            let info = writer.finish()?;
            record_failures(db, options.batch, &failed)?;
            db.record_shard(&ShardRow {
                batch_id: options.batch,
                part,
                path,
                rows: info.rows,
                sha256: info.sha256,
            })?;
            timings.io_s += write_started.elapsed().as_secs_f64();
            timings.papers += info.rows;
            report.parts_written += 1;
            report.papers_embedded += info.rows;
            report.papers_failed += failed.len() as u64;
            Ok::<(), EmbedJobError>(())
        },
    )?;
    timings.inference_s = inference.as_secs_f64();
    timings.tokenize_s = tokenize.as_secs_f64();
    Ok(())
}

/// Papers that could not be embedded go to the quarantine, with the reason.
fn record_failures(
    db: &RunDb,
    batch: BatchId,
    failed: &[(String, String)],
) -> Result<(), EmbedJobError> {
    if failed.is_empty() {
        return Ok(());
    }
    db.record_embed_failures(batch, failed)?;
    embedfleet_core::quarantine::write_jsonl(db).map_err(|source| EmbedJobError::Io {
        path: db.dir().into(),
        source,
    })
}

#[cfg(test)]
mod tests {
    #[cfg(target_os = "linux")]
    #[test]
    fn peak_rss_is_read_from_proc() {
        let before = super::process_peak_rss_bytes().expect("VmHWM on Linux");
        // Touch 64 MiB so the peak must reach at least that.
        let big = vec![1u8; 64 << 20];
        std::hint::black_box(&big);
        let after = super::process_peak_rss_bytes().unwrap();
        assert!(after >= before && after >= 64 << 20, "{before} -> {after}");
    }
}
