//! The blockwise kernel for a mask other than causal (an encoder's: every key of the sequence,
//! or a sliding window): the same tiles and online softmax, visiting only the key tiles the
//! mask lets a query tile see, with a mask added to a tile only where some of its scores are
//! hidden. The causal path (`super::packed_attention`) stays as it is: it is what the fused
//! kernel is checked against.

use candle_core::{DType, Device, Result, Tensor, D};

use super::{AttnContext, Mask};

/// [`super::packed_attention`] under `mask`.
pub(super) fn packed_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    ctx: &AttnContext,
    scale: f64,
    mask: Mask,
) -> Result<Tensor> {
    super::per_sequence(q, k, v, &ctx.spans, |qs, ks, vs| {
        let (n_kv, g, len, hd) = qs.dims4()?;
        let mut tiles = Vec::new();
        let mut q0 = 0;
        while q0 < len {
            let q_len = ctx.tile.min(len - q0);
            let qt = qs.narrow(2, q0, q_len)?.reshape((n_kv, g * q_len, hd))?;
            let out = query_tile(&qt, ks, vs, (q0, q_len, g), ctx.tile, scale, mask)?;
            tiles.push(out.reshape((n_kv, g, q_len, hd))?);
            q0 += q_len;
        }
        Tensor::cat(&tiles, 2)
    })
}

/// The additive mask of query rows `[q0, q0 + q_len)` against keys `[k0, k0 + k_len)`.
fn mask_tile(
    mask: Mask,
    (q0, q_len): (usize, usize),
    (k0, k_len): (usize, usize),
    dev: &Device,
) -> Result<Tensor> {
    let values: Vec<f32> = (0..q_len * k_len)
        .map(|i| {
            let (row, col) = (q0 + i / k_len, k0 + i % k_len);
            if mask.sees(row, col) {
                0.0
            } else {
                f32::NEG_INFINITY
            }
        })
        .collect();
    Tensor::from_vec(values, (q_len, k_len), dev)
}

/// One query tile (`[n_kv, g*q_len, hd]`, rows from `q0`) against the key tiles `mask` lets it
/// see, with an online softmax in f32.
fn query_tile(
    qt: &Tensor,
    k: &Tensor,
    v: &Tensor,
    (q0, q_len, g): (usize, usize, usize),
    tile: usize,
    scale: f64,
    mask: Mask,
) -> Result<Tensor> {
    let dtype = v.dtype();
    let (lo, hi) = mask.keys_of(q0, q0 + q_len, k.dim(1)?);
    let mut state: Option<(Tensor, Tensor, Tensor)> = None;
    let mut k0 = lo;
    while k0 < hi {
        let k_len = tile.min(hi - k0);
        let s = (qt
            .matmul(&k.narrow(1, k0, k_len)?.t()?)?
            .to_dtype(DType::F32)?
            * scale)?;
        let s = if mask.sees_all(q0, q0 + q_len, k0, k0 + k_len) {
            s
        } else {
            let (n_kv, rows, _) = s.dims3()?;
            let add = mask_tile(mask, (q0, q_len), (k0, k_len), s.device())?;
            s.reshape((n_kv, g, q_len, k_len))?
                .broadcast_add(&add)?
                .reshape((n_kv, rows, k_len))?
        };
        // A row may see none of this tile's keys: its max is floored so that exp() of its
        // scores is 0, not NaN; every row sees its own key in some tile.
        let tile_max = s.max_keepdim(D::Minus1)?.maximum(-1e30)?;
        let m_new = match &state {
            None => tile_max,
            Some((m, _, _)) => m.maximum(&tile_max)?,
        };
        let p = s.broadcast_sub(&m_new)?.exp()?;
        let pv = p
            .to_dtype(dtype)?
            .matmul(&v.narrow(1, k0, k_len)?)?
            .to_dtype(DType::F32)?;
        let row_sum = p.sum_keepdim(D::Minus1)?;
        state = Some(match state {
            None => (m_new, row_sum, pv),
            Some((m, l, acc)) => {
                let corr = (m - &m_new)?.exp()?;
                (
                    m_new,
                    ((l * &corr)? + row_sum)?,
                    (acc.broadcast_mul(&corr)? + pv)?,
                )
            }
        });
        k0 += k_len;
    }
    let (_, l, acc) = state
        .ok_or_else(|| candle_core::Error::Msg("a query tile saw no key. This is a bug.".into()))?;
    acc.broadcast_div(&l)?.to_dtype(dtype)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::AttentionKernel;
    use crate::packed::SeqSpan;

    /// Blockwise and the CPU's tiled kernel agree under every mask, across tiles and sequences.
    #[test]
    fn blockwise_agrees_with_the_tiled_kernel_under_full_and_window_masks() {
        let dev = Device::Cpu;
        let (nh, nkv, hd) = (4, 2, 8);
        let lens = [1usize, 7, 40];
        let total: usize = lens.iter().sum();
        let q = Tensor::randn(0f32, 1.0, (total, nh, hd), &dev).unwrap();
        let k = Tensor::randn(0f32, 1.0, (total, nkv, hd), &dev).unwrap();
        let v = Tensor::randn(0f32, 1.0, (total, nkv, hd), &dev).unwrap();
        let mut spans = Vec::new();
        let mut start = 0;
        for len in lens {
            spans.push(SeqSpan { start, len });
            start += len;
        }
        let masks = [
            Mask::Full,
            Mask::Window { left: 4, right: 4 },
            Mask::Window { left: 9, right: 2 },
        ];
        for mask in masks {
            for tile in [1, 5, 16, 64] {
                let run = |kernel: AttentionKernel| {
                    let ctx = AttnContext::new(spans.clone(), tile, kernel.clone(), &dev).unwrap();
                    kernel.attention(&q, &k, &v, &ctx, 0.3, mask).unwrap()
                };
                let diff = (run(AttentionKernel::Blockwise) - run(AttentionKernel::Tiled))
                    .unwrap()
                    .abs()
                    .unwrap()
                    .max_all()
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap();
                assert!(diff < 1e-5, "{mask:?} tile {tile}: max diff {diff}");
            }
        }
    }
}
