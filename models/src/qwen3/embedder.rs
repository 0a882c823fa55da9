//! [`Qwen3Embedder`]: a loaded Qwen3 model directory behind the [`Embedder`] trait.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::{DType, Device};

use super::config::Config;
use super::memory::{check_tokens_per_forward, estimate_memory, token_budget};
use super::model::Qwen3Model;
use crate::embedder::{matryoshka, Embedder};
use crate::error::{ModelError, ModelResult};
use crate::family::LoadOptions;
use crate::memory::{check_cap, share_of_free, MemoryEstimate};
use crate::packed::PackedSequences;
use crate::packed::SeqSpan;
use crate::weights::Weights;

/// A Qwen3-Embedding model loaded from a Hugging Face directory.
pub struct Qwen3Embedder {
    model: Qwen3Model,
    dir: PathBuf,
    output_dim: usize,
    tile: usize,
    dtype: DType,
    /// `u64::MAX` means no cap; atomic so the cap can change through `&self`.
    memory_limit: AtomicU64,
}

impl std::fmt::Debug for Qwen3Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qwen3Embedder")
            .field("dir", &self.dir)
            .field("dtype", &self.dtype)
            .field("output_dim", &self.output_dim)
            .finish()
    }
}

impl Qwen3Embedder {
    /// Loads `config.json` and the weights of `dir` (memory-mapped) onto the chosen device.
    pub fn load(dir: &Path, opts: &LoadOptions) -> ModelResult<Qwen3Embedder> {
        let cfg = Config::from_file(&dir.join("config.json"))?;
        let device = opts.device.open()?;
        let dtype = opts.dtype.unwrap_or(match device {
            Device::Cpu => DType::F32,
            _ => DType::BF16,
        });
        if !matches!(dtype, DType::F32 | DType::BF16 | DType::F16) {
            return Err(ModelError::InvalidDevice {
                spec: opts.device.to_string(),
                reason: format!("dtype {dtype:?} is not supported; use f32, bf16 or f16"),
            });
        }
        let weights = Weights::open(dir, dtype, &device)?;
        let mut model = Qwen3Model::new(&cfg, &weights)?;
        drop(weights);
        if opts.fp8_projections {
            crate::fp8::check_device(&device, dtype)?;
            model.quantize_projections_fp8()?;
        }
        #[cfg(feature = "cuda")]
        if matches!(device, Device::Cuda(_)) {
            let heads = (
                cfg.num_attention_heads,
                cfg.num_key_value_heads,
                cfg.head_dim(),
            );
            let fused = crate::attention_check::fused_kernel(
                heads,
                &[crate::attention::Mask::Causal],
                model.dtype(),
                &device,
                opts,
            )?;
            if let Some(kernel) = fused {
                model.set_attention_kernel(kernel);
            }
        }
        // The weights were uploaded on this thread's stream; the forwards run on the worker's
        // thread, another stream (cudarc's per-thread default). Waiting here orders the upload
        // before any forward, whichever attention kernel runs (the fused self-test's read-back
        // did it only when the fused kernel is on).
        device.synchronize()?;
        tracing::info!(
            dir = %dir.display(),
            device = %opts.device,
            ?dtype,
            attention = model.attention_kernel().name(),
            fp8 = model.projections_fp8(),
            "loaded Qwen3 model"
        );
        Self::from_model(model, dir, opts)
    }

    /// Wraps an already built model (benchmarks build one from random tensors).
    pub fn from_model(
        model: Qwen3Model,
        dir: &Path,
        opts: &LoadOptions,
    ) -> ModelResult<Qwen3Embedder> {
        let hidden = model.config().hidden_size;
        let output_dim = opts.output_dim.unwrap_or(hidden);
        if output_dim == 0 || output_dim > hidden {
            return Err(ModelError::InvalidDim {
                dim: output_dim,
                hidden,
            });
        }
        let dtype = model.dtype();
        Ok(Qwen3Embedder {
            model,
            dir: dir.to_path_buf(),
            output_dim,
            tile: opts.attention_tile.max(1),
            dtype,
            memory_limit: AtomicU64::new(opts.memory_limit.unwrap_or(u64::MAX)),
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &Config {
        self.model.config()
    }

    /// Compute dtype of weights and activations.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// A query of the GPU's free and total bytes (see [`Embedder::memory_probe`]).
    fn memory_probe(&self) -> Option<crate::embedder::MemoryProbe> {
        #[cfg(feature = "cuda")]
        if let Device::Cuda(d) = self.model.device() {
            let context = d.cuda_stream().context().clone();
            return Some(Box::new(move || {
                // What our pool holds idle is ours to use: free for planning, though the
                // driver counts it as used.
                let idle = crate::device::pool::idle_bytes(&context);
                context
                    .mem_get_info()
                    .ok()
                    .map(|(free, total)| ((free as u64 + idle).min(total as u64), total as u64))
            }));
        }
        None
    }

    /// Memory estimate of embedding sequences of these lengths in one call.
    pub fn memory_estimate(&self, seq_lens: &[usize]) -> MemoryEstimate {
        estimate_memory(
            self.config(),
            self.dtype.size_in_bytes() as u64,
            seq_lens,
            self.tile,
        )
    }

    fn check_memory(&self, spans: &[SeqSpan]) -> ModelResult<()> {
        // Over candle's u32 element counts a kernel would index wrongly: refuse it as an
        // out-of-memory, so the caller halves the batch as it would for a real one.
        let tokens: u64 = spans.iter().map(|s| s.len as u64).sum();
        check_tokens_per_forward(self.config(), tokens).map_err(|detail| {
            ModelError::OutOfMemory {
                needed: None,
                limit: None,
                detail,
            }
        })?;
        let lens: Vec<usize> = spans.iter().map(|s| s.len).collect();
        check_cap(self.memory_limit.load(Ordering::Relaxed), &lens, |lens| {
            self.memory_estimate(lens).total()
        })
    }

    /// Runs the model on a validated batch; rows are L2-normalised f32 of `output_dim`.
    fn forward(&self, batch: &PackedSequences, spans: Vec<SeqSpan>) -> ModelResult<Vec<Vec<f32>>> {
        let prepared = self.model.prepare(&batch.ids, spans.clone(), self.tile)?;
        let hidden = self.model.layers(&prepared, &spans)?;
        drop(prepared);
        let pooled = self.model.pool(&hidden)?;
        let rows = pooled.to_vec2::<f32>()?;
        Ok(rows
            .into_iter()
            .map(|r| matryoshka(&r, self.output_dim))
            .collect())
    }
}

impl Embedder for Qwen3Embedder {
    fn embed(&self, batch: &PackedSequences) -> ModelResult<Vec<Vec<f32>>> {
        let spans = batch.spans(self.config().vocab_size, self.max_position_embeddings())?;
        if spans.is_empty() {
            return Ok(Vec::new());
        }
        let _span =
            tracing::debug_span!("embed", seqs = spans.len(), tokens = batch.ids.len()).entered();
        self.check_memory(&spans)?;
        let out = self.forward(batch, spans);
        #[cfg(feature = "cuda")]
        if let (Err(ModelError::OutOfMemory { .. }), Device::Cuda(d)) = (&out, self.model.device())
        {
            // The smaller retry, or another process, gets back what the pool kept.
            crate::device::pool::trim(d.cuda_stream().context());
        }
        out
    }

    fn max_position_embeddings(&self) -> usize {
        self.config().max_position_embeddings
    }

    fn hidden_size(&self) -> usize {
        self.config().hidden_size
    }

    fn output_dim(&self) -> usize {
        self.output_dim
    }

    fn compute_dtype(&self) -> DType {
        self.dtype
    }

    fn fp8_projections(&self) -> bool {
        self.model.projections_fp8()
    }

    fn estimate_memory(&self, seq_lens: &[usize]) -> u64 {
        self.memory_estimate(seq_lens).total()
    }

    fn set_memory_limit(&self, limit: Option<u64>) {
        self.memory_limit
            .store(limit.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn memory_probe(&self) -> Option<crate::embedder::MemoryProbe> {
        Qwen3Embedder::memory_probe(self)
    }

    fn watch_peak_memory(&self) -> Option<crate::embedder::PeakWatch> {
        #[cfg(feature = "cuda")]
        if let Device::Cuda(d) = self.model.device() {
            let watch = crate::device::pool::watch_peak(d.cuda_stream().context())?;
            return Some(Box::new(watch));
        }
        None
    }

    fn attention_kernel(&self) -> &'static str {
        self.model.attention_kernel().name()
    }

    fn prepare_attention(&self, batches: &[Vec<usize>]) -> ModelResult<f64> {
        #[cfg(feature = "cuda")]
        if let crate::attention::AttentionKernel::Fused(fused) = self.model.attention_kernel() {
            let scale = (1.0 / (self.config().head_dim() as f64).sqrt()) as f32;
            return Ok(fused.prepare(batches, scale, &[crate::attention::Mask::Causal])?);
        }
        let _ = batches;
        Ok(0.0)
    }

    fn token_budget(&self, workers: usize) -> Option<u64> {
        let (free, _) = self.device_memory()?;
        Some(token_budget(
            self.config(),
            self.dtype.size_in_bytes() as u64,
            self.tile,
            share_of_free(free, workers),
        ))
    }
}
