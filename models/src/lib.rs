//! Embedding models in candle, a folder per model family: loading, tokenizer conventions, the
//! forward pass, memory estimates and test assets.
//!
//! The embed job talks to a model through the small [`Embedder`] trait and
//! [`PackedSequences`] (one mini-batch's flat ids plus cumulative sequence lengths, as TEI's
//! `Batch`). Which implementation serves a model directory is decided once, from the
//! `model_type` of its `config.json`, by the [`registry`] (as TEI's candle backend matches on
//! the model type): [`load_embedder`], [`load_tokenizer`], [`verify_model_dir`] and
//! [`write_tiny_model`] go through it. Each family implements [`ModelFamily`]; the one family
//! today is Qwen3 ([`qwen3`]).

mod ab_switch;
pub mod attention;
pub mod attention_check;
pub mod attention_plan;
pub mod bert;
pub mod cpu;
pub mod device;
pub mod elementwise;
pub mod encoder;
pub mod error;
pub mod family;
#[cfg(feature = "cuda")]
pub mod fused;
pub mod gemma3;
pub mod layer_kinds;
pub mod memory;
pub mod modernbert;
pub mod packed;
pub mod projection;
pub mod qwen3;
pub mod registry;
pub mod rotary;
pub mod sentence;
pub mod stage_profile;
pub mod tiny;
pub mod tiny_tokenizers;
pub mod tokenizer;
pub mod verify;
pub mod weights;

pub use attention::AttentionKernel;
pub use attention_check::probe_attention;
pub use candle_core::DType;
pub use device::{
    build_cuda, build_for, build_table, driver_advice, driver_cuda, driver_cuda_version,
    driver_major, min_driver_for, parse_devices, runs_on, supported_gpus, BuildChoice, CudaVersion,
    DeviceSpec, KernelForm, CUDA_BUILD, CUDA_COMPUTE_CAP, CUDA_VERSION, KERNEL_FORM,
};
pub use error::{is_out_of_memory, ModelError, ModelResult};
pub use family::{
    LoadOptions, ModelFamily, ModelShape, ModelSummary, OutputDims, DEFAULT_ATTENTION_TILE,
};
pub use memory::MemoryEstimate;
pub use packed::{PackedSequences, SeqSpan};
pub use registry::{
    default_family, describe_vectors, families_help, family_of, known_model_types, load_embedder,
    load_tokenizer, model_layout, output_dims, query_instruction, verify_model_dir,
    write_tiny_model, write_tiny_model_of, write_tiny_model_with,
};
pub use sentence::{Pooling, SentenceLayout};
pub use tiny::TinyModelOptions;
pub use tokenizer::{Framing, QueryFormat, Specials, TextFormat, Tokenizer};

/// A model that turns packed token sequences into embeddings. Sync and object-safe: the
/// embed job keeps one `Box<dyn Embedder>` per device, on that device's own thread.
pub trait Embedder: Send + Sync {
    /// One L2-normalised f32 vector of [`Embedder::output_dim`] components per sequence, in
    /// batch order. A batch over the memory cap, or a device allocation failure, is
    /// [`ModelError::OutOfMemory`]: halve the batch and retry.
    fn embed(&self, batch: &PackedSequences) -> ModelResult<Vec<Vec<f32>>>;

    /// Longest sequence the model accepts, in tokens (including the appended EOS).
    fn max_position_embeddings(&self) -> usize;

    /// Width of the model's hidden state (the full embedding dimension).
    fn hidden_size(&self) -> usize;

    /// Width of the returned vectors (`hidden_size` unless a Matryoshka dim was set).
    fn output_dim(&self) -> usize;

    /// The dtype weights and activations are computed in (shard metadata records it); f32
    /// unless the model says otherwise.
    fn compute_dtype(&self) -> DType {
        DType::F32
    }

    /// Always false: batches are packed, so budget them by total tokens, not `max_len × n`.
    fn is_padded(&self) -> bool {
        false
    }

    /// Estimated peak bytes of embedding sequences of these lengths in one call.
    fn estimate_memory(&self, seq_lens: &[usize]) -> u64;

    /// Sets or clears the memory cap checked by `embed` before it runs a batch.
    fn set_memory_limit(&self, limit: Option<u64>);

    /// The most tokens one mini-batch should hold on this device, planned from the memory the
    /// device has free now (after loading) divided among the `workers` that run forwards on it
    /// at once (`cuda:0,0`: two); `None` where there is no such limit to plan by (the CPU).
    fn token_budget(&self, workers: usize) -> Option<u64> {
        let _ = workers;
        None
    }

    /// Free and total bytes of the model's device now, when it is a GPU.
    fn device_memory(&self) -> Option<(u64, u64)> {
        self.memory_probe().and_then(|probe| probe())
    }

    /// A query of [`Embedder::device_memory`] that another thread can run while this model
    /// computes (a benchmark's peak-memory sampler); `None` on the CPU.
    fn memory_probe(&self) -> Option<MemoryProbe> {
        None
    }

    /// Starts watching the peak of [`Embedder::device_memory`]'s use without polling (a GPU
    /// pool's high-water mark); the returned call gives the peak bytes in use since. `None`
    /// where there is none to read (the CPU): poll [`Embedder::memory_probe`] instead.
    fn watch_peak_memory(&self) -> Option<PeakWatch> {
        None
    }

    /// The attention kernel it runs (`tiled-cpu`, `blockwise`, `cudnn-fused`).
    fn attention_kernel(&self) -> &'static str {
        "blockwise"
    }

    /// Builds now whatever the attention kernel plans per shape, for mini-batches of these
    /// sequence lengths (a warm-up's work, kept out of timed forwards); returns the seconds
    /// it took. Nothing to build for the blockwise kernel.
    fn prepare_attention(&self, batches: &[Vec<usize>]) -> ModelResult<f64> {
        let _ = batches;
        Ok(0.0)
    }
}

impl std::fmt::Debug for dyn Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder")
            .field("output_dim", &self.output_dim())
            .field("compute_dtype", &self.compute_dtype())
            .field("attention", &self.attention_kernel())
            .finish()
    }
}

/// See [`Embedder::memory_probe`].
pub type MemoryProbe = Box<dyn Fn() -> Option<(u64, u64)> + Send>;

/// See [`Embedder::watch_peak_memory`].
pub type PeakWatch = Box<dyn FnOnce() -> Option<u64>>;

/// Keeps the first `dim` components of `v` and L2-normalises them (accumulated in f64): a
/// Matryoshka output dimension. A zero vector stays zero.
pub fn matryoshka(v: &[f32], dim: usize) -> Vec<f32> {
    let v = &v[..dim.min(v.len())];
    let norm = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    if norm == 0.0 {
        return v.to_vec();
    }
    v.iter().map(|&x| (x as f64 / norm) as f32).collect()
}
