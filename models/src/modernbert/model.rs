//! The ModernBERT encoder, as transformers' `models/modernbert/modeling_modernbert.py`
//! computes it: token embeddings layer-normed (no position table); each layer pre-norm (the
//! first without an attention norm), q/k/v one product, rotary positions with the theta of the
//! layer's kind, attention over the whole sequence (global layers) or a window of
//! `local_attention / 2` keys either side (local layers), then a GeGLU feed-forward block
//! (`Wo(act(input) * gate)` of `Wi`'s two halves); a final norm on every token. No biases
//! unless the config asks for them.

use candle_core::{DType, Result, Tensor};
use candle_nn::Linear;

use super::config::{Config, LayerKind};
use crate::attention::{AttentionKernel, AttnContext};
use crate::encoder::{AttentionUse, EncoderModel};
use crate::error::ModelResult;
use crate::layer_kinds::masks_of;
use crate::packed::SeqSpan;
use crate::projection::project;
use crate::rotary::RopeTable;
use crate::weights::Weights;

/// LayerNorm, with a bias where the config has one.
struct Norm {
    weight: Tensor,
    bias: Tensor,
    eps: f32,
}

impl Norm {
    fn load(cfg: &Config, w: &Weights, name: &str) -> ModelResult<Norm> {
        let h = cfg.hidden_size;
        let weight = w.get(&format!("{name}.weight"), &[h])?;
        let bias = if cfg.norm_bias {
            w.get(&format!("{name}.bias"), &[h])?
        } else {
            weight.zeros_like()?
        };
        Ok(Norm {
            weight,
            bias,
            eps: cfg.norm_eps as f32,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        candle_nn::ops::layer_norm(&x.contiguous()?, &self.weight, &self.bias, self.eps)
    }
}

/// A projection, with a bias where the config has one.
struct Dense {
    linear: Linear,
    bias: Option<Tensor>,
}

impl Dense {
    fn load(w: &Weights, name: &str, shape: [usize; 2], bias: bool) -> ModelResult<Dense> {
        Ok(Dense {
            linear: Linear::new(w.get(&format!("{name}.weight"), &shape)?, None),
            bias: if bias {
                Some(w.get(&format!("{name}.bias"), &[shape[0]])?)
            } else {
                None
            },
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
    attn_norm: Option<Norm>,
    wqkv: Dense,
    wo: Dense,
    mlp_norm: Norm,
    wi: Dense,
    mlp_wo: Dense,
    kind: LayerKind,
}

/// A loaded ModernBERT.
pub struct ModernBertModel {
    cfg: Config,
    embeddings: Tensor,
    embedding_norm: Norm,
    layers: Vec<Layer>,
    final_norm: Norm,
    global_rope: RopeTable,
    local_rope: RopeTable,
    kernel: AttentionKernel,
    tile: usize,
}

impl ModernBertModel {
    pub fn new(
        cfg: &Config,
        w: &Weights,
        kernel: AttentionKernel,
        tile: usize,
    ) -> ModelResult<ModernBertModel> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let layers = (0..cfg.num_hidden_layers)
            .map(|l| {
                let p = format!("layers.{l}");
                Ok(Layer {
                    // Layer 0's attention norm is an identity: the embeddings were just normed.
                    attn_norm: if l == 0 {
                        None
                    } else {
                        Some(Norm::load(cfg, w, &format!("{p}.attn_norm"))?)
                    },
                    wqkv: Dense::load(
                        w,
                        &format!("{p}.attn.Wqkv"),
                        [3 * h, h],
                        cfg.attention_bias,
                    )?,
                    wo: Dense::load(w, &format!("{p}.attn.Wo"), [h, h], cfg.attention_bias)?,
                    mlp_norm: Norm::load(cfg, w, &format!("{p}.mlp_norm"))?,
                    wi: Dense::load(w, &format!("{p}.mlp.Wi"), [2 * i, h], cfg.mlp_bias)?,
                    mlp_wo: Dense::load(w, &format!("{p}.mlp.Wo"), [h, i], cfg.mlp_bias)?,
                    kind: cfg.layers[l],
                })
            })
            .collect::<ModelResult<Vec<_>>>()?;
        let embeddings = w.get("embeddings.tok_embeddings.weight", &[cfg.vocab_size, h])?;
        let (dtype, dev) = (embeddings.dtype(), embeddings.device().clone());
        let rope = |theta| {
            RopeTable::new(
                theta,
                cfg.head_dim(),
                cfg.max_position_embeddings,
                dtype,
                &dev,
            )
        };
        Ok(ModernBertModel {
            embedding_norm: Norm::load(cfg, w, "embeddings.norm")?,
            final_norm: Norm::load(cfg, w, "final_norm")?,
            global_rope: rope(cfg.global_rope_theta)?,
            local_rope: rope(cfg.local_rope_theta)?,
            embeddings,
            layers,
            cfg: cfg.clone(),
            kernel,
            tile: tile.max(1),
        })
    }
}

impl EncoderModel for ModernBertModel {
    fn forward(&self, ids: &[u32], spans: &[SeqSpan]) -> Result<Tensor> {
        let dev = self.embeddings.device();
        let ctx = AttnContext::new(spans.to_vec(), self.tile, self.kernel.clone(), dev)?;
        let (global, local) = (
            self.global_rope.gather(spans)?,
            self.local_rope.gather(spans)?,
        );
        let ids = Tensor::new(ids, dev)?;
        let mut x = self
            .embedding_norm
            .forward(&self.embeddings.index_select(&ids, 0)?)?;
        let (t, nh, hd) = (x.dim(0)?, self.cfg.num_attention_heads, self.cfg.head_dim());
        let window = self.cfg.half_window();
        for layer in &self.layers {
            let h = match &layer.attn_norm {
                Some(norm) => norm.forward(&x)?,
                None => x.clone(),
            };
            let qkv = layer.wqkv.forward(&h)?.reshape((t, 3 * nh, hd))?;
            let rope = match layer.kind {
                LayerKind::Global => &global,
                LayerKind::Local => &local,
            };
            let mask = layer.kind.mask(window);
            let q = rope.apply(&qkv.narrow(1, 0, nh)?)?;
            let k = rope.apply(&qkv.narrow(1, nh, nh)?)?;
            let v = qkv.narrow(1, 2 * nh, nh)?;
            let scale = 1.0 / (hd as f64).sqrt();
            let attended = self.kernel.attention(&q, &k, &v, &ctx, scale, mask)?;
            x = (x + layer.wo.forward(&attended)?)?;
            let gated = layer.wi.forward(&layer.mlp_norm.forward(&x)?)?;
            let gelu = if self.cfg.exact_gelu() {
                crate::activation::Gelu::Erf
            } else {
                crate::activation::Gelu::Tanh
            };
            let product = crate::activation::geglu(&gated, self.cfg.intermediate_size, gelu)?;
            x = (x + layer.mlp_wo.forward(&product)?)?;
        }
        self.final_norm.forward(&x)
    }

    fn hidden_size(&self) -> usize {
        self.cfg.hidden_size
    }

    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }

    fn positions(&self) -> usize {
        self.cfg.max_position_embeddings
    }

    fn parameters(&self) -> u64 {
        self.cfg.num_parameters()
    }

    /// The residual and its norm (2H), q/k/v and the rotated q and k (5H), the attention
    /// output and its projection (2H), `Wi`'s product, the activated half and the product (4I).
    fn floats_per_token(&self) -> u64 {
        (9 * self.cfg.hidden_size + 4 * self.cfg.intermediate_size) as u64
    }

    fn attention(&self) -> AttentionUse {
        let masks = masks_of(&self.cfg.layers, self.cfg.half_window());
        AttentionUse::multi_head(self.cfg.num_attention_heads, self.cfg.head_dim(), masks)
    }

    fn dtype(&self) -> DType {
        self.embeddings.dtype()
    }

    fn kernel(&self) -> &AttentionKernel {
        &self.kernel
    }

    fn set_kernel(&mut self, kernel: AttentionKernel) {
        self.kernel = kernel;
    }
}
