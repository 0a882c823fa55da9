//! The one error type of the models crate.
//!
//! Every variant that concerns a file names it, and every variant that concerns a tensor names
//! the tensor, so a user with a broken model directory knows what to fix. Callers that act on
//! an error (the embed job's out-of-memory fallback) match on the variant, never on the text.
//! A variant says its cause in its message (`cause`) and does not also return it as its
//! source, so the cause is said once wherever the error is printed (the rule
//! `embedfleet_core::cause` states for the other crates; this crate depends on none of them).

use std::path::{Path, PathBuf};

/// Result alias used across the crate's public API.
pub type ModelResult<T> = Result<T, ModelError>;

/// Everything that can go wrong while loading or running an embedding model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The model directory itself is absent (a typo, an unmounted filesystem) or is a file.
    #[error("{path} {what}: give the directory that holds the model's config.json, tokenizer and weights")]
    NoModelDir { path: PathBuf, what: &'static str },

    /// A file the model directory must contain is absent.
    #[error("missing file {path}: {hint}")]
    MissingFile { path: PathBuf, hint: &'static str },

    /// A file exists but could not be read.
    #[error("failed to read {path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },

    /// `config.json` is not valid JSON or lacks a required field.
    #[error("invalid model config {path}: {cause}")]
    ConfigParse {
        path: PathBuf,
        cause: serde_json::Error,
    },

    /// `config.json` parses but describes a model this crate does not implement.
    #[error("unsupported model config {path}: {reason}")]
    UnsupportedConfig { path: PathBuf, reason: String },

    /// `model.safetensors.index.json` is malformed.
    #[error("invalid safetensors index {path}: {reason}")]
    InvalidIndex { path: PathBuf, reason: String },

    /// A safetensors file could not be opened or its header parsed.
    #[error("failed to open safetensors file {path}: {cause}")]
    Safetensors {
        path: PathBuf,
        cause: Box<candle_core::Error>,
    },

    /// A weight the architecture needs is in none of the weight files.
    #[error("missing tensor `{name}` (also tried it after a task head's `model.`, `bert.`, `roberta.`) in {searched}")]
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
    #[error("failed to load tensor `{name}` from {path}: {cause}")]
    TensorLoad {
        name: String,
        path: PathBuf,
        cause: Box<candle_core::Error>,
    },

    /// `tokenizer.json` could not be loaded or used.
    #[error("tokenizer {path}: {reason}")]
    Tokenizer { path: PathBuf, reason: String },

    /// The tokenizer has no end-of-sequence token (`<|endoftext|>` for Qwen3), which
    /// last-token pooling needs.
    #[error("tokenizer {path} has no `{token}` token; use the tokenizer.json shipped with the {family} model")]
    MissingEos {
        path: PathBuf,
        token: &'static str,
        family: &'static str,
    },

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

    /// A Matryoshka width the model was not trained for.
    #[error(
        "--dim {dim}: this model's vectors are trained at {} dimensions only; give one of those \
         or leave --dim out",
        trained.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
    )]
    UntrainedDim { dim: usize, trained: Vec<usize> },

    /// A `model_type` no family of this build has.
    #[error("no model family `{model_type}` in this build; known model types: {known}")]
    UnknownFamily { model_type: String, known: String },

    /// `--precision` asked for what this model or dtype cannot give, on any node; the reason
    /// says what to do.
    #[error("{reason}")]
    PrecisionRefused { reason: String },

    /// This node's device cannot give what is asked (FP8 on a GPU without FP8 tensor cores,
    /// an FP8 kernel that failed its check on this GPU): another node may.
    #[error("{reason}")]
    DeviceRefused { reason: String },

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

    /// The fused attention kernel cannot run on this device (no cuDNN, a GPU it does not
    /// support, or results that disagree with the reference at start-up).
    #[error(
        "the fused attention kernel cannot run on {device}: {reason}; \
         EMBEDFLEET_ATTENTION=blockwise runs the slower blockwise kernel instead"
    )]
    AttentionKernel { device: String, reason: String },

    /// Any other failure inside the tensor backend.
    #[error("model backend failed: {0}")]
    Backend(Box<candle_core::Error>),
}

/// The text of a file of a model directory; a missing one is [`ModelError::MissingFile`] with
/// `hint`, any other failure [`ModelError::Io`].
pub fn read_model_file(path: &Path, hint: &'static str) -> ModelResult<String> {
    std::fs::read_to_string(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => ModelError::MissingFile {
            path: path.to_path_buf(),
            hint,
        },
        _ => ModelError::Io {
            path: path.to_path_buf(),
            cause: source,
        },
    })
}

impl ModelError {
    /// Whether this node's device refused, where another node may not: FP8 on a GPU without
    /// its tensor cores or failing its check, and the fused attention refused here (no usable
    /// cuDNN, a GPU it does not support, a start-up self-test that disagreed). The embed job
    /// exits `embedfleet_core::exit::DEVICE_REFUSED` (5) for these.
    pub fn is_device_refusal(&self) -> bool {
        matches!(
            self,
            ModelError::DeviceRefused { .. } | ModelError::AttentionKernel { .. }
        )
    }
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

/// True when a candle error is a device allocation failure: the driver's
/// `CUDA_ERROR_OUT_OF_MEMORY` or cuBLAS' `CUBLAS_STATUS_ALLOC_FAILED`, read from the typed
/// error candle boxes in `Error::Cuda` (never from its text). Wrapping variants (`Context`,
/// `WithBacktrace`, ...) are unwrapped. Without the `cuda` feature no backend error is one.
pub fn is_out_of_memory(err: &candle_core::Error) -> bool {
    use candle_core::Error as E;
    match err {
        #[cfg(feature = "cuda")]
        E::Cuda(inner) => cuda_out_of_memory(inner.as_ref()),
        E::WithBacktrace { inner, .. } => is_out_of_memory(inner),
        E::WithPath { inner, .. } => is_out_of_memory(inner),
        E::Context { inner, .. } => is_out_of_memory(inner),
        _ => false,
    }
}

#[cfg(feature = "cuda")]
fn cuda_out_of_memory(inner: &(dyn std::error::Error + Send + Sync + 'static)) -> bool {
    use candle_core::cuda_backend::cudarc::cublas::sys::cublasStatus_t;
    use candle_core::cuda_backend::cudarc::driver::sys::CUresult;
    use candle_core::cuda_backend::CudaError;
    match inner.downcast_ref::<CudaError>() {
        Some(CudaError::Cuda(e)) => e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY,
        Some(CudaError::Load { cuda, .. }) => cuda.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY,
        Some(CudaError::Cublas(e)) => e.0 == cublasStatus_t::CUBLAS_STATUS_ALLOC_FAILED,
        _ => false,
    }
}

/// The typed out-of-memory error a kernel of our own reports (the fused attention's shim when
/// cuDNN or its workspace cannot allocate), so that [`is_out_of_memory`] sees it as the
/// driver's own.
#[cfg(feature = "cuda")]
pub fn cuda_out_of_memory_error() -> candle_core::Error {
    use candle_core::cuda_backend::cudarc::driver::{sys::CUresult, DriverError};
    use candle_core::cuda_backend::CudaError;
    candle_core::Error::Cuda(Box::new(CudaError::Cuda(DriverError(
        CUresult::CUDA_ERROR_OUT_OF_MEMORY,
    ))))
}
