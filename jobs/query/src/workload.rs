//! `embedfleet query`: every term becomes a query (through the instruction template), embedded
//! in batches on the run's devices and searched in batches with K requests in flight; the
//! results go to one parquet file.
//!
//! Resumable: terms are done in parts of `part_queries`; each part's results are written
//! atomically to `<output>.parts/part-NNNNNN.parquet` as soon as it is searched, and a killed
//! run continues with the parts not written. When every part is there, they are joined into
//! `<output>` (atomically) and the parts folder goes.

use crate::request::{QueryRequest, Searched};
use crate::results;
use crate::search::{search_batched, Percentiles};
use embedfleet_core::atomic;
use embedfleet_embed::{LoadedModels, QueryEmbedError};
use embedfleet_models::{DeviceSpec, TextRule};
use embedfleet_vectordb::{SearchOptions, Sink, UploadError};
use indicatif::{ProgressBar, ProgressStyle};
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
    /// The run's precision: an FP8 run's queries go through FP8 projections too (on a GPU
    /// natively, on the CPU by the library's emulation), as its documents did.
    pub precision: embedfleet_core::Precision,
    /// Token budget of one mini-batch of queries.
    pub batch_tokens: u64,
    /// The run's text rule, by which its papers were prepared (`None`: a run fixed before
    /// embedfleet recorded it); a query's text is prepared by the same.
    pub text_rule: Option<TextRule>,
    loaded: Option<LoadedModels>,
}

impl QueryModel {
    pub fn new(model_dir: PathBuf, devices: Vec<DeviceSpec>, output_dim: Option<usize>) -> Self {
        Self {
            model_dir,
            devices,
            output_dim,
            precision: embedfleet_core::Precision::Native,
            batch_tokens: embedfleet_core::settings::DEFAULT_BATCH_TOKENS,
            text_rule: Some(TextRule::default()),
            loaded: None,
        }
    }

    /// The model preparing texts by `rule` (the run's pinned one).
    pub fn with_text_rule(mut self, rule: Option<TextRule>) -> Self {
        self.text_rule = rule;
        self
    }

    /// The model embedding at `precision` (the run's pinned one).
    pub fn with_precision(mut self, precision: embedfleet_core::Precision) -> Self {
        self.precision = precision;
        self
    }

    /// The query vectors of `texts`, in order.
    pub fn embed(
        &mut self,
        instruction: &str,
        texts: &[String],
    ) -> Result<Vec<Vec<f32>>, QueryEmbedError> {
        if self.loaded.is_none() {
            let how = embedfleet_embed::ModelLoad {
                output_dim: self.output_dim,
                precision: self.precision,
                fp8_emulated_on_cpu: true,
                text_rule: self.text_rule,
                ..Default::default()
            };
            if self.precision == embedfleet_core::Precision::Fp8
                && self.devices.iter().any(|d| matches!(d, DeviceSpec::Cpu))
            {
                eprintln!(
                    "the run's vectors were made with FP8 projections: its queries are too, \
                     by the CPU's emulation of the GPU's arithmetic (slower than f32)"
                );
            }
            self.loaded = Some(LoadedModels::load_with(
                &self.model_dir,
                &self.devices,
                &how,
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
    /// Where the collection is, what it held and which model embeds the terms: with the above,
    /// the request stored with the results.
    pub searched: Searched,
    /// Overwrite an output (and drop a parts folder) made by another request.
    pub replace: bool,
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
    /// Queries of this run answered with fewer rows than asked although the collection holds
    /// that many matching points: an index that gave up early (pgvector under a selective
    /// filter without iterative scans returns such answers with no error).
    pub short: u64,
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
    Search(UploadError),
    #[error("failed to write {path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("the query job's vectors have none for the term {term:?}: run the same command again")]
    NoVector { term: String },
    #[error("{} holds an unfinished query run of another request ({}): run that request again to finish it, add --replace to start this one over, or give another --output", parts.display(), differences.join("; "))]
    Changed {
        parts: PathBuf,
        differences: Vec<String>,
    },
    #[error("{} holds the results of another query request ({}): add --replace to overwrite it, or give another --output", output.display(), differences.join("; "))]
    OtherRequest {
        output: PathBuf,
        differences: Vec<String>,
    },
    #[error("{} exists but is not a results file this embedfleet wrote ({why}): add --replace to overwrite it, or give another --output", output.display())]
    NotResults { output: PathBuf, why: String },
}

/// Said in the message, so not returned as the source (`embedfleet_core::cause`): no
/// `#[from]`, which would return it.
impl From<UploadError> for QueryError {
    fn from(e: UploadError) -> Self {
        Self::Search(e)
    }
}

impl QueryError {
    /// Refusals (exit code 4) as opposed to failures.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            QueryError::Changed { .. }
                | QueryError::OtherRequest { .. }
                | QueryError::NotResults { .. }
        )
    }

    /// The query model was refused by this node's device (exit code 5).
    pub fn is_device_refusal(&self) -> bool {
        matches!(self, QueryError::Embed(e) if e.is_device_refusal())
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
        cause: source,
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
    let request = QueryRequest::new(
        &options.terms,
        &options.collection,
        &options.search,
        &options.instruction,
        options.part_queries,
        &options.searched,
    );
    if answered(&options.output, &request, options.replace)? {
        // A join that was killed before it removed the parts leaves them: they are this
        // request's, and done.
        let parts = parts_dir(&options.output);
        if parts_request(&parts).is_some_and(|r| r == request) {
            std::fs::remove_dir_all(&parts).map_err(io(&parts))?;
        }
        report.already_done = total;
        return Ok(report);
    }
    let parts = open_parts(options, &request)?;
    let request_json =
        serde_json::to_string(&request).expect("the request serialises. This is a bug.");
    let per = options.part_queries.max(1);
    let chunks: Vec<&[String]> = options.terms.chunks(per).collect();
    let bar = progress_bar(options.progress, total);
    let mut latencies = Vec::new();
    // Every answer should hold k rows, or every point matching the filter when fewer match.
    let matching = sink.count(
        embedfleet_vectordb::CountRequest::new(&options.collection)
            .filter(options.search.filter.as_ref()),
    )?;
    let full = (options.search.k as u64).min(matching);
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
        report.short += found
            .hits
            .iter()
            .filter(|hits| (hits.len() as u64) < full)
            .count() as u64;
        latencies.extend(found.batch_latencies);
        let batch = results::to_batch(terms, (index * per) as u64, &found.hits);
        report.rows += batch.num_rows() as u64;
        results::write(&path, &[batch], &request_json).map_err(io(&path))?;
        bar.inc(terms.len() as u64);
        if let Some(ms) = std::env::var(TEST_DELAY_ENV)
            .ok()
            .and_then(|v| v.parse().ok())
        {
            std::thread::sleep(Duration::from_millis(ms));
        }
    }
    bar.finish_and_clear();
    join_parts(&parts, chunks.len(), &options.output, &request)?;
    report.latency = Percentiles::of(&latencies);
    Ok(report)
}

/// True when `options.output` already holds the answer to the request `options` makes
/// (nothing to embed); false otherwise, refusals included (`run` says them).
pub fn is_answered(options: &QueryOptions) -> bool {
    let request = QueryRequest::new(
        &options.terms,
        &options.collection,
        &options.search,
        &options.instruction,
        options.part_queries,
        &options.searched,
    );
    matches!(answered(&options.output, &request, false), Ok(true))
}

/// True when `output` holds the answer to `request`; false when it is missing, or made by
/// another request and `replace` allows overwriting it; refused otherwise.
fn answered(output: &Path, request: &QueryRequest, replace: bool) -> Result<bool, QueryError> {
    let not_results = |why: String| QueryError::NotResults {
        output: output.into(),
        why,
    };
    // What the path leads to (a link followed: a dangling one is no file, and the results
    // replace the link, never what it points at). A directory, a FIFO or a device is never
    // opened, and never replaced.
    let meta = match std::fs::metadata(output) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io(output)(e)),
        Ok(meta) => meta,
    };
    if !meta.is_file() {
        return Err(not_results("not a regular file".into()));
    }
    let stored = match results::read_request(output) {
        Ok(Some(json)) => serde_json::from_str::<QueryRequest>(&json).ok(),
        Ok(None) => None,
        Err(_) if replace => None,
        Err(e) => return Err(not_results(format!("not a parquet file: {e}"))),
    };
    match stored {
        Some(stored) if stored == *request => Ok(true),
        _ if replace => Ok(false),
        Some(stored) => Err(QueryError::OtherRequest {
            output: output.into(),
            differences: stored.differences(request),
        }),
        None => Err(not_results("its footer names no query request".into())),
    }
}

/// The request a parts folder was made for, when it has one that reads.
fn parts_request(parts: &Path) -> Option<QueryRequest> {
    let bytes = std::fs::read(parts.join("key.json")).ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn open_parts(options: &QueryOptions, request: &QueryRequest) -> Result<PathBuf, QueryError> {
    let parts = parts_dir(&options.output);
    if parts.exists() {
        match parts_request(&parts) {
            Some(stored) if stored == *request => {}
            _ if options.replace => std::fs::remove_dir_all(&parts).map_err(io(&parts))?,
            Some(stored) => {
                return Err(QueryError::Changed {
                    differences: stored.differences(request),
                    parts,
                })
            }
            None => {
                return Err(QueryError::Changed {
                    parts,
                    differences: vec!["its key.json is missing or unreadable".into()],
                })
            }
        }
    }
    std::fs::create_dir_all(&parts).map_err(io(&parts))?;
    atomic::remove_leftovers(&parts).map_err(io(&parts))?;
    let key_path = parts.join("key.json");
    if !key_path.is_file() {
        let json = serde_json::to_vec_pretty(request).expect("the key serialises. This is a bug.");
        atomic::write(&key_path, &json).map_err(io(&key_path))?;
    }
    Ok(parts)
}

/// Joins the parts into `output` (atomically, the request in its footer), then removes the
/// parts folder.
fn join_parts(
    parts: &Path,
    count: usize,
    output: &Path,
    request: &QueryRequest,
) -> Result<(), QueryError> {
    let mut batches = Vec::new();
    for index in 0..count {
        let path = parts.join(format!("part-{index:06}.parquet"));
        batches.extend(results::read(&path).map_err(io(&path))?);
    }
    if let Some(dir) = output.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let json = serde_json::to_string(request).expect("the request serialises. This is a bug.");
    results::write(output, &batches, &json).map_err(io(output))?;
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
