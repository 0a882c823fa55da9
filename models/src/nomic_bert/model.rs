//! The NomicBERT encoder, as nomic's published architecture computes it (nomic-embed-text;
//! `NomicBertModel` of the model card's remote code): word and token-type embeddings (no
//! position table), a LayerNorm; then each layer post-norm as BERT's, with rotary positions
//! (whole heads, rotated in halves) on q and k, attention over the whole sequence, and a SwiGLU
//! feed-forward block `fc2(fc11(x) · silu(fc12(x)))`. Biases where the config has them.

use candle_core::{DType, Result, Tensor};
use candle_nn::Linear;

use super::config::Config;
use crate::attention::{AttentionKernel, AttnContext, Mask};
use crate::encoder::{AttentionUse, EncoderModel};
use crate::error::ModelResult;
use crate::packed::SeqSpan;
use crate::projection::project;
use crate::rotary::RopeTable;
use crate::weights::Weights;

struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
    eps: f32,
}

impl LayerNorm {
    fn load(cfg: &Config, w: &Weights, name: &str) -> ModelResult<LayerNorm> {
        let h = cfg.hidden_size();
        Ok(LayerNorm {
            weight: w.get(&format!("{name}.weight"), &[h])?,
            bias: w.get(&format!("{name}.bias"), &[h])?,
            eps: cfg.layer_norm_epsilon as f32,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        candle_nn::ops::layer_norm(&x.contiguous()?, &self.weight, &self.bias, self.eps)
    }
}

/// One or more projections of the same input as one product (their weights, and biases where
/// there are any, stacked along the output axis).
struct Dense {
    linear: Linear,
    bias: Option<Tensor>,
}

impl Dense {
    /// `names`' weights (`[out, input]` each) stacked; their biases when `bias`.
    fn load(
        w: &Weights,
        names: &[&str],
        out: usize,
        input: usize,
        bias: bool,
    ) -> ModelResult<Dense> {
        let weights = names
            .iter()
            .map(|n| w.get(&format!("{n}.weight"), &[out, input]))
            .collect::<ModelResult<Vec<_>>>()?;
        let bias = if bias {
            let biases = names
                .iter()
                .map(|n| w.get(&format!("{n}.bias"), &[out]))
                .collect::<ModelResult<Vec<_>>>()?;
            Some(Tensor::cat(&biases, 0)?)
        } else {
            None
        };
        Ok(Dense {
            linear: Linear::new(Tensor::cat(&weights, 0)?, None),
            bias,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = project(&self.linear, x)?;
        match &self.bias {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }
}

struct Layer {
    wqkv: Dense,
    out_proj: Dense,
    norm1: LayerNorm,
    /// fc12 and fc11, one product: the gate half, then the value half (SwiGLU's order).
    fc1: Dense,
    fc2: Dense,
    norm2: LayerNorm,
}

/// A loaded NomicBERT.
pub struct NomicBertModel {
    cfg: Config,
    word_embeddings: Tensor,
    /// Token type 0's row (every token's: a single-segment input), `[1, H]`.
    token_type: Option<Tensor>,
    emb_ln: LayerNorm,
    layers: Vec<Layer>,
    rope: RopeTable,
    kernel: AttentionKernel,
    tile: usize,
}

impl NomicBertModel {
    pub fn new(
        cfg: &Config,
        w: &Weights,
        kernel: AttentionKernel,
        tile: usize,
    ) -> ModelResult<NomicBertModel> {
        let (h, i) = (cfg.hidden_size(), cfg.intermediate_size());
        let layers = (0..cfg.n_layer)
            .map(|l| {
                let p = format!("encoder.layers.{l}");
                let name = |n: &str| format!("{p}.{n}");
                Ok(Layer {
                    wqkv: Dense::load(w, &[&name("attn.Wqkv")], 3 * h, h, cfg.qkv_proj_bias)?,
                    out_proj: Dense::load(w, &[&name("attn.out_proj")], h, h, cfg.qkv_proj_bias)?,
                    norm1: LayerNorm::load(cfg, w, &name("norm1"))?,
                    fc1: Dense::load(
                        w,
                        &[&name("mlp.fc12"), &name("mlp.fc11")],
                        i,
                        h,
                        cfg.mlp_fc1_bias,
                    )?,
                    fc2: Dense::load(w, &[&name("mlp.fc2")], h, i, cfg.mlp_fc2_bias)?,
                    norm2: LayerNorm::load(cfg, w, &name("norm2"))?,
                })
            })
            .collect::<ModelResult<Vec<_>>>()?;
        let word_embeddings = w.get("embeddings.word_embeddings.weight", &[cfg.vocab_size, h])?;
        let token_type = if cfg.type_vocab_size > 0 {
            let table = w.get(
                "embeddings.token_type_embeddings.weight",
                &[cfg.type_vocab_size, h],
            )?;
            Some(table.narrow(0, 0, 1)?)
        } else {
            None
        };
        let (dtype, dev) = (word_embeddings.dtype(), word_embeddings.device().clone());
        Ok(NomicBertModel {
            rope: RopeTable::new(
                cfg.rotary_emb_base,
                cfg.head_dim(),
                cfg.n_positions,
                dtype,
                &dev,
            )?,
            emb_ln: LayerNorm::load(cfg, w, "emb_ln")?,
            word_embeddings,
            token_type,
            layers,
            cfg: cfg.clone(),
            kernel,
            tile: tile.max(1),
        })
    }
}

impl EncoderModel for NomicBertModel {
    fn forward(&self, ids: &[u32], spans: &[SeqSpan]) -> Result<Tensor> {
        let dev = self.word_embeddings.device();
        let ctx = AttnContext::new(spans.to_vec(), self.tile, self.kernel.clone(), dev)?;
        let rope = self.rope.gather(spans)?;
        let ids = Tensor::new(ids, dev)?;
        let mut x = self.word_embeddings.index_select(&ids, 0)?;
        if let Some(row) = &self.token_type {
            x = x.broadcast_add(row)?;
        }
        let mut x = self.emb_ln.forward(&x)?;
        let (t, nh, hd) = (x.dim(0)?, self.cfg.n_head, self.cfg.head_dim());
        let scale = 1.0 / (hd as f64).sqrt();
        for layer in &self.layers {
            let qkv = layer.wqkv.forward(&x)?.reshape((t, 3 * nh, hd))?;
            let q = rope.apply(&qkv.narrow(1, 0, nh)?)?;
            let k = rope.apply(&qkv.narrow(1, nh, nh)?)?;
            let v = qkv.narrow(1, 2 * nh, nh)?;
            let attended = self.kernel.attention(&q, &k, &v, &ctx, scale, Mask::Full)?;
            x = layer
                .norm1
                .forward(&(x + layer.out_proj.forward(&attended)?)?)?;
            // On the CPU in f32 the row kernel (any mode); elsewhere candle's ops.
            let swiglu = crate::elementwise::Elementwise::Candle;
            let product = swiglu.swiglu(&layer.fc1.forward(&x)?)?;
            x = layer.norm2.forward(&(x + layer.fc2.forward(&product)?)?)?;
        }
        Ok(x)
    }

    fn hidden_size(&self) -> usize {
        self.cfg.hidden_size()
    }

    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }

    fn positions(&self) -> usize {
        self.cfg.n_positions
    }

    fn parameters(&self) -> u64 {
        self.cfg.num_parameters()
    }

    /// The residual and its norm (2H), q/k/v and the rotated q and k (5H), the attention
    /// output and its projection (2H), fc1's product, the activated gate and the product (4I).
    fn floats_per_token(&self) -> u64 {
        (9 * self.cfg.hidden_size() + 4 * self.cfg.intermediate_size()) as u64
    }

    fn attention(&self) -> AttentionUse {
        AttentionUse::multi_head(self.cfg.n_head, self.cfg.head_dim(), vec![Mask::Full])
    }

    fn dtype(&self) -> DType {
        self.word_embeddings.dtype()
    }

    fn kernel(&self) -> &AttentionKernel {
        &self.kernel
    }

    fn set_kernel(&mut self, kernel: AttentionKernel) {
        self.kernel = kernel;
    }
}
