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
//! each sequence. Fewer, larger kernels: q/k/v and gate/up are one matrix product each (weights
//! concatenated at load), rotary rows are gathered from a table kept on the device and applied
//! token-major (`rope_thd`), so a layer makes no transposed copy; RMSNorm and its f32
//! accumulation are candle's fused kernel. (candle-nn offers no fused residual-add + RMSNorm,
//! so that stays an add and a norm.) The forward pass is split into [`Qwen3Model::prepare`] (embedding lookup,
//! rotary tables, attention context), [`Qwen3Model::layers`] and [`Qwen3Model::pool`].

use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::Linear;

use super::config::Config;
use crate::attention::{AttentionKernel, AttnContext, Mask};
use crate::elementwise::Elementwise;
use crate::error::ModelResult;
use crate::packed::SeqSpan;
use crate::projection::Projection;
use crate::stage_profile::stage;
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

/// Several projections of the same input as one: their weights stacked along the output axis,
/// so one matrix product (one kernel) computes them all. Each part is checked against its own
/// name and shape first.
fn merged_linear(w: &Weights, parts: &[(String, usize)], in_dim: usize) -> ModelResult<Linear> {
    let weights = parts
        .iter()
        .map(|(name, out_dim)| w.get(&format!("{name}.weight"), &[*out_dim, in_dim]))
        .collect::<ModelResult<Vec<_>>>()?;
    Ok(Linear::new(Tensor::cat(&weights, 0)?, None))
}

/// Rotary tables for every position the model takes, `[max_positions, head_dim / 2]` each,
/// kept on the model's device: a forward gathers its tokens' rows on the device (one small
/// upload of positions) instead of computing and uploading tables every time.
struct RotaryTable {
    cos: Tensor,
    sin: Tensor,
}

impl RotaryTable {
    /// Frequencies follow transformers' default rope init (`inv_freq = theta^(-2i/d)`, products
    /// in f32).
    fn new(cfg: &Config, dtype: DType, dev: &Device) -> Result<RotaryTable> {
        let half = cfg.head_dim() / 2;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| (1.0 / cfg.rope_theta.powf(2.0 * i as f64 / cfg.head_dim() as f64)) as f32)
            .collect();
        let positions = cfg.max_position_embeddings.max(1);
        let (mut cos, mut sin) = (
            Vec::with_capacity(positions * half),
            Vec::with_capacity(positions * half),
        );
        for pos in 0..positions {
            for f in &inv_freq {
                let angle = pos as f32 * f;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        let cos = Tensor::from_vec(cos, (positions, half), dev)?.to_dtype(dtype)?;
        let sin = Tensor::from_vec(sin, (positions, half), dev)?.to_dtype(dtype)?;
        Ok(RotaryTable { cos, sin })
    }

    /// The rows of the tokens of a packed batch: positions restart at 0 for every span. Rows
    /// past the tokens, up to `rows` (the attention kernel's padding), take position 0: they
    /// rotate the zero rows there, which stay zero.
    fn gather(&self, spans: &[SeqSpan], rows: usize) -> Result<Rotary> {
        let mut positions: Vec<u32> = spans.iter().flat_map(|s| 0..s.len as u32).collect();
        positions.resize(rows.max(positions.len()), 0);
        let positions = Tensor::new(positions.as_slice(), self.cos.device())?;
        Ok(Rotary {
            cos: self.cos.index_select(&positions, 0)?,
            sin: self.sin.index_select(&positions, 0)?,
        })
    }
}

/// Rotary rows for the tokens of one packed batch, `[T, head_dim / 2]` each.
pub struct Rotary {
    cos: Tensor,
    sin: Tensor,
}

impl Rotary {
    /// Rotates `[T, heads, hd]` in place of layout (rotate-half convention, as transformers),
    /// token-major as the projections give it: no transposed copy.
    fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.unsqueeze(0)?;
        candle_nn::rotary_emb::rope_thd(&x, &self.cos, &self.sin)?.squeeze(0)
    }
}

/// The attention layer with q, k and v projected by one matrix product (their weights are
/// concatenated at load), per-head RMSNorm on q and k, and rotary on the device, all in the
/// token-major `[T, heads, hd]` layout the fused kernel takes.
struct Attention {
    qkv_proj: Projection,
    o_proj: Projection,
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
            qkv_proj: merged_linear(
                w,
                &[
                    (format!("{p}.q_proj"), nq),
                    (format!("{p}.k_proj"), nkv),
                    (format!("{p}.v_proj"), nkv),
                ],
                h,
            )?
            .into(),
            o_proj: linear(w, &format!("{p}.o_proj"), h, nq)?.into(),
            q_norm: RmsNorm::load(w, &format!("{p}.q_norm"), hd, cfg.rms_norm_eps)?,
            k_norm: RmsNorm::load(w, &format!("{p}.k_norm"), hd, cfg.rms_norm_eps)?,
            n_heads: cfg.num_attention_heads,
            n_kv: cfg.num_key_value_heads,
            head_dim: hd,
        })
    }

    fn forward(
        &self,
        x: &Tensor,
        rot: &Rotary,
        ctx: &AttnContext,
        ew: Elementwise,
    ) -> Result<Tensor> {
        let attended = self.attend(x, rot, ctx, ew)?;
        stage("o_proj", x.device(), || self.o_proj.forward(&attended))
    }

    /// q and k of the packed `qkv`, normed per head and rotated, in `rows` rows (the kernel's:
    /// the fused kernel's padded buffers). The copy that makes each narrowed part contiguous
    /// for the norm is the one that pads it, so the kernel takes them as they are; zero rows
    /// stay zero through the norm and the rotary.
    fn normed_rotated_qk(
        &self,
        qkv: &Tensor,
        rot: &Rotary,
        rows: usize,
        ew: Elementwise,
    ) -> Result<(Tensor, Tensor)> {
        let one = |first: usize, heads: usize, norm: &RmsNorm| -> Result<Tensor> {
            let (w, eps) = (&norm.weight, norm.eps);
            if let Some(t) = ew.qk_norm_rope(qkv, first, heads, w, eps, &rot.cos, &rot.sin, rows)? {
                return Ok(t);
            }
            rot.apply(&norm.forward(&pad_rows(&qkv.narrow(1, first, heads)?, rows)?)?)
        };
        let (nh, nkv) = (self.n_heads, self.n_kv);
        Ok((one(0, nh, &self.q_norm)?, one(nh, nkv, &self.k_norm)?))
    }

    /// Every token's attention output before `o_proj`: `[T, n_heads * head_dim]`.
    fn attend(
        &self,
        x: &Tensor,
        rot: &Rotary,
        ctx: &AttnContext,
        ew: Elementwise,
    ) -> Result<Tensor> {
        let t = x.dim(0)?;
        let (nh, nkv, hd) = (self.n_heads, self.n_kv, self.head_dim);
        let dev = x.device();
        let qkv =
            stage("qkv_proj", dev, || self.qkv_proj.forward(x))?.reshape((t, nh + 2 * nkv, hd))?;
        let (q, k) = stage("qk_norm_rope", dev, || {
            self.normed_rotated_qk(&qkv, rot, ctx.rows, ew)
        })?;
        // v stays a view: each kernel makes the one copy it needs (the blockwise path its
        // head-major copy, the fused one its padded buffer), not a second one here.
        let v = qkv.narrow(1, nh + nkv, nkv)?;
        // The softmax scale goes into the kernel: pre-scaling q in bf16 would round it.
        let scale = 1.0 / (hd as f64).sqrt();
        stage("attention", dev, || {
            ctx.kernel.attention(&q, &k, &v, ctx, scale, Mask::Causal)
        })
    }
}

/// `x` (`[T, heads, hd]`, a view) with zero rows appended up to `rows`: one copy, contiguous.
/// With no rows to add, `x` as it is (the norm makes its own contiguous copy).
fn pad_rows(x: &Tensor, rows: usize) -> Result<Tensor> {
    let t = x.dim(0)?;
    if rows <= t {
        return Ok(x.clone());
    }
    x.pad_with_zeros(0, 0, rows - t)
}

/// The SwiGLU MLP with gate and up projected by one matrix product.
struct Mlp {
    gate_up_proj: Projection,
    down_proj: Projection,
}

impl Mlp {
    fn load(cfg: &Config, w: &Weights, p: &str) -> ModelResult<Mlp> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        Ok(Mlp {
            gate_up_proj: merged_linear(
                w,
                &[(format!("{p}.gate_proj"), i), (format!("{p}.up_proj"), i)],
                h,
            )?
            .into(),
            down_proj: linear(w, &format!("{p}.down_proj"), h, i)?.into(),
        })
    }
}

impl Mlp {
    fn forward(&self, x: &Tensor, ew: Elementwise) -> Result<Tensor> {
        // silu(gate) * up over the two halves of one product.
        let dev = x.device();
        let gate_up = stage("gate_up_proj", dev, || self.gate_up_proj.forward(x))?;
        let h = stage("swiglu", dev, || ew.swiglu(&gate_up))?;
        stage("down_proj", dev, || self.down_proj.forward(&h))
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

    /// The layer on `x`, whose input norm `normed` the step before computed (fused with its
    /// residual add); returns the layer's output and `next` (the next layer's input norm) of it.
    fn forward(
        &self,
        x: &Tensor,
        normed: &Tensor,
        rot: &Rotary,
        ctx: &AttnContext,
        next: &RmsNorm,
        ew: Elementwise,
    ) -> Result<(Tensor, Tensor)> {
        let h = self.self_attn.forward(normed, rot, ctx, ew)?;
        let (x, normed) = add_then_norm(x, &h, &self.post_attention_layernorm, ew)?;
        let h = self.mlp.forward(&normed, ew)?;
        add_then_norm(&x, &h, next, ew)
    }

    /// The layer's output at the rows `rows` of `x` only (`[rows, H]`). Attention still reads
    /// every token's keys and values; `o_proj`, the residual and the MLP run on those rows
    /// alone. The last layer feeds nothing but the pooled tokens, so it needs no more.
    fn forward_rows(
        &self,
        x: &Tensor,
        normed: &Tensor,
        rot: &Rotary,
        ctx: &AttnContext,
        rows: &Tensor,
        ew: Elementwise,
    ) -> Result<Tensor> {
        let dev = x.device();
        let attended = self
            .self_attn
            .attend(normed, rot, ctx, ew)?
            .index_select(rows, 0)?;
        let h = stage("o_proj", dev, || self.self_attn.o_proj.forward(&attended))?;
        let (x, normed) = add_then_norm(
            &x.index_select(rows, 0)?,
            &h,
            &self.post_attention_layernorm,
            ew,
        )?;
        let h = self.mlp.forward(&normed, ew)?;
        stage("residual", dev, || x + h)
    }
}

/// The residual `x + h` and `norm` of it: one kernel with [`Elementwise::Fused`], an add and
/// candle's norm otherwise.
fn add_then_norm(
    x: &Tensor,
    h: &Tensor,
    norm: &RmsNorm,
    ew: Elementwise,
) -> Result<(Tensor, Tensor)> {
    stage("residual_norm", x.device(), || {
        ew.add_rms_norm(x, h, &norm.weight, norm.eps)
    })
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
    rotary: RotaryTable,
    kernel: AttentionKernel,
    elementwise: Elementwise,
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
            rotary: RotaryTable::new(cfg, w.dtype(), w.device())?,
            // The CPU's own tiled kernel in f32 (blockwise when asked, for an A/B check); a
            // GPU's fused kernel replaces this after its self-test (the embedder's), else
            // blockwise.
            kernel: if w.device().is_cpu()
                && w.dtype() == DType::F32
                && !crate::attention_check::blockwise_asked()
            {
                AttentionKernel::Tiled
            } else {
                AttentionKernel::Blockwise
            },
            elementwise: Elementwise::from_env(),
            dtype: w.dtype(),
            device: w.device().clone(),
        })
    }

    /// Runs attention with `kernel` from now on (the embedder picks the fused kernel on a GPU
    /// after its self-test).
    pub fn set_attention_kernel(&mut self, kernel: AttentionKernel) {
        self.kernel = kernel;
    }

    /// Runs the elementwise steps (SwiGLU, residual add and norm) with `ew` from now on (the
    /// default: [`Elementwise::from_env`]).
    pub fn set_elementwise(&mut self, ew: Elementwise) {
        self.elementwise = ew;
    }

    /// Quantizes every projection's weight to FP8 (`--precision fp8`; [`crate::fp8`]): codes
    /// and per-channel scales on a GPU, the emulation on the CPU. The loaded weights are
    /// dropped as each is replaced, so the projections' memory halves on a GPU.
    pub fn quantize_projections_fp8(&mut self) -> Result<()> {
        for layer in &mut self.layers {
            for p in [
                &mut layer.self_attn.qkv_proj,
                &mut layer.self_attn.o_proj,
                &mut layer.mlp.gate_up_proj,
                &mut layer.mlp.down_proj,
            ] {
                *p = p.to_fp8()?;
            }
        }
        Ok(())
    }

    /// Whether the projections are FP8.
    pub fn projections_fp8(&self) -> bool {
        self.layers
            .first()
            .is_some_and(|l| l.self_attn.qkv_proj.is_fp8())
    }

    /// The attention kernel in use.
    pub fn attention_kernel(&self) -> &AttentionKernel {
        &self.kernel
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
        let ctx = AttnContext::new(spans, tile, self.kernel.clone(), &self.device)?;
        let rotary = self.rotary.gather(&ctx.spans, ctx.rows)?;
        Ok(Prepared {
            hidden,
            rotary,
            ctx,
        })
    }

    /// Runs every decoder layer; returns the un-normed hidden state of each span's last token
    /// (the pooled one): `[n_spans, H]`. The last layer computes those rows only
    /// ([`Layer::forward_rows`]): its other rows would be thrown away.
    pub fn layers(&self, prepared: &Prepared, spans: &[SeqSpan]) -> Result<Tensor> {
        let last: Vec<u32> = spans.iter().map(|s| (s.start + s.len - 1) as u32).collect();
        let last = Tensor::new(last.as_slice(), &self.device)?;
        let Some((final_layer, layers)) = self.layers.split_last() else {
            return prepared.hidden.index_select(&last, 0);
        };
        let (rot, ctx) = (&prepared.rotary, &prepared.ctx);
        let mut x = prepared.hidden.clone();
        let mut normed = stage("norm", &self.device, || {
            self.layers[0].input_layernorm.forward(&x)
        })?;
        for (i, layer) in layers.iter().enumerate() {
            let next = &self.layers[i + 1].input_layernorm;
            (x, normed) = layer.forward(&x, &normed, rot, ctx, next, self.elementwise)?;
        }
        // EF_LAST_LAYER_ALL_ROWS=1 (an A/B switch for the GPU check): the last layer on every
        // row, as the others, and its pooled rows taken after.
        if crate::ab_switch::AbSwitch::LastLayerAllRows.on() {
            let all = Tensor::arange(0u32, x.dim(0)? as u32, &self.device)?;
            return final_layer
                .forward_rows(&x, &normed, rot, ctx, &all, self.elementwise)?
                .index_select(&last, 0);
        }
        final_layer.forward_rows(&x, &normed, rot, ctx, &last, self.elementwise)
    }

    /// Final norm of the pooled rows `layers` returned, computed in f32: `[n_spans, H]` (not
    /// yet L2-normalised). The norm is per token, so normalising only the pooled rows equals
    /// normalising all.
    pub fn pool(&self, pooled: &Tensor) -> Result<Tensor> {
        let pooled = pooled.to_dtype(DType::F32)?;
        let weight = self.norm.weight.to_dtype(DType::F32)?;
        candle_nn::ops::rms_norm(&pooled, &weight, self.norm.eps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qwen3::tiny::{random_weights, tiny_config};

    fn tiny_model() -> Qwen3Model {
        tiny_model_in(DType::F32)
    }

    fn tiny_model_in(dtype: DType) -> Qwen3Model {
        let cfg = tiny_config();
        let tensors = random_weights(&cfg, 7).unwrap().into_iter().collect();
        let w = Weights::from_tensors(tensors, "tiny", dtype, &Device::Cpu);
        Qwen3Model::new(&cfg, &w).unwrap()
    }

    fn spans_and_ids() -> (Vec<SeqSpan>, Vec<u32>) {
        let spans = vec![
            SeqSpan { start: 0, len: 37 },
            SeqSpan { start: 37, len: 1 },
            SeqSpan { start: 38, len: 4 },
        ];
        let ids = (0..42u32).map(|i| (i * 131 + 7) % 500).collect();
        (spans, ids)
    }

    fn values(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1().unwrap()
    }

    /// The fused kernel's rows on the CPU: q and k made in a padded buffer hold the unpadded
    /// ones' values in their first rows and zeros after.
    #[test]
    fn q_and_k_made_in_padded_rows_are_the_tokens_then_zeros() {
        for ew in [Elementwise::Candle, Elementwise::Fused] {
            q_and_k_in_padded_rows(ew);
        }
    }

    fn q_and_k_in_padded_rows(ew: Elementwise) {
        let model = tiny_model();
        let (spans, ids) = spans_and_ids();
        let prepared = model.prepare(&ids, spans.clone(), 16).unwrap();
        let attn = &model.layers[0].self_attn;
        let (t, nh, nkv, hd) = (42, attn.n_heads, attn.n_kv, attn.head_dim);
        let qkv = attn
            .qkv_proj
            .forward(&prepared.hidden)
            .unwrap()
            .reshape((t, nh + 2 * nkv, hd))
            .unwrap();
        let (q, k) = attn
            .normed_rotated_qk(&qkv, &prepared.rotary, t, ew)
            .unwrap();
        let padded_rot = model.rotary.gather(&spans, 64).unwrap();
        let (qp, kp) = attn.normed_rotated_qk(&qkv, &padded_rot, 64, ew).unwrap();
        for (plain, padded, heads) in [(&q, &qp, nh), (&k, &kp, nkv)] {
            assert_eq!(padded.dims(), &[64, heads, hd]);
            assert!(padded.is_contiguous());
            assert_eq!(values(&padded.narrow(0, 0, t).unwrap()), values(plain));
            let tail = values(&padded.narrow(0, t, 64 - t).unwrap());
            assert!(
                tail.iter().all(|&v| v == 0.0),
                "the padded tail is not zero"
            );
        }
    }

    /// A whole forward with q and k in padded rows (as the fused kernel takes them) gives the
    /// same pooled rows as the unpadded one.
    #[test]
    fn a_forward_with_padded_q_and_k_pools_the_same_rows() {
        let model = tiny_model();
        let (spans, ids) = spans_and_ids();
        let plain = model.prepare(&ids, spans.clone(), 16).unwrap();
        let mut padded = model.prepare(&ids, spans.clone(), 16).unwrap();
        assert_eq!(padded.ctx.rows, 42);
        padded.ctx.rows = 64;
        padded.rotary = model.rotary.gather(&spans, 64).unwrap();
        let a = values(&model.layers(&plain, &spans).unwrap());
        let b = values(&model.layers(&padded, &spans).unwrap());
        assert_eq!(a.len(), 3 * 128);
        assert_eq!(a, b);
    }

    /// The fused elementwise steps give the pooled rows of candle's ops: to f32 rounding in
    /// f32, within bf16's drift in bf16 (where they round at other points, so not bit-equal:
    /// the fused path did run).
    #[test]
    fn the_fused_elementwise_forward_pools_the_rows_of_candles_ops() {
        let (spans, ids) = spans_and_ids();
        for (dtype, floor) in [(DType::F32, 1.0 - 1e-9), (DType::BF16, 0.999)] {
            let mut model = tiny_model_in(dtype);
            let run = |model: &Qwen3Model| {
                let prepared = model.prepare(&ids, spans.clone(), 16).unwrap();
                let pooled = model.layers(&prepared, &spans).unwrap();
                let rows = model.pool(&pooled).unwrap();
                rows.to_vec2::<f32>().unwrap()
            };
            model.set_elementwise(Elementwise::Candle);
            let candle = run(&model);
            model.set_elementwise(Elementwise::Fused);
            let fused = run(&model);
            assert_eq!(fused.len(), 3);
            for (a, b) in candle.iter().zip(&fused) {
                let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
                let norm = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
                let cosine = dot / (norm(a) * norm(b));
                assert!(cosine >= floor, "{dtype:?}: cosine {cosine}");
            }
            if dtype == DType::BF16 {
                assert_ne!(
                    candle, fused,
                    "bf16: the fused path rounds at its own points"
                );
            }
        }
    }
}
