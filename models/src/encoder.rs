//! What the encoder families share (BERT and its kin, ModernBERT, EmbeddingGemma): an
//! [`EncoderEmbedder`] puts an [`EncoderModel`]'s final hidden states through the directory's
//! sentence-transformers head (pooling, dense modules), normalises them and cuts them to a
//! Matryoshka width where the model was trained for one. A family's folder holds only its
//! config, its forward pass and its tiny model.
//!
//! Unlike Qwen3, which pools its last token before the final norm, an encoder pools after its
//! last layer over every token (mean pooling needs them all), so the model returns the whole
//! `[T, H]` hidden state.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::{DType, Device, Result, Tensor};

use crate::attention::{AttentionKernel, Mask};
use crate::embedder::{matryoshka, Embedder};
use crate::error::{ModelError, ModelResult};
use crate::family::{LoadOptions, OutputDims};
use crate::memory::{check_cap, MemoryEstimate};
use crate::packed::PackedSequences;
use crate::packed::SeqSpan;
use crate::sentence::{SentenceHead, SentenceLayout};
use crate::weights::Weights;

/// An encoder's forward pass over a packed batch.
pub trait EncoderModel: Send + Sync {
    /// The final hidden states of every token, `[T, hidden]`.
    fn forward(&self, ids: &[u32], spans: &[SeqSpan]) -> Result<Tensor>;
    fn hidden_size(&self) -> usize;
    fn vocab_size(&self) -> usize;
    /// The longest sequence its positions take, in tokens.
    fn positions(&self) -> usize;
    /// Parameters, the embedding table included.
    fn parameters(&self) -> u64;
    /// Floats alive together per token inside one layer (see [`estimate`]).
    fn floats_per_token(&self) -> u64;
    /// Its attention: heads, scale and the masks of its layers.
    fn attention(&self) -> AttentionUse;
    fn dtype(&self) -> DType;
    fn kernel(&self) -> &AttentionKernel;
    /// Runs attention with `kernel` from now on (the loader's fused kernel on a GPU).
    fn set_kernel(&mut self, kernel: AttentionKernel);
}

/// An encoder's attention, as the fused kernel is made, self-tested and planned for it.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionUse {
    /// Query heads, key/value heads (fewer under grouped-query attention: EmbeddingGemma's
    /// one), head dimension.
    pub heads: (usize, usize, usize),
    /// What q·k is multiplied by.
    pub scale: f64,
    /// The masks its layers attend under, each once.
    pub masks: Vec<Mask>,
}

impl AttentionUse {
    /// `heads` heads of `head_dim`, each with its own key/value head, q·k scaled by
    /// `1/√head_dim`: BERT's kin's, ModernBERT's and NomicBERT's attention.
    pub fn multi_head(heads: usize, head_dim: usize, masks: Vec<Mask>) -> AttentionUse {
        AttentionUse {
            heads: (heads, heads, head_dim),
            scale: 1.0 / (head_dim as f64).sqrt(),
            masks,
        }
    }
}

/// The kernel an encoder is built with on `device`: the CPU's tiled kernel for f32 on the CPU,
/// else the blockwise one, which [`load_encoder`] replaces by cuDNN's fused kernel on a GPU
/// once it passes its self-test under the model's masks ([`fused_or_blockwise`]).
pub fn encoder_kernel(device: &Device, dtype: DType) -> AttentionKernel {
    if device.is_cpu() && dtype == DType::F32 && !crate::attention_check::blockwise_asked() {
        AttentionKernel::Tiled
    } else {
        AttentionKernel::Blockwise
    }
}

/// The compute dtype of `opts` on `device` (f32 on the CPU, bf16 on a GPU unless asked),
/// refusing what the encoders do not compute in.
pub fn compute_dtype(device: &Device, opts: &LoadOptions) -> ModelResult<DType> {
    if opts.fp8_projections {
        return Err(ModelError::PrecisionRefused {
            reason: "--precision fp8 is Qwen3-Embedding's (its 4B model's projections are where \
                     a paper run's time goes); the encoder families run bf16 on a GPU. Leave \
                     --precision out"
                .into(),
        });
    }
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
    Ok(dtype)
}

/// The Matryoshka widths a model was trained for (EmbeddingGemma's 768/512/256/128), or none
/// (a BERT's vectors have one width).
#[derive(Debug, Clone, Copy)]
pub enum Widths {
    Only,
    Matryoshka(&'static [usize]),
}

/// The longest sequence an encoder takes: its positions, or the shorter length its model card
/// sets (`sentence_bert_config.json`'s `max_seq_length`: all-MiniLM's 256 of 512 positions).
pub fn context(positions: usize, layout: &SentenceLayout) -> usize {
    layout
        .max_seq_length
        .map_or(positions, |n| n.min(positions))
}

/// The widths of `widths` for vectors `layout` makes of `hidden`-wide states.
pub fn output_dims(widths: Widths, layout: &SentenceLayout, hidden: usize) -> OutputDims {
    match widths {
        Widths::Only => OutputDims::Trained(vec![layout.output_width(hidden)]),
        Widths::Matryoshka(dims) => OutputDims::Trained(dims.to_vec()),
    }
}

/// An encoder family's `load`, its model's construction aside: the device opened, the dtype
/// chosen, the weights opened and the attention kernel picked; `build` makes the model from
/// them (with the attention tile); the embedder then wears the directory's head (`layout`).
pub fn load_encoder<M: EncoderModel + 'static>(
    family: &str,
    dir: &Path,
    opts: &LoadOptions,
    (layout, widths): (&SentenceLayout, Widths),
    build: impl FnOnce(&Weights, AttentionKernel, usize) -> ModelResult<M>,
) -> ModelResult<Box<dyn Embedder>> {
    let device = opts.device.open()?;
    let dtype = compute_dtype(&device, opts)?;
    let weights = Weights::open(dir, dtype, &device)?;
    #[allow(unused_mut)] // the CPU build never swaps its kernel
    let mut model = build(
        &weights,
        encoder_kernel(&device, dtype),
        opts.attention_tile,
    )?;
    drop(weights);
    #[cfg(feature = "cuda")]
    if !device.is_cpu() {
        if let Some(kernel) = fused_or_blockwise(&model.attention(), dtype, &device, opts) {
            model.set_kernel(kernel);
        }
    }
    device.synchronize()?;
    tracing::info!(dir = %dir.display(), device = %opts.device, ?dtype, family, "loaded model");
    Ok(Box::new(EncoderEmbedder::new(
        model, dir, layout, widths, opts, &device,
    )?))
}

/// An encoder with its sentence-transformers head behind the [`Embedder`] trait.
pub struct EncoderEmbedder<M> {
    model: M,
    head: SentenceHead,
    dir: PathBuf,
    /// The longest sequence taken: the positions, or the shorter length the model card sets.
    context: usize,
    /// The vectors' full width: the last dense module's, else the hidden size.
    width: usize,
    output_dim: usize,
    tile: usize,
    memory_limit: AtomicU64,
}

impl<M: EncoderModel> EncoderEmbedder<M> {
    /// `model` loaded from `dir` with the head `layout` describes; `opts.output_dim` must be
    /// one of `widths`.
    pub fn new(
        model: M,
        dir: &Path,
        layout: &SentenceLayout,
        widths: Widths,
        opts: &LoadOptions,
        device: &Device,
    ) -> ModelResult<Self> {
        let hidden = model.hidden_size();
        let head = SentenceHead::load(layout, hidden, model.dtype(), device)?;
        let width = layout.output_width(hidden);
        let output_dim = match (opts.output_dim, widths) {
            (None, _) => width,
            (Some(dim), _) if dim == width => dim,
            (Some(dim), Widths::Matryoshka(dims)) if dims.contains(&dim) => dim,
            (Some(dim), widths) => {
                return Err(ModelError::UntrainedDim {
                    dim,
                    trained: match widths {
                        Widths::Only => vec![width],
                        Widths::Matryoshka(dims) => dims.to_vec(),
                    },
                })
            }
        };
        let context = context(model.positions(), layout);
        Ok(EncoderEmbedder {
            model,
            head,
            dir: dir.to_path_buf(),
            context,
            width,
            output_dim,
            tile: opts.attention_tile.max(1),
            memory_limit: AtomicU64::new(opts.memory_limit.unwrap_or(u64::MAX)),
        })
    }

    /// The estimate of a forward over sequences of these lengths.
    pub fn memory_estimate(&self, seq_lens: &[usize]) -> MemoryEstimate {
        estimate(&self.model, seq_lens, self.tile)
    }

    fn check_memory(&self, spans: &[SeqSpan]) -> ModelResult<()> {
        let lens: Vec<usize> = spans.iter().map(|s| s.len).collect();
        check_cap(self.memory_limit.load(Ordering::Relaxed), &lens, |lens| {
            self.memory_estimate(lens).total()
        })
    }
}

impl<M> std::fmt::Debug for EncoderEmbedder<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncoderEmbedder")
            .field("dir", &self.dir)
            .field("output_dim", &self.output_dim)
            .finish()
    }
}

/// Weights, plus `floats_per_token` for every packed token, plus one attention tile's scores
/// and accumulators in f32 (tiles run one after another).
pub fn estimate<M: EncoderModel>(model: &M, seq_lens: &[usize], tile: usize) -> MemoryEstimate {
    let b = model.dtype().size_in_bytes() as u64;
    let t: u64 = seq_lens.iter().map(|&l| l as u64).sum();
    let longest = seq_lens.iter().copied().max().unwrap_or(0);
    let (heads, _, hd) = model.attention().heads;
    let (heads, hd) = (heads as u64, hd as u64);
    let tile = tile.min(longest).max(1) as u64;
    let attention = if t == 0 {
        0
    } else {
        (3 * heads * tile * tile + tile * tile + 3 * heads * tile * hd) * 4
    };
    MemoryEstimate {
        weights: model.parameters() * b,
        activations: t * model.floats_per_token() * b,
        attention,
    }
}

impl<M: EncoderModel> Embedder for EncoderEmbedder<M> {
    fn embed(&self, batch: &PackedSequences) -> ModelResult<Vec<Vec<f32>>> {
        let spans = batch.spans(self.model.vocab_size(), self.context)?;
        if spans.is_empty() {
            return Ok(Vec::new());
        }
        self.check_memory(&spans)?;
        let hidden = self.model.forward(&batch.ids, &spans)?;
        let pooled = self.head.apply(&hidden, &spans)?;
        Ok(pooled
            .to_vec2::<f32>()?
            .into_iter()
            .map(|row| matryoshka(&row, self.output_dim))
            .collect())
    }

    fn max_position_embeddings(&self) -> usize {
        self.context
    }

    fn hidden_size(&self) -> usize {
        self.width
    }

    fn output_dim(&self) -> usize {
        self.output_dim
    }

    fn compute_dtype(&self) -> DType {
        self.model.dtype()
    }

    fn estimate_memory(&self, seq_lens: &[usize]) -> u64 {
        self.memory_estimate(seq_lens).total()
    }

    fn set_memory_limit(&self, limit: Option<u64>) {
        self.memory_limit
            .store(limit.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn attention_kernel(&self) -> &'static str {
        self.model.kernel().name()
    }

    fn prepare_attention(&self, batches: &[Vec<usize>]) -> ModelResult<f64> {
        #[cfg(feature = "cuda")]
        if let AttentionKernel::Fused(fused) = self.model.kernel() {
            let attention = self.model.attention();
            return Ok(fused.prepare(batches, attention.scale as f32, &attention.masks)?);
        }
        let _ = batches;
        Ok(0.0)
    }
}

/// cuDNN's fused kernel for an encoder of `attention` on a GPU, or `None` (the blockwise
/// kernel it was built with stays) when `EMBEDFLEET_ATTENTION=blockwise` asks, the dtype is not
/// bf16, or the kernel is refused: no cuDNN, a cuDNN without non-causal bands (before 9.10.2),
/// a head width it does not take, or a self-test that disagrees. Unlike Qwen3, whose load is
/// refused then (blockwise, a 4B model's paper run would take many times as long, unasked),
/// an encoder falls back, saying why: its blockwise run is the one it had before the fused
/// kernel took its masks, and it is cheap.
#[cfg(feature = "cuda")]
fn fused_or_blockwise(
    attention: &AttentionUse,
    dtype: DType,
    device: &Device,
    opts: &LoadOptions,
) -> Option<AttentionKernel> {
    let masks = &attention.masks;
    match crate::attention_check::fused_kernel(attention.heads, masks, dtype, device, opts) {
        Ok(kernel) => kernel,
        Err(refused) => {
            tracing::warn!(
                device = %opts.device,
                ?masks,
                "{refused}; this encoder runs the blockwise attention kernel instead"
            );
            None
        }
    }
}
