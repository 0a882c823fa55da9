//! Causal attention over a packed batch, computed tile by tile.
//!
//! The batch is packed: sequences lie end to end with no padding, and each attends only to
//! itself (a block-diagonal causal mask). Rather than build that mask, we loop over the
//! sequences and, inside each, over query tiles of `tile` rows; each query tile visits the
//! key tiles at or before it with an online softmax (running max `m`, running sum `l`,
//! rescaled accumulator), as in FlashAttention. The largest temporary is therefore
//! `heads × tile × tile` scores, whatever the sequence length: a 32,768-token paper never
//! materialises a 32,768² matrix, and no compute is spent on padding or on masked-out tiles.
//!
//! Grouped-query attention is done without repeating K/V: the `g` query heads sharing a
//! key/value head are stacked along the row axis, so one batched matmul per KV head serves
//! the whole group.
//!
//! Softmax statistics and the accumulator are f32 whatever the model dtype (bf16 on CUDA).
//!
//! This blockwise path is the CPU kernel and the reference; on a GPU the model runs cuDNN's
//! fused attention instead ([`AttentionKernel::Fused`], see `crate::fused`), after a start-up
//! self-test against this one (`crate::attention_check`). This module dispatches to the fused
//! kernel; the fused kernel knows nothing of this one.

use candle_core::{DType, Device, Result, Tensor, D};

pub use crate::cpu::attention::Mask;
use crate::packed::SeqSpan;

mod masked;

/// Which implementation computes attention.
#[derive(Clone)]
pub enum AttentionKernel {
    /// Tile by tile with an online softmax, in candle ops (below): the reference the fused
    /// and tiled kernels are checked against.
    Blockwise,
    /// The CPU's own kernel, f32 (`crate::cpu::attention`): the same schedule in one pass
    /// per tile, vectorised, no tensor per tile. The CPU forward's default.
    Tiled,
    /// cuDNN's fused attention over the whole packed batch, one call per layer.
    #[cfg(feature = "cuda")]
    Fused(std::sync::Arc<crate::fused::FusedAttention>),
}

impl std::fmt::Debug for AttentionKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl AttentionKernel {
    /// `blockwise` or `cudnn-fused`, for logs and reports.
    pub fn name(&self) -> &'static str {
        match self {
            AttentionKernel::Blockwise => "blockwise",
            AttentionKernel::Tiled => "tiled-cpu",
            #[cfg(feature = "cuda")]
            AttentionKernel::Fused(_) => "cudnn-fused",
        }
    }

    /// Attention of every sequence of the batch to itself, each query seeing the keys `mask`
    /// lets it (causal for a decoder, all or a window for an encoder). `q`: `[T, n_heads, hd]`;
    /// `k`, `v`: `[T, n_kv, hd]`, token-major as the projections give them; `scale`
    /// multiplies q·k (applied in f32, never to q in the model dtype). `q` and `k` may carry
    /// zero rows past the tokens, up to [`AttnContext::rows`] (the fused kernel's padded
    /// buffers, made at the one copy they need anyway). Returns `[T, n_heads * hd]`.
    pub fn attention(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        ctx: &AttnContext,
        scale: f64,
        mask: Mask,
    ) -> Result<Tensor> {
        match self {
            AttentionKernel::Blockwise if mask == Mask::Causal => {
                packed_attention(q, k, v, ctx, scale)
            }
            AttentionKernel::Blockwise => masked::packed_attention(q, k, v, ctx, scale, mask),
            AttentionKernel::Tiled => tiled::attention(q, k, v, ctx, scale, mask),
            #[cfg(feature = "cuda")]
            AttentionKernel::Fused(fused) => {
                fused.forward(q, k, v, ctx.fused_batch()?, scale, mask)
            }
        }
    }
}

/// Per-forward attention context shared by all layers.
pub struct AttnContext {
    pub spans: Vec<SeqSpan>,
    pub tile: usize,
    /// The rows the kernel takes q and k in: the tokens, or for the fused kernel its padded
    /// buffer's length (a multiple of 64 tokens), so that the model's normed and rotated q and
    /// k are made in that buffer and not copied into it again.
    pub rows: usize,
    /// The kernel every layer of this forward runs.
    pub kernel: AttentionKernel,
    /// `[t, t]` additive causal mask (0 on and below the diagonal, -inf above), f32, where
    /// `t = min(tile, longest sequence)`; diagonal tiles use its top-left corner. Blockwise
    /// only.
    pub mask: Option<Tensor>,
    /// The fused kernel's per-batch arguments (lengths and offsets on the device).
    #[cfg(feature = "cuda")]
    pub fused: Option<crate::fused::FusedBatch>,
}

impl AttnContext {
    /// Builds the context for `spans`: for the blockwise kernel, query/key tiles of `tile`
    /// tokens and their mask; for the fused one, its device arguments (uploaded once per
    /// forward, shared by every layer).
    pub fn new(
        spans: Vec<SeqSpan>,
        tile: usize,
        kernel: AttentionKernel,
        device: &Device,
    ) -> Result<AttnContext> {
        let tokens = spans.iter().map(|s| s.len).sum();
        match &kernel {
            AttentionKernel::Tiled => Ok(AttnContext {
                spans,
                tile,
                rows: tokens,
                kernel,
                mask: None,
                #[cfg(feature = "cuda")]
                fused: None,
            }),
            AttentionKernel::Blockwise => {
                let longest = spans.iter().map(|s| s.len).max().unwrap_or(1);
                let mask = causal_mask(tile.min(longest).max(1), device)?;
                Ok(AttnContext {
                    spans,
                    tile,
                    rows: tokens,
                    kernel,
                    mask: Some(mask),
                    #[cfg(feature = "cuda")]
                    fused: None,
                })
            }
            #[cfg(feature = "cuda")]
            AttentionKernel::Fused(fused) => {
                let batch = fused.batch(&spans, device)?;
                Ok(AttnContext {
                    spans,
                    tile,
                    // EF_FUSED_QK_COPY=1 (an A/B switch for the GPU check): q and k made in
                    // rows of their own and copied into the padded buffers by the kernel.
                    rows: if crate::ab_switch::AbSwitch::FusedQkCopy.on() {
                        tokens
                    } else {
                        batch.padded_rows().max(tokens)
                    },
                    kernel,
                    mask: None,
                    fused: Some(batch),
                })
            }
        }
    }

    /// The fused kernel's arguments of this forward.
    #[cfg(feature = "cuda")]
    fn fused_batch(&self) -> Result<&crate::fused::FusedBatch> {
        self.fused.as_ref().ok_or_else(|| {
            candle_core::Error::Msg("fused attention without its batch. This is a bug.".into())
        })
    }

    fn mask(&self) -> Result<&Tensor> {
        self.mask.as_ref().ok_or_else(|| {
            candle_core::Error::Msg("blockwise attention without its mask. This is a bug.".into())
        })
    }
}

/// [`AttentionKernel::Tiled`]: `crate::cpu::attention` as a candle op over q, k and v as the
/// model holds them (views into the qkv product: no copy).
mod tiled {
    use candle_core::{CpuStorage, Layout, Result, Shape, Tensor};

    use super::AttnContext;
    use crate::cpu::attention::{Heads, Mask, Rows};
    use crate::packed::SeqSpan;

    pub(super) fn attention(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        ctx: &AttnContext,
        scale: f64,
        mask: Mask,
    ) -> Result<Tensor> {
        let op = Tiled {
            spans: &ctx.spans,
            scale: scale as f32,
            mask,
        };
        q.apply_op3_no_bwd(k, v, &op)
    }

    struct Tiled<'a> {
        spans: &'a [SeqSpan],
        scale: f32,
        mask: Mask,
    }

    /// `[T, heads, hd]` rows of a layout whose last two dimensions are packed (heads `hd`
    /// apart, values 1 apart): its data from its start, and its token stride.
    fn rows<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<(Rows<'a>, usize, usize)> {
        let (t, heads, hd) = l.shape().dims3()?;
        let stride = l.stride();
        if stride[2] != 1 || (heads > 1 && stride[1] != hd) {
            candle_core::bail!("tiled attention: {what} is not packed by heads");
        }
        let CpuStorage::F32(data) = s else {
            candle_core::bail!("tiled attention: f32 only");
        };
        let row = if t > 1 { stride[0] } else { heads * hd };
        Ok((
            Rows {
                data,
                offset: l.start_offset(),
                stride: row,
            },
            heads,
            hd,
        ))
    }

    impl candle_core::CustomOp3 for Tiled<'_> {
        fn name(&self) -> &'static str {
            "tiled-attention"
        }

        fn cpu_fwd(
            &self,
            q: &CpuStorage,
            q_l: &Layout,
            k: &CpuStorage,
            k_l: &Layout,
            v: &CpuStorage,
            v_l: &Layout,
        ) -> Result<(CpuStorage, Shape)> {
            let (q, n_heads, hd) = rows(q, q_l, "q")?;
            let (k, n_kv, _) = rows(k, k_l, "k")?;
            let (v, _, _) = rows(v, v_l, "v")?;
            let total: usize = self.spans.iter().map(|s| s.len).sum();
            let mut out = vec![0f32; total * n_heads * hd];
            let heads = Heads {
                n_heads,
                n_kv,
                head_dim: hd,
            };
            crate::cpu::attention::attention(
                crate::cpu::Simd::detect(),
                q,
                k,
                v,
                self.spans,
                heads,
                self.scale,
                self.mask,
                &mut out,
            );
            Ok((CpuStorage::F32(out), Shape::from((total, n_heads * hd))))
        }
    }
}

/// The `[t, t]` additive causal mask: 0 on and below the diagonal, -inf above, f32.
fn causal_mask(t: usize, device: &Device) -> Result<Tensor> {
    let mask: Vec<f32> = (0..t * t)
        .map(|i| {
            if i % t > i / t {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    Tensor::from_vec(mask, (t, t), device)
}

/// Attention for a packed batch, tile by tile (see the module docs).
///
/// `q`: `[T, n_heads, hd]`; `k`, `v`: `[T, n_kv, hd]`; `scale` multiplies the scores (in f32).
/// `q` and `k` may have padding rows past the `T` of `v` (left out here). Returns
/// `[T, n_heads * hd]`.
pub fn packed_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    ctx: &AttnContext,
    scale: f64,
) -> Result<Tensor> {
    per_sequence(q, k, v, &ctx.spans, |qs, ks, vs| {
        sequence_attention(qs, ks, vs, ctx, scale)
    })
}

/// `attend` on each sequence of the batch, head-major (`q`: `[n_kv, g, L, hd]`; `k`, `v`:
/// `[n_kv, L, hd]`; it returns `[n_kv, g, L, hd]`), the outputs joined token-major again:
/// the blockwise kernel's layout for its per-head matrix products, whatever its mask.
fn per_sequence(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    spans: &[SeqSpan],
    attend: impl Fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let total = v.dim(0)?;
    let (q, k) = (q.narrow(0, 0, total)?, k.narrow(0, 0, total)?);
    let (_, n_heads, hd) = q.dims3()?;
    let n_kv = k.dim(1)?;
    let g = n_heads / n_kv;
    // Head-major for the per-head matrix products of this path.
    let (q, k, v) = (
        q.transpose(0, 1)?.contiguous()?,
        k.transpose(0, 1)?.contiguous()?,
        v.transpose(0, 1)?.contiguous()?,
    );
    let mut outs = Vec::with_capacity(spans.len());
    for span in spans {
        let qs = q
            .narrow(1, span.start, span.len)?
            .reshape((n_kv, g, span.len, hd))?;
        let ks = k.narrow(1, span.start, span.len)?.contiguous()?;
        let vs = v.narrow(1, span.start, span.len)?.contiguous()?;
        outs.push(attend(&qs, &ks, &vs)?);
    }
    // Each output is [n_kv, g, len, hd] = [n_heads, len, hd]; join along the token axis.
    let out = Tensor::cat(&outs, 2)?.reshape((n_heads, total, hd))?;
    out.transpose(0, 1)?
        .contiguous()?
        .reshape((total, n_heads * hd))
}

/// Causal attention of one sequence, query tile by query tile.
///
/// `q`: `[n_kv, g, L, hd]`; `k`, `v`: `[n_kv, L, hd]`. Returns `[n_kv, g, L, hd]`.
fn sequence_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    ctx: &AttnContext,
    scale: f64,
) -> Result<Tensor> {
    let (n_kv, g, len, hd) = q.dims4()?;
    let mut tiles = Vec::with_capacity(len.div_ceil(ctx.tile));
    let mut q_start = 0;
    while q_start < len {
        let q_len = ctx.tile.min(len - q_start);
        let qt = q
            .narrow(2, q_start, q_len)?
            .reshape((n_kv, g * q_len, hd))?;
        let out = query_tile(&qt, k, v, q_start, q_len, g, ctx, scale)?;
        tiles.push(out.reshape((n_kv, g, q_len, hd))?);
        q_start += q_len;
    }
    if tiles.len() == 1 {
        return Ok(tiles.remove(0));
    }
    Tensor::cat(&tiles, 2)
}

/// Scaled scores of a `[n_kv, g*q_len, hd]` query tile against keys
/// `[k_start, k_start + k_len)`, in f32, with the causal mask applied when the key tile is the
/// diagonal one.
fn tile_scores(
    qt: &Tensor,
    k: &Tensor,
    k_start: usize,
    k_len: usize,
    scale: f64,
    diag: Option<(usize, &AttnContext)>,
) -> Result<Tensor> {
    let kt = k.narrow(1, k_start, k_len)?;
    let s = (qt.matmul(&kt.t()?)?.to_dtype(DType::F32)? * scale)?;
    match diag {
        None => Ok(s),
        Some((g, ctx)) => {
            let (n_kv, rows, _) = s.dims3()?;
            let q_len = rows / g;
            let mask = ctx.mask()?.narrow(0, 0, q_len)?.narrow(1, 0, k_len)?;
            s.reshape((n_kv, g, q_len, k_len))?
                .broadcast_add(&mask)?
                .reshape((n_kv, rows, k_len))
        }
    }
}

/// One query tile against all key tiles up to and including the diagonal one.
#[allow(clippy::too_many_arguments)]
fn query_tile(
    qt: &Tensor,
    k: &Tensor,
    v: &Tensor,
    q_start: usize,
    q_len: usize,
    g: usize,
    ctx: &AttnContext,
    scale: f64,
) -> Result<Tensor> {
    let dtype = v.dtype();
    if q_start == 0 {
        // Only the diagonal tile: a plain masked softmax, no running statistics needed.
        let s = tile_scores(qt, k, 0, q_len, scale, Some((g, ctx)))?;
        let p = candle_nn::ops::softmax_last_dim(&s)?.to_dtype(dtype)?;
        return p.matmul(&v.narrow(1, 0, q_len)?);
    }
    // Key tiles are aligned with query tiles, so every key tile visited has, for every query
    // row, at least one unmasked key: the running max is finite after the first tile.
    let mut m: Option<Tensor> = None;
    let mut l = Tensor::zeros(1, DType::F32, qt.device())?;
    let mut acc = Tensor::zeros(1, DType::F32, qt.device())?;
    let mut k_start = 0;
    while k_start <= q_start {
        let diag = k_start == q_start;
        let k_len = if diag { q_len } else { ctx.tile };
        let s = tile_scores(qt, k, k_start, k_len, scale, diag.then_some((g, ctx)))?;
        let tile_max = s.max_keepdim(D::Minus1)?;
        let m_new = match &m {
            None => tile_max,
            Some(m_old) => m_old.maximum(&tile_max)?,
        };
        let p = s.broadcast_sub(&m_new)?.exp()?;
        let pv = p.to_dtype(dtype)?.matmul(&v.narrow(1, k_start, k_len)?)?;
        let pv = pv.to_dtype(DType::F32)?;
        let row_sum = p.sum_keepdim(D::Minus1)?;
        match &m {
            None => {
                l = row_sum;
                acc = pv;
            }
            Some(m_old) => {
                let corr = (m_old - &m_new)?.exp()?;
                l = ((l * &corr)? + row_sum)?;
                acc = (acc.broadcast_mul(&corr)? + pv)?;
            }
        }
        m = Some(m_new);
        k_start += k_len;
    }
    acc.broadcast_div(&l)?.to_dtype(dtype)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Naive reference: full softmax(q kᵀ + causal) v per head, for one sequence.
    fn reference(q: &Tensor, k: &Tensor, v: &Tensor, g: usize) -> Tensor {
        let (nh, len, _) = q.dims3().unwrap();
        let mask = causal_mask(len, q.device()).unwrap();
        let heads: Vec<Tensor> = (0..nh)
            .map(|h| {
                let qh = q.get(h).unwrap();
                let kh = k.get(h / g).unwrap();
                let vh = v.get(h / g).unwrap();
                let s = qh
                    .matmul(&kh.t().unwrap())
                    .unwrap()
                    .broadcast_add(&mask)
                    .unwrap();
                candle_nn::ops::softmax_last_dim(&s)
                    .unwrap()
                    .matmul(&vh)
                    .unwrap()
            })
            .collect();
        let out = Tensor::stack(&heads, 0).unwrap();
        out.transpose(0, 1)
            .unwrap()
            .contiguous()
            .unwrap()
            .reshape((len, ()))
            .unwrap()
    }

    #[test]
    fn tiled_matches_full_softmax_across_tiles_and_sequences() {
        let dev = Device::Cpu;
        let (nh, nkv, hd) = (4, 2, 8);
        let lens = [1usize, 7, 23];
        let total: usize = lens.iter().sum();
        let q = Tensor::randn(0f32, 1.0, (nh, total, hd), &dev).unwrap();
        let k = Tensor::randn(0f32, 1.0, (nkv, total, hd), &dev).unwrap();
        let v = Tensor::randn(0f32, 1.0, (nkv, total, hd), &dev).unwrap();
        // The kernel takes token-major `[T, heads, hd]` and applies the scale itself.
        let scale = 0.37;
        let token_major = |t: &Tensor| t.transpose(0, 1).unwrap().contiguous().unwrap();
        let (qt, kt, vt) = (token_major(&q), token_major(&k), token_major(&v));
        let mut spans = Vec::new();
        let mut start = 0;
        for len in lens {
            spans.push(SeqSpan { start, len });
            start += len;
        }
        for tile in [1, 4, 5, 64] {
            let ctx =
                AttnContext::new(spans.clone(), tile, AttentionKernel::Blockwise, &dev).unwrap();
            let got = AttentionKernel::Blockwise
                .attention(&qt, &kt, &vt, &ctx, scale, Mask::Causal)
                .unwrap();
            for span in &spans {
                let n = |t: &Tensor| {
                    t.narrow(1, span.start, span.len)
                        .unwrap()
                        .contiguous()
                        .unwrap()
                };
                let want = reference(&(n(&q) * scale).unwrap(), &n(&k), &n(&v), nh / nkv);
                let got = got.narrow(0, span.start, span.len).unwrap();
                let diff = (got - want).unwrap().abs().unwrap().max_all().unwrap();
                let diff = diff.to_scalar::<f32>().unwrap();
                assert!(diff < 1e-5, "tile {tile} span {span:?}: max diff {diff}");
            }
        }
    }
}
