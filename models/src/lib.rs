//! Qwen3-Embedding in candle: loading, tokenizer, the embedding forward pass, memory
//! estimates and test assets.
//!
//! The embed job talks to a model through the small [`Embedder`] trait and
//! [`PackedSequences`] (one mini-batch's flat ids plus cumulative sequence lengths, as TEI's
//! `Batch`). The only
//! implementation is [`Qwen3Embedder`]; [`write_tiny_model`] writes a small random model in
//! the Hugging Face layout for tests.

pub mod attention;
pub mod attention_plan;
pub mod config;
pub mod device;
pub mod embedder;
pub mod error;
#[cfg(feature = "cuda")]
pub mod fused;
pub mod memory;
pub mod qwen3;
pub mod tiny;
pub mod tokenizer;
pub mod verify;
pub mod vocab;
pub mod weights;

pub use attention::AttentionKernel;
pub use candle_core::DType;
pub use config::Config;
pub use device::{
    build_cuda, build_for, build_table, driver_advice, driver_cuda, driver_cuda_version,
    driver_major, min_driver_for, parse_devices, runs_on, supported_gpus, BuildChoice, CudaVersion,
    DeviceSpec, KernelForm, CUDA_BUILD, CUDA_COMPUTE_CAP, CUDA_VERSION, KERNEL_FORM,
};
pub use embedder::{
    matryoshka, probe_attention, LoadOptions, Qwen3Embedder, DEFAULT_ATTENTION_TILE,
};
pub use error::{is_out_of_memory, ModelError, ModelResult};
pub use memory::{estimate_memory, max_tokens_per_forward, token_budget, MemoryEstimate};
pub use tiny::{tiny_config, write_tiny_model, write_tiny_model_with, TinyModelOptions};
pub use tokenizer::{format_query, Tokenizer, EOS_TOKEN};
pub use verify::{verify_model_dir, ModelSummary};

use attention::SeqSpan;

/// A mini-batch's sequences packed end to end (TEI's `Batch`): `ids`, and `cu_seqlens` with
/// `cu_seqlens[0] == 0` and `cu_seqlens[i+1] - cu_seqlens[i]` the length of sequence `i`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PackedSequences {
    pub ids: Vec<u32>,
    pub cu_seqlens: Vec<u32>,
}

impl PackedSequences {
    /// Packs sequences end to end.
    pub fn from_sequences<S: AsRef<[u32]>>(seqs: &[S]) -> PackedSequences {
        let mut batch = PackedSequences {
            ids: Vec::new(),
            cu_seqlens: vec![0],
        };
        for s in seqs {
            batch.push(s.as_ref());
        }
        batch
    }

    /// Appends one sequence.
    pub fn push(&mut self, seq: &[u32]) {
        if self.cu_seqlens.is_empty() {
            self.cu_seqlens.push(0);
        }
        self.ids.extend_from_slice(seq);
        self.cu_seqlens.push(self.ids.len() as u32);
    }

    /// Number of sequences.
    pub fn len(&self) -> usize {
        self.cu_seqlens.len().saturating_sub(1)
    }

    /// True when the batch holds no sequence.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks the batch and returns each sequence's span in `ids`.
    fn spans(&self, vocab_size: usize, max_len: usize) -> ModelResult<Vec<SeqSpan>> {
        let bad = |m: String| Err(ModelError::InvalidBatch(m));
        if self.cu_seqlens.is_empty() {
            return if self.ids.is_empty() {
                Ok(Vec::new())
            } else {
                bad("cu_seqlens is empty".into())
            };
        }
        if self.cu_seqlens[0] != 0 {
            return bad("cu_seqlens must start at 0".into());
        }
        if *self.cu_seqlens.last().unwrap_or(&0) as usize != self.ids.len() {
            return bad(format!(
                "cu_seqlens ends at {:?}, ids has {}",
                self.cu_seqlens.last(),
                self.ids.len()
            ));
        }
        let mut spans = Vec::with_capacity(self.len());
        for (index, w) in self.cu_seqlens.windows(2).enumerate() {
            if w[1] <= w[0] {
                return bad(format!("sequence {index} is empty or cu_seqlens decreases"));
            }
            let len = (w[1] - w[0]) as usize;
            if len > max_len {
                return Err(ModelError::SequenceTooLong {
                    index,
                    len,
                    max: max_len,
                });
            }
            spans.push(SeqSpan {
                start: w[0] as usize,
                len,
            });
        }
        if let Some(id) = self.ids.iter().find(|&&id| id as usize >= vocab_size) {
            return bad(format!(
                "token id {id} is not below vocab_size {vocab_size}"
            ));
        }
        Ok(spans)
    }
}

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

    /// The attention kernel it runs (`blockwise`, `cudnn-fused`).
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

/// See [`Embedder::memory_probe`].
pub type MemoryProbe = Box<dyn Fn() -> Option<(u64, u64)> + Send>;
