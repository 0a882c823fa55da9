//! Gemma 3's text model as EmbeddingGemma runs it, as transformers'
//! `models/gemma3/modeling_gemma3.py` computes it with `use_bidirectional_attention`: token
//! embeddings scaled by `sqrt(hidden)`; each layer a sandwich (RMSNorm before and after the
//! attention and the MLP, all with Gemma's `1 + w` scale); q and k normed per head, then rotary
//! with the theta of the layer's kind; grouped-query attention scaled by
//! `query_pre_attn_scalar^-0.5` over the whole sequence (global layers) or `sliding_window / 2`
//! keys either side (local layers); a GeGLU MLP (tanh GELU); a final norm on every token.

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

/// Gemma's RMSNorm: the stored weight `w` scales by `1 + w` (added once, at load, in f32), and
/// the norm is computed in f32 whatever the model's dtype, as transformers computes it: `1 + w`
/// rounded to bf16 would be off by up to 2⁻⁸ in every channel of every norm.
struct Norm {
    scale: Tensor,
    eps: f32,
}

impl Norm {
    fn load(w: &Weights, name: &str, dim: usize, eps: f64) -> ModelResult<Norm> {
        let weight = w.get(&format!("{name}.weight"), &[dim])?;
        Ok(Norm {
            scale: (weight.to_dtype(DType::F32)? + 1.0)?,
            eps: eps as f32,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dtype = x.dtype();
        let x = x.contiguous()?.to_dtype(DType::F32)?;
        candle_nn::ops::rms_norm(&x, &self.scale, self.eps)?.to_dtype(dtype)
    }
}

fn linear(w: &Weights, names: &[String], out_dims: &[usize], in_dim: usize) -> ModelResult<Linear> {
    let parts = names
        .iter()
        .zip(out_dims)
        .map(|(name, &out)| w.get(&format!("{name}.weight"), &[out, in_dim]))
        .collect::<ModelResult<Vec<_>>>()?;
    Ok(Linear::new(Tensor::cat(&parts, 0)?, None))
}

struct Layer {
    input_norm: Norm,
    qkv: Linear,
    q_norm: Norm,
    k_norm: Norm,
    o: Linear,
    post_attention_norm: Norm,
    pre_feedforward_norm: Norm,
    gate_up: Linear,
    down: Linear,
    post_feedforward_norm: Norm,
    kind: LayerKind,
}

/// A loaded Gemma 3 text encoder.
pub struct Gemma3Model {
    cfg: Config,
    embeddings: Tensor,
    layers: Vec<Layer>,
    norm: Norm,
    global_rope: RopeTable,
    local_rope: RopeTable,
    kernel: AttentionKernel,
    tile: usize,
}

impl Gemma3Model {
    pub fn new(
        cfg: &Config,
        w: &Weights,
        kernel: AttentionKernel,
        tile: usize,
    ) -> ModelResult<Gemma3Model> {
        let (h, i, hd, eps) = (
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.head_dim,
            cfg.rms_norm_eps,
        );
        let (q, kv) = (cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd);
        let layers = (0..cfg.num_hidden_layers)
            .map(|l| {
                let p = format!("layers.{l}");
                let a = format!("{p}.self_attn");
                let m = format!("{p}.mlp");
                Ok(Layer {
                    input_norm: Norm::load(w, &format!("{p}.input_layernorm"), h, eps)?,
                    qkv: linear(
                        w,
                        &[
                            format!("{a}.q_proj"),
                            format!("{a}.k_proj"),
                            format!("{a}.v_proj"),
                        ],
                        &[q, kv, kv],
                        h,
                    )?,
                    q_norm: Norm::load(w, &format!("{a}.q_norm"), hd, eps)?,
                    k_norm: Norm::load(w, &format!("{a}.k_norm"), hd, eps)?,
                    o: linear(w, &[format!("{a}.o_proj")], &[h], q)?,
                    post_attention_norm: Norm::load(
                        w,
                        &format!("{p}.post_attention_layernorm"),
                        h,
                        eps,
                    )?,
                    pre_feedforward_norm: Norm::load(
                        w,
                        &format!("{p}.pre_feedforward_layernorm"),
                        h,
                        eps,
                    )?,
                    gate_up: linear(
                        w,
                        &[format!("{m}.gate_proj"), format!("{m}.up_proj")],
                        &[i, i],
                        h,
                    )?,
                    down: linear(w, &[format!("{m}.down_proj")], &[h], i)?,
                    post_feedforward_norm: Norm::load(
                        w,
                        &format!("{p}.post_feedforward_layernorm"),
                        h,
                        eps,
                    )?,
                    kind: cfg.layers[l],
                })
            })
            .collect::<ModelResult<Vec<_>>>()?;
        let embeddings = w.get("embed_tokens.weight", &[cfg.vocab_size, h])?;
        let (dtype, dev) = (embeddings.dtype(), embeddings.device().clone());
        let rope = |theta| RopeTable::new(theta, hd, cfg.max_position_embeddings, dtype, &dev);
        Ok(Gemma3Model {
            norm: Norm::load(w, "norm", h, eps)?,
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

impl EncoderModel for Gemma3Model {
    fn forward(&self, ids: &[u32], spans: &[SeqSpan]) -> Result<Tensor> {
        let dev = self.embeddings.device();
        let ctx = AttnContext::new(spans.to_vec(), self.tile, self.kernel.clone(), dev)?;
        let (global, local) = (
            self.global_rope.gather(spans)?,
            self.local_rope.gather(spans)?,
        );
        let ids = Tensor::new(ids, dev)?;
        let mut x = (self.embeddings.index_select(&ids, 0)? * self.cfg.embed_scale() as f64)?;
        let t = x.dim(0)?;
        let (nh, nkv, hd) = (
            self.cfg.num_attention_heads,
            self.cfg.num_key_value_heads,
            self.cfg.head_dim,
        );
        let i = self.cfg.intermediate_size;
        let window = self.cfg.half_window();
        let scale = 1.0 / self.cfg.query_pre_attn_scalar.sqrt();
        for layer in &self.layers {
            let h = layer.input_norm.forward(&x)?;
            let qkv = project(&layer.qkv, &h)?.reshape((t, nh + 2 * nkv, hd))?;
            let rope = match layer.kind {
                LayerKind::Global => &global,
                LayerKind::Local => &local,
            };
            let mask = layer.kind.mask(window);
            let q = rope.apply(&layer.q_norm.forward(&qkv.narrow(1, 0, nh)?)?)?;
            let k = rope.apply(&layer.k_norm.forward(&qkv.narrow(1, nh, nkv)?)?)?;
            let v = qkv.narrow(1, nh + nkv, nkv)?;
            let attended = self.kernel.attention(&q, &k, &v, &ctx, scale, mask)?;
            let attended = project(&layer.o, &attended)?;
            x = (x + layer.post_attention_norm.forward(&attended)?)?;
            let h = layer.pre_feedforward_norm.forward(&x)?;
            let gate_up = project(&layer.gate_up, &h)?;
            let product = crate::activation::geglu(&gate_up, i, crate::activation::Gelu::Tanh)?;
            let mlp = project(&layer.down, &product)?;
            x = (x + layer.post_feedforward_norm.forward(&mlp)?)?;
        }
        self.norm.forward(&x)
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

    /// The residual and its norms (3H), q/k/v and the normed, rotated q and k (3q + 4kv as
    /// floats of H-sized rows at most), the attention output and its projection (2H), the
    /// gate/up product, the activated gate and the product (4I).
    fn floats_per_token(&self) -> u64 {
        let hd = self.cfg.head_dim;
        let (q, kv) = (
            self.cfg.num_attention_heads * hd,
            self.cfg.num_key_value_heads * hd,
        );
        (5 * self.cfg.hidden_size + 3 * q + 4 * kv + 4 * self.cfg.intermediate_size) as u64
    }

    fn attention(&self) -> AttentionUse {
        AttentionUse {
            heads: (
                self.cfg.num_attention_heads,
                self.cfg.num_key_value_heads,
                self.cfg.head_dim,
            ),
            scale: 1.0 / self.cfg.query_pre_attn_scalar.sqrt(),
            masks: masks_of(&self.cfg.layers, self.cfg.half_window()),
        }
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
