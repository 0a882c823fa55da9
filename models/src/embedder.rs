//! [`Qwen3Embedder`]: a loaded model directory behind the [`Embedder`] trait.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::{DType, Device};

use crate::attention::SeqSpan;
use crate::config::Config;
use crate::device::DeviceSpec;
use crate::error::{ModelError, ModelResult};
use crate::memory::{estimate_memory, MemoryEstimate};
use crate::qwen3::Qwen3Model;
use crate::tokenizer::Tokenizer;
use crate::weights::Weights;
use crate::{Embedder, PackedSequences};

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
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            device: DeviceSpec::Cpu,
            dtype: None,
            output_dim: None,
            attention_tile: DEFAULT_ATTENTION_TILE,
            memory_limit: None,
        }
    }
}

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
        #[allow(unused_mut)]
        let mut model = Qwen3Model::new(&cfg, &weights)?;
        drop(weights);
        #[cfg(feature = "cuda")]
        if matches!(device, Device::Cuda(_)) {
            use_fused_attention(&mut model, &device, opts)?;
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

    /// Loads `tokenizer.json` from the same directory.
    pub fn tokenizer(&self) -> ModelResult<Tokenizer> {
        Tokenizer::from_file(&self.dir.join("tokenizer.json"))
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
    fn memory_probe(&self) -> Option<crate::MemoryProbe> {
        #[cfg(feature = "cuda")]
        if let Device::Cuda(d) = self.model.device() {
            let context = d.cuda_stream().context().clone();
            return Some(Box::new(move || {
                context
                    .mem_get_info()
                    .ok()
                    .map(|(free, total)| (free as u64, total as u64))
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
        crate::memory::check_tokens_per_forward(self.config(), tokens).map_err(|detail| {
            ModelError::OutOfMemory {
                needed: None,
                limit: None,
                detail,
            }
        })?;
        let limit = self.memory_limit.load(Ordering::Relaxed);
        if limit == u64::MAX {
            return Ok(());
        }
        let lens: Vec<usize> = spans.iter().map(|s| s.len).collect();
        let needed = self.memory_estimate(&lens).total();
        if needed > limit {
            return Err(ModelError::OutOfMemory {
                needed: Some(needed),
                limit: Some(limit),
                detail: format!(
                    "{} sequences, {} tokens need about {needed} bytes, over the {limit}-byte cap",
                    lens.len(),
                    lens.iter().sum::<usize>()
                ),
            });
        }
        Ok(())
    }

    /// Runs the model on a validated batch; rows are L2-normalised f32 of `output_dim`.
    fn forward(&self, batch: &PackedSequences, spans: Vec<SeqSpan>) -> ModelResult<Vec<Vec<f32>>> {
        let prepared = self.model.prepare(&batch.ids, spans.clone(), self.tile)?;
        let hidden = self.model.layers(&prepared)?;
        drop(prepared);
        let pooled = self.model.pool(&hidden, &spans)?;
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
        self.forward(batch, spans)
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

    fn estimate_memory(&self, seq_lens: &[usize]) -> u64 {
        self.memory_estimate(seq_lens).total()
    }

    fn set_memory_limit(&self, limit: Option<u64>) {
        self.memory_limit
            .store(limit.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn memory_probe(&self) -> Option<crate::MemoryProbe> {
        Qwen3Embedder::memory_probe(self)
    }

    fn attention_kernel(&self) -> &'static str {
        self.model.attention_kernel().name()
    }

    fn prepare_attention(&self, batches: &[Vec<usize>]) -> ModelResult<f64> {
        #[cfg(feature = "cuda")]
        if let crate::AttentionKernel::Fused(fused) = self.model.attention_kernel() {
            let shapes: Vec<_> =
                crate::attention_plan::planned_shapes(batches.iter().map(Vec::as_slice))
                    .into_iter()
                    .collect();
            let scale = (1.0 / (self.config().head_dim() as f64).sqrt()) as f32;
            return Ok(fused.prepare(&shapes, scale)?);
        }
        let _ = batches;
        Ok(0.0)
    }

    fn token_budget(&self, workers: usize) -> Option<u64> {
        let (free, _) = self.device_memory()?;
        Some(crate::memory::token_budget(
            self.config(),
            self.dtype.size_in_bytes() as u64,
            self.tile,
            crate::memory::share_of_free(free, workers),
        ))
    }
}

/// Largest difference the start-up self-test accepts between the fused and the blockwise
/// attention outputs (bf16 values of magnitude about 1; a layout or mask error gives
/// differences of that magnitude).
#[cfg(feature = "cuda")]
pub const FUSED_SELF_TEST_TOLERANCE: f32 = 0.05;

/// On a GPU, attention runs in cuDNN's fused kernel once it agrees with the blockwise one on
/// the device; it is refused, saying why, when it cannot run or disagrees.
/// `EMBEDFLEET_ATTENTION=blockwise` keeps the blockwise kernel.
#[cfg(feature = "cuda")]
fn use_fused_attention(
    model: &mut Qwen3Model,
    device: &Device,
    opts: &LoadOptions,
) -> ModelResult<()> {
    use crate::attention::AttentionKernel;
    use crate::fused::FusedAttention;
    if std::env::var("EMBEDFLEET_ATTENTION").as_deref() == Ok("blockwise") {
        tracing::warn!(device = %opts.device, "EMBEDFLEET_ATTENTION=blockwise: the fused kernel is off");
        return Ok(());
    }
    let refuse = |reason: String| ModelError::AttentionKernel {
        device: opts.device.to_string(),
        reason,
    };
    if model.dtype() != DType::BF16 {
        return Err(refuse(format!(
            "it computes in bf16, this model in {:?}",
            model.dtype()
        )));
    }
    let cfg = model.config();
    let fused = FusedAttention::new(
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim(),
    )
    .map_err(refuse)?;
    let version = fused.cudnn_version();
    let kernel = AttentionKernel::Fused(std::sync::Arc::new(fused));
    let tile = opts.attention_tile.max(1);
    let diff = FusedAttention::self_test(&kernel, device, tile)
        .map_err(|e| refuse(format!("its start-up self-test failed: {e}")))?;
    if !(diff <= FUSED_SELF_TEST_TOLERANCE) {
        return Err(refuse(format!(
            "its start-up self-test differs from the blockwise kernel by {diff} \
             (tolerance {FUSED_SELF_TEST_TOLERANCE})"
        )));
    }
    tracing::info!(device = %opts.device, cudnn = version, self_test_max_diff = diff, "fused attention on");
    model.set_attention_kernel(kernel);
    Ok(())
}

/// Checks, in a few seconds and before any model is loaded, whether cuDNN's fused attention
/// runs on `device`: the kernel for the 4B/8B head layout (32 query and 8 key/value heads of
/// 128) and its start-up self-test. `Ok` names the kernel the device will run; `Err` says why
/// the fused kernel is refused (`EMBEDFLEET_ATTENTION=blockwise` then runs the blockwise one).
pub fn probe_attention(device: &DeviceSpec) -> Result<String, String> {
    match device {
        DeviceSpec::Cpu => Ok("blockwise (the CPU has no fused kernel)".into()),
        #[cfg(feature = "cuda")]
        DeviceSpec::Cuda(_) => {
            use crate::attention::AttentionKernel;
            use crate::fused::FusedAttention;
            let opened = device.open().map_err(|e| e.to_string())?;
            let fused = FusedAttention::new(32, 8, 128)?;
            let version = fused.cudnn_version();
            let kernel = AttentionKernel::Fused(std::sync::Arc::new(fused));
            let diff = FusedAttention::self_test(&kernel, &opened, DEFAULT_ATTENTION_TILE)?;
            if !(diff <= FUSED_SELF_TEST_TOLERANCE) {
                return Err(format!(
                    "its self-test differs from the blockwise kernel by {diff} (tolerance {FUSED_SELF_TEST_TOLERANCE})"
                ));
            }
            Ok(format!(
                "cudnn-fused (cuDNN {version}, self-test max difference {diff})"
            ))
        }
        #[cfg(not(feature = "cuda"))]
        DeviceSpec::Cuda(_) => Err("this is a CPU build: no CUDA kernels".into()),
    }
}

/// Keeps the first `dim` components of `v` and L2-normalises them (accumulated in f64).
/// A zero vector stays zero.
pub fn matryoshka(v: &[f32], dim: usize) -> Vec<f32> {
    let v = &v[..dim.min(v.len())];
    let norm = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    if norm == 0.0 {
        return v.to_vec();
    }
    v.iter().map(|&x| (x as f64 / norm) as f32).collect()
}
