//! `embedfleet query`: every term becomes a query (through the instruction template), embedded
//! in batches on the run's devices and searched in batches with K requests in flight; the
//! results go to one parquet file.
//!
//! Resumable: terms are done in parts of `part_queries`; each part's results are written
//! atomically to `<output>.parts/part-NNNNNN.parquet` as soon as it is searched, and a killed
//! run continues with the parts not written. When every part is there, they are joined into
//! `<output>` (atomically) and the parts folder goes.

use crate::results;
use crate::search::{search_batched, Percentiles};
use embedfleet_core::atomic;
use embedfleet_embed::{LoadedModels, QueryEmbedError};
use embedfleet_models::DeviceSpec;
use embedfleet_upload::{SearchOptions, Sink, UploadError};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Terms per part: the unit written at once (and lost at a kill).
pub const DEFAULT_PART_QUERIES: usize = 1024;

/// Test hook: milliseconds to wait after each part is written, so a test can kill a run
/// between parts.
pub const TEST_DELAY_ENV: &str = "EMBEDFLEET_TEST_QUERY_DELAY_MS";

/// The model that embeds the queries, loaded on first use (a finished run loads nothing).
pub struct QueryModel {
    pub model_dir: PathBuf,
    pub devices: Vec<DeviceSpec>,
    pub output_dim: Option<usize>,
    /// Token budget of one mini-batch of queries.
    pub batch_tokens: u64,
    loaded: Option<LoadedModels>,
}

impl QueryModel {
    pub fn new(model_dir: PathBuf, devices: Vec<DeviceSpec>, output_dim: Option<usize>) -> Self {
        Self {
            model_dir,
            devices,
            output_dim,
            batch_tokens: embedfleet_core::settings::DEFAULT_BATCH_TOKENS,
            loaded: None,
        }
    }

    /// The query vectors of `texts`, in order.
    pub fn embed(
        &mut self,
        instruction: &str,
        texts: &[String],
    ) -> Result<Vec<Vec<f32>>, QueryEmbedError> {
        if self.loaded.is_none() {
            self.loaded = Some(LoadedModels::load(
                &self.model_dir,
                &self.devices,
                self.output_dim,
                None,
            )?);
        }
        let loaded = self.loaded.as_ref().expect("loaded above. This is a bug.");
        loaded.embed_queries(instruction, texts, self.batch_tokens)
    }
}

/// What turns query terms into vectors for [`run`]: the model here ([`QueryModel`]), or the
/// vectors a query job made on a GPU node
/// ([`PrecomputedVectors`](crate::vectors::PrecomputedVectors)).
pub trait EmbedQueries {
    /// The query vectors of `texts`, in order.
    fn embed_queries(
        &mut self,
        instruction: &str,
        texts: &[String],
    ) -> Result<Vec<Vec<f32>>, QueryError>;
}

impl EmbedQueries for QueryModel {
    fn embed_queries(
        &mut self,
        instruction: &str,
        texts: &[String],
    ) -> Result<Vec<Vec<f32>>, QueryError> {
        Ok(self.embed(instruction, texts)?)
    }
}

/// What a query run does.
#[derive(Debug, Clone)]
pub struct QueryOptions {
    pub collection: String,
    pub terms: Vec<String>,
    /// The retrieval instruction of the query template.
    pub instruction: String,
    /// Results per query and the filter.
    pub search: SearchOptions,
    /// Queries per search request.
    pub batch_size: usize,
    /// Search requests in flight.
    pub in_flight: usize,
    pub output: PathBuf,
    pub part_queries: usize,
    pub progress: bool,
}

/// What a query run came to.
#[derive(Debug, Clone, Default)]
pub struct QueryReport {
    pub queries: u64,
    /// Queries whose results an earlier run had written.
    pub already_done: u64,
    /// Result rows written by this run.
    pub rows: u64,
    pub embed: Duration,
    pub search: Duration,
    /// Latency of each search request of this run.
    pub latency: Percentiles,
}

impl QueryReport {
    /// Queries searched per second of search time, by this run.
    pub fn queries_per_s(&self) -> f64 {
        (self.queries - self.already_done) as f64 / self.search.as_secs_f64().max(1e-9)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error(transparent)]
    Embed(#[from] QueryEmbedError),
    #[error("search failed: {0}")]
    Search(#[from] UploadError),
    #[error("failed to write {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the query job's vectors have none for the term {term:?}: run the same command again")]
    NoVector { term: String },
    #[error("{parts} holds an unfinished query run with other terms or settings: finish it with the same command, or remove it (or pick another --output)")]
    Changed { parts: PathBuf },
}

impl QueryError {
    /// Refusals (exit code 4) as opposed to failures.
    pub fn is_refusal(&self) -> bool {
        matches!(self, QueryError::Changed { .. })
    }
}

/// What the parts folder was made for; a resumed run must match it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct PartsKey {
    terms: String,
    collection: String,
    search: String,
    instruction: String,
    part_queries: usize,
}

impl PartsKey {
    fn of(o: &QueryOptions) -> Self {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        for t in &o.terms {
            h.update(t.as_bytes());
            h.update(b"\n");
        }
        PartsKey {
            terms: format!("{:016x}", h.digest()),
            collection: o.collection.clone(),
            search: format!("{:?}", o.search),
            instruction: o.instruction.clone(),
            part_queries: o.part_queries,
        }
    }
}

/// `<output>.parts`, beside the output.
pub fn parts_dir(output: &Path) -> PathBuf {
    let mut name = output.file_name().unwrap_or_default().to_os_string();
    name.push(".parts");
    output.with_file_name(name)
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> QueryError + '_ {
    move |source| QueryError::Io {
        path: path.into(),
        source,
    }
}

/// Runs the query workload (see the module docs).
pub fn run(
    sink: &dyn Sink,
    model: &mut dyn EmbedQueries,
    options: &QueryOptions,
) -> Result<QueryReport, QueryError> {
    let total = options.terms.len() as u64;
    let mut report = QueryReport {
        queries: total,
        ..QueryReport::default()
    };
    if options.output.is_file() && !parts_dir(&options.output).exists() {
        report.already_done = total;
        return Ok(report);
    }
    let parts = open_parts(options)?;
    let per = options.part_queries.max(1);
    let chunks: Vec<&[String]> = options.terms.chunks(per).collect();
    let bar = progress_bar(options.progress, total);
    let mut latencies = Vec::new();
    for (index, terms) in chunks.iter().enumerate() {
        let path = parts.join(format!("part-{index:06}.parquet"));
        if path.is_file() {
            report.already_done += terms.len() as u64;
            bar.inc(terms.len() as u64);
            continue;
        }
        let started = Instant::now();
        let vectors = model.embed_queries(&options.instruction, terms)?;
        report.embed += started.elapsed();
        let found = search_batched(
            sink,
            &options.collection,
            &vectors,
            &options.search,
            options.batch_size,
            options.in_flight,
        )?;
        report.search += found.elapsed;
        latencies.extend(found.batch_latencies);
        let batch = results::to_batch(terms, (index * per) as u64, &found.hits);
        report.rows += batch.num_rows() as u64;
        results::write(&path, &[batch]).map_err(io(&path))?;
        bar.inc(terms.len() as u64);
        if let Some(ms) = std::env::var(TEST_DELAY_ENV)
            .ok()
            .and_then(|v| v.parse().ok())
        {
            std::thread::sleep(Duration::from_millis(ms));
        }
    }
    bar.finish_and_clear();
    join_parts(&parts, chunks.len(), &options.output)?;
    report.latency = Percentiles::of(&latencies);
    Ok(report)
}

fn open_parts(options: &QueryOptions) -> Result<PathBuf, QueryError> {
    let parts = parts_dir(&options.output);
    std::fs::create_dir_all(&parts).map_err(io(&parts))?;
    atomic::remove_leftovers(&parts).map_err(io(&parts))?;
    let key_path = parts.join("key.json");
    let key = PartsKey::of(options);
    match std::fs::read(&key_path) {
        Ok(bytes) => {
            let stored: Option<PartsKey> = serde_json::from_slice(&bytes).ok();
            if stored.as_ref() != Some(&key) {
                return Err(QueryError::Changed { parts });
            }
        }
        Err(_) => {
            let json = serde_json::to_vec_pretty(&key).expect("the key serialises. This is a bug.");
            atomic::write(&key_path, &json).map_err(io(&key_path))?;
        }
    }
    Ok(parts)
}

/// Joins the parts into `output` (atomically), then removes the parts folder.
fn join_parts(parts: &Path, count: usize, output: &Path) -> Result<(), QueryError> {
    let mut batches = Vec::new();
    for index in 0..count {
        let path = parts.join(format!("part-{index:06}.parquet"));
        batches.extend(results::read(&path).map_err(io(&path))?);
    }
    if let Some(dir) = output.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    results::write(output, &batches).map_err(io(output))?;
    std::fs::remove_dir_all(parts).map_err(io(parts))
}

fn progress_bar(show: bool, total: u64) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} queries  {per_sec}  ETA {eta}")
            .expect("the template is valid. This is a bug."),
    );
    bar
}
