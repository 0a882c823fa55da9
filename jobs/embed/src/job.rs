//! `embedfleet embed-job`: one batch (one per-node job) from its batch file to parquet shards.
//!
//! A job never opens run.db (on a cluster it runs on another host than the run's owner, over
//! a shared filesystem where SQLite's locks do not hold): it reads `plan.json` and its batch
//! file, and writes only files of its own — parquet shards and its result manifest, both named
//! by its attempt token (see `embedfleet_core::handoff`). The batch's papers (less later
//! duplicates) are cut into parts of `shard_papers`; each part becomes one shard, written
//! atomically, after which the manifest is rewritten. A job killed at any moment loses at most
//! the part it was on: the next attempt takes over every part an earlier attempt finished
//! (its shard verified by sha256) and writes the rest. The owner ingests the manifest.

use super::pipeline::PartOutcome;
use super::{write_rows, LoadedModels};
use embedfleet_core::batchfile;
use embedfleet_core::handoff::{
    papers_digest, AttemptManifest, AttemptShard, ExpectedBatch, HandoffError, OutputSettings,
    PinError, PlanManifest,
};
use embedfleet_core::rundb::BatchTimings;
use embedfleet_core::shardfile::{ShardFileError, ShardMeta, ShardWriter, VectorDtype};
use embedfleet_core::{BatchId, Paper, Precision, RunLayout};
use embedfleet_models::{DeviceSpec, ModelError, TextRule};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Test hook: milliseconds an embed job waits after each shard it wrote, so that a test can
/// strike (a full disk, a kill) while the job is mid-batch.
pub const TEST_SHARD_DELAY_ENV: &str = "EMBEDFLEET_TEST_SHARD_DELAY_MS";

fn test_shard_delay() -> Option<Duration> {
    std::env::var(TEST_SHARD_DELAY_ENV)
        .ok()?
        .parse()
        .ok()
        .map(Duration::from_millis)
}

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
    /// `--precision`: the device's own, or FP8 projections.
    pub precision: Precision,
    /// Longest sequence fed to the model, EOS included; longer papers are chunked. `None`: the
    /// model's context (`max_position_embeddings`).
    pub max_tokens: Option<usize>,
    /// Papers per shard file.
    pub shard_papers: usize,
    /// Test hook: a memory cap (bytes) on the model's own estimate, to exercise the
    /// out-of-memory fallback without a GPU.
    pub memory_limit: Option<u64>,
    /// How texts are prepared before they are tokenised (`--text-rule`); `None`: a run fixed
    /// before embedfleet recorded it, whose texts are prepared as they were then.
    pub text_rule: Option<TextRule>,
}

impl EmbedJobOptions {
    /// The settings that decide the batch's rows, which every attempt of the run must share.
    pub fn output_settings(&self) -> OutputSettings {
        output_settings(
            &self.model_dir,
            self.output_dim,
            self.vector_dtype,
            self.precision,
            self.max_tokens,
            self.shard_papers,
            self.text_rule,
        )
    }
}

/// The output settings of documents embedded with these options (see [`OutputSettings`]); the
/// pooling is the one of `model_dir`'s family. A directory whose family cannot be read has
/// none (empty), and nothing is pinned from it: the embed job refuses it before pinning
/// ([`run`]), `submit`'s preflight before any job.
pub fn output_settings(
    model_dir: &Path,
    dim: Option<usize>,
    vector_dtype: VectorDtype,
    precision: Precision,
    max_tokens: Option<usize>,
    shard_papers: usize,
    text_rule: Option<TextRule>,
) -> OutputSettings {
    let layout = embedfleet_models::model_layout(model_dir).ok();
    OutputSettings {
        model: super::model_revision(model_dir),
        model_dir: std::path::absolute(model_dir)
            .unwrap_or_else(|_| model_dir.to_path_buf())
            .display()
            .to_string(),
        dim,
        vector_dtype,
        precision,
        max_tokens,
        shard_papers: shard_papers.max(1),
        pooling: layout
            .as_ref()
            .map(|layout| layout.pooling.name().to_string())
            .unwrap_or_default(),
        normalized: true,
        // The directory's document prompt: written before every paper's text.
        instruction: layout
            .map(|layout| layout.document_prompt)
            .filter(|prompt| !prompt.is_empty()),
        text_rule: text_rule.map(|rule| rule.name().to_string()),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EmbedJobError {
    #[error("batch {0} is not in this run: `embedfleet status` lists the batches")]
    NoSuchBatch(BatchId),
    #[error("the run is not completely planned (no plan.json): run `embedfleet plan` again first")]
    NotPlanned,
    #[error("plan.json was written by an older embedfleet (it names no plan id, so no result of this job could be accepted): run `embedfleet plan` (or `submit`) on the run's login node again to write it anew")]
    PlanWithoutId,
    #[error(transparent)]
    Pinned(#[from] PinError),
    #[error(transparent)]
    Handoff(#[from] HandoffError),
    #[error(transparent)]
    Batch(#[from] batchfile::BatchFileError),
    #[error(transparent)]
    Shard(#[from] ShardFileError),
    #[error("failed to load the model: {0}")]
    Model(ModelError),
    /// Another attempt at the batch finished first (and verified): this one stops.
    #[error("attempt {0} of the batch finished first")]
    Superseded(String),
    #[error("failed to prepare {path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
}

/// Said in the message, so not returned as the source (`embedfleet_core::cause`): no
/// `#[from]`, which would return it.
impl From<ModelError> for EmbedJobError {
    fn from(e: ModelError) -> Self {
        Self::Model(e)
    }
}

impl EmbedJobError {
    /// Errors that fail the same way on every attempt (exit code 4: the submit loop does not
    /// retry them): an unplanned run, a batch that is not there, settings other than the
    /// run's, a device this build cannot open, a model directory that is not a usable model of
    /// a family this build implements. A read error is not among them.
    pub fn is_refusal(&self) -> bool {
        match self {
            EmbedJobError::NotPlanned
            | EmbedJobError::PlanWithoutId
            | EmbedJobError::NoSuchBatch(_)
            | EmbedJobError::Pinned(PinError::Differs { .. }) => true,
            EmbedJobError::Model(e) => matches!(
                e,
                ModelError::InvalidDevice { .. }
                    | ModelError::NoModelDir { .. }
                    | ModelError::MissingFile { .. }
                    | ModelError::ConfigParse { .. }
                    | ModelError::UnsupportedConfig { .. }
                    | ModelError::InvalidIndex { .. }
                    | ModelError::MissingTensor { .. }
                    | ModelError::TensorShape { .. }
                    | ModelError::MissingEos { .. }
                    | ModelError::InvalidDim { .. }
                    // --precision fp8 for a family or dtype that has none, on any node.
                    | ModelError::PrecisionRefused { .. }
            ),
            _ => false,
        }
    }

    /// This node's device refused (exit code 5): FP8 on a GPU without FP8 tensor cores, the
    /// fused attention refused here. Another queue's nodes may run the batch: the submit loop
    /// sets this one's queue aside at the first and retries the batch elsewhere.
    pub fn is_device_refusal(&self) -> bool {
        matches!(self, EmbedJobError::Model(e) if e.is_device_refusal())
    }
}

/// What a job run came to.
#[derive(Debug, Clone, Default)]
pub struct JobReport {
    /// This attempt's token (in its shard and manifest names).
    pub attempt: String,
    pub parts_written: u32,
    /// Parts taken over from earlier attempts.
    pub parts_skipped: u32,
    /// Another attempt had done the whole batch already: this one made nothing.
    pub already_done_by: Option<String>,
    pub papers_embedded: u64,
    pub papers_failed: u64,
    pub timings: BatchTimings,
}

pub fn run(options: &EmbedJobOptions) -> Result<JobReport, EmbedJobError> {
    let started = Instant::now();
    let layout = RunLayout::new(&options.run_dir);
    let plan = PlanManifest::read(&layout)?.ok_or(EmbedJobError::NotPlanned)?;
    if plan.plan_id.is_empty() {
        return Err(EmbedJobError::PlanWithoutId);
    }
    let batch = plan
        .batches
        .get(&options.batch.0)
        .ok_or(EmbedJobError::NoSuchBatch(options.batch))?;
    // The family decides the pooling the run pinned: a directory without one is refused here,
    // not as other settings than the run's.
    embedfleet_models::family_of(&options.model_dir)?;
    let settings = options.output_settings();
    settings.pin(&layout)?;
    let mut timings = BatchTimings::default();
    let io_started = Instant::now();
    let papers = read_papers(&layout.resolve(&batch.path), &batch.excluded_rows)?;
    let expected = ExpectedBatch::new(
        &plan.plan_id,
        papers.iter().map(|p| p.id.as_str()),
        options.shard_papers,
    );
    let earlier = AttemptManifest::read_all(&layout, options.batch.0);
    if let Some(done) = done_by_another(&layout, &earlier, &expected, &settings) {
        return Ok(JobReport {
            already_done_by: Some(done),
            ..JobReport::default()
        });
    }
    let parts: Vec<Vec<Paper>> = papers
        .chunks(options.shard_papers.max(1))
        .map(<[Paper]>::to_vec)
        .collect();
    drop(papers);
    let devices = options
        .devices
        .iter()
        .map(|d| format!("{d:?}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut manifest = AttemptManifest::start(
        &plan.plan_id,
        options.batch.0,
        devices,
        settings,
        parts.len() as u32,
    );
    let done = take_over_parts(&layout, &manifest, &expected, earlier)?;
    let todo: Vec<u32> = (0..parts.len() as u32)
        .filter(|p| !done.contains_key(p))
        .collect();
    manifest.shards = done.values().cloned().collect();
    manifest.write(&layout)?;
    timings.io_s += io_started.elapsed().as_secs_f64();
    let report = JobReport {
        attempt: manifest.attempt.clone(),
        parts_skipped: done.len() as u32,
        ..JobReport::default()
    };
    let mut attempt = Attempt {
        layout: &layout,
        options,
        expected: &expected,
        manifest,
        done,
        timings,
        report,
    };
    let result = if todo.is_empty() {
        Ok(())
    } else {
        attempt.embed_parts(&plan.settings.minibatch, parts, &todo)
    };
    let Attempt {
        mut manifest,
        done,
        mut timings,
        mut report,
        ..
    } = attempt;
    timings.total_s = started.elapsed().as_secs_f64();
    timings.peak_memory_bytes = timings.peak_memory_bytes.or_else(process_peak_rss_bytes);
    manifest.timings = timings.clone();
    manifest.shards = done.into_values().collect();
    report.timings = timings;
    if let Err(EmbedJobError::Superseded(winner)) = result {
        // Not a failure: the batch is done. The manifest stays incomplete (the owner records
        // this attempt as abandoned) and its shards are left for the owner to remove.
        report.already_done_by = Some(winner);
        manifest.write(&layout)?;
        return Ok(report);
    }
    let error = result.as_ref().err().map(ToString::to_string);
    manifest.finish(&layout, error)?;
    result?;
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

/// The attempt, among `manifests`, that completed the batch for this plan with these
/// settings and verifies — unless the owner rejected it (it may know what a job cannot).
fn done_by_another(
    layout: &RunLayout,
    manifests: &[(PathBuf, Result<AttemptManifest, HandoffError>)],
    expected: &ExpectedBatch,
    settings: &OutputSettings,
) -> Option<String> {
    manifests.iter().find_map(|(_, m)| {
        let m = m.as_ref().ok().filter(|m| m.complete)?;
        if layout.attempt_rejection(m.batch, &m.attempt).exists() {
            return None;
        }
        m.verify(layout, expected, Some(settings)).ok()?;
        Some(m.attempt.clone())
    })
}

/// The parts earlier attempts of this plan finished with these settings, whose shard file is
/// intact and holds exactly the part's papers, each linked under this attempt's own name (a
/// manifest names only its own attempt's files; the owner removes the earlier attempt's).
fn take_over_parts(
    layout: &RunLayout,
    manifest: &AttemptManifest,
    expected: &ExpectedBatch,
    earlier: Vec<(PathBuf, Result<AttemptManifest, HandoffError>)>,
) -> Result<BTreeMap<u32, AttemptShard>, EmbedJobError> {
    let mut done = BTreeMap::new();
    for (_, m) in earlier {
        let Ok(m) = m else { continue };
        let same_run = m.plan_id == manifest.plan_id
            && embedfleet_core::pin::Pinned::differences(&m.settings, &manifest.settings)
                .is_empty()
            && m.parts == manifest.parts;
        if !same_run {
            continue;
        }
        for shard in m.shards {
            let Some(digest) = expected.parts.get(shard.part as usize) else {
                continue;
            };
            if done.contains_key(&shard.part)
                || shard.verify(layout, m.batch, &m.attempt, digest).is_err()
            {
                continue;
            }
            let own = RunLayout::shard_file_name(m.batch, shard.part, &manifest.attempt);
            link_or_copy(&layout.resolve(&shard.file), &layout.resolve(&own))?;
            done.insert(shard.part, AttemptShard { file: own, ..shard });
        }
    }
    Ok(done)
}

/// `to` holds `from`'s bytes: a hard link where the filesystem has them, else a copy made
/// atomically.
fn link_or_copy(from: &Path, to: &Path) -> Result<(), EmbedJobError> {
    let io = |source| EmbedJobError::Io {
        path: to.to_path_buf(),
        cause: source,
    };
    if std::fs::hard_link(from, to).is_ok() {
        return Ok(());
    }
    embedfleet_core::atomic::copy(from, to)
        .map(drop)
        .map_err(io)
}

/// An attempt at a batch while it embeds: what it has written so far (its manifest, rewritten
/// after every shard, and the parts done, taken over or its own), what it measured and what it
/// reports.
struct Attempt<'a> {
    layout: &'a RunLayout,
    options: &'a EmbedJobOptions,
    /// The batch's papers as the plan has them: what another attempt's shards must match.
    expected: &'a ExpectedBatch,
    manifest: AttemptManifest,
    done: BTreeMap<u32, AttemptShard>,
    timings: BatchTimings,
    report: JobReport,
}

impl Attempt<'_> {
    /// Embeds the parts `todo` of `parts` on the job's devices, writing each part's shard as
    /// it comes.
    fn embed_parts(
        &mut self,
        rule: &embedfleet_core::settings::MiniBatchRule,
        mut parts: Vec<Vec<Paper>>,
        todo: &[u32],
    ) -> Result<(), EmbedJobError> {
        let options = self.options;
        let how = crate::ModelLoad {
            output_dim: options.output_dim,
            memory_limit: options.memory_limit,
            dtype: None,
            precision: options.precision,
            // A run's jobs are refused FP8 on the CPU (submit says so first): never emulated.
            fp8_emulated_on_cpu: false,
            text_rule: options.text_rule,
        };
        let loaded = LoadedModels::load_with(&options.model_dir, &options.devices, &how)?;
        self.timings.model_load_s = loaded.load_time.as_secs_f64();
        let encoding = loaded.encoding(options.max_tokens, rule.clone(), None);
        let work: Vec<Vec<Paper>> = todo
            .iter()
            .map(|&p| std::mem::take(&mut parts[p as usize]))
            .collect();
        let mut next = todo.iter();
        let (mut inference, mut tokenize) = (Duration::ZERO, Duration::ZERO);
        let shard_dir = self.layout.shard_dir();
        std::fs::create_dir_all(&shard_dir).map_err(|source| EmbedJobError::Io {
            path: shard_dir,
            cause: source,
        })?;
        loaded.embed_parts(work.into_iter(), &encoding, |papers, outcome| {
            let part = *next.next().expect("one outcome per part. This is a bug.");
            inference += outcome.inference;
            tokenize += outcome.tokenize;
            self.part_embedded(part, &papers, &outcome, &loaded.meta)
        })?;
        self.timings.inference_s = inference.as_secs_f64();
        self.timings.tokenize_s = tokenize.as_secs_f64();
        Ok(())
    }

    /// Part `part` embedded: its shard written, the manifest rewritten (a killed attempt's
    /// parts serve the next one), and the attempt stopped if another finished the batch.
    fn part_embedded(
        &mut self,
        part: u32,
        papers: &[Paper],
        outcome: &PartOutcome,
        meta: &ShardMeta,
    ) -> Result<(), EmbedJobError> {
        let (layout, options) = (self.layout, self.options);
        let timings = &mut self.timings;
        timings.tokens += outcome.tokens;
        timings.padding_tokens += outcome.padding_tokens;
        timings.fallback_split += outcome.fallbacks.split;
        timings.fallback_sequential += outcome.fallbacks.sequential;
        timings.fallback_chunked += outcome.fallbacks.chunked;
        timings.long_chunked += outcome.long_chunked;
        let write_started = Instant::now();
        // Also before the write: an attempt that wakes after the batch was done elsewhere (a
        // process stopped past its job's end, a node that comes back after the run ended)
        // writes nothing that only the owner's next ingest would remove.
        self.stand_down_if_done_elsewhere()?;
        let file = RunLayout::shard_file_name(options.batch.0, part, &self.manifest.attempt);
        let mut writer = ShardWriter::create(&layout.resolve(&file), options.vector_dtype, meta)?;
        let failed = write_rows(&mut writer, papers, &outcome.results)?;
        let info = writer.finish()?;
        let digest = papers_digest(papers.iter().map(|p| p.id.as_str()));
        self.report.papers_failed += failed.len() as u64;
        self.done.insert(
            part,
            AttemptShard {
                part,
                file,
                rows: info.rows,
                sha256: info.sha256,
                failed,
                papers: digest,
                written_unix_s: Some(
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default()
                        .as_secs_f64(),
                ),
            },
        );
        self.manifest.shards = self.done.values().cloned().collect();
        self.manifest.write(layout)?;
        self.timings.io_s += write_started.elapsed().as_secs_f64();
        self.timings.papers += info.rows;
        self.report.parts_written += 1;
        self.report.papers_embedded += info.rows;
        if let Some(pause) = test_shard_delay() {
            std::thread::sleep(pause);
        }
        // Two attempts at once (a lost job that still runs beside its replacement): the one
        // that finishes first wins, and the other stops at its next shard instead of spending
        // a node on rows nobody will take.
        self.stand_down_if_done_elsewhere()
    }

    /// [`EmbedJobError::Superseded`] when another attempt completed the batch (see
    /// [`done_by_another`]).
    fn stand_down_if_done_elsewhere(&self) -> Result<(), EmbedJobError> {
        let others: Vec<_> = AttemptManifest::read_all(self.layout, self.options.batch.0)
            .into_iter()
            .filter(|(_, m)| {
                m.as_ref()
                    .map_or(true, |m| m.attempt != self.manifest.attempt)
            })
            .collect();
        match done_by_another(self.layout, &others, self.expected, &self.manifest.settings) {
            Some(winner) => Err(EmbedJobError::Superseded(winner)),
            None => Ok(()),
        }
    }
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
