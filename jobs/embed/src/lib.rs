//! The embed stage: the per-node embed job (`embedfleet embed-job`: one planned batch to parquet
//! shards) and the one-off `embedfleet embed` (any files to one parquet file).
//!
//! Like TEI's core, this crate drives the model through `embedfleet_models::Embedder` and knows
//! nothing of schedulers or Qdrant: the orchestrator starts jobs as processes of the `embedfleet`
//! binary, and the upload stage reads the shards this crate writes.

pub mod bench;
pub mod chunk;
pub mod device;
#[cfg(test)]
mod fake_device;
pub mod files;
pub mod job;
pub mod minibatch;
pub mod pipeline;

use embedfleet_core::settings::MiniBatchRule;
use embedfleet_core::shardfile::{ShardFileError, ShardMeta, ShardRow, ShardWriter};
use embedfleet_core::{Paper, Precision};
use embedfleet_models::{DeviceSpec, Embedder, LoadOptions, ModelError, TextRule, Tokenizer};
use pipeline::{Embedded, Encoding, PartOutcome};
use std::path::Path;
use std::time::{Duration, Instant};

pub use embedfleet_models::parse_devices;

/// The mini-batch rule with its token budget capped by `device_budget`, the tokens the
/// tightest device's free memory holds in one forward: the plan's budget is what batching
/// aims for, the device's what it can take. The study's rule is kept as it is (the
/// out-of-memory fallback catches what does not fit).
pub fn capped_rule(rule: MiniBatchRule, device_budget: Option<u64>) -> MiniBatchRule {
    match (rule, device_budget) {
        (MiniBatchRule::TokenBudget { max_tokens }, Some(device)) => MiniBatchRule::TokenBudget {
            max_tokens: max_tokens.min(device.max(1)),
        },
        (rule, _) => rule,
    }
}

/// Tokenizer threads on `cores` cores beside `gpu_workers` GPU worker threads: one core is
/// left to each worker, which must keep its GPU fed, and at least one thread tokenizes.
pub fn tokenize_threads(cores: usize, gpu_workers: usize) -> usize {
    cores.saturating_sub(gpu_workers).max(1)
}

/// For each worker's device, how many workers run on it (`cuda:0,0,1` gives 2, 2, 1): they
/// compute at once, so each plans with its share of the device's free memory.
pub fn workers_per_device(devices: &[DeviceSpec]) -> Vec<usize> {
    devices
        .iter()
        .map(|d| devices.iter().filter(|o| *o == d).count())
        .collect()
}

/// A model directory loaded once per device, with the tokenizer they share: the one embedder
/// setup of the embed job, `embed` and queries (load → context length → encode → embed → rows).
pub struct LoadedModels {
    pub models: Vec<Box<dyn Embedder>>,
    /// The device of each model (a GPU may appear more than once: workers that share it).
    pub devices: Vec<DeviceSpec>,
    pub tokenizer: Tokenizer,
    pub meta: ShardMeta,
    /// Wall time of loading all devices (in parallel).
    pub load_time: Duration,
}

/// How [`LoadedModels::load_with`] loads a model beyond its directory and devices. `Default`:
/// the model's own width, no memory cap, the device's dtype, native precision, texts as given
/// (today's sentence-transformers).
#[derive(Debug, Clone)]
pub struct ModelLoad {
    pub output_dim: Option<usize>,
    pub memory_limit: Option<u64>,
    /// `None`: f32 on the CPU, bf16 on a GPU.
    pub dtype: Option<embedfleet_models::DType>,
    pub precision: Precision,
    /// `precision` fp8 taken on the CPU too, by the library's emulation of the GPU's FP8
    /// arithmetic: the queries of an FP8 run, embedded by the function its documents were
    /// (slower than f32, which a query's few tokens afford; a run's jobs are refused instead).
    pub fp8_emulated_on_cpu: bool,
    /// How texts are prepared before they are tokenised (`--text-rule`); `None`: a run fixed
    /// before embedfleet recorded it ([`embedfleet_models::Tokenizer::with_text_rule`]).
    pub text_rule: Option<TextRule>,
}

impl Default for ModelLoad {
    fn default() -> Self {
        ModelLoad {
            output_dim: None,
            memory_limit: None,
            dtype: None,
            precision: Precision::Native,
            fp8_emulated_on_cpu: false,
            text_rule: Some(TextRule::default()),
        }
    }
}

/// What shard metadata says the vectors were computed in: the dtype (`bf16`), with `+fp8`
/// when the projections ran in FP8.
pub fn compute_label(model: &dyn Embedder) -> String {
    let dtype = format!("{:?}", model.compute_dtype()).to_lowercase();
    if model.fp8_projections() {
        format!("{dtype}+fp8")
    } else {
        dtype
    }
}

impl LoadedModels {
    /// Loads the model directory on every device, in parallel, with the implementation of
    /// its family (`config.json`'s `model_type`). `memory_limit` caps the model's own memory
    /// estimate per forward (a test hook for the out-of-memory fallback).
    pub fn load(
        model_dir: &Path,
        devices: &[DeviceSpec],
        output_dim: Option<usize>,
        memory_limit: Option<u64>,
    ) -> Result<Self, ModelError> {
        let how = ModelLoad {
            output_dim,
            memory_limit,
            ..ModelLoad::default()
        };
        Self::load_with(model_dir, devices, &how)
    }

    /// [`LoadedModels::load`] with every option: a compute dtype (`bench-gpu --dtype` compares
    /// a device's bf16 with its f32, or the CPU's) and the precision (`--precision fp8`,
    /// refused on the CPU before anything loads: it would be slower there, not faster).
    pub fn load_with(
        model_dir: &Path,
        devices: &[DeviceSpec],
        how: &ModelLoad,
    ) -> Result<Self, ModelError> {
        let started = Instant::now();
        let fp8 = how.precision == Precision::Fp8;
        // EMBEDFLEET_FP8_EMULATE=1: the CPU's emulation (slow, for the GPU check's dry run on a
        // CPU machine, which runs the script's FP8 step end to end), never for a run.
        let emulate = how.fp8_emulated_on_cpu
            || std::env::var("EMBEDFLEET_FP8_EMULATE").as_deref() == Ok("1");
        if fp8 && !emulate && devices.iter().any(|d| matches!(d, DeviceSpec::Cpu)) {
            let reason = embedfleet_models::fp8::refusal(None).unwrap_or_default();
            return Err(ModelError::PrecisionRefused { reason });
        }
        let family = embedfleet_models::family_of(model_dir)?;
        if devices.iter().any(|d| matches!(d, DeviceSpec::Cpu)) {
            // A CPU forward allocates its activations afresh each time: keep freed memory
            // rather than fault it in again (about 15 % of a BERT-base forward).
            embedfleet_models::cpu::allocator::keep_freed_memory();
        }
        let loaded: Vec<Result<Box<dyn Embedder>, ModelError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = devices
                .iter()
                .map(|device| {
                    let options = LoadOptions {
                        device: *device,
                        output_dim: how.output_dim,
                        memory_limit: how.memory_limit,
                        dtype: how.dtype,
                        fp8_projections: fp8,
                        ..LoadOptions::default()
                    };
                    scope.spawn(move || family.load(model_dir, &options))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a model loader panicked. This is a bug."))
                .collect()
        });
        let models = loaded.into_iter().collect::<Result<Vec<_>, _>>()?;
        let first = models.first().ok_or_else(|| ModelError::InvalidDevice {
            spec: String::new(),
            reason: "no device given".into(),
        })?;
        let tokenizer = family.tokenizer(model_dir, how.text_rule)?;
        let layout = family.layout(model_dir)?;
        if !layout.from_files && family.layout_defaults().say_when_used {
            // Said once per job: the vectors follow the family's conventions, not the card's.
            tracing::warn!(
                dir = %model_dir.display(),
                pooling = layout.pooling.name(),
                document_prompt = %layout.document_prompt,
                "the model directory has no sentence-transformers files (modules.json): \
                 pooling and prompts are the {} family's defaults",
                family.name()
            );
        }
        let meta = ShardMeta {
            model: model_name(model_dir),
            model_revision: model_revision(model_dir),
            compute_dtype: compute_label(first.as_ref()),
            pooling: layout.pooling.name().into(),
            document_prompt: layout.document_prompt.clone(),
            text_rule: how.text_rule.map(|r| r.name().to_string()),
            normalized: true,
            dim: first.output_dim(),
            embedfleet_version: env!("CARGO_PKG_VERSION").into(),
            timings: None,
        };
        Ok(LoadedModels {
            models,
            devices: devices.to_vec(),
            tokenizer,
            meta,
            load_time: started.elapsed(),
        })
    }

    /// How texts become token sequences for these models: sequences of at most `max_tokens`
    /// (EOS included; `None`: the model's context, and never more), cut into mini-batches by
    /// `rule`, as queries with `query_instruction` when it is given. A token budget is capped
    /// by what the devices' free memory holds (see [`capped_rule`]). Tokenisation leaves one
    /// core to each GPU worker.
    pub fn encoding(
        &self,
        max_tokens: Option<usize>,
        rule: MiniBatchRule,
        query_instruction: Option<String>,
    ) -> Encoding<'_> {
        let (rule, gpu_workers) = self.device_rule(rule);
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Encoding {
            tokenizer: &self.tokenizer,
            max_len: max_tokens
                .unwrap_or(usize::MAX)
                .min(self.models[0].max_position_embeddings()),
            rule,
            query_instruction,
            tokenize_threads: tokenize_threads(cores, gpu_workers),
        }
    }

    /// `rule` with its token budget capped by the tightest device's free memory (see
    /// [`capped_rule`]), a device's memory divided among the workers that share it, and how
    /// many devices plan by memory (the GPU workers).
    pub fn device_rule(&self, rule: MiniBatchRule) -> (MiniBatchRule, usize) {
        let sharing = workers_per_device(&self.devices);
        let budgets: Vec<u64> = self
            .models
            .iter()
            .zip(sharing.into_iter().chain(std::iter::repeat(1)))
            .filter_map(|(m, workers)| m.token_budget(workers))
            .collect();
        let rule = capped_rule(rule, budgets.iter().copied().min());
        if let MiniBatchRule::TokenBudget { max_tokens } = &rule {
            tracing::info!(max_tokens, ?budgets, "mini-batch token budget");
        }
        (rule, budgets.len())
    }

    /// Embeds a stream of parts on every device (see [`pipeline::embed_parts`]).
    pub fn embed_parts<E>(
        &self,
        parts: impl Iterator<Item = Vec<Paper>> + Send,
        encoding: &Encoding,
        on_part: impl FnMut(Vec<Paper>, PartOutcome) -> Result<(), E>,
    ) -> Result<(), E> {
        pipeline::embed_parts(&self.models, parts, encoding, on_part)
    }

    /// Query vectors of `texts` (in the family's query format), in order, through
    /// the same pipeline as papers: a long query is embedded in chunks, never cut.
    pub fn embed_queries(
        &self,
        instruction: &str,
        texts: &[String],
        batch_tokens: u64,
    ) -> Result<Vec<Vec<f32>>, QueryEmbedError> {
        let rule = MiniBatchRule::TokenBudget {
            max_tokens: batch_tokens,
        };
        let encoding = self.encoding(None, rule, Some(instruction.to_string()));
        let papers: Vec<Paper> = texts
            .iter()
            .enumerate()
            .map(|(i, text)| Paper {
                id: i.to_string(),
                text: text.clone(),
                ..Paper::default()
            })
            .collect();
        let mut vectors = Vec::with_capacity(texts.len());
        self.embed_parts(std::iter::once(papers), &encoding, |_, outcome| {
            for (index, result) in outcome.results.into_iter().enumerate() {
                let embedded = result.map_err(|why| QueryEmbedError::Failed { index, why })?;
                vectors.push(embedded.vector);
            }
            Ok::<(), QueryEmbedError>(())
        })?;
        Ok(vectors)
    }
}

/// Why queries could not be embedded.
#[derive(Debug, thiserror::Error)]
pub enum QueryEmbedError {
    /// The model could not be loaded.
    #[error("failed to load the model: {0}")]
    Model(ModelError),
    /// One query failed in the model (its tokenizer or its forward).
    #[error("query {index} could not be embedded: {why}")]
    Failed { index: usize, why: String },
}

impl QueryEmbedError {
    /// The model was refused by this node's device (`ModelError::is_device_refusal`: FP8 on
    /// an A100): the query job exits 5, as an embed job does.
    pub fn is_device_refusal(&self) -> bool {
        matches!(self, QueryEmbedError::Model(e) if e.is_device_refusal())
    }
}

/// Said in the message, so not returned as the source (`embedfleet_core::cause`): no
/// `#[from]`, which would return it.
impl From<ModelError> for QueryEmbedError {
    fn from(e: ModelError) -> Self {
        Self::Model(e)
    }
}

/// The query vector of `text` with the model of `model_dir` on the CPU (the sample query of
/// `embedfleet run`).
pub fn embed_query(
    model_dir: &Path,
    output_dim: Option<usize>,
    instruction: &str,
    text: &str,
) -> Result<Vec<f32>, QueryEmbedError> {
    let loaded = LoadedModels::load(model_dir, &[DeviceSpec::Cpu], output_dim, None)?;
    let mut vectors = loaded.embed_queries(instruction, &[text.to_string()], 32_768)?;
    Ok(vectors.pop().expect("one vector per query. This is a bug."))
}

/// Writes one part's embedded papers as rows of `writer`; returns the papers that failed, with
/// why (they go to the quarantine).
pub fn write_rows(
    writer: &mut ShardWriter,
    papers: &[Paper],
    results: &[Result<Embedded, String>],
) -> Result<Vec<(String, String)>, ShardFileError> {
    let mut failed = Vec::new();
    for (paper, result) in papers.iter().zip(results) {
        match result {
            Ok(e) => writer.push(&ShardRow {
                paper,
                vector: &e.vector,
                n_chars: paper.n_chars() as u32,
                n_tokens: e.n_tokens,
                n_chunks: e.n_chunks,
            })?,
            Err(why) => failed.push((paper.id.clone(), why.clone())),
        }
    }
    Ok(failed)
}

fn model_name(dir: &Path) -> String {
    let canonical = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    canonical
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| dir.display().to_string())
}

/// A short hash of config.json and the weight files' fingerprints (size and first and last
/// MiB): different weights give a different revision without hashing gigabytes.
pub fn model_revision(dir: &Path) -> String {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    if let Ok(config) = std::fs::read(dir.join("config.json")) {
        hasher.update(&config);
    }
    let mut weights: Vec<_> = std::fs::read_dir(dir)
        .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    weights.retain(|p: &std::path::PathBuf| p.extension().is_some_and(|e| e == "safetensors"));
    weights.sort();
    for path in weights {
        if let Ok(fp) = embedfleet_core::fingerprint::Fingerprint::of(&path) {
            hasher.update(&fp.size.to_le_bytes());
            hasher.update(fp.edges.as_bytes());
        }
    }
    format!("{:016x}", hasher.digest())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake_device::FakeDevice;

    #[test]
    fn the_device_caps_a_token_budget_and_leaves_the_study_rule_alone() {
        let plan = MiniBatchRule::TokenBudget { max_tokens: 65_536 };
        assert_eq!(
            capped_rule(plan.clone(), Some(20_000)),
            MiniBatchRule::TokenBudget { max_tokens: 20_000 }
        );
        assert_eq!(capped_rule(plan.clone(), Some(1 << 20)), plan);
        assert_eq!(capped_rule(plan.clone(), None), plan);
        let study = MiniBatchRule::STUDY;
        assert_eq!(capped_rule(study.clone(), Some(10)), study);
    }

    #[test]
    fn workers_on_one_device_are_counted_per_device() {
        use DeviceSpec::{Cpu, Cuda};
        assert_eq!(
            workers_per_device(&[Cuda(0), Cuda(0), Cuda(1)]),
            vec![2, 2, 1]
        );
        assert_eq!(workers_per_device(&[Cuda(0), Cuda(1)]), vec![1, 1]);
        assert_eq!(workers_per_device(&[Cpu]), vec![1]);
    }

    #[test]
    fn two_workers_on_one_gpu_each_plan_with_half_its_memory() {
        let dir = tempfile::tempdir().unwrap();
        embedfleet_models::write_tiny_model(dir.path(), 0).unwrap();
        let tokenizer = embedfleet_models::load_tokenizer(dir.path(), None).unwrap();
        let loaded = |devices: Vec<DeviceSpec>| LoadedModels {
            models: devices
                .iter()
                .map(|_| {
                    Box::new(FakeDevice {
                        free: Some(40_000),
                        ..FakeDevice::default()
                    }) as Box<dyn Embedder>
                })
                .collect(),
            devices,
            tokenizer: tokenizer.clone(),
            meta: ShardMeta {
                model: "fake".into(),
                model_revision: String::new(),
                compute_dtype: "bf16".into(),
                pooling: "last_token".into(),
                document_prompt: String::new(),
                text_rule: None,
                normalized: true,
                dim: 4,
                embedfleet_version: String::new(),
                timings: None,
            },
            load_time: Duration::ZERO,
        };
        let plan = MiniBatchRule::TokenBudget {
            max_tokens: 1 << 20,
        };
        let (alone, workers) = loaded(vec![DeviceSpec::Cuda(0)]).device_rule(plan.clone());
        assert_eq!(alone, MiniBatchRule::TokenBudget { max_tokens: 40_000 });
        assert_eq!(workers, 1);
        let (shared, workers) =
            loaded(vec![DeviceSpec::Cuda(0), DeviceSpec::Cuda(0)]).device_rule(plan.clone());
        assert_eq!(shared, MiniBatchRule::TokenBudget { max_tokens: 20_000 });
        assert_eq!(workers, 2);
        // Two GPUs of one worker each: each has all of its own.
        let (apart, _) = loaded(vec![DeviceSpec::Cuda(0), DeviceSpec::Cuda(1)]).device_rule(plan);
        assert_eq!(apart, MiniBatchRule::TokenBudget { max_tokens: 40_000 });
    }

    #[test]
    fn tokenizers_leave_a_core_to_each_gpu_worker() {
        assert_eq!(tokenize_threads(16, 4), 12);
        assert_eq!(tokenize_threads(16, 0), 16);
        assert_eq!(tokenize_threads(4, 4), 1);
        assert_eq!(tokenize_threads(2, 8), 1);
    }
}
