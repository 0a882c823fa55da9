//! What a model family is to the rest of the crate and to the embed job: the [`ModelFamily`]
//! trait, and the family-neutral types it speaks in ([`LoadOptions`], [`ModelShape`],
//! [`ModelSummary`], and the tokenizer's [`TextFormat`]).
//!
//! A family is one folder under `models/src/` (Qwen3's is `qwen3/`) with one type implementing
//! [`ModelFamily`], listed once in [`crate::registry::FAMILIES`]. Everything that differs between
//! architectures sits behind it: the `config.json` it reads, the tensors it loads, its memory
//! model, its end-of-sequence and query conventions, the checks of a directory and the tiny test
//! model. Inside a family, code works in `candle_core::Result`; the trait's methods return
//! [`ModelError`](crate::ModelError).

use std::path::{Path, PathBuf};

use candle_core::DType;

use crate::device::DeviceSpec;
use crate::embedder::Embedder;
use crate::error::ModelResult;
use crate::sentence::{LayoutDefaults, SentenceLayout};
use crate::text_rule::TextRule;
use crate::tiny::TinyModelOptions;
use crate::tokenizer::{QueryFormat, TextFormat, Tokenizer};

/// Default attention tile (query and key tokens per tile).
pub const DEFAULT_ATTENTION_TILE: usize = 512;

/// How to load a model directory. `Default` is CPU, f32, full dimension, no memory cap.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub device: DeviceSpec,
    /// Compute dtype; `None` picks f32 on CPU and bf16 on CUDA.
    pub dtype: Option<DType>,
    /// Matryoshka output dimension: keep the first `dim` components, then renormalise.
    pub output_dim: Option<usize>,
    /// Query/key tokens per attention tile; bounds the attention workspace.
    pub attention_tile: usize,
    /// When set, `embed` fails with `OutOfMemory` if a batch's estimate exceeds it (bytes).
    pub memory_limit: Option<u64>,
    /// FP8 projections (`--precision fp8`, [`crate::fp8`]): Qwen3's only; a GPU of compute
    /// capability 8.9 or newer in bf16, or the emulation on the CPU (the library's, for tests:
    /// the embed job refuses it there).
    pub fp8_projections: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            device: DeviceSpec::Cpu,
            dtype: None,
            output_dim: None,
            attention_tile: DEFAULT_ATTENTION_TILE,
            memory_limit: None,
            fp8_projections: false,
        }
    }
}

/// A model's dimensions as `config.json` gives them, in words every family shares: what
/// `doctor` prints and `bench-gpu` counts FLOPs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelShape {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    /// Longest sequence the model takes, in tokens.
    pub max_position_embeddings: usize,
    /// Parameters, the embedding table included (no LM head).
    pub parameters: u64,
}

impl ModelShape {
    /// Parameters outside the embedding table (the ones a token's forward multiplies by).
    pub fn non_embedding_parameters(&self) -> u64 {
        self.parameters - (self.vocab_size * self.hidden_size) as u64
    }
}

/// The vector widths a model directory can give (`--dim`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputDims {
    /// Any width up to this one (Qwen3-Embedding's Matryoshka training: the first N
    /// components, renormalised).
    UpTo(usize),
    /// Only these widths, the full one first (a BERT's one width; EmbeddingGemma's 768, 512,
    /// 256, 128).
    Trained(Vec<usize>),
}

impl OutputDims {
    /// The full width.
    pub fn full(&self) -> usize {
        match self {
            OutputDims::UpTo(n) => *n,
            OutputDims::Trained(dims) => dims[0],
        }
    }

    /// Why `dim` is not one of these, in a user's words; `None` when it is.
    pub fn refuse(&self, dim: usize) -> Option<String> {
        match self {
            OutputDims::UpTo(n) if (1..=*n).contains(&dim) => None,
            OutputDims::UpTo(n) => Some(format!(
                "gives {n}-dimensional vectors; give --dim from 1 to {n} (its first N components, \
                 renormalised), or leave it out for all {n}"
            )),
            OutputDims::Trained(dims) if dims.contains(&dim) => None,
            OutputDims::Trained(dims) => {
                Some(format!(
                "is trained for {} dimensions only; give one of those, or leave --dim out for {}",
                dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "),
                dims[0]
            ))
            }
        }
    }
}

/// What a checked model directory holds (see [`ModelFamily::verify`]).
#[derive(Debug, Clone)]
pub struct ModelSummary {
    /// The family's `model_type` (`qwen3`).
    pub model_type: &'static str,
    pub shape: ModelShape,
    pub weight_files: Vec<PathBuf>,
    /// Bytes of the weight files.
    pub weight_bytes: u64,
    pub tensors: usize,
}

/// One model architecture: everything that tells it from another, behind one type. The
/// registry picks it by `config.json`'s `model_type`; callers never name the family.
pub trait ModelFamily: Send + Sync {
    /// The `model_type` of `config.json` this family implements (`qwen3`): the registry's key.
    fn model_type(&self) -> &'static str;

    /// The checkpoint classes (`config.json`'s `architectures`) whose weights it reads; the
    /// registry names the family to a user whose `config.json` lacks a `model_type`.
    fn architectures(&self) -> &'static [&'static str];

    /// Its name in messages (`Qwen3`).
    fn name(&self) -> &'static str;

    /// Its special tokens and query format.
    fn text_format(&self) -> TextFormat;

    /// The pooling, dense modules and prompts of a directory without sentence-transformers
    /// files, and the poolings the family computes.
    fn layout_defaults(&self) -> LayoutDefaults;

    /// What `dir`'s sentence-transformers files say follows the transformer and which prompts
    /// its inputs carry, else [`ModelFamily::layout_defaults`].
    fn layout(&self, dir: &Path) -> ModelResult<SentenceLayout> {
        SentenceLayout::read(dir, &self.layout_defaults())
    }

    /// The task a query is embedded with when none is given: for a family that wraps the
    /// task in its own words (Qwen3) the retrieval instruction of its model card; for one
    /// whose queries carry a prompt, the default query prompt ([`ModelFamily::query_instruction`]
    /// reads a directory's own).
    fn default_instruction(&self) -> &'static str;

    /// The instruction `dir`'s queries are embedded with when none is given: the family's
    /// task, or the directory's query prompt.
    fn query_instruction(&self, dir: &Path) -> ModelResult<String> {
        Ok(match self.text_format().query {
            QueryFormat::Instructed(_) => self.default_instruction().to_string(),
            QueryFormat::Prompt => self.layout(dir)?.query_prompt,
        })
    }

    /// A checkpoint of this family, as the help names one (`Qwen/Qwen3-Embedding-4B`).
    fn example_checkpoint(&self) -> &'static str;

    /// How a query is written for the model, with placeholders (`Instruct: <query
    /// instruction>\nQuery:<query>`, `<query prompt><query>`): what a dataset card tells its
    /// readers to embed.
    fn query_example(&self) -> String {
        self.text_format()
            .format_query(self.query_placeholder(), "<query>")
    }

    /// The placeholder of a query's instruction in [`ModelFamily::query_example`].
    fn query_placeholder(&self) -> &'static str {
        match self.text_format().query {
            QueryFormat::Instructed(_) => "<query instruction>",
            QueryFormat::Prompt => "<query prompt>",
        }
    }

    /// Loads the model directory `dir` on `opts.device`, checking every weight against its
    /// `config.json`; unsupported set-ups fail here, never mid-run.
    fn load(&self, dir: &Path, opts: &LoadOptions) -> ModelResult<Box<dyn Embedder>>;

    /// The dimensions of `dir`'s `config.json`; no weight is read.
    fn shape(&self, dir: &Path) -> ModelResult<ModelShape>;

    /// The widths `dir`'s vectors can have; no weight is read.
    fn output_dims(&self, dir: &Path) -> ModelResult<OutputDims> {
        Ok(OutputDims::UpTo(self.shape(dir)?.hidden_size))
    }

    /// Checks `dir` without loading its weights, as a login node can (no GPU, little memory):
    /// `config.json` valid, every weight file's header readable, a few tensors present with
    /// the config's shapes, `tokenizer.json` usable. The first problem is the error.
    fn verify(&self, dir: &Path) -> ModelResult<ModelSummary>;

    /// Writes a tiny random model of this family in the Hugging Face layout (for tests and
    /// demos); the same options always give the same bytes. Returns the files written.
    fn write_tiny_model(&self, dir: &Path, opts: &TinyModelOptions) -> ModelResult<Vec<PathBuf>>;

    /// `dir`'s `tokenizer.json`, with this family's conventions, the directory's document
    /// prompt and `do_lower_case`, texts prepared by `rule` (see [`Tokenizer::with_text_rule`]).
    fn tokenizer(&self, dir: &Path, rule: Option<TextRule>) -> ModelResult<Tokenizer> {
        let layout = self.layout(dir)?;
        Tokenizer::from_file(&dir.join("tokenizer.json"), self.text_format())?
            .with_text_rule(rule, layout.lowercase)
            .with_document_prompt(&layout.document_prompt)
    }
}
