//! The one trait the embed job talks to a model through ([`Embedder`]), and the Matryoshka
//! cut every family's vectors take.

use crate::error::ModelResult;
use crate::packed::PackedSequences;
use candle_core::DType;

/// A model that turns packed token sequences into embeddings. Sync and object-safe: the
/// embed job keeps one `Box<dyn Embedder>` per device, on that device's own thread.
pub trait Embedder: Send + Sync {
    /// One L2-normalised f32 vector of [`Embedder::output_dim`] components per sequence, in
    /// batch order. A batch over the memory cap, or a device allocation failure, is
    /// [`ModelError::OutOfMemory`](crate::error::ModelError::OutOfMemory): halve the batch and retry.
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

    /// Whether the projections run in FP8 (`--precision fp8`; shard metadata records it).
    fn fp8_projections(&self) -> bool {
        false
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
