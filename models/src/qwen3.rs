//! Qwen3 as an embedding model: the decoder stack of `Qwen3Model` without an LM head.
//!
//! Reference: `transformers/models/qwen3/modeling_qwen3.py` (`Qwen3Model`). Each layer is
//! pre-norm attention (q/k/v projections, per-head RMSNorm on q and k, rotary embedding with
//! `rope_theta`, grouped-query causal attention, output projection) followed by a pre-norm
//! SwiGLU MLP. The embedding of a sequence is the final-normed hidden state of its last token
//! (the appended `<|endoftext|>`), L2-normalised.
//!
//! Batches are packed (see [`crate::attention`]): tokens of all sequences are one `[T, H]`
//! matrix, so projections and MLPs run on real tokens only, and positions restart at 0 for
//! each sequence. The forward pass is split into [`Qwen3Model::prepare`] (embedding lookup,
//! rotary tables, attention context), [`Qwen3Model::layers`] and [`Qwen3Model::pool`].

use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::Linear;

use crate::attention::{packed_attention, AttnContext, SeqSpan};
use crate::config::Config;
use crate::error::ModelResult;
use crate::weights::Weights;

/// RMSNorm with a learned scale; candle's fused op accumulates in f32 for half types.
#[derive(Debug, Clone)]
struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    fn load(w: &Weights, name: &str, dim: usize, eps: f64) -> ModelResult<RmsNorm> {
        Ok(RmsNorm {
            weight: w.get(&format!("{name}.weight"), &[dim])?,
            eps: eps as f32,
        })
    }
}

impl Module for RmsNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        candle_nn::ops::rms_norm(&x.contiguous()?, &self.weight, self.eps)
    }
}

fn linear(w: &Weights, name: &str, out_dim: usize, in_dim: usize) -> ModelResult<Linear> {
    Ok(Linear::new(
        w.get(&format!("{name}.weight"), &[out_dim, in_dim])?,
        None,
    ))
}

/// Rotary tables for the tokens of one packed batch, `[T, head_dim / 2]` each.
pub struct Rotary {
    cos: Tensor,
    sin: Tensor,
}

impl Rotary {
    /// Positions restart at 0 for every span. Frequencies follow transformers'
    /// default rope init (`inv_freq = theta^(-2i/d)`, products in f32).
    fn new(cfg: &Config, spans: &[SeqSpan], dtype: DType, dev: &Device) -> Result<Rotary> {
        let half = cfg.head_dim() / 2;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| (1.0 / cfg.rope_theta.powf(2.0 * i as f64 / cfg.head_dim() as f64)) as f32)
            .collect();
        let total: usize = spans.iter().map(|s| s.len).sum();
        let (mut cos, mut sin) = (
            Vec::with_capacity(total * half),
            Vec::with_capacity(total * half),
        );
        for span in spans {
            for pos in 0..span.len {
                for f in &inv_freq {
                    let angle = pos as f32 * f;
                    cos.push(angle.cos());
                    sin.push(angle.sin());
                }
            }
        }
        let cos = Tensor::from_vec(cos, (total, half), dev)?.to_dtype(dtype)?;
        let sin = Tensor::from_vec(sin, (total, half), dev)?.to_dtype(dtype)?;
        Ok(Rotary { cos, sin })
    }

    /// Applies the rotation to `[heads, T, hd]` (rotate-half convention, as transformers).
    fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.unsqueeze(0)?.contiguous()?;
        candle_nn::rotary_emb::rope(&x, &self.cos, &self.sin)?.squeeze(0)
    }
}

struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    n_heads: usize,
    n_kv: usize,
    head_dim: usize,
}

impl Attention {
    fn load(cfg: &Config, w: &Weights, p: &str) -> ModelResult<Attention> {
        let (h, hd) = (cfg.hidden_size, cfg.head_dim());
        let (nq, nkv) = (cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd);
        Ok(Attention {
            q_proj: linear(w, &format!("{p}.q_proj"), nq, h)?,
            k_proj: linear(w, &format!("{p}.k_proj"), nkv, h)?,
            v_proj: linear(w, &format!("{p}.v_proj"), nkv, h)?,
            o_proj: linear(w, &format!("{p}.o_proj"), h, nq)?,
            q_norm: RmsNorm::load(w, &format!("{p}.q_norm"), hd, cfg.rms_norm_eps)?,
            k_norm: RmsNorm::load(w, &format!("{p}.k_norm"), hd, cfg.rms_norm_eps)?,
            n_heads: cfg.num_attention_heads,
            n_kv: cfg.num_key_value_heads,
            head_dim: hd,
        })
    }

    /// Projects `[T, H]` to `[heads, T, hd]`, with per-head norm and rotary when given.
    fn heads(
        &self,
        x: &Tensor,
        proj: &Linear,
        heads: usize,
        norm: Option<&RmsNorm>,
    ) -> Result<Tensor> {
        let t = x.dim(0)?;
        let y = proj.forward(x)?.reshape((t, heads, self.head_dim))?;
        let y = match norm {
            Some(n) => n.forward(&y)?,
            None => y,
        };
        y.transpose(0, 1)?.contiguous()
    }

    fn forward(&self, x: &Tensor, rot: &Rotary, ctx: &AttnContext) -> Result<Tensor> {
        let q = rot.apply(&self.heads(x, &self.q_proj, self.n_heads, Some(&self.q_norm))?)?;
        let k = rot.apply(&self.heads(x, &self.k_proj, self.n_kv, Some(&self.k_norm))?)?;
        let v = self.heads(x, &self.v_proj, self.n_kv, None)?;
        let q = (q * (1.0 / (self.head_dim as f64).sqrt()))?;
        let out = packed_attention(&q, &k, &v, ctx)?;
        self.o_proj.forward(&out)
    }
}

struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Mlp {
    fn load(cfg: &Config, w: &Weights, p: &str) -> ModelResult<Mlp> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        Ok(Mlp {
            gate_proj: linear(w, &format!("{p}.gate_proj"), i, h)?,
            up_proj: linear(w, &format!("{p}.up_proj"), i, h)?,
            down_proj: linear(w, &format!("{p}.down_proj"), h, i)?,
        })
    }
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let gate = candle_nn::ops::silu(&self.gate_proj.forward(x)?)?;
        (gate * self.up_proj.forward(x)?)?.apply(&self.down_proj)
    }
}

struct Layer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
}

impl Layer {
    fn load(cfg: &Config, w: &Weights, i: usize) -> ModelResult<Layer> {
        let p = format!("layers.{i}");
        let eps = cfg.rms_norm_eps;
        Ok(Layer {
            input_layernorm: RmsNorm::load(
                w,
                &format!("{p}.input_layernorm"),
                cfg.hidden_size,
                eps,
            )?,
            self_attn: Attention::load(cfg, w, &format!("{p}.self_attn"))?,
            post_attention_layernorm: RmsNorm::load(
                w,
                &format!("{p}.post_attention_layernorm"),
                cfg.hidden_size,
                eps,
            )?,
            mlp: Mlp::load(cfg, w, &format!("{p}.mlp"))?,
        })
    }

    fn forward(&self, x: &Tensor, rot: &Rotary, ctx: &AttnContext) -> Result<Tensor> {
        let h = self
            .self_attn
            .forward(&self.input_layernorm.forward(x)?, rot, ctx)?;
        let x = (x + h)?;
        let h = self
            .mlp
            .forward(&self.post_attention_layernorm.forward(&x)?)?;
        x + h
    }
}

/// Everything `layers` needs, computed once per forward.
pub struct Prepared {
    pub hidden: Tensor,
    pub rotary: Rotary,
    pub ctx: AttnContext,
}

/// The Qwen3 decoder stack used as an embedder.
pub struct Qwen3Model {
    cfg: Config,
    embed_tokens: Tensor,
    layers: Vec<Layer>,
    norm: RmsNorm,
    dtype: DType,
    device: Device,
}

impl Qwen3Model {
    /// Loads every weight, checking names and shapes against `cfg`.
    pub fn new(cfg: &Config, w: &Weights) -> ModelResult<Qwen3Model> {
        let embed_tokens = w.get("embed_tokens.weight", &[cfg.vocab_size, cfg.hidden_size])?;
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| Layer::load(cfg, w, i))
            .collect::<ModelResult<Vec<_>>>()?;
        Ok(Qwen3Model {
            cfg: cfg.clone(),
            embed_tokens,
            layers,
            norm: RmsNorm::load(w, "norm", cfg.hidden_size, cfg.rms_norm_eps)?,
            dtype: w.dtype(),
            device: w.device().clone(),
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Dtype of the weights and activations.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Embedding lookup of the packed ids, rotary tables and attention context.
    pub fn prepare(&self, ids: &[u32], spans: Vec<SeqSpan>, tile: usize) -> Result<Prepared> {
        let ids = Tensor::new(ids, &self.device)?;
        let hidden = self.embed_tokens.index_select(&ids, 0)?;
        let rotary = Rotary::new(&self.cfg, &spans, self.dtype, &self.device)?;
        let ctx = AttnContext::new(spans, tile, &self.device)?;
        Ok(Prepared {
            hidden,
            rotary,
            ctx,
        })
    }

    /// Runs every decoder layer; returns the un-normed hidden states `[T, H]`.
    pub fn layers(&self, prepared: &Prepared) -> Result<Tensor> {
        let mut x = prepared.hidden.clone();
        for layer in &self.layers {
            x = layer.forward(&x, &prepared.rotary, &prepared.ctx)?;
        }
        Ok(x)
    }

    /// Final norm of each span's last token, computed in f32: `[n_spans, H]` (not yet L2-normalised).
    /// The norm is per token, so normalising only the pooled rows equals normalising all.
    pub fn pool(&self, hidden: &Tensor, spans: &[SeqSpan]) -> Result<Tensor> {
        let last: Vec<u32> = spans.iter().map(|s| (s.start + s.len - 1) as u32).collect();
        let last = Tensor::new(last.as_slice(), &self.device)?;
        let pooled = hidden.index_select(&last, 0)?.to_dtype(DType::F32)?;
        let weight = self.norm.weight.to_dtype(DType::F32)?;
        candle_nn::ops::rms_norm(&pooled, &weight, self.norm.eps)
    }
}
