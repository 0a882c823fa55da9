//! The forward's elementwise steps on the CPU, f32, each one pass per row, rows split over
//! rayon's pool: the same arithmetic as [`crate::elementwise::cpu`] (the reference, which the
//! tests compare with), vectorised, with the polynomial `exp` of [`super::exp`].

use rayon::prelude::*;

use super::exp::exp;
use super::{simd_kernel, Simd};

/// Rows handed to one task at least: fewer cost more to schedule than to compute.
const MIN_ROWS: usize = 16;

/// `silu(gate) · up` per row of `gate_up` (`rows × 2·inter`, gate then up): `rows × inter`.
pub fn swiglu(gate_up: &[f32], inter: usize) -> Vec<f32> {
    let simd = Simd::detect();
    map_rows(gate_up, 2 * inter, inter, |gu, o| swiglu_row(simd, gu, o))
}

/// `row(input_row, out_row)` over the rows of `input` (`rows × in_cols`) into `rows ×
/// out_cols`, rows split over the pool: the driver of the activations (a gated one reads
/// `2·inter` columns a row and writes `inter`).
pub(crate) fn map_rows(
    input: &[f32],
    in_cols: usize,
    out_cols: usize,
    row: impl Fn(&[f32], &mut [f32]) + Sync,
) -> Vec<f32> {
    let rows = input.len() / in_cols;
    let mut out = vec![0f32; rows * out_cols];
    out.par_chunks_mut(out_cols)
        .zip(input.par_chunks(in_cols))
        .with_min_len(MIN_ROWS)
        .for_each(|(o, i)| row(i, o));
    out
}

simd_kernel! {
    fn swiglu_row<const FMA: bool>(gate_up: &[f32], out: &mut [f32]) {
        let (gate, up) = gate_up.split_at(out.len());
        for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
            *o = *g / (1.0 + exp::<FMA>(-*g)) * *u;
        }
    }
}

/// `x + h` per row and its RMSNorm with weight `w` (`hidden`): the sums, then the normed rows,
/// in one buffer (`2 × rows × hidden`), as the fused op returns them.
pub fn add_rms_norm(x: &[f32], h: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let hidden = w.len();
    let mut out = vec![0f32; 2 * x.len()];
    let (sums, normed) = out.split_at_mut(x.len());
    let simd = Simd::detect();
    sums.par_chunks_mut(hidden)
        .zip(normed.par_chunks_mut(hidden))
        .zip(x.par_chunks(hidden).zip(h.par_chunks(hidden)))
        .with_min_len(MIN_ROWS)
        .for_each(|((s, n), (x, h))| add_rms_norm_row(simd, x, h, w, eps, s, n));
    out
}

simd_kernel! {
    fn add_rms_norm_row<const FMA: bool>(
        x: &[f32],
        h: &[f32],
        w: &[f32],
        eps: f32,
        sum: &mut [f32],
        normed: &mut [f32],
    ) {
        for ((s, a), b) in sum.iter_mut().zip(x).zip(h) {
            *s = a + b;
        }
        let inv = inv_rms::<FMA>(sum, eps);
        for ((n, s), wv) in normed.iter_mut().zip(sum.iter()).zip(w) {
            *n = s * inv * wv;
        }
    }
}

/// `1 / sqrt(mean(x²) + eps)`, the squares summed in 16 lanes (as a vector unit does).
#[inline(always)]
fn inv_rms<const FMA: bool>(x: &[f32], eps: f32) -> f32 {
    let mut lanes = [0f32; 16];
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        for (l, v) in lanes.iter_mut().zip(c) {
            *l = super::fmadd::<FMA>(*v, *v, *l);
        }
    }
    let mut squares: f32 = lanes.iter().sum();
    for v in chunks.remainder() {
        squares += v * v;
    }
    1.0 / (squares / x.len() as f32 + eps).sqrt()
}

/// Per-head RMSNorm (weight `w`, `hd`) then the rotary (`cos`, `sin`: `hd / 2` per token) of
/// the heads `first..first + heads` of `qkv` (`tokens × row_heads × hd`), into `rows ≥ tokens`
/// rows of `heads × hd`, zeros past `tokens`.
#[allow(clippy::too_many_arguments)]
pub fn qk_norm_rope(
    qkv: &[f32],
    row_heads: usize,
    first: usize,
    heads: usize,
    w: &[f32],
    eps: f32,
    cos: &[f32],
    sin: &[f32],
    rows: usize,
) -> Vec<f32> {
    let hd = w.len();
    let tokens = qkv.len() / (row_heads * hd);
    let mut out = vec![0f32; rows * heads * hd];
    let simd = Simd::detect();
    let half = hd / 2;
    out.par_chunks_mut(heads * hd)
        .take(tokens)
        .enumerate()
        .with_min_len(MIN_ROWS)
        .for_each(|(t, dst)| {
            let src = &qkv[(t * row_heads + first) * hd..][..heads * hd];
            let (c, s) = (&cos[t * half..][..half], &sin[t * half..][..half]);
            norm_rope_row(simd, src, w, eps, c, s, dst);
        });
    out
}

simd_kernel! {
    fn norm_rope_row<const FMA: bool>(
        src: &[f32],
        w: &[f32],
        eps: f32,
        cos: &[f32],
        sin: &[f32],
        dst: &mut [f32],
    ) {
        let hd = w.len();
        let half = hd / 2;
        for (x, out) in src.chunks_exact(hd).zip(dst.chunks_exact_mut(hd)) {
            let inv = inv_rms::<FMA>(x, eps);
            let (x1, x2) = x.split_at(half);
            let (w1, w2) = w.split_at(half);
            let (o1, o2) = out.split_at_mut(half);
            for i in 0..half {
                let a = x1[i] * inv * w1[i];
                let b = x2[i] * inv * w2[i];
                o1[i] = a * cos[i] - b * sin[i];
                o2[i] = a * sin[i] + b * cos[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elementwise::cpu;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 2000) as f32 / 500.0 - 2.0)
            .collect()
    }

    fn close(a: &[f32], b: &[f32], tol: f32) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(
                (x - y).abs() <= tol * (1.0 + y.abs()),
                "{i}: {x} against {y}"
            );
        }
    }

    #[test]
    fn each_step_matches_the_reference_arithmetic() {
        let (rows, inter, hidden) = (37, 72, 96);
        let gate_up = values(rows * 2 * inter, 1);
        close(
            &swiglu(&gate_up, inter),
            &cpu::swiglu::<f32>(&gate_up, inter),
            1e-6,
        );
        let (x, h, w) = (
            values(rows * hidden, 2),
            values(rows * hidden, 3),
            values(hidden, 4),
        );
        let got = add_rms_norm(&x, &h, &w, 1e-6);
        let both = cpu::add_rms_norm::<f32>(&x, &h, &w, 1e-6);
        close(&got[..rows * hidden], &both[..rows * hidden], 0.0);
        close(&got[rows * hidden..], &both[rows * hidden..], 1e-6);
        let (row_heads, hd, tokens) = (5, 32, 37);
        let qkv = values(tokens * row_heads * hd, 5);
        let (cos, sin) = (values(tokens * hd / 2, 6), values(tokens * hd / 2, 7));
        let wn = values(hd, 8);
        let got = qk_norm_rope(&qkv, row_heads, 1, 3, &wn, 1e-6, &cos, &sin, tokens + 3);
        let want =
            cpu::qk_norm_rope::<f32>(&qkv, row_heads, 1, 3, &wn, 1e-6, &cos, &sin, tokens + 3);
        close(&got, &want, 2e-6);
    }
}
