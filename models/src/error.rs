//! The one error type of the models crate.
//!
//! Every variant that concerns a file names it, and every variant that concerns a tensor names
//! the tensor, so a user with a broken model directory knows what to fix. Callers that act on
//! an error (the embed job's out-of-memory fallback) match on the variant, never on the text.

use std::path::PathBuf;

/// Result alias used across the crate's public API.
pub type ModelResult<T> = Result<T, ModelError>;

/// Everything that can go wrong while loading or running an embedding model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file the model directory must contain is absent.
    #[error("missing file {path}: {hint}")]
    MissingFile { path: PathBuf, hint: &'static str },

    /// A file exists but could not be read.
    #[error("failed to read {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// `config.json` is not valid JSON or lacks a required field.
    #[error("invalid model config {path}: {source}")]
    ConfigParse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    /// `config.json` parses but describes a model this crate does not implement.
    #[error("unsupported model config {path}: {reason}")]
    UnsupportedConfig { path: PathBuf, reason: String },

    /// `model.safetensors.index.json` is malformed.
    #[error("invalid safetensors index {path}: {reason}")]
    InvalidIndex { path: PathBuf, reason: String },

    /// A safetensors file could not be opened or its header parsed.
    #[error("failed to open safetensors file {path}: {source}")]
    Safetensors {
        path: PathBuf,
        #[source]
        source: Box<candle_core::Error>,
    },

    /// A weight the architecture needs is in none of the weight files.
    #[error("missing tensor `{name}` (also tried `model.{name}`) in {searched}")]
    MissingTensor { name: String, searched: String },

    /// A weight exists with a shape that does not match `config.json`.
    #[error("tensor `{name}` in {path} has shape {actual:?}, config.json implies {expected:?}")]
    TensorShape {
        name: String,
        path: PathBuf,
        expected: Vec<usize>,
        actual: Vec<usize>,
    },

    /// A weight could not be read or converted (unsupported dtype, truncated file).
    #[error("failed to load tensor `{name}` from {path}: {source}")]
    TensorLoad {
        name: String,
        path: PathBuf,
        #[source]
        source: Box<candle_core::Error>,
    },

    /// `tokenizer.json` could not be loaded or used.
    #[error("tokenizer {path}: {reason}")]
    Tokenizer { path: PathBuf, reason: String },

    /// The tokenizer has no `<|endoftext|>` token, which last-token pooling needs.
    #[error("tokenizer {path} has no `<|endoftext|>` token; use the tokenizer.json shipped with the Qwen3 model")]
    MissingEos { path: PathBuf },

    /// A batch handed to `embed` is malformed (bad `cu_seqlens`, empty sequence, id out of range).
    #[error("invalid token batch: {0}")]
    InvalidBatch(String),

    /// A sequence is longer than the model's context; the caller must split it into chunks.
    #[error("sequence {index} has {len} tokens, more than the model's {max} positions; split it into chunks")]
    SequenceTooLong {
        index: usize,
        len: usize,
        max: usize,
    },

    /// A Matryoshka output dimension outside `1..=hidden_size`.
    #[error("output dimension {dim} is not in 1..={hidden}")]
    InvalidDim { dim: usize, hidden: usize },

    /// A device string such as `cuda:x` that cannot be parsed or opened.
    #[error("invalid device `{spec}`: {reason}")]
    InvalidDevice { spec: String, reason: String },

    /// The mini-batch does not fit in memory: halve it and retry.
    ///
    /// Raised either by the memory cap (`needed`/`limit` set) or by a CUDA allocation failure.
    #[error("out of memory: {detail}; retry with a smaller batch")]
    OutOfMemory {
        needed: Option<u64>,
        limit: Option<u64>,
        detail: String,
    },

    /// Any other failure inside the tensor backend.
    #[error("model backend failed: {0}")]
    Backend(Box<candle_core::Error>),
}

impl From<candle_core::Error> for ModelError {
    /// Lifts a backend error, turning a CUDA out-of-memory into [`ModelError::OutOfMemory`].
    fn from(err: candle_core::Error) -> Self {
        if is_out_of_memory(&err) {
            return ModelError::OutOfMemory {
                needed: None,
                limit: None,
                detail: err.to_string(),
            };
        }
        ModelError::Backend(Box::new(err))
    }
}

/// True when a candle error is a device allocation failure.
///
/// candle boxes CUDA driver errors in `Error::Cuda`; the driver's own code
/// (`CUDA_ERROR_OUT_OF_MEMORY`) and cuBLAS' `CUBLAS_STATUS_ALLOC_FAILED` are the typed
/// values inside, which we read through their `Debug` form because cudarc's types only exist
/// with the `cuda` feature. Wrapping variants (`Context`, `WithBacktrace`, ...) are unwrapped.
pub fn is_out_of_memory(err: &candle_core::Error) -> bool {
    use candle_core::Error as E;
    match err {
        E::Cuda(inner) => {
            let text = format!("{inner:?}");
            text.contains("OUT_OF_MEMORY") || text.contains("ALLOC_FAILED")
        }
        E::WithBacktrace { inner, .. } => is_out_of_memory(inner),
        E::WithPath { inner, .. } => is_out_of_memory(inner),
        E::Context { inner, .. } => is_out_of_memory(inner),
        _ => false,
    }
}
