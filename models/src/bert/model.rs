//! The BERT encoder (also RoBERTa's and XLM-RoBERTa's), as transformers'
//! `models/bert/modeling_bert.py` computes it: word, position and token-type embeddings summed
//! and layer-normed; each layer post-norm (self-attention with biases over the whole sequence,
//! then `LayerNorm(dense(attn) + x)`, then the feed-forward block and its own residual norm).
//! No final norm; the pooler is not used (sentence-transformers pools the hidden states).
//!
//! Packed like Qwen3's: the tokens of every sequence are one `[T, H]` matrix; q, k and v are one
//! matrix product (weights concatenated at load) and the attention kernel reads them as views.
//! RoBERTa's positions count from `pad_token_id + 1` and skip pad ids inside a text, as its
//! `create_position_ids_from_input_ids` does.

use candle_core::{DType, Device, Result, Tensor};
use candle_nn::Linear;

use super::config::{Activation, Config, Variant};
use crate::attention::{AttentionKernel, AttnContext, Mask};
use crate::encoder::{AttentionUse, EncoderModel};
use crate::error::ModelResult;
use crate::packed::SeqSpan;
use crate::projection::project;
use crate::weights::Weights;

/// LayerNorm with weight and bias (`LayerNorm.weight`, or TF1 conversions' `gamma`/`beta`).
struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
    eps: f32,
}

impl LayerNorm {
    fn load(w: &Weights, name: &str, dim: usize, eps: f64) -> ModelResult<LayerNorm> {
        let (weight, bias) = match w.get(&format!("{name}.weight"), &[dim]) {
            Ok(weight) => (weight, w.get(&format!("{name}.bias"), &[dim])?),
            Err(first) => match w.get(&format!("{name}.gamma"), &[dim]) {
                Ok(gamma) => (gamma, w.get(&format!("{name}.beta"), &[dim])?),
                Err(_) => return Err(first),
            },
        };
        Ok(LayerNorm {
            weight,
            bias,
            eps: eps as f32,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        candle_nn::ops::layer_norm(&x.contiguous()?, &self.weight, &self.bias, self.eps)
    }
}

/// A linear layer with its bias added after the projection (which runs without one).
struct Dense {
    linear: Linear,
    bias: Tensor,
}

impl Dense {
    /// Several of them stacked along the output axis: one product computes them all.
    fn load(w: &Weights, names: &[&str], out_dim: usize, in_dim: usize) -> ModelResult<Dense> {
        let mut weights = Vec::with_capacity(names.len());
        let mut biases = Vec::with_capacity(names.len());
        for name in names {
            weights.push(w.get(&format!("{name}.weight"), &[out_dim, in_dim])?);
            biases.push(w.get(&format!("{name}.bias"), &[out_dim])?);
        }
        Ok(Dense {
            linear: Linear::new(Tensor::cat(&weights, 0)?, None),
            bias: Tensor::cat(&biases, 0)?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        project(&self.linear, x)?.broadcast_add(&self.bias)
    }

    /// `gelu(x·Wᵀ + b)`: the bias added in the GELU's pass (one pass over the product on the
    /// CPU, not two).
    fn forward_gelu(&self, x: &Tensor, gelu: crate::activation::Gelu) -> Result<Tensor> {
        crate::activation::bias_gelu(&project(&self.linear, x)?, &self.bias, gelu)
    }
}

struct Layer {
    qkv: Dense,
    attention_out: Dense,
    attention_norm: LayerNorm,
    intermediate: Dense,
    output: Dense,
    output_norm: LayerNorm,
}

impl Layer {
    fn load(cfg: &Config, w: &Weights, p: &str) -> ModelResult<Layer> {
        let (h, i, eps) = (cfg.hidden_size, cfg.intermediate_size, cfg.layer_norm_eps);
        let s = format!("{p}.attention.self");
        Ok(Layer {
            qkv: Dense::load(
                w,
                &[
                    &format!("{s}.query"),
                    &format!("{s}.key"),
                    &format!("{s}.value"),
                ],
                h,
                h,
            )?,
            attention_out: Dense::load(w, &[&format!("{p}.attention.output.dense")], h, h)?,
            attention_norm: LayerNorm::load(w, &format!("{p}.attention.output.LayerNorm"), h, eps)?,
            intermediate: Dense::load(w, &[&format!("{p}.intermediate.dense")], i, h)?,
            output: Dense::load(w, &[&format!("{p}.output.dense")], h, i)?,
            output_norm: LayerNorm::load(w, &format!("{p}.output.LayerNorm"), h, eps)?,
        })
    }
}

/// A loaded BERT-like encoder.
pub struct BertModel {
    cfg: Config,
    variant: Variant,
    word: Tensor,
    position: Tensor,
    /// Row 0 of the token-type table: every token of a single text has type 0.
    token_type: Tensor,
    embedding_norm: LayerNorm,
    layers: Vec<Layer>,
    activation: Activation,
    kernel: AttentionKernel,
    tile: usize,
}

impl BertModel {
    /// Loads every weight of `cfg`'s encoder from `w`, checking its shape.
    pub fn new(
        cfg: &Config,
        variant: Variant,
        w: &Weights,
        kernel: AttentionKernel,
        tile: usize,
    ) -> ModelResult<BertModel> {
        let h = cfg.hidden_size;
        let e = "embeddings";
        let layers = (0..cfg.num_hidden_layers)
            .map(|l| Layer::load(cfg, w, &format!("encoder.layer.{l}")))
            .collect::<ModelResult<Vec<_>>>()?;
        Ok(BertModel {
            word: w.get(&format!("{e}.word_embeddings.weight"), &[cfg.vocab_size, h])?,
            position: w.get(
                &format!("{e}.position_embeddings.weight"),
                &[cfg.max_position_embeddings, h],
            )?,
            token_type: w
                .get(
                    &format!("{e}.token_type_embeddings.weight"),
                    &[cfg.type_vocab_size, h],
                )?
                .get(0)?,
            embedding_norm: LayerNorm::load(w, &format!("{e}.LayerNorm"), h, cfg.layer_norm_eps)?,
            layers,
            activation: cfg.activation().map_err(candle_core::Error::Msg)?,
            cfg: cfg.clone(),
            variant,
            kernel,
            tile: tile.max(1),
        })
    }

    /// Each token's position: from 0 in each sequence (BERT), or RoBERTa's count of the
    /// non-pad tokens so far after `pad_token_id` (a pad id keeps `pad_token_id`).
    fn position_ids(&self, ids: &[u32], spans: &[SeqSpan]) -> Vec<u32> {
        if !self.variant.offsets_positions() {
            return spans.iter().flat_map(|s| 0..s.len as u32).collect();
        }
        let pad = self.cfg.position_offset() as u32 - 1;
        let mut positions = Vec::with_capacity(ids.len());
        for span in spans {
            let mut seen = 0;
            for &id in &ids[span.start..span.start + span.len] {
                if id == pad {
                    positions.push(pad);
                } else {
                    seen += 1;
                    positions.push(pad + seen);
                }
            }
        }
        positions
    }

    fn embed(&self, ids: &[u32], spans: &[SeqSpan]) -> Result<Tensor> {
        let dev = self.word.device();
        let positions = Tensor::new(self.position_ids(ids, spans).as_slice(), dev)?;
        let ids = Tensor::new(ids, dev)?;
        let x = self
            .word
            .index_select(&ids, 0)?
            .broadcast_add(&self.token_type)?;
        let x = (x + self.position.index_select(&positions, 0)?)?;
        self.embedding_norm.forward(&x)
    }

    fn layer(&self, layer: &Layer, x: &Tensor, ctx: &AttnContext) -> Result<Tensor> {
        let t = x.dim(0)?;
        let nh = self.cfg.num_attention_heads;
        let hd = self.cfg.head_dim();
        let qkv = layer.qkv.forward(x)?.reshape((t, 3 * nh, hd))?;
        let (q, k, v) = (
            qkv.narrow(1, 0, nh)?,
            qkv.narrow(1, nh, nh)?,
            qkv.narrow(1, 2 * nh, nh)?,
        );
        let scale = 1.0 / (hd as f64).sqrt();
        let attended = self.kernel.attention(&q, &k, &v, ctx, scale, Mask::Full)?;
        let a = layer
            .attention_norm
            .forward(&(layer.attention_out.forward(&attended)? + x)?)?;
        let h = match self.activation {
            Activation::GeluErf => layer
                .intermediate
                .forward_gelu(&a, crate::activation::Gelu::Erf)?,
            Activation::GeluTanh => layer
                .intermediate
                .forward_gelu(&a, crate::activation::Gelu::Tanh)?,
            Activation::Relu => layer.intermediate.forward(&a)?.relu()?,
        };
        layer.output_norm.forward(&(layer.output.forward(&h)? + a)?)
    }
}

impl EncoderModel for BertModel {
    fn forward(&self, ids: &[u32], spans: &[SeqSpan]) -> Result<Tensor> {
        let dev: &Device = self.word.device();
        let ctx = AttnContext::new(spans.to_vec(), self.tile, self.kernel.clone(), dev)?;
        let mut x = self.embed(ids, spans)?;
        for layer in &self.layers {
            x = self.layer(layer, &x, &ctx)?;
        }
        Ok(x)
    }

    fn hidden_size(&self) -> usize {
        self.cfg.hidden_size
    }

    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }

    fn positions(&self) -> usize {
        self.cfg.context(self.variant)
    }

    fn parameters(&self) -> u64 {
        self.cfg.num_parameters()
    }

    /// The residual, the q/k/v product (3H), the attention output and its projection (2H),
    /// the normed sum (H), the intermediate and its activation (2I), the output (H).
    fn floats_per_token(&self) -> u64 {
        (8 * self.cfg.hidden_size + 2 * self.cfg.intermediate_size) as u64
    }

    fn attention(&self) -> AttentionUse {
        let (nh, hd) = (self.cfg.num_attention_heads, self.cfg.head_dim());
        AttentionUse::multi_head(nh, hd, vec![Mask::Full])
    }

    fn dtype(&self) -> DType {
        self.word.dtype()
    }

    fn kernel(&self) -> &AttentionKernel {
        &self.kernel
    }

    fn set_kernel(&mut self, kernel: AttentionKernel) {
        self.kernel = kernel;
    }
}
